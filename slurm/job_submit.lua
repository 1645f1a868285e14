--[[
job_submit.lua for Slurm's job_submit/lua plugin (JobSubmitPlugins=lua): refuses at sbatch what
Slurm's burst_buffer/lua would silently ignore or pend on forever, with a message naming the
line and the fix:

  * another system's directive (`#DW ...`, `#BB ...`): the job would run without a buffer;
  * a `#BB_LUA` line after the first command: Slurm reads only the leading comment block;
  * `sbatch --bb TEXT` with no directive line in the script: not read by the Lua plugin;
  * an unknown pool, `capacity=` without `pool=`, a capacity larger than the whole pool.

Install it next to slurm.conf with burst_buffer.lua; it reads the same spillway-bb.env (for
SPILLWAY_BIN and SPILLWAY_BB_POOLS_CACHE). The checks are `spillway bb submit-check`
(crates/slurm/src/directive.rs), which only reads the script and the pools cache: it runs inside
slurmctld with its locks held, so it never asks the manager. Jobs whose script and --bb mention
no burst buffer directive are passed without starting anything.
]]

local script_name = "job_submit.lua"

local function config_dir()
	local source = debug.getinfo(1, "S").source
	if source and source:sub(1, 1) == "@" then
		local dir = source:sub(2):match("^(.*)/[^/]*$")
		if dir then
			return dir
		end
	end
	local conf = os.getenv("SLURM_CONF")
	if conf then
		return conf:match("^(.*)/[^/]*$") or "."
	end
	return "/etc/slurm"
end

local dir = config_dir()

local function load_settings()
	local settings = {}
	local file = io.open(dir .. "/spillway-bb.env", "r")
	if file then
		for line in file:lines() do
			local key, value = line:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
			if key then
				settings[key] = value
			end
		end
		file:close()
	end
	return settings
end

local settings = load_settings()
local spillway = settings.SPILLWAY_BIN or "spillway"
local pools_cache = settings.SPILLWAY_BB_POOLS_CACHE or (dir .. "/spillway-pools.json")

local function quote(word)
	return "'" .. tostring(word):gsub("'", "'\\''") .. "'"
end

-- Whether the job mentions a burst buffer at all: a directive-looking line or --bb text.
local function mentions_burst_buffer(script, bb)
	if bb and bb:match("%S") then
		return true
	end
	if not script then
		return false
	end
	for line in script:gmatch("[^\n]+") do
		if line:match("^%s*#BB") or line:match("^%s*#DW") then
			return true
		end
	end
	return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local script = job_desc.script
	local bb = job_desc.burst_buffer
	if not mentions_burst_buffer(script, bb) then
		return slurm.SUCCESS
	end
	local path = os.tmpname()
	local file = io.open(path, "w")
	if not file then
		slurm.log_error("%s: cannot write %s; burst buffer checks skipped", script_name, path)
		return slurm.SUCCESS
	end
	file:write(script or "")
	file:close()
	local words = { quote(spillway), "bb", "submit-check", "--pools-cache", quote(pools_cache) }
	if bb and bb:match("%S") then
		table.insert(words, "--bb")
		table.insert(words, quote(bb))
	end
	table.insert(words, quote(path))
	local pipe = io.popen(table.concat(words, " ") .. " 2>&1; echo \"__spillway_rc=$?\"", "r")
	local output = pipe and pipe:read("*a") or ""
	if pipe then
		pipe:close()
	end
	os.remove(path)
	local rc = tonumber(output:match("__spillway_rc=(%d+)%s*$")) or 127
	output = output:gsub("__spillway_rc=%d+%s*$", ""):gsub("%s+$", "")
	if rc == 127 then
		-- The binary is missing or broken: say so in the log, let burst_buffer/lua decide.
		slurm.log_error("%s: %s could not run: %s", script_name, spillway, output)
		return slurm.SUCCESS
	end
	if rc ~= 0 then
		slurm.log_user("%s", output)
		return slurm.ERROR
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS

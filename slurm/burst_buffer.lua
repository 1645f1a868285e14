--[[
burst_buffer.lua for Slurm's burst_buffer/lua plugin (22.05 through 24.11): Spillway as the burst
buffer.

Install next to slurm.conf and burst_buffer.conf (Directive=BB_LUA), with a file
spillway-bb.env beside it naming the spillway binary and its settings:

    SPILLWAY_BIN=/usr/bin/spillway
    SPILLWAY_MANAGER=/run/spillway/manager.sock
    SPILLWAY_BB_MOUNT_ROOT=/mnt/spillway
    SPILLWAY_BB_STATE_DIR=/var/lib/spillway/bb

(optional: SPILLWAY_MANAGER_AUTH=munge and SPILLWAY_MANAGER=tcp://HOST:PORT for a manager on
another host, SPILLWAY_MUNGE_SOCKET.) scripts/slurm/start.sh writes it for the test cluster. The
mount on each node is Slurm's Prolog/Epilog (`spillway bb prolog` / `bb epilog`), not a hook of
this file. Every hook is a thin call of
`spillway bb <hook>`, where the logic and its tests live (crates/slurm).

Where the hooks run (22.05): slurm_bb_job_process, slurm_bb_pools and slurm_bb_paths run inside
slurmctld with its locks held and cannot be killed, so they only do local work: job_process
parses the script (`spillway bb validate`), paths writes one env var, pools reads a cache file
and refreshes it in a detached child when it is stale. The others run in slurmscriptd children
with the timeouts of burst_buffer.conf. Every hook accepts extra arguments (`...`) because later
Slurm versions pass more (23.02+: uid and gid; 24.05+: job_info too) and reads only those 22.05
passes; 24.05 also requires slurm_bb_test_data_in/out. A hook returns slurm.SUCCESS or slurm.ERROR plus a message; for
job_process the message is what sbatch prints, for the others it lands in the job's reason.
]]

local script_name = "burst_buffer.lua"

-- The directory holding this file (and slurm.conf): from Lua's own chunk name, else SLURM_CONF.
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

-- KEY=VALUE lines of spillway-bb.env (missing file: defaults, spillway on PATH).
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
-- Seconds after which slurm_bb_pools starts a background refresh of the cache.
local pools_max_age = tonumber(settings.SPILLWAY_BB_POOLS_MAX_AGE or "10")

local function quote(word)
	return "'" .. tostring(word):gsub("'", "'\\''") .. "'"
end

-- `env K=V ... spillway bb <words>` as one shell word list; with `detach`, run it in its own
-- session (`setsid -w`: still waited for, but out of the hook's process group).
local function command(words, detach)
	local parts = { "env" }
	if detach then
		parts = { "setsid", "-w", "env" }
	end
	local keys = {
		"SPILLWAY_MANAGER",
		"SPILLWAY_MANAGER_AUTH",
		"SPILLWAY_MUNGE_SOCKET",
		"SPILLWAY_BB_MOUNT_ROOT",
		"SPILLWAY_BB_STATE_DIR",
	}
	for _, key in ipairs(keys) do
		if settings[key] then
			table.insert(parts, quote(key .. "=" .. settings[key]))
		end
	end
	table.insert(parts, quote(spillway))
	table.insert(parts, "bb")
	for _, word in ipairs(words) do
		table.insert(parts, quote(word))
	end
	return table.concat(parts, " ")
end

-- Run `spillway bb ...`; return its exit status and its output (stdout and stderr merged).
-- Lua 5.1's popen gives no exit status, so the shell appends it as a last line.
local function run(words, detach)
	local cmd = command(words, detach) .. " 2>&1; echo \"__spillway_rc=$?\""
	local pipe = io.popen(cmd, "r")
	if not pipe then
		return 127, "cannot run " .. spillway
	end
	local output = pipe:read("*a") or ""
	pipe:close()
	local rc = tonumber(output:match("__spillway_rc=(%d+)%s*$")) or 127
	output = output:gsub("__spillway_rc=%d+%s*$", ""):gsub("%s+$", "")
	return rc, output
end

-- Map a run to Slurm's return convention, logging what happened.
local function hook(name, job_id, words, detach)
	local rc, output = run(words, detach)
	if rc ~= 0 then
		slurm.log_error("%s: %s job %s failed (exit %d): %s", script_name, name, tostring(job_id), rc, output)
		return slurm.ERROR, output
	end
	if output ~= "" then
		slurm.log_info("%s: %s job %s: %s", script_name, name, tostring(job_id), output)
	end
	return slurm.SUCCESS, output
end

function slurm_bb_job_process(job_script, ...)
	local rc, output = run({ "validate", job_script })
	if rc ~= 0 then
		return slurm.ERROR, output
	end
	return slurm.SUCCESS
end

local function file_age(path)
	-- Lua has no stat; ask the shell (fast, local) for the mtime and compare with os.time().
	local pipe = io.popen("stat -c %Y " .. quote(path) .. " 2>/dev/null")
	if not pipe then
		return nil
	end
	local mtime = tonumber(pipe:read("*a"))
	pipe:close()
	if not mtime then
		return nil
	end
	return os.time() - mtime
end

local function read_file(path)
	local file = io.open(path, "r")
	if not file then
		return nil
	end
	local text = file:read("*a")
	file:close()
	return text
end

function slurm_bb_pools(...)
	local age = file_age(pools_cache)
	if age == nil then
		-- First call (slurmctld start): one bounded synchronous refresh (a local socket call,
		-- at most a few seconds when the manager is down), then whatever we have.
		run({ "pools", "--refresh", "--cache", pools_cache })
	elseif age > pools_max_age then
		-- Stale: refresh in a detached child and answer from the cache now.
		os.execute(command({ "pools", "--refresh", "--cache", pools_cache }) .. " >/dev/null 2>&1 </dev/null &")
	end
	local pools = read_file(pools_cache)
	if not pools or pools == "" then
		slurm.log_error("%s: no pools cache at %s (is the spillway manager up?)", script_name, pools_cache)
		return slurm.SUCCESS
	end
	return slurm.SUCCESS, pools
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, ...)
	local words = { "setup", "--job", job_id, "--uid", uid, "--gid", gid }
	if pool and pool ~= "" and pool ~= "(null)" then
		table.insert(words, "--pool")
		table.insert(words, pool)
	end
	table.insert(words, job_script)
	return hook("setup", job_id, words)
end

function slurm_bb_data_in(job_id, job_script, ...)
	return hook("data_in", job_id, { "data-in", "--job", job_id, job_script })
end

-- Slurm 24.05 and later require these two and poll them after data_in / data_out until they stop
-- answering "BUSY". Spillway's data_in and data_out return only once the copy is done (22.05
-- has no polling hook), so by the time these run there is nothing left to wait for.
function slurm_bb_test_data_in(job_id, ...)
	return slurm.SUCCESS
end

function slurm_bb_test_data_out(job_id, ...)
	return slurm.SUCCESS
end

function slurm_bb_real_size(job_id, ...)
	-- 22.05 passes only the job id; the job's record (written by setup) is enough.
	local rc, output = run({ "real-size", "--job", job_id })
	if rc ~= 0 then
		slurm.log_error("%s: real_size job %s failed: %s", script_name, job_id, output)
		return slurm.ERROR, output
	end
	-- The size is the last line; warnings (stderr, merged) may come before it.
	local size = output:match("^(%d+)$") or output:match("\n(%d+)$")
	if size then
		return slurm.SUCCESS, size
	end
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file, ...)
	return hook("paths", job_id, { "paths", "--job", job_id, job_script, path_file })
end

function slurm_bb_pre_run(job_id, job_script, ...)
	return hook("pre_run", job_id, { "pre-run", "--job", job_id, job_script })
end

function slurm_bb_post_run(job_id, job_script, ...)
	return hook("post_run", job_id, { "post-run", "--job", job_id, job_script })
end

function slurm_bb_data_out(job_id, job_script, ...)
	return hook("data_out", job_id, { "data-out", "--job", job_id, job_script })
end

function slurm_bb_job_teardown(job_id, job_script, hurry, ...)
	local words = { "teardown", "--job", job_id }
	if hurry == "true" then
		table.insert(words, "--hurry")
	end
	if job_script and job_script ~= "" then
		table.insert(words, job_script)
	end
	-- Slurm 22.05 kills every script of a job when a pending job is cancelled (killpg, SIGKILL),
	-- and that can hit the teardown it has just queued for the cancel; a killed teardown is not
	-- retried. In its own session the cleanup runs to the end even if this hook is killed.
	return hook("teardown", job_id, words, true)
end

-- `scontrol show bbstat WORDS`: 22.05 passes the words; 23.02 and later pass the asking user's
-- uid and gid first. `spillway bb status` tells them apart by Slurm's version (never by the
-- words, which the user types) and asks the manager as that user, or for capacity only.
function slurm_bb_get_status(...)
	local words = { "status" }
	for _, word in ipairs({ ... }) do
		table.insert(words, word)
	end
	local rc, output = run(words)
	if rc ~= 0 then
		return slurm.ERROR, output
	end
	return slurm.SUCCESS, output .. "\n"
end

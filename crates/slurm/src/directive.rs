//! The `#BB_LUA` job script directive: what a batch job asks of the burst buffer.
//!
//! ```text
//! #BB_LUA capacity=SIZE [pool=NAME] [access=striped|private] [persistent=NAME] [replicas=K]
//!         [tiering=baseline|high-priority|interference-aware|measured]
//!         [bandwidth=RATE/s] [iops=RATE] [metadata=RATE/s]   (performance targets: with one,
//!                                     capacity= may be left out; docs/design/targets.md)
//! #BB_LUA stage_in=PFS_SRC:RES_DST  stage_out=RES_SRC:PFS_DST      (repeatable)
//! #BB_LUA stage_in source=PFS_SRC destination=RES_DST [type=file|directory|list]
//! #BB_LUA stage_out source=RES_SRC destination=PFS_DST [when=always|success]
//! #BB_LUA create_persistent name=NAME capacity=SIZE|TARGETS [pool=…] [access=…] [replicas=…] [tiering=…]
//! #BB_LUA destroy_persistent name=NAME                              (repeatable)
//! #BB_LUA use_persistent name=NAME        (repeatable: mounted beside, at $SPILLWAY_BB_<NAME>)
//! ```
//!
//! Values may be quoted (`source="/lustre/my run/in"`, `'…'` literally, `"…"` with `\"` and
//! `\\`); the long stage lines take paths with `:` and spaces.
//!
//! Pure parsing, no I/O: the Slurm `job_process` hook runs it inside slurmctld on every
//! submission (`spillway bb validate`), and every later hook re-parses the same script, so the
//! script is the only job state the hooks need. The lines are found the way Slurm 22.05's
//! burst_buffer/lua plugin finds them (so both agree on what the job asked for): only the leading
//! block of `#` lines counts (empty lines are skipped, the first other line ends it), a line ending
//! in `\` continues on the next directive line, and sizes use Slurm's suffixes (`k`/`KiB` = 1024,
//! `KB` = 1000, up to `P`/`PiB`/`PB`; no suffix = bytes). Unlike Slurm, which silently reads
//! `10X` as 10 bytes, every unknown key, bad size or bad path is an error naming the token.

/// Directive name as configured by `Directive=BB_LUA` in burst_buffer.conf (without the `#`).
pub const DIRECTIVE_DEFAULT: &str = "BB_LUA";

/// Longest pool or persistent reservation name accepted.
pub const NAME_BYTES_MAX: usize = 64;

/// Most `use_persistent` lines in one job: each is one more mount on every node of the job.
pub const USE_PERSISTENT_MAX: usize = 8;

/// The environment variable a job finds the persistent reservation `name` of a
/// `use_persistent` line at: `SPILLWAY_BB_` and the name in capitals, `-` and `.` as `_`
/// (`campaign-2.in` → `SPILLWAY_BB_CAMPAIGN_2_IN`).
pub fn persistent_variable(name: &str) -> String {
    let suffix: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect();
    format!("SPILLWAY_BB_{suffix}")
}

/// Variables the job gets anyway, which no `use_persistent` name may map to.
const RESERVED_VARIABLES: [&str; 1] = ["SPILLWAY_BB_RESERVATION"];

pub use spillway_policy::namespace::NamespaceAccess as Access;

/// One copy between the PFS and the reservation. `pfs_path` is absolute; `reservation_path` is
/// relative to the reservation's root (no `..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub pfs_path: String,
    pub reservation_path: String,
    /// What the source must be (stage-in only; a stage-out copies a file or a tree, whichever
    /// its source is).
    pub kind: StageKind,
    /// When a stage-out runs (stage-in: always).
    pub when: StageWhen,
}

impl Stage {
    /// A stage of the short form (`SRC:DST`): any source kind, always.
    fn plain(pfs_path: String, reservation_path: String) -> Stage {
        Stage { pfs_path, reservation_path, kind: StageKind::Any, when: StageWhen::Always }
    }
}

/// `type=` of a long stage line: what its source must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageKind {
    /// A file or a directory tree, whichever the source is.
    Any,
    /// A regular file; anything else fails the stage.
    File,
    /// A directory, copied as a tree.
    Directory,
    /// A file listing `SOURCE DESTINATION` pairs, one per line (stage-in only).
    List,
}

impl StageKind {
    /// The word `spillway stage-in --type` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Any => "any",
            StageKind::File => "file",
            StageKind::Directory => "directory",
            StageKind::List => "list",
        }
    }
}

/// `when=` of a stage-out line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageWhen {
    /// Whatever the job's exit (the default).
    Always,
    /// Only when the job exited 0 (`ExitCode=0:0`).
    Success,
}

/// Everything a job's directive lines ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// Bytes requested (`capacity=`); `None` only when `persistent=` names an existing reservation.
    pub capacity_bytes: Option<u64>,
    /// Pool requested; `None` lets the manager choose (BIOS Algorithm 2).
    pub pool: Option<String>,
    /// `access=`; `None`: striped, or by performance targets what the manager's plan chooses.
    pub access: Option<Access>,
    /// Performance targets (`bandwidth=`, `iops=`, `metadata=`; capacity stays in
    /// `capacity_bytes`): the manager places the reservation by them.
    pub rates: spillway_policy::targets::Targets,
    /// Named persistent reservation the job uses (created by the first job if missing); never
    /// destroyed at the job's teardown.
    pub persistent: Option<String>,
    /// Copies of every committed byte on distinct hosts until drained (`replicas=`, 1–4).
    pub replicas: u32,
    /// The tiering strategy of the job's I/O phases (`tiering=`; `None`: the site's default).
    pub tiering: Option<spillway_policy::Strategy>,
    /// `create_persistent`: `persistent` names a reservation this job creates, which must not
    /// exist yet (the job then uses it as with `persistent=`).
    pub create_persistent: bool,
    /// `destroy_persistent`: persistent reservations destroyed, as the job's user, at teardown.
    pub destroy_persistent: Vec<String>,
    /// `use_persistent`: existing persistent reservations the job mounts beside its own, each
    /// at [`persistent_variable`] of its name (stage lines copy to and from the job's own only).
    pub use_persistent: Vec<String>,
    /// Copies PFS → reservation before the job starts, in script order.
    pub stage_in: Vec<Stage>,
    /// Copies reservation → PFS after the job ends, in script order.
    pub stage_out: Vec<Stage>,
}

/// Why a job script's directive was rejected; every variant names the line and the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DirectiveError {
    #[error("line {line}: `{token}` is not a #{directive} directive (expected `#{directive} key=value ...`)")]
    NotDirective { line: usize, token: String, directive: String },
    #[error("line {line}: `{token}` is not key=value")]
    NotKeyValue { line: usize, token: String },
    #[error("line {line}: unknown key in `{token}` (known: capacity, bandwidth, iops, metadata, pool, access, persistent, replicas, tiering, stage_in, stage_out; and the lines `stage_in source=…`, `stage_out source=…`, `create_persistent name=…`, `destroy_persistent name=…`, `use_persistent name=…`)")]
    UnknownKey { line: usize, token: String },
    #[error("line {line}: `{token}` repeats {key}= (given once per job)")]
    Duplicate { line: usize, token: String, key: &'static str },
    #[error("line {line}: bad size in `{token}`: {problem}")]
    BadSize { line: usize, token: String, problem: SizeError },
    #[error("line {line}: bad access mode in `{token}` (expected striped or private)")]
    BadAccess { line: usize, token: String },
    #[error("line {line}: bad replica count in `{token}` (expected 1 to 4)")]
    BadReplicas { line: usize, token: String },
    #[error("line {line}: bad tiering strategy in `{token}` (expected baseline, high-priority, interference-aware or measured)")]
    BadTiering { line: usize, token: String },
    #[error("line {line}: bad performance target in `{token}`: {problem}")]
    BadTarget { line: usize, token: String, problem: spillway_policy::targets::TargetParseError },
    #[error("line {line}: bad name in `{token}`: {problem}")]
    BadName { line: usize, token: String, problem: &'static str },
    #[error("line {line}: bad stage path in `{token}`: {problem}")]
    BadStage { line: usize, token: String, problem: &'static str },
    #[error("line {line}: bad `{verb}` line: {problem} (expected `#{directive} {usage}`)")]
    BadPersistentLine {
        line: usize,
        verb: &'static str,
        problem: String,
        directive: String,
        usage: &'static str,
    },
    #[error("line {line}: unterminated quote in `{text}`")]
    UnterminatedQuote { line: usize, text: String },
    #[error("line {line}: bad `{verb}` line: {problem} (expected `#{directive} {verb} source=PATH destination=PATH {options}`)")]
    BadStageLine {
        line: usize,
        verb: &'static str,
        problem: String,
        directive: String,
        options: &'static str,
    },
    #[error("line {line}: `\\` continues a directive but no directive line follows")]
    DanglingContinuation { line: usize },
    #[error("the #{directive} lines ask for no capacity: add capacity=SIZE or a performance target (bandwidth=RATE/s, iops=RATE, metadata=RATE/s), or persistent=NAME to use an existing reservation")]
    NoCapacity { directive: String },
    #[error("line {line}: `{token}` is {system}'s directive, which this cluster does not read: ask Spillway with `#{directive} capacity=SIZE pool=NAME ...` lines before the first command")]
    ForeignDirective { line: usize, token: String, system: &'static str, directive: String },
    #[error("line {line}: #{directive} after the first command (line {first_command}) is ignored by Slurm: move it above line {first_command}")]
    LateDirective { line: usize, first_command: usize, directive: String },
    #[error("--bb {text:?} is not read by this cluster's burst buffer: put `#{directive} {text}` in a batch script (sbatch), before its first command")]
    BbOption { text: String, directive: String },
    #[error("line {line}: `pool={pool}`: no such pool (this cluster's pools: {known})")]
    UnknownPool { line: usize, pool: String, known: String },
    #[error("line {line}: capacity= needs pool=NAME beside it (Slurm's burst_buffer/lua refuses it otherwise; this cluster's pools: {known})")]
    PoolRequired { line: usize, known: String },
    #[error("line {line}: capacity {capacity} is more than pool {pool} holds in all ({pool_capacity}): ask for at most that{others}")]
    TooLarge { line: usize, capacity: String, pool: String, pool_capacity: String, others: String },
}

/// A pool as Slurm's pools answer (the cache `slurm_bb_pools` reads) describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSize {
    pub name: String,
    /// Its whole capacity (quantity × granularity).
    pub capacity_bytes: u64,
}

/// The burst buffer directives of other systems, which Slurm's burst_buffer/lua ignores.
const FOREIGN_DIRECTIVES: [(&str, &str); 2] = [("#DW", "DataWarp"), ("#BB", "DataWarp")];

/// What Slurm would silently ignore in a job script, refused at submission (`spillway bb
/// submit-check`, run by Slurm's job_submit/lua): another system's directive line (`#DW`,
/// `#BB`), this directive after the first command (Slurm reads only the leading block), and
/// `sbatch --bb TEXT` (`bb_option`) when the script has no directive line. Then the directive
/// itself ([`parse_script`]) and, when `pools` is known, its pool and size.
pub fn check_submission(
    script: &str,
    directive: &str,
    bb_option: Option<&str>,
    pools: Option<&[PoolSize]>,
) -> Result<(), DirectiveError> {
    let marker = format!("#{directive}");
    let mut first_command = None;
    // A here-document's body is data (a script that writes the next job's script), not
    // directives of this one.
    let mut heredoc_end: Option<&str> = None;
    for (index, raw) in script.split('\n').enumerate() {
        let number = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if let Some(end) = heredoc_end {
            if line.trim_start_matches('\t') == end {
                heredoc_end = None;
            }
            continue;
        }
        let token = line.split_whitespace().next().unwrap_or("");
        if token == marker {
            if let Some(first_command) = first_command {
                let directive = directive.to_string();
                return Err(DirectiveError::LateDirective {
                    line: number,
                    first_command,
                    directive,
                });
            }
        } else if let Some(&(_, system)) = FOREIGN_DIRECTIVES.iter().find(|(t, _)| *t == token) {
            let (token, directive) = (token.to_string(), directive.to_string());
            return Err(DirectiveError::ForeignDirective {
                line: number,
                token,
                system,
                directive,
            });
        } else if !line.is_empty() && !line.starts_with('#') {
            first_command = first_command.or(Some(number));
            heredoc_end = heredoc_delimiter(line);
        }
    }
    let parsed = parse_script(script, directive)?;
    let bb_option = bb_option.map(str::trim).filter(|text| !text.is_empty());
    if let (None, Some(text)) = (&parsed, bb_option) {
        let (text, directive) = (text.to_string(), directive.to_string());
        return Err(DirectiveError::BbOption { text, directive });
    }
    match (parsed, pools) {
        (Some(parsed), Some(pools)) => check_pool(script, directive, &parsed, pools),
        _ => Ok(()),
    }
}

/// The delimiter of the first here-document a shell line starts (`<<END`, `<<-END`, `<<'END'`,
/// `<< "END"`; not a here-string `<<<`).
fn heredoc_delimiter(line: &str) -> Option<&str> {
    let mut rest = line;
    while let Some(at) = rest.find("<<") {
        let after = &rest[at + 2..];
        if let Some(after_here_string) = after.strip_prefix('<') {
            rest = after_here_string;
            continue;
        }
        let word = after.strip_prefix('-').unwrap_or(after).trim_start();
        let word = word.trim_start_matches(['\'', '"']);
        let end = word
            .find(|c: char| c.is_whitespace() || "'\";|&()<>".contains(c))
            .unwrap_or(word.len());
        return (end > 0).then(|| &word[..end]);
    }
    None
}

/// The directive's pool exists and can hold its capacity at all (else the job would pend
/// forever); a capacity names its pool, as Slurm's burst_buffer/lua requires.
fn check_pool(
    script: &str,
    directive: &str,
    parsed: &Directive,
    pools: &[PoolSize],
) -> Result<(), DirectiveError> {
    let known = || match pools.len() {
        0 => "none yet".to_string(),
        _ => pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
    };
    let line_of = |key: &str| -> usize {
        let prefix = format!("{key}=");
        let lines = directive_lines(script, directive).unwrap_or_default();
        lines
            .iter()
            .find(|(_, body)| body.split_whitespace().any(|t| t.starts_with(&prefix)))
            .or(lines.first())
            .map_or(1, |(line, _)| *line)
    };
    let Some(capacity) = parsed.capacity_bytes else { return Ok(()) };
    let Some(name) = &parsed.pool else {
        return Err(DirectiveError::PoolRequired { line: line_of("capacity"), known: known() });
    };
    let Some(pool) = pools.iter().find(|p| &p.name == name) else {
        let (line, pool) = (line_of("pool"), name.clone());
        return Err(DirectiveError::UnknownPool { line, pool, known: known() });
    };
    if capacity > pool.capacity_bytes {
        let bigger: Vec<&str> = pools
            .iter()
            .filter(|p| p.capacity_bytes >= capacity)
            .map(|p| p.name.as_str())
            .collect();
        let others = match bigger.as_slice() {
            [] => String::new(),
            names => format!(", or pool {}", names.join(" or ")),
        };
        return Err(DirectiveError::TooLarge {
            line: line_of("capacity"),
            capacity: spillway_types::format_bytes(capacity),
            pool: pool.name.clone(),
            pool_capacity: spillway_types::format_bytes(pool.capacity_bytes),
            others,
        });
    }
    Ok(())
}

/// Why a size such as `10GiB` did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    #[error("no digits")]
    NoDigits,
    #[error("zero")]
    Zero,
    #[error("unknown suffix `{0}` (use k/KiB, KB, m/MiB, MB, g/GiB, GB, t/TiB, TB, p/PiB, PB)")]
    Suffix(String),
    #[error("sizes in nodes (`{0}`) are not supported; give bytes")]
    Nodes(String),
    #[error("more than 2^64 bytes")]
    Overflow,
}

/// Parse a size with Slurm's suffixes: no suffix = bytes, `k`/`kib` = 1024, `kb` = 1000, and the
/// same for m, g, t, p; case-insensitive. Zero is an error.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let suffix = &text[digits_end..];
    if digits_end > 0 && matches!(suffix.to_ascii_lowercase().as_str(), "n" | "node" | "nodes") {
        return Err(SizeError::Nodes(suffix.to_string()));
    }
    match spillway_types::parse_size(text) {
        Ok(0) => Err(SizeError::Zero),
        Ok(bytes) => Ok(bytes),
        Err(spillway_types::SizeError::NoDigits) => Err(SizeError::NoDigits),
        Err(spillway_types::SizeError::UnknownUnit(_)) => {
            Err(SizeError::Suffix(suffix.to_string()))
        }
        Err(spillway_types::SizeError::Overflow) => Err(SizeError::Overflow),
    }
}

/// The directive lines of `script` as Slurm 22.05 sees them: from the leading comment block,
/// continuations joined, each with the 1-based number of its first line and the text after
/// `#<directive>`.
pub fn directive_lines(
    script: &str,
    directive: &str,
) -> Result<Vec<(usize, String)>, DirectiveError> {
    let marker = format!("#{directive}");
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut continuing = false;
    for (index, raw) in script.split('\n').enumerate() {
        let number = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.is_empty() {
            continue; // Slurm tokenizes on '\n' and so never sees empty lines
        }
        if !line.starts_with('#') {
            break; // the first command ends the header, as in sbatch and Slurm's plugin
        }
        let Some(rest) = line.strip_prefix(&marker) else {
            if continuing {
                return Err(DirectiveError::DanglingContinuation { line: number - 1 });
            }
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            let token = line.split_whitespace().next().unwrap_or(line).to_string();
            return Err(DirectiveError::NotDirective {
                line: number,
                token,
                directive: directive.to_string(),
            });
        }
        let (body, continues) = match rest.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (rest, false),
        };
        if continuing {
            let last = lines.last_mut().expect("a continuation follows a directive line");
            last.1.push(' ');
            last.1.push_str(body);
        } else {
            lines.push((number, body.to_string()));
        }
        continuing = continues;
    }
    if continuing {
        let line = lines.last().map(|l| l.0).unwrap_or(0);
        return Err(DirectiveError::DanglingContinuation { line });
    }
    Ok(lines)
}

/// Parse the job's directive. `Ok(None)`: the script has no directive line (no burst buffer).
pub fn parse_script(script: &str, directive: &str) -> Result<Option<Directive>, DirectiveError> {
    let lines = directive_lines(script, directive)?;
    if lines.is_empty() {
        return Ok(None);
    }
    let mut fields = DirectiveFields::default();
    for (line, body) in &lines {
        let tokens = split_quoted(body).ok_or_else(|| DirectiveError::UnterminatedQuote {
            line: *line,
            text: body.trim().to_string(),
        })?;
        match tokens.first().map(String::as_str) {
            Some("stage_in") => {
                fields.stage_in.push(parse_stage_line(*line, "stage_in", &tokens[1..], directive)?);
            }
            Some("stage_out") => {
                let stage = parse_stage_line(*line, "stage_out", &tokens[1..], directive)?;
                fields.stage_out.push(stage);
            }
            Some("create_persistent") => fields.add_create_line(*line, &tokens[1..], directive)?,
            Some("destroy_persistent") => {
                fields.add_destroy_line(*line, &tokens[1..], directive)?;
            }
            Some("use_persistent") => fields.add_use_line(*line, &tokens[1..], directive)?,
            _ => {
                for token in &tokens {
                    fields.add_token(*line, token)?;
                }
            }
        }
    }
    fields.finish(directive).map(Some)
}

/// Splits a directive line into words at unquoted whitespace: `'…'` is taken literally, `"…"`
/// with `\"` and `\\` as escapes; quotes may start inside a word (`source="/a b"`). `None`: a
/// quote is not closed.
pub fn split_quoted(text: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => current.push(c),
                    }
                }
            }
            '"' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\') => current.push(c),
                            c => {
                                current.push('\\');
                                current.push(c);
                            }
                        },
                        c => current.push(c),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Some(words)
}

/// The long form `stage_in|stage_out source=… destination=… [type=…] [when=…]`.
fn parse_stage_line(
    line: usize,
    verb: &'static str,
    tokens: &[String],
    directive: &str,
) -> Result<Stage, DirectiveError> {
    let stage_in = verb == "stage_in";
    let bad = |problem: String| DirectiveError::BadStageLine {
        line,
        verb,
        problem,
        directive: directive.to_string(),
        options: if stage_in { "[type=file|directory|list]" } else { "[when=always|success]" },
    };
    let (mut source, mut destination, mut kind, mut when) = (None, None, None, None);
    for token in tokens {
        let Some((key, value)) = token.split_once('=') else {
            return Err(bad(format!("`{token}` is not key=value")));
        };
        let slot_taken = match key {
            "source" => source.replace(value.to_string()).is_some(),
            "destination" => destination.replace(value.to_string()).is_some(),
            "type" if stage_in => {
                let parsed = match value {
                    "file" => StageKind::File,
                    "directory" => StageKind::Directory,
                    "list" => StageKind::List,
                    _ => return Err(bad(format!("`{token}`: type is file, directory or list"))),
                };
                kind.replace(parsed).is_some()
            }
            "when" if !stage_in => {
                let parsed = match value {
                    "always" => StageWhen::Always,
                    "success" => StageWhen::Success,
                    _ => return Err(bad(format!("`{token}`: when is always or success"))),
                };
                when.replace(parsed).is_some()
            }
            "type" => {
                return Err(bad(format!(
                    "`{token}`: type= applies to stage_in (a stage-out copies a file or a tree, whichever its source is)"
                )))
            }
            "when" => {
                return Err(bad(format!("`{token}`: when= applies to stage_out (stage-in always runs)")))
            }
            _ => return Err(bad(format!("unknown key in `{token}`"))),
        };
        if slot_taken {
            return Err(bad(format!("`{token}` repeats {key}=")));
        }
    }
    let (Some(source), Some(destination)) = (source, destination) else {
        return Err(bad("source= and destination= are both required".to_string()));
    };
    let (pfs, reservation) = if stage_in { (source, destination) } else { (destination, source) };
    check_pfs_path(&pfs).map_err(|problem| bad(format!("`{pfs}`: {problem}")))?;
    check_reservation_path(&reservation)
        .map_err(|problem| bad(format!("`{reservation}`: {problem}")))?;
    Ok(Stage {
        pfs_path: pfs,
        reservation_path: reservation,
        kind: kind.unwrap_or(StageKind::Any),
        when: when.unwrap_or(StageWhen::Always),
    })
}

/// What the directive's tokens have set so far, one field per key.
#[derive(Default)]
struct DirectiveFields {
    capacity_bytes: Option<u64>,
    pool: Option<String>,
    access: Option<Access>,
    rates: spillway_policy::targets::Targets,
    persistent: Option<String>,
    replicas: Option<u32>,
    tiering: Option<spillway_policy::Strategy>,
    stage_in: Vec<Stage>,
    stage_out: Vec<Stage>,
    create_persistent: bool,
    destroy_persistent: Vec<String>,
    /// The `use_persistent` names, each with its line.
    use_persistent: Vec<(usize, String)>,
}

const CREATE_USAGE: &str = "create_persistent name=NAME capacity=SIZE|bandwidth=…|iops=…|metadata=… [pool=NAME] [access=…] [replicas=…] [tiering=…]";
const DESTROY_USAGE: &str = "destroy_persistent name=NAME";
const USE_USAGE: &str = "use_persistent name=NAME";

fn bad_persistent_line(
    line: usize,
    verb: &'static str,
    usage: &'static str,
    directive: &str,
    problem: String,
) -> DirectiveError {
    DirectiveError::BadPersistentLine {
        line,
        verb,
        problem,
        directive: directive.to_string(),
        usage,
    }
}

impl DirectiveFields {
    /// `create_persistent name=NAME capacity=SIZE …`: the job's one reservation is the
    /// persistent NAME, created by this job.
    fn add_create_line(
        &mut self,
        line: usize,
        tokens: &[String],
        directive: &str,
    ) -> Result<(), DirectiveError> {
        let bad = |problem| {
            bad_persistent_line(line, "create_persistent", CREATE_USAGE, directive, problem)
        };
        if self.create_persistent || self.persistent.is_some() {
            return Err(bad(
                "a job has one reservation: this one or persistent=, given once".into()
            ));
        }
        let mut named = false;
        for token in tokens {
            match token.split_once('=') {
                Some(("name", name)) => {
                    check_persistent_name(name).map_err(|p| bad(format!("`{token}`: {p}")))?;
                    named = true;
                    self.persistent = Some(name.to_string());
                }
                Some((
                    "capacity" | "bandwidth" | "iops" | "metadata" | "pool" | "access" | "replicas"
                    | "tiering",
                    _,
                )) => {
                    self.add_token(line, token)?;
                }
                _ => return Err(bad(format!("`{token}` is not one of its keys"))),
            }
        }
        if !named {
            return Err(bad("name= is required".into()));
        }
        // On this line: a capacity= or target of another line would be that line's reservation.
        let asks = |t: &&String| {
            ["capacity=", "bandwidth=", "iops=", "metadata="].iter().any(|key| t.starts_with(key))
        };
        if !tokens.iter().any(|t| asks(&t)) {
            let elsewhere = if self.capacity_bytes.is_some() || self.rates.has_rates() {
                " (the capacity= or target of another line asks for the job's own reservation: a job has one, this or that)"
            } else {
                ""
            };
            return Err(bad(format!(
                "capacity= or a target (bandwidth=, iops=, metadata=) is required on this line{elsewhere}"
            )));
        }
        self.create_persistent = true;
        Ok(())
    }

    /// `destroy_persistent name=NAME`.
    fn add_destroy_line(
        &mut self,
        line: usize,
        tokens: &[String],
        directive: &str,
    ) -> Result<(), DirectiveError> {
        let bad = |problem| {
            bad_persistent_line(line, "destroy_persistent", DESTROY_USAGE, directive, problem)
        };
        let name = only_name(tokens).map_err(bad)?;
        if self.destroy_persistent.contains(&name) {
            return Err(bad(format!("`name={name}` is given twice")));
        }
        self.destroy_persistent.push(name);
        Ok(())
    }

    /// `use_persistent name=NAME`: one more reservation, mounted beside the job's own.
    fn add_use_line(
        &mut self,
        line: usize,
        tokens: &[String],
        directive: &str,
    ) -> Result<(), DirectiveError> {
        let bad =
            |problem| bad_persistent_line(line, "use_persistent", USE_USAGE, directive, problem);
        let name = only_name(tokens).map_err(bad)?;
        let variable = persistent_variable(&name);
        if RESERVED_VARIABLES.contains(&variable.as_str()) {
            return Err(bad(format!(
                "`name={name}` would be ${variable}, which every job has: rename the reservation"
            )));
        }
        if let Some((_, other)) =
            self.use_persistent.iter().find(|(_, other)| persistent_variable(other) == variable)
        {
            return Err(bad(format!("`name={name}` and `name={other}` are both ${variable}")));
        }
        if self.use_persistent.len() == USE_PERSISTENT_MAX {
            return Err(bad(format!(
                "at most {USE_PERSISTENT_MAX} reservations are used beside the job's own"
            )));
        }
        self.use_persistent.push((line, name));
        Ok(())
    }

    /// Parse one `key=value` token of directive line `line` into its field.
    fn add_token(&mut self, line: usize, token: &str) -> Result<(), DirectiveError> {
        let Some((key, value)) = token.split_once('=') else {
            return Err(DirectiveError::NotKeyValue { line, token: token.to_string() });
        };
        let given_once = |already_given: bool, key: &'static str| {
            if already_given {
                return Err(DirectiveError::Duplicate { line, token: token.to_string(), key });
            }
            Ok(())
        };
        let bad_name =
            |problem| DirectiveError::BadName { line, token: token.to_string(), problem };
        let bad_stage =
            |problem| DirectiveError::BadStage { line, token: token.to_string(), problem };
        match key {
            "capacity" => {
                given_once(self.capacity_bytes.is_some(), "capacity")?;
                let bytes = parse_size(value).map_err(|problem| DirectiveError::BadSize {
                    line,
                    token: token.to_string(),
                    problem,
                })?;
                self.capacity_bytes = Some(bytes);
            }
            "pool" => {
                given_once(self.pool.is_some(), "pool")?;
                check_name(value).map_err(bad_name)?;
                self.pool = Some(value.to_string());
            }
            "access" => {
                given_once(self.access.is_some(), "access")?;
                let access = parse_access(value)
                    .ok_or_else(|| DirectiveError::BadAccess { line, token: token.to_string() })?;
                self.access = Some(access);
            }
            "persistent" => {
                given_once(self.persistent.is_some(), "persistent")?;
                check_persistent_name(value).map_err(bad_name)?;
                self.persistent = Some(value.to_string());
            }
            "replicas" => {
                given_once(self.replicas.is_some(), "replicas")?;
                let replicas =
                    value.parse::<u32>().ok().filter(|k| (1..=4).contains(k)).ok_or_else(|| {
                        DirectiveError::BadReplicas { line, token: token.to_string() }
                    })?;
                self.replicas = Some(replicas);
            }
            "tiering" => {
                given_once(self.tiering.is_some(), "tiering")?;
                let strategy = spillway_policy::Strategy::parse(value)
                    .ok_or_else(|| DirectiveError::BadTiering { line, token: token.to_string() })?;
                self.tiering = Some(strategy);
            }
            "bandwidth" | "iops" | "metadata" => self.add_rate(line, token, key, value)?,
            "stage_in" => self.stage_in.push(parse_stage_in(value).map_err(bad_stage)?),
            "stage_out" => self.stage_out.push(parse_stage_out(value).map_err(bad_stage)?),
            _ => return Err(DirectiveError::UnknownKey { line, token: token.to_string() }),
        }
        Ok(())
    }

    /// `bandwidth=`, `iops=` or `metadata=` (`key`), each given once.
    fn add_rate(
        &mut self,
        line: usize,
        token: &str,
        key: &str,
        value: &str,
    ) -> Result<(), DirectiveError> {
        let (key, given) = match key {
            "bandwidth" => ("bandwidth", self.rates.bandwidth_bytes_per_s.is_some()),
            "iops" => ("iops", self.rates.iops.is_some()),
            _ => ("metadata", self.rates.metadata_ops_per_s.is_some()),
        };
        let token = token.to_string();
        if given {
            return Err(DirectiveError::Duplicate { line, token, key });
        }
        self.rates.set(key, value).map_err(|problem| DirectiveError::BadTarget {
            line,
            token,
            problem,
        })
    }

    /// Check the directive as a whole (it must ask for some capacity) and fill in defaults.
    fn finish(self, directive: &str) -> Result<Directive, DirectiveError> {
        if self.capacity_bytes.is_none() && !self.rates.has_rates() && self.persistent.is_none() {
            return Err(DirectiveError::NoCapacity { directive: directive.to_string() });
        }
        if let Some((line, name)) =
            self.use_persistent.iter().find(|(_, name)| Some(name) == self.persistent.as_ref())
        {
            return Err(bad_persistent_line(
                *line,
                "use_persistent",
                USE_USAGE,
                directive,
                format!("{name} is already the job's own reservation ($SPILLWAY_BB)"),
            ));
        }
        Ok(Directive {
            capacity_bytes: self.capacity_bytes,
            pool: self.pool,
            access: self.access,
            rates: self.rates,
            persistent: self.persistent,
            replicas: self.replicas.unwrap_or(1),
            tiering: self.tiering,
            create_persistent: self.create_persistent,
            destroy_persistent: self.destroy_persistent,
            use_persistent: self.use_persistent.into_iter().map(|(_, name)| name).collect(),
            stage_in: self.stage_in,
            stage_out: self.stage_out,
        })
    }
}

fn parse_access(value: &str) -> Option<Access> {
    match value {
        "striped" => Some(Access::Striped),
        "private" => Some(Access::Private),
        _ => None,
    }
}

/// The name of a line that takes `name=NAME` and nothing else.
fn only_name(tokens: &[String]) -> Result<String, String> {
    let [token] = tokens else {
        return Err(format!("{} words after it, expected name=NAME only", tokens.len()));
    };
    let Some(name) = token.strip_prefix("name=") else {
        return Err(format!("`{token}` is not name=NAME"));
    };
    check_persistent_name(name).map_err(|p| format!("`{token}`: {p}"))?;
    Ok(name.to_string())
}

/// A persistent reservation's name: a valid name that does not look like a job reservation's.
fn check_persistent_name(name: &str) -> Result<(), &'static str> {
    check_name(name)?;
    if name.starts_with("job-") {
        return Err("names starting with job- are reserved for job reservations");
    }
    Ok(())
}

/// `stage_in=PFS_SRC:RES_DST`.
fn parse_stage_in(value: &str) -> Result<Stage, &'static str> {
    let (pfs, reservation) = split_stage(value)?;
    check_pfs_path(&pfs)?;
    check_reservation_path(&reservation)?;
    Ok(Stage::plain(pfs, reservation))
}

/// `stage_out=RES_SRC:PFS_DST`: for stage_out the reservation side comes first.
fn parse_stage_out(value: &str) -> Result<Stage, &'static str> {
    let (reservation, pfs) = split_stage(value)?;
    check_reservation_path(&reservation)?;
    check_pfs_path(&pfs)?;
    Ok(Stage::plain(pfs, reservation))
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > NAME_BYTES_MAX {
        return Err("longer than 64 bytes");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or digit");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err("only letters, digits, '-', '_' and '.' are allowed");
    }
    Ok(())
}

/// `SRC:DST` split at the first `:` (so the first path may not contain one).
fn split_stage(value: &str) -> Result<(String, String), &'static str> {
    let Some((src, dst)) = value.split_once(':') else {
        return Err("expected SRC:DST");
    };
    if src.is_empty() || dst.is_empty() {
        return Err("expected SRC:DST with both paths non-empty");
    }
    Ok((src.to_string(), dst.to_string()))
}

fn check_pfs_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("the PFS path must be absolute");
    }
    if path.split('/').any(|c| c == "..") {
        return Err("`..` is not allowed in the PFS path");
    }
    Ok(())
}

fn check_reservation_path(path: &str) -> Result<(), &'static str> {
    if path.starts_with('/') {
        return Err("the reservation path must be relative to the reservation root");
    }
    if path.split('/').any(|c| c == "..") {
        return Err("`..` is not allowed in the reservation path");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(script: &str) -> Result<Option<Directive>, DirectiveError> {
        parse_script(script, DIRECTIVE_DEFAULT)
    }

    #[test]
    fn sizes_follow_slurm_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("10mib"), Ok(10 << 20));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("3GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
        assert_eq!(parse_size("0"), Err(SizeError::Zero));
        assert_eq!(parse_size("G"), Err(SizeError::NoDigits));
        assert_eq!(parse_size("10X"), Err(SizeError::Suffix("X".into())));
        assert_eq!(parse_size("4N"), Err(SizeError::Nodes("N".into())));
        assert_eq!(parse_size("99999999999999999999"), Err(SizeError::Overflow));
        assert_eq!(parse_size("20000P"), Err(SizeError::Overflow));
    }

    #[test]
    fn full_directive_over_several_lines() {
        let script = "#!/bin/sh\n#SBATCH -N 1\n\n#BB_LUA capacity=1GiB pool=fast access=striped\n\
                      #BB_LUA stage_in=/pfs/in/data:input stage_in=/pfs/in/cfg:cfg\n\
                      #BB_LUA stage_out=ckpt:/pfs/out/ckpt\nsrun app\n#BB_LUA capacity=1\n";
        let d = parse(script).unwrap().unwrap();
        assert_eq!(d.capacity_bytes, Some(1 << 30));
        assert_eq!(d.pool.as_deref(), Some("fast"));
        assert_eq!(d.access, Some(Access::Striped));
        assert_eq!(d.persistent, None);
        assert_eq!(
            d.stage_in,
            vec![
                Stage::plain("/pfs/in/data".into(), "input".into()),
                Stage::plain("/pfs/in/cfg".into(), "cfg".into()),
            ]
        );
        assert_eq!(d.stage_out, vec![Stage::plain("/pfs/out/ckpt".into(), "ckpt".into())]);
    }

    #[test]
    fn long_stage_lines_take_quoted_paths_kinds_and_when() {
        let script = "#!/bin/sh\n#BB_LUA capacity=1G pool=p\n\
             #BB_LUA stage_in source=\"/pfs/my run/in:put\" destination='in put' type=directory\n\
             #BB_LUA stage_in source=/pfs/list.txt destination=. type=list\n\
             #BB_LUA stage_out source=ckpt destination=/pfs/out when=success\n\
             #BB_LUA stage_out=\"logs dir:/pfs/a b\"\nsrun app\n";
        let d = parse(script).unwrap().unwrap();
        assert_eq!(
            d.stage_in,
            vec![
                Stage {
                    pfs_path: "/pfs/my run/in:put".into(),
                    reservation_path: "in put".into(),
                    kind: StageKind::Directory,
                    when: StageWhen::Always,
                },
                Stage {
                    pfs_path: "/pfs/list.txt".into(),
                    reservation_path: ".".into(),
                    kind: StageKind::List,
                    when: StageWhen::Always,
                },
            ]
        );
        assert_eq!(
            d.stage_out,
            vec![
                Stage {
                    pfs_path: "/pfs/out".into(),
                    reservation_path: "ckpt".into(),
                    kind: StageKind::Any,
                    when: StageWhen::Success,
                },
                Stage::plain("/pfs/a b".into(), "logs dir".into()),
            ]
        );
        assert_eq!(split_quoted(r#"a "b \" c" 'd\e'f"#).unwrap(), ["a", "b \" c", "d\\ef"]);
        assert_eq!(split_quoted("x=\"open"), None);
    }

    #[test]
    fn persistent_reservations_created_and_destroyed_by_jobs() {
        let d = parse(
            "#!/bin/sh\n#BB_LUA create_persistent name=campaign capacity=2G pool=fast access=striped\n\
             #BB_LUA destroy_persistent name=old-1\n#BB_LUA destroy_persistent name=old-2\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.persistent.as_deref(), Some("campaign"));
        assert!(d.create_persistent);
        assert_eq!(d.capacity_bytes, Some(2 << 30));
        assert_eq!(d.pool.as_deref(), Some("fast"));
        assert_eq!(d.destroy_persistent, ["old-1", "old-2"]);
        let d = parse("#BB_LUA persistent=last destroy_persistent=x\n");
        assert!(matches!(d, Err(DirectiveError::UnknownKey { .. })), "{d:?}");
        let d = parse("#BB_LUA persistent=last\n#BB_LUA destroy_persistent name=last\n");
        let d = d.unwrap().unwrap();
        assert!(!d.create_persistent);
        assert_eq!(d.destroy_persistent, ["last"]);
        let cases: &[(&str, &str)] = &[
            ("#BB_LUA create_persistent capacity=1G", "name= is required"),
            (
                "#BB_LUA create_persistent name=x",
                "capacity= or a target (bandwidth=, iops=, metadata=) is required",
            ),
            ("#BB_LUA create_persistent name=job-3 capacity=1G", "reserved for job reservations"),
            (
                "#BB_LUA create_persistent name=x capacity=1G stage_in=/a:b",
                "is not one of its keys",
            ),
            ("#BB_LUA destroy_persistent", "expected name=NAME only"),
            ("#BB_LUA destroy_persistent x", "is not name=NAME"),
        ];
        for (line, problem) in cases {
            let error = parse(&format!("#!/bin/sh\n{line}\n")).expect_err(line).to_string();
            assert!(error.starts_with("line 2"), "{line}: {error}");
            assert!(error.contains(problem), "{line}: {error}");
        }
        let elsewhere = "#BB_LUA capacity=1G pool=p\n#BB_LUA create_persistent name=b\n";
        let error = parse(elsewhere).unwrap_err().to_string();
        assert!(
            error.contains("line 2") && error.contains("a job has one, this or that"),
            "{error}"
        );
        let twice = "#BB_LUA persistent=a\n#BB_LUA create_persistent name=b capacity=1G\n";
        let error = parse(twice).unwrap_err().to_string();
        assert!(error.contains("a job has one reservation"), "{error}");
        let twice = "#BB_LUA destroy_persistent name=a\n#BB_LUA destroy_persistent name=a\n";
        assert!(parse(twice).unwrap_err().to_string().contains("given twice"));
    }

    #[test]
    fn further_persistent_reservations_each_get_a_variable() {
        let d = parse(
            "#!/bin/sh\n#BB_LUA capacity=1G pool=p\n#BB_LUA use_persistent name=inputs\n\
             #BB_LUA use_persistent name=campaign-2.in\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.use_persistent, ["inputs", "campaign-2.in"]);
        assert_eq!(persistent_variable("inputs"), "SPILLWAY_BB_INPUTS");
        assert_eq!(persistent_variable("campaign-2.in"), "SPILLWAY_BB_CAMPAIGN_2_IN");
        let too_many: String = (0..=USE_PERSISTENT_MAX)
            .map(|i| format!("#BB_LUA use_persistent name=r{i}\n"))
            .collect();
        let cases: &[(&str, &str)] = &[
            (
                "#BB_LUA use_persistent name=a\n#BB_LUA use_persistent name=A",
                "are both $SPILLWAY_BB_A",
            ),
            (
                "#BB_LUA use_persistent name=a-b\n#BB_LUA use_persistent name=a.b",
                "are both $SPILLWAY_BB_A_B",
            ),
            ("#BB_LUA use_persistent name=Reservation", "every job has"),
            ("#BB_LUA persistent=main\n#BB_LUA use_persistent name=main", "already the job's own"),
            ("#BB_LUA use_persistent name=job-4", "reserved for job reservations"),
            ("#BB_LUA use_persistent name=a capacity=1G", "expected name=NAME only"),
            (&too_many, "at most 8"),
        ];
        for (lines, problem) in cases {
            let script = format!("#!/bin/sh\n#BB_LUA capacity=1G pool=p\n{lines}\n");
            let error = parse(&script).expect_err(lines).to_string();
            assert!(error.contains(problem), "{lines}: {error}");
            assert!(error.contains("use_persistent"), "{lines}: {error}");
        }
    }

    #[test]
    fn bad_long_stage_lines_name_the_problem() {
        let cases: &[(&str, &str)] = &[
            ("#BB_LUA stage_in source=/pfs/a", "source= and destination= are both required"),
            (
                "#BB_LUA stage_in source=/pfs/a destination=x type=tree",
                "type is file, directory or list",
            ),
            (
                "#BB_LUA stage_in source=/pfs/a destination=x when=success",
                "when= applies to stage_out",
            ),
            (
                "#BB_LUA stage_out source=x destination=/pfs/a type=file",
                "type= applies to stage_in",
            ),
            (
                "#BB_LUA stage_out source=x destination=/pfs/a when=never",
                "when is always or success",
            ),
            (
                "#BB_LUA stage_out source=/abs destination=/pfs/a",
                "relative to the reservation root",
            ),
            ("#BB_LUA stage_in source=rel destination=x", "must be absolute"),
            ("#BB_LUA stage_in source=/a source=/b destination=x", "repeats source="),
            ("#BB_LUA stage_in source=/a destination=x colour=red", "unknown key in `colour=red`"),
            ("#BB_LUA stage_in source=/a destination=x extra", "`extra` is not key=value"),
            ("#BB_LUA capacity=1G stage_in=\"/a:b", "unterminated quote"),
        ];
        for (line, problem) in cases {
            let error =
                parse(&format!("#!/bin/sh\n#BB_LUA capacity=1G\n{line}\n")).expect_err(line);
            let message = error.to_string();
            assert!(message.starts_with("line 3"), "{line}: {message}");
            assert!(message.contains(problem), "{line}: {message}");
        }
    }

    #[test]
    fn performance_targets_alone_or_with_capacity() {
        let d = parse("#!/bin/sh\n#BB_LUA bandwidth=2GiB/s\n").unwrap().unwrap();
        assert_eq!(d.rates.bandwidth_bytes_per_s, Some(2 << 30));
        assert_eq!((d.capacity_bytes, d.pool, d.access), (None, None, None));
        let d = parse("#BB_LUA capacity=1G pool=p iops=20k metadata=5k/s\n").unwrap().unwrap();
        assert_eq!((d.rates.iops, d.rates.metadata_ops_per_s), (Some(20_000), Some(5_000)));
        assert_eq!(d.capacity_bytes, Some(1 << 30));
        let d = parse("#BB_LUA create_persistent name=campaign metadata=50k/s\n").unwrap().unwrap();
        assert_eq!((d.rates.metadata_ops_per_s, d.create_persistent), (Some(50_000), true));
        let cases = [
            ("#BB_LUA bandwidth=2GiB", "end it with /s"),
            ("#BB_LUA iops=20q", "unknown unit"),
            ("#BB_LUA metadata=0", "metadata"),
            ("#BB_LUA bandwidth=1G/s bandwidth=2G/s", "repeats bandwidth="),
            ("#BB_LUA create_persistent name=x pool=p", "capacity= or a target"),
        ];
        for (line, problem) in cases {
            let error = parse(&format!("#!/bin/sh\n{line}\n")).expect_err(line).to_string();
            assert!(error.starts_with("line 2"), "{line}: {error}");
            assert!(error.contains(problem), "{line}: {error}");
        }
        let error = parse("#BB_LUA pool=p\n").unwrap_err().to_string();
        assert!(error.contains("bandwidth=RATE/s"), "{error}");
    }

    #[test]
    fn defaults_and_no_directive() {
        assert_eq!(parse("#!/bin/sh\necho hi\n"), Ok(None));
        // A directive after the first command is not part of the header (as in Slurm).
        assert_eq!(parse("#!/bin/sh\necho hi\n#BB_LUA capacity=1G\n"), Ok(None));
        let d = parse("#!/bin/sh\n#BB_LUA capacity=5M\n").unwrap().unwrap();
        assert_eq!(d.access, None, "striped, unless targets make the plan choose");
        assert_eq!(d.pool, None);
        assert!(d.stage_in.is_empty() && d.stage_out.is_empty());
    }

    #[test]
    fn continuation_lines_join() {
        let d = parse("#!/bin/sh\n#BB_LUA capacity=5M \\\n#BB_LUA pool=p1\n").unwrap().unwrap();
        assert_eq!(d.capacity_bytes, Some(5 << 20));
        assert_eq!(d.pool.as_deref(), Some("p1"));
        assert_eq!(
            parse("#!/bin/sh\n#BB_LUA capacity=5M \\\n#SBATCH -N1\n"),
            Err(DirectiveError::DanglingContinuation { line: 2 })
        );
        assert_eq!(
            parse("#BB_LUA capacity=5M \\\n"),
            Err(DirectiveError::DanglingContinuation { line: 1 })
        );
    }

    #[test]
    fn tiering_names_a_strategy_once() {
        assert_eq!(parse("#BB_LUA capacity=1G\n").unwrap().unwrap().tiering, None);
        let d = parse("#BB_LUA capacity=1G tiering=interference-aware\n").unwrap().unwrap();
        assert_eq!(d.tiering, Some(spillway_policy::Strategy::InterferenceAware));
        assert_eq!(
            parse("#BB_LUA capacity=1G tiering=fastest\n"),
            Err(DirectiveError::BadTiering { line: 1, token: "tiering=fastest".into() })
        );
        assert!(matches!(
            parse("#BB_LUA capacity=1G tiering=baseline tiering=measured\n"),
            Err(DirectiveError::Duplicate { key: "tiering", .. })
        ));
    }

    #[test]
    fn replicas_default_to_one() {
        assert_eq!(parse("#BB_LUA capacity=1G\n").unwrap().unwrap().replicas, 1);
        assert_eq!(parse("#BB_LUA capacity=1G replicas=2\n").unwrap().unwrap().replicas, 2);
    }

    #[test]
    fn persistent_without_capacity_is_allowed() {
        let d = parse("#BB_LUA persistent=shared-1\n").unwrap().unwrap();
        assert_eq!(d.persistent.as_deref(), Some("shared-1"));
        assert_eq!(d.capacity_bytes, None);
    }

    #[test]
    fn errors_name_the_bad_token() {
        let cases: &[(&str, &str)] = &[
            ("#BB_LUA capacity=10X", "capacity=10X"),
            ("#BB_LUA capacity=0", "capacity=0"),
            ("#BB_LUA capacity=1G colour=blue", "colour=blue"),
            ("#BB_LUA capacity=1G bogus", "bogus"),
            ("#BB_LUA capacity=1G access=shared", "access=shared"),
            ("#BB_LUA capacity=1G replicas=0", "replicas=0"),
            ("#BB_LUA capacity=1G replicas=5", "replicas=5"),
            ("#BB_LUA capacity=1G replicas=two", "replicas=two"),
            ("#BB_LUA capacity=1G replicas=2 replicas=2", "replicas=2"),
            ("#BB_LUA capacity=1G pool=a/b", "pool=a/b"),
            ("#BB_LUA capacity=1G capacity=2G", "capacity=2G"),
            ("#BB_LUA persistent=job-7", "persistent=job-7"),
            ("#BB_LUA capacity=1G stage_in=relative:dst", "stage_in=relative:dst"),
            ("#BB_LUA capacity=1G stage_in=/pfs/a:/abs", "stage_in=/pfs/a:/abs"),
            ("#BB_LUA capacity=1G stage_in=/pfs/a", "stage_in=/pfs/a"),
            ("#BB_LUA capacity=1G stage_out=ckpt:rel", "stage_out=ckpt:rel"),
            ("#BB_LUA capacity=1G stage_out=../x:/pfs/x", "stage_out=../x:/pfs/x"),
            ("#BB_LUAX capacity=1G", "#BB_LUAX"),
        ];
        for (script, token) in cases {
            let error = parse(&format!("#!/bin/sh\n{script}\n")).expect_err(script);
            let message = error.to_string();
            assert!(message.contains(token), "{script}: {message}");
            assert!(message.starts_with("line 2"), "{script}: {message}");
        }
        // A private reservation is staged per node (stage-in into each, stage-out into one
        // directory per node).
        let private = "#!/bin/sh\n#BB_LUA capacity=1G\n#BB_LUA access=private stage_out=a:/pfs/a\n";
        let d = parse(private).unwrap().unwrap();
        assert_eq!((d.access, d.stage_out.len()), (Some(Access::Private), 1));
        let d = parse("#BB_LUA capacity=1G access=private\n").unwrap().unwrap();
        assert_eq!(d.access, Some(Access::Private));
        let error = parse("#BB_LUA pool=fast\n").unwrap_err();
        assert!(matches!(error, DirectiveError::NoCapacity { .. }), "{error}");
        assert!(error.to_string().contains("capacity=SIZE"));
    }

    #[test]
    fn what_slurm_would_ignore_is_refused_at_submission_by_line() {
        let check = |script: &str| check_submission(script, DIRECTIVE_DEFAULT, None, None);
        let error =
            check("#!/bin/sh\n#SBATCH -N 1\n#DW jobdw capacity=1GB\nsrun app\n").unwrap_err();
        assert!(matches!(error, DirectiveError::ForeignDirective { line: 3, .. }), "{error}");
        assert!(error.to_string().contains("#BB_LUA capacity=SIZE"), "{error}");
        let error = check("#!/bin/sh\n#BB create_persistent name=x\n").unwrap_err();
        assert!(matches!(error, DirectiveError::ForeignDirective { line: 2, .. }), "{error}");
        let late = "#!/bin/sh\n#SBATCH -N 1\n\necho start\n#BB_LUA capacity=1G pool=p\n";
        let error = check(late).unwrap_err();
        assert_eq!(
            error,
            DirectiveError::LateDirective { line: 5, first_command: 4, directive: "BB_LUA".into() }
        );
        assert!(error.to_string().contains("move it above line 4"), "{error}");
        // A here-document writing the next job's script holds data, not directives.
        let chain = "#!/bin/sh\n#BB_LUA capacity=1G pool=p\ncat > next.sh <<'EOF'\n#!/bin/sh\n\
                     #BB_LUA capacity=2G pool=p\n#DW jobdw\nEOF\nsbatch next.sh <<< x\n";
        check(chain).unwrap();
        let after = format!("{chain}#BB_LUA capacity=3G\n");
        assert!(matches!(
            check(&after).unwrap_err(),
            DirectiveError::LateDirective { line: 9, .. }
        ));
        assert_eq!(heredoc_delimiter("cat <<-\"END\" > x"), Some("END"));
        assert_eq!(heredoc_delimiter("read a <<< \"$b\""), None);
        // Not directives: a comment mentioning one, #BB_LUAX (parse_script names that), DWARF.
        check("#!/bin/sh\n# see #DW docs\necho '#DWARF'\n").unwrap();
        check("#!/bin/sh\n#BB_LUA capacity=1G pool=p\nsrun app # #BB_LUA in a comment\n").unwrap();
        // --bb without any directive line in the script: refused; beside one: the script's.
        let bb = |script: &str, option: &str| {
            check_submission(script, DIRECTIVE_DEFAULT, Some(option), None)
        };
        let error = bb("#!/bin/sh\nsrun app\n", "capacity=1G pool=p").unwrap_err();
        assert!(error.to_string().contains("#BB_LUA capacity=1G pool=p"), "{error}");
        bb("#!/bin/sh\nsrun app\n", "  ").unwrap();
        bb("#!/bin/sh\n#BB_LUA capacity=1G pool=p\n", "capacity=1G pool=p").unwrap();
    }

    #[test]
    fn pools_and_sizes_are_checked_against_the_cluster_at_submission() {
        let pools = [
            PoolSize { name: "fast".into(), capacity_bytes: 10 << 30 },
            PoolSize { name: "big".into(), capacity_bytes: 100 << 30 },
        ];
        let check =
            |script: &str| check_submission(script, DIRECTIVE_DEFAULT, None, Some(&pools[..]));
        check("#!/bin/sh\n#BB_LUA capacity=10G pool=fast\n").unwrap();
        check("#!/bin/sh\n#BB_LUA persistent=shared\n").unwrap();
        let error = check("#!/bin/sh\n#SBATCH -N1\n#BB_LUA capacity=1G \\\n#BB_LUA pool=fats\n")
            .unwrap_err();
        assert!(matches!(error, DirectiveError::UnknownPool { line: 3, .. }), "{error}");
        assert!(error.to_string().contains("pools: fast, big"), "{error}");
        let error = check("#!/bin/sh\n#BB_LUA access=private\n#BB_LUA capacity=1G\n").unwrap_err();
        assert!(matches!(error, DirectiveError::PoolRequired { line: 3, .. }), "{error}");
        let error = check("#!/bin/sh\n#BB_LUA capacity=20G pool=fast\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 2: capacity 20.0 GiB is more than pool fast holds in all (10.0 GiB): ask for at most that, or pool big"
        );
        let error = check("#!/bin/sh\n#BB_LUA capacity=1T pool=big\n").unwrap_err();
        assert!(error.to_string().ends_with("ask for at most that"), "{error}");
        // Bad tokens are still named first.
        let error = check("#!/bin/sh\n#BB_LUA capacity=1G pool=fast colour=blue\n").unwrap_err();
        assert!(matches!(error, DirectiveError::UnknownKey { .. }), "{error}");
    }

    #[test]
    fn other_directive_names() {
        let d = parse_script("#DW capacity=1G\n", "DW").unwrap().unwrap();
        assert_eq!(d.capacity_bytes, Some(1 << 30));
        assert_eq!(parse_script("#DW capacity=1G\n", DIRECTIVE_DEFAULT), Ok(None));
    }
}

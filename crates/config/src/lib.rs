//! Every knob, declared once.
//!
//! A knob is declared with [`knobs!`]: name, type, unit, default and one line of documentation.
//! The same declaration gives the TOML key (`[section] name = …`), the environment override
//! (`SPILLWAY_<SECTION>_<NAME>`) and the row of `docs/reference/config.md`
//! (`spillway config-doc` prints it). Precedence: command-line flag > environment > file > default.

use std::collections::BTreeMap;
use std::path::Path;

pub mod drain;
pub mod manager;
pub mod server;
pub mod store;

pub use drain::DrainKnobs;
pub use manager::{JobOwnerCheck, ManagerKnobs, StreamKeyKind};
pub use server::ServerKnobs;
pub use store::StoreKnobs;

/// How a daemon authenticates peers that reach it over TCP (`server.auth`, `manager.auth`).
/// Peers on a Unix socket are always identified by `SO_PEERCRED`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Authentication {
    /// Only what the kernel knows: the owner of a loopback peer's socket; remote peers are
    /// `nobody`, and listening on a non-loopback address needs an explicit switch.
    #[default]
    None,
    /// MUNGE credentials checked by the local `munged`: the peer's uid and gid are the
    /// credential's, on any address.
    Munge,
}

/// A `munge_socket` knob as a path: `None` for "" (libmunge's default socket).
pub(crate) fn munge_socket_path(knob: &str) -> Option<std::path::PathBuf> {
    (!knob.is_empty()).then(|| std::path::PathBuf::from(knob))
}

/// One row of the knob reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobInfo {
    pub section: &'static str,
    pub name: &'static str,
    pub unit: &'static str,
    pub default: String,
    pub doc: &'static str,
}

/// Declares a section of knobs: a struct whose fields all have a unit, a default and a doc line.
#[macro_export]
macro_rules! knobs {
    (
        $(#[doc = $struct_doc:literal])*
        section $section:literal;
        pub struct $name:ident {
            $(
                #[doc = $doc:literal]
                $field:ident : $ty:ty = $default:expr, unit = $unit:literal;
            )*
        }
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $( #[doc = $doc] pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl $name {
            /// The section name in the TOML file and in environment variables.
            pub const SECTION: &'static str = $section;

            /// Every knob of this section, for the generated reference.
            pub fn describe() -> Vec<$crate::KnobInfo> {
                let defaults = Self::default();
                vec![ $( $crate::KnobInfo {
                    section: $section,
                    name: stringify!($field),
                    unit: $unit,
                    default: format!("{:?}", defaults.$field),
                    doc: $doc,
                }, )* ]
            }
        }
    };
}

/// Why a configuration could not be loaded. Names the file, key or variable at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("environment variable {variable}={value:?} is not a valid value: {message}")]
    Environment { variable: String, value: String, message: String },
    #[error("knob {section}.{name} = {value}: {reason}")]
    Invalid { section: &'static str, name: &'static str, value: String, reason: String },
}

impl ConfigError {
    /// Knob `section.name` refuses `value`, for `reason`.
    pub fn invalid(
        section: &'static str,
        name: &'static str,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid { section, name, value: value.to_string(), reason: reason.into() }
    }
}

/// Checks a TCP listen address knob: `IP:PORT`, and a loopback address unless `remote_allowed`
/// (`remote_refusal` says why not, and how to allow it if one can).
pub(crate) fn check_listen_address(
    section: &'static str,
    name: &'static str,
    value: &str,
    remote_allowed: bool,
    remote_refusal: &str,
) -> Result<(), ConfigError> {
    let address: std::net::SocketAddr = value
        .parse()
        .map_err(|e| ConfigError::invalid(section, name, value, format!("not IP:PORT ({e})")))?;
    if !address.ip().is_loopback() && !remote_allowed {
        return Err(ConfigError::invalid(
            section,
            name,
            value,
            format!("not a loopback address; {remote_refusal}"),
        ));
    }
    Ok(())
}

/// `metrics_listen_address`: empty, or an `IP:PORT` (any interface: the scraper is elsewhere).
pub(crate) fn check_metrics_address(section: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Ok(());
    }
    check_listen_address(section, "metrics_listen_address", value, true, "")
}

/// The whole daemon configuration, one member per section.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub store: StoreKnobs,
    pub server: ServerKnobs,
    pub drain: DrainKnobs,
    pub manager: ManagerKnobs,
}

impl Config {
    /// Loads `path` (if given), applies `SPILLWAY_<SECTION>_<NAME>` environment overrides from
    /// `environment`, and validates. Flags are applied by the caller afterwards, then
    /// [`Config::validate`] again.
    pub fn load(
        path: Option<&Path>,
        environment: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                text.parse::<toml::Table>().map_err(|error| ConfigError::Parse {
                    path: path.display().to_string(),
                    message: error.to_string(),
                })?
            }
            None => toml::Table::new(),
        };
        apply_environment(&mut table, environment)?;
        let config: Config =
            toml::Value::Table(table).try_into().map_err(|error: toml::de::Error| {
                ConfigError::Parse {
                    path: path
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "(environment)".into()),
                    message: error.to_string(),
                }
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks cross-knob constraints of every section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.store.validate()?;
        self.server.validate()?;
        self.drain.validate()?;
        self.manager.validate()?;
        Ok(())
    }

    /// Every knob of every section.
    pub fn describe() -> Vec<KnobInfo> {
        let mut all = StoreKnobs::describe();
        all.extend(ServerKnobs::describe());
        all.extend(DrainKnobs::describe());
        all.extend(ManagerKnobs::describe());
        all
    }

    /// The knob reference of the daemon sections as a Markdown table.
    pub fn reference_markdown() -> String {
        render_reference(&Self::describe())
    }
}

/// Renders knobs (of any sections, e.g. the daemon's plus the simulators') as the Markdown
/// reference that `docs/reference/config.md` holds.
pub fn render_reference(knobs: &[KnobInfo]) -> String {
    let mut out = String::from(
        "# Configuration reference\n\nGenerated by `spillway config-doc`; do not edit by hand.\n\
             Set a knob in the TOML file as `[section] name = value`, or with the environment\n\
             variable `SPILLWAY_<SECTION>_<NAME>`; command-line flags win over both.\n\n\
             | knob | unit | default | meaning |\n|---|---|---|---|\n",
    );
    for knob in knobs {
        out.push_str(&format!(
            "| `{}.{}` | {} | `{}` | {} |\n",
            knob.section,
            knob.name,
            knob.unit,
            knob.default,
            knob.doc.trim()
        ));
    }
    out
}

fn apply_environment(
    table: &mut toml::Table,
    environment: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let knobs: BTreeMap<String, KnobInfo> = Config::describe()
        .into_iter()
        .map(|k| (format!("SPILLWAY_{}_{}", k.section, k.name).to_uppercase(), k))
        .collect();
    for (variable, value) in environment {
        let Some(knob) = knobs.get(&variable) else {
            continue;
        };
        // Parse the value as a TOML value so numbers, booleans and strings all work; a bare word
        // that is not valid TOML is taken as a string.
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let section =
            table.entry(knob.section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section {
            toml::Value::Table(section) => {
                section.insert(knob.name.to_string(), parsed);
            }
            _ => {
                return Err(ConfigError::Environment {
                    variable,
                    value,
                    message: format!("[{}] in the file is not a table", knob.section),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn unknown_key_is_named() {
        let dir = std::env::temp_dir().join(format!("spillway-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[store]\nno_such_knob = 3\n").unwrap();
        let error = Config::load(Some(&file), Vec::new()).unwrap_err().to_string();
        assert!(error.contains("no_such_knob"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reference_lists_every_knob() {
        let markdown = Config::reference_markdown();
        for knob in Config::describe() {
            assert!(markdown.contains(&format!("`{}.{}`", knob.section, knob.name)));
            assert!(!knob.unit.is_empty() && !knob.doc.trim().is_empty());
        }
    }
}

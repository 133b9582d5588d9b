//! What `cloudcore.yaml` and `edgecore.yaml` share: reading a file (YAML,
//! shaped like KubeEdge's: which modules run, where they listen, where data
//! lives), the command-line flags over it, and logging. Every field has a
//! default, so an empty file is a valid configuration; unknown keys are
//! refused, and an error names the key and what was expected. Each
//! binary's own schema lives in its crate (`cloudcore::config`,
//! `edgecore::config`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid configuration: which key, what was expected.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// The key and the problem, as `modules.edgeHub.transport: ...`.
        reason: String,
    },
    /// The `log` filter does not parse.
    #[error("{0}")]
    Log(String),
}

/// The keys both binaries take from their command line as well as from
/// their file.
pub trait CoreConfig: for<'de> Deserialize<'de> + Default + Check {
    /// `dataDir`.
    fn data_dir_mut(&mut self) -> &mut PathBuf;
    /// `log`.
    fn log_mut(&mut self) -> &mut String;
}

/// A binary's settings: its file (see [`read`]), with `--data-dir` and
/// `--log` over it, and its logging set up from the result.
pub fn settle<T: CoreConfig>(
    explicit: Option<&Path>,
    default: &Path,
    data_dir: Option<PathBuf>,
    log: Option<String>,
) -> Result<T, ConfigError> {
    let mut settings: T = read(explicit, default)?;
    if let Some(dir) = data_dir {
        *settings.data_dir_mut() = dir;
    }
    if let Some(log) = log {
        *settings.log_mut() = log;
    }
    init_logging(settings.log_mut()).map_err(ConfigError::Log)?;
    Ok(settings)
}

/// Reads a configuration file; a missing `path` at the default location
/// means the defaults.
pub fn load<T: for<'de> Deserialize<'de> + Default + Check>(
    path: &Path,
    required: bool,
) -> Result<T, ConfigError> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(T::default());
        }
        Err(source) => {
            return Err(ConfigError::Read {
                path: shown,
                source,
            });
        }
    };
    parse(&text).map_err(|reason| ConfigError::Invalid {
        path: shown,
        reason,
    })
}

/// Reads the file a binary was given (`explicit`, which must exist), or
/// else `default` if it exists, or else the defaults.
pub fn read<T: for<'de> Deserialize<'de> + Default + Check>(
    explicit: Option<&Path>,
    default: &Path,
) -> Result<T, ConfigError> {
    match explicit {
        Some(path) => load(path, true),
        None => load(default, false),
    }
}

/// Sets up a binary's logging: RUST_LOG when it is set, `log` (a
/// RUST_LOG-style filter, the `log` key) otherwise; a filter that does not
/// parse is an error naming the key.
pub fn init_logging(log: &str) -> Result<(), String> {
    let filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => tracing_subscriber::EnvFilter::try_new(log)
            .map_err(|err| format!("log: {log:?} is not a log filter: {err}"))?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    Ok(())
}

/// Parses and checks a configuration; the error names the key.
pub fn parse<T: for<'de> Deserialize<'de> + Default + Check>(text: &str) -> Result<T, String> {
    if text.trim().is_empty() {
        return Ok(T::default());
    }
    let config: T = serde_yaml_ng::from_str(text).map_err(|err| err.to_string())?;
    config.check()?;
    Ok(config)
}

/// The configuration as YAML, as `--defaultconfig` prints it.
pub fn to_yaml<T: Serialize>(config: &T) -> String {
    serde_yaml_ng::to_string(config).unwrap_or_default()
}

/// Checks beyond the types: values that read but cannot work.
pub trait Check {
    /// `Err("key: what is wrong")` for the first bad value.
    fn check(&self) -> Result<(), String>;
}

/// An optional listener: whether it runs, and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    /// Whether it runs.
    #[serde(default = "yes")]
    pub enable: bool,
    /// host:port (a socket path for a Unix socket); checked only when it
    /// runs.
    #[serde(default)]
    pub address: String,
}

impl Listener {
    /// A listener that runs, on `address`.
    pub fn on(address: &str) -> Listener {
        Listener {
            enable: true,
            address: address.to_owned(),
        }
    }

    /// A listener that is off (`address` is where it would run).
    pub fn off(address: &str) -> Listener {
        Listener {
            enable: false,
            address: address.to_owned(),
        }
    }

    /// Applies a command-line flag: an address enables it there, "off"
    /// disables it, none leaves it as the file says.
    pub fn apply_flag(&mut self, flag: Option<String>) {
        apply_listener_flag(&mut self.enable, &mut self.address, flag);
    }

    /// Its address, when it runs.
    pub fn enabled(&self) -> Option<&str> {
        self.enable.then_some(self.address.as_str())
    }
}

/// [`Listener::apply_flag`] on a section's own `enable` and `address`.
pub fn apply_listener_flag(enable: &mut bool, address: &mut String, flag: Option<String>) {
    match flag.as_deref() {
        None => {}
        Some("off") => *enable = false,
        Some(given) => {
            *enable = true;
            *address = given.to_owned();
        }
    }
}

/// `true`: the default of an `enable` key.
fn yes() -> bool {
    true
}

/// `path`, or `dir/name` when `path` is empty.
pub fn or_under(path: &Path, dir: &Path, name: &str) -> PathBuf {
    if path.as_os_str().is_empty() {
        dir.join(name)
    } else {
        path.to_path_buf()
    }
}

/// `Err("key: expected host:port, ..")` unless `address` is host:port.
pub fn check_host_port(key: &str, address: &str) -> Result<(), String> {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("{key}: expected host:port, got {address:?}")),
    }
}

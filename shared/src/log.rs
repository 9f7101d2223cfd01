//! The `-v` flag every nodelet command takes, and the tracing filter it selects: the daemon
//! (`nodelet run`, `nodelet hollow`) and the client commands log the same way.

use clap::Args;

/// Log verbosity, shared by every command.
#[derive(Debug, Clone, Default, Args)]
pub struct LogArgs {
    /// Log verbosity like the kubelet's -v: 0-1 info, 2-3 more detail, 4-5 debug, 6+ trace. RUST_LOG, when
    /// set, takes precedence.
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u8>,
}

/// Why the log subscriber could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// `RUST_LOG` is not a valid filter.
    #[error("invalid RUST_LOG {value:?}: {message}")]
    InvalidFilter {
        /// The variable's value.
        value: String,
        /// Why tracing refused it.
        message: String,
    },
    /// A global subscriber is already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// The tracing filter directive for a kubelet-style verbosity level (used when `RUST_LOG` is unset). The
/// target `nodelet` matches every nodelet crate (`nodelet`, `nodelet_cli`, `nodelet_node`, …): a directive's
/// target is a prefix.
pub fn filter_directive(verbosity: Option<u8>) -> &'static str {
    match verbosity.unwrap_or(0) {
        0 | 1 => "info",
        2 | 3 => "info,nodelet=debug",
        4 | 5 => "debug",
        _ => "trace",
    }
}

/// The filter of a process: `RUST_LOG` when set, else the `-v` level, else `default_directive`.
pub fn env_filter(
    verbosity: Option<u8>,
    default_directive: &str,
) -> Result<tracing_subscriber::EnvFilter, LogError> {
    use tracing_subscriber::EnvFilter;
    Ok(match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v)
            .map_err(|e| LogError::InvalidFilter { value: v.clone(), message: e.to_string() })?,
        _ => match verbosity {
            Some(_) => EnvFilter::new(filter_directive(verbosity)),
            None => EnvFilter::new(default_directive),
        },
    })
}

/// Installs the global tracing subscriber (text on stderr, colours on a terminal): `RUST_LOG` when set,
/// else the `-v` level, else `default_directive` (e.g. `warn` for the client commands, whose stdout is
/// the product).
pub fn init_text(verbosity: Option<u8>, default_directive: &str) -> Result<(), LogError> {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(env_filter(verbosity, default_directive)?)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|e| LogError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_tracing_levels() {
        assert_eq!(filter_directive(None), "info");
        assert_eq!(filter_directive(Some(2)), "info,nodelet=debug");
        assert_eq!(filter_directive(Some(4)), "debug");
        assert_eq!(filter_directive(Some(9)), "trace");
    }
}

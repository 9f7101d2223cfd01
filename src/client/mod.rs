//! nodelet's client commands: `nodelet get pods` (asks the local nodelet's API) and `nodelet logs` (reads
//! the CRI log files directly).

mod get;
mod logs;
mod nodes;
mod pods;
mod storage;

pub(crate) use get::{GetError, now};
pub(crate) use logs::LogsError;

use crate::cli::{GetArgs, LogsArgs};

/// `nodelet get pods ...`: prints the table (or JSON/YAML/names) on stdout, "No resources found" on stderr.
pub(crate) async fn run_get(args: &GetArgs) -> Result<(), GetError> {
    get::run(args).await
}

/// `nodelet logs POD ...`: prints the container's log on stdout.
pub(crate) async fn run_logs(args: &LogsArgs) -> Result<(), LogsError> {
    logs::run(args).await
}

//! nodelet's client commands: `nodelet get pods` (asks the local nodelet's API), `nodelet logs` (reads
//! the CRI log files directly), `nodelet exec` and `nodelet port-forward` (WebSockets to the local nodelet's
//! main port).

mod exec;
mod get;
mod logs;
mod nodes;
mod pods;
mod port_forward;
mod storage;
mod stream;

pub(crate) use get::{GetError, now};
pub(crate) use logs::LogsError;

pub(crate) use stream::StreamError;

use crate::cli::{ExecArgs, GetArgs, LogsArgs, PortForwardArgs};

/// `nodelet get pods ...`: prints the table (or JSON/YAML/names) on stdout, "No resources found" on stderr.
pub(crate) async fn run_get(args: &GetArgs) -> Result<(), GetError> {
    get::run(args).await
}

/// `nodelet logs POD ...`: prints the container's log on stdout.
pub(crate) async fn run_logs(args: &LogsArgs) -> Result<(), LogsError> {
    logs::run(args).await
}

/// `nodelet exec POD -- CMD…`: returns the command's exit code.
pub(crate) async fn run_exec(args: &ExecArgs) -> Result<i32, StreamError> {
    exec::run(args).await
}

/// `nodelet port-forward POD [LOCAL:]REMOTE…`: runs until interrupted.
pub(crate) async fn run_port_forward(args: &PortForwardArgs) -> Result<(), StreamError> {
    port_forward::run(args).await
}

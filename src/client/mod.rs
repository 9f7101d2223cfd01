//! nodelet's client commands: `nodelet get pods` (asks the local nodelet's API), `nodelet logs` (reads
//! the CRI log files directly), `nodelet exec`, `nodelet attach`, `nodelet debug`, `nodelet cp` and `nodelet port-forward`
//! (WebSockets to the local nodelet's main port).

mod cp;
mod debug;
mod exec;
mod get;
mod logs;
mod nodes;
mod pods;
mod port_forward;
mod session;
mod storage;
mod stream;

pub(crate) use cp::CpError;
pub(crate) use get::{GetError, now};
pub(crate) use logs::LogsError;

pub(crate) use stream::StreamError;

use crate::cli::{AttachArgs, CpArgs, DebugArgs, ExecArgs, GetArgs, LogsArgs, PortForwardArgs};

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

/// `nodelet attach POD`: returns the exit code the session ended with.
pub(crate) async fn run_attach(args: &AttachArgs) -> Result<i32, StreamError> {
    exec::attach(args).await
}

/// `nodelet debug POD --image=IMAGE [-it] [-- CMD…]`: adds an ephemeral container; with -i returns the exit
/// code the attach session ended with.
pub(crate) async fn run_debug(args: &DebugArgs) -> Result<i32, StreamError> {
    debug::run(args).await
}

/// `nodelet cp SRC DEST`: copies files to or from a container.
pub(crate) async fn run_cp(args: &CpArgs) -> Result<(), CpError> {
    cp::run(args).await
}

//! nodelet's client commands: `nodelet get` and `nodelet describe pod` (ask the local nodelet's API;
//! selectors in [`selector`], `-o jsonpath` in [`jsonpath`], the other formats in [`output`]), `nodelet logs` (reads
//! the CRI log files directly), `nodelet exec`, `nodelet attach`, `nodelet debug`, `nodelet cp` and `nodelet port-forward`
//! (WebSocket or SPDY/3.1 sessions, [`session`], to the local nodelet's main port).

mod cp;
mod debug;
mod describe;
mod events;
mod exec;
mod extensions;
mod get;
mod jsonpath;
mod logs;
mod nodes;
mod output;
mod pods;
mod port_forward;
pub(crate) mod selector;
mod session;
mod spdy;
mod storage;
mod stream;

pub(crate) use cp::CpError;
pub(crate) use get::{GetError, now};
pub(crate) use logs::LogsError;
pub(crate) use output::custom_columns_from_file;

pub(crate) use stream::StreamError;

use crate::cli::{AttachArgs, CpArgs, DebugArgs, DescribeArgs, ExecArgs, GetArgs, LogsArgs, PortForwardArgs};

/// `nodelet describe pod [NAME…]`: prints the pods like `kubectl describe pod`.
pub(crate) async fn run_describe(args: &DescribeArgs) -> Result<(), GetError> {
    describe::run(args, now()).await
}

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

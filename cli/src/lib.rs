//! nodelet's client commands, a kubectl for the nodelet on this machine: `nodelet get` and `nodelet describe
//! pod` (ask the local nodelet's API; selectors in [`selector`], `-o jsonpath` in `jsonpath`, the other
//! formats in `output`), `nodelet logs` (reads the CRI log files directly), `nodelet exec`, `nodelet attach`,
//! `nodelet debug`, `nodelet cp` and `nodelet port-forward` (WebSocket or SPDY/3.1 sessions, `session`, to the
//! local nodelet's main port).
//!
//! The client talks to the daemon over HTTP(S) only; what both read and write (YAML, Go durations, CRI log
//! lines, DNS names, the `-v` flag) is in `nodelet-shared`. A binary adds the commands ([`Command`], a clap
//! subcommand enum) to its command line and runs the one given with [`run`]; the `nodelet` binary does it
//! through `nodelet::Invocation::from_args_with_client`.

pub mod args;
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
pub mod selector;
mod session;
mod spdy;
mod storage;
mod stream;

pub use args::{Command, OutputFormatError};
pub use cp::CpError;
pub use get::GetError;
pub use jsonpath::JsonPathError;
pub use logs::LogsError;
pub use output::CustomColumnsFileError;
pub use spdy::SpdyError;
pub use stream::StreamError;

use args::GetArgs;
use get::now;
use k8s_openapi::api::core::v1::Pod;

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `get` or `describe`.
    #[error(transparent)]
    Get(#[from] GetError),
    /// `logs`.
    #[error(transparent)]
    Logs(#[from] LogsError),
    /// `exec`, `attach`, `debug` or `port-forward`.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// `cp`.
    #[error(transparent)]
    Cp(#[from] CpError),
}

/// Runs `command` to its end: the exit code of the process (`exec`, `attach` and `debug`: the remote
/// command's; the others 0), or why it failed.
pub async fn execute(command: Command) -> Result<i32, Error> {
    match command {
        Command::Get(args) => get::run(&args).await.map(|()| 0).map_err(Error::from),
        Command::Describe(args) => describe::run(&args, now()).await.map(|()| 0).map_err(Error::from),
        Command::Logs(args) => logs::run(&args).await.map(|()| 0).map_err(Error::from),
        Command::Exec(args) => exec::run(&args).await.map_err(Error::from),
        Command::Attach(args) => exec::attach(&args).await.map_err(Error::from),
        Command::Debug(args) => debug::run(&args).await.map_err(Error::from),
        Command::PortForward(args) => port_forward::run(&args).await.map(|()| 0).map_err(Error::from),
        Command::Cp(args) => cp::run(&args).await.map(|()| 0).map_err(Error::from),
    }
}

/// Sets up logging (stderr: `RUST_LOG`, else `-v`, else warnings only: stdout is the product), runs
/// `command` on a new tokio runtime and exits the process: 0 on success; on failure a one-line `error: …`
/// and exit code 1 (like kubectl), or the remote command's code for `exec`, `attach` and `debug`.
pub fn run(command: Command) -> ! {
    if let Err(e) = nodelet_shared::log::init_text(command.verbosity(), "warn") {
        // as an error returned from `main`
        eprintln!("Error: {e}");
        std::process::exit(1)
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => exit_error(&format!("cannot start the async runtime: {e}")),
    };
    rt.block_on(async move {
        // Exiting here, inside the runtime, also ends a blocked read of stdin.
        match execute(command).await {
            Ok(code) => std::process::exit(code),
            Err(e) => exit_error(&e.to_string()),
        }
    })
}

/// The pods `nodelet get pods` asks for with `args` (one request to the server the flags name).
pub async fn fetch_pods(args: &GetArgs) -> Result<Vec<Pod>, GetError> {
    get::fetch_pods(args).await
}

fn exit_error(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}

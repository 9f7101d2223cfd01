//! The `nodelet` binary: the daemon (`nodelet run`) with the standard pairs, the library's own commands
//! (`hollow`, `completion`, `man`), and the client commands of `nodelet-cli` (`get`, `logs`, `exec`, …).
//! Everything is in the two libraries; a binary with extensions looks the same plus `.with_extension(…)`
//! (see `docs/extensions.md`).

use nodelet::{Invocation, Node};

fn main() -> anyhow::Result<()> {
    match Invocation::<nodelet_cli::Command>::from_args_with_client()? {
        Invocation::Daemon(config) => Ok(Node::builder(config).build()?.run()?),
        Invocation::Builtin(command) => command.run(),
        Invocation::Client(command) => nodelet_cli::run(command),
    }
}

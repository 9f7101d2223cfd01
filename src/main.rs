//! The `nodelet` binary: the daemon (`nodelet run`) with the standard pairs, and the client commands.
//! Everything is in the library (`src/lib.rs`); a binary with extensions looks the same plus
//! `.with_extension(…)` (see `docs/extensions.md`).

use nodelet::{Invocation, Node};

fn main() -> anyhow::Result<()> {
    match Invocation::from_args()? {
        Invocation::Daemon(config) => Ok(Node::builder(config).build()?.run()?),
        Invocation::Client(command) => command.run(),
    }
}

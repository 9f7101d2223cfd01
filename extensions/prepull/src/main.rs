//! `nodelet-prepull`: the standard nodelet plus the pre-pull extension. Same commands and flags as
//! `nodelet`, the client commands included; the manifest directory is `$NODELET_PREPULL_DIR`, else
//! `<root-dir>/prepull.d`.

use nodelet::{Invocation, Node};
use nodelet_prepull::Prepull;

fn main() -> anyhow::Result<()> {
    match Invocation::<nodelet_cli::Command>::from_args_with_client()? {
        Invocation::Daemon(config) => {
            let dir = std::env::var_os("NODELET_PREPULL_DIR")
                .map_or_else(|| config.root_dir().join("prepull.d"), std::path::PathBuf::from);
            Ok(Node::builder(config).with_extension(Prepull::new(dir)).build()?.run()?)
        }
        Invocation::Builtin(command) => command.run(),
        Invocation::Client(command) => nodelet_cli::run(command),
    }
}

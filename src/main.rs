//! nodelet: a node agent that runs Kubernetes pods by reconciling desired against actual state.

use clap::Parser;

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(name = "nodelet", version, about = "Runs Kubernetes pods on this machine")]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    anyhow::bail!("nodelet cannot run pods yet: the pod reconcilers are being built (see the open issues)")
}

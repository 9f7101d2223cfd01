//! The command line of a nodelet binary: `nodelet run …` (or no command) starts the daemon; `hollow`,
//! `completion` and `man` are the library's own commands ([`BuiltinCommand`]); the client commands are the
//! binary's choice: the `nodelet` binary adds `nodelet-cli`'s (`get`, `logs`, `exec`, …) with
//! [`Invocation::from_args_with_client`], a binary without them calls [`Invocation::from_args`].

use std::path::PathBuf;

use super::Error;
use crate::cli::{self, Commands, NoClient};
use crate::{config, logging};

/// What the command line asks for; `C` is the binary's client commands (a clap [`Subcommand`](clap::Subcommand)
/// enum such as `nodelet_cli::Command`), [`NoClient`] for none.
#[derive(Debug)]
pub enum Invocation<C = NoClient> {
    /// `nodelet run` (or no command): the configuration of the daemon to start; logging is set up.
    Daemon(NodeConfig),
    /// `hollow`, `completion` or `man`, run by the library; logging is set up.
    Builtin(BuiltinCommand),
    /// One of the binary's client commands, parsed; the client sets up its own logging.
    Client(C),
}

/// The daemon's configuration: flags over the config file over the defaults, validated.
#[derive(Debug)]
pub struct NodeConfig {
    pub(crate) loaded: Box<config::Loaded>,
}

impl NodeConfig {
    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.loaded.config.node_name
    }

    /// nodelet's root directory (`--root-dir`).
    pub fn root_dir(&self) -> &std::path::Path {
        &self.loaded.config.root_dir
    }
}

/// A command the library runs itself, ready to run: `hollow`, `completion` or `man` (the last two print
/// what is generated from the binary's whole command line, its client commands included).
#[derive(Debug)]
pub struct BuiltinCommand(Builtin);

#[derive(Debug)]
enum Builtin {
    Hollow(Box<cli::HollowArgs>),
    Completion { shell: String, command: Box<clap::Command> },
    Man { dir: Option<PathBuf>, command: Box<clap::Command> },
}

impl Invocation {
    /// Parses the process's arguments as the command line without client commands (`run`, `hollow`,
    /// `completion`, `man`); see [`from_args_with_client`](Invocation::from_args_with_client).
    pub fn from_args() -> Result<Self, Error> {
        Self::from_args_with_client()
    }
}

impl<C: clap::Subcommand> Invocation<C> {
    /// Parses the process's arguments with the client commands `C` between `run` and `hollow` (exits with
    /// clap's usage error or help like any CLI); for the daemon loads its configuration and sets up
    /// logging, for a built-in command sets up logging.
    pub fn from_args_with_client() -> Result<Self, Error> {
        let command = cli::try_parse_with::<C, _, _>(std::env::args_os()).unwrap_or_else(|e| e.exit());
        let (builtin, verbosity) = match command {
            Commands::Run(args) => {
                // The daemon logs as its configuration says (`--logging-format`, `logging:`): read it first.
                let loaded = config::Config::load(&args).map_err(|e| Error::Config(e.into()))?;
                logging::init(loaded.config.logging.format, loaded.config.logging.verbosity)
                    .map_err(|e| Error::Config(e.into()))?;
                // as the kubelet prints them: `Flag --NAME has been deprecated, …`
                for warning in &args.deprecation_warnings {
                    tracing::warn!("{warning}");
                }
                return Ok(Invocation::Daemon(NodeConfig { loaded: Box::new(loaded) }));
            }
            Commands::Client(command) => return Ok(Invocation::Client(command)),
            Commands::Hollow(args) => {
                let verbosity = args.log.verbosity;
                (Builtin::Hollow(Box::new(args)), verbosity)
            }
            Commands::Completion(args) => {
                let command = Box::new(cli::command_with::<C>());
                (Builtin::Completion { shell: args.shell, command }, None)
            }
            Commands::Man(args) => {
                (Builtin::Man { dir: args.dir, command: Box::new(cli::command_with::<C>()) }, None)
            }
        };
        nodelet_shared::log::init_text(verbosity, "warn").map_err(|e| Error::Config(e.into()))?;
        Ok(Invocation::Builtin(BuiltinCommand(builtin)))
    }
}

impl BuiltinCommand {
    /// Runs the command and exits the process: 0 on success; on failure a one-line `error: …` and exit
    /// code 1.
    pub fn run(self) -> ! {
        let result = match self.0 {
            Builtin::Hollow(args) => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt.block_on(crate::hollow::run(&args)).map_err(|e| e.to_string()),
                Err(e) => Err(format!("cannot start the async runtime: {e}")),
            },
            Builtin::Completion { shell, mut command } => {
                cli::completion(&mut command, &shell, &mut std::io::stdout().lock())
                    .map_err(|e| e.to_string())
            }
            Builtin::Man { dir: Some(dir), command } => {
                cli::man_pages_to(*command, &dir).map_err(|e| format!("cannot write the man pages: {e}"))
            }
            Builtin::Man { dir: None, command } => {
                cli::man_page(*command, &mut std::io::stdout().lock()).map_err(|e| e.to_string())
            }
        };
        match result {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1)
            }
        }
    }
}

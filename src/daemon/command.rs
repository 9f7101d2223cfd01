//! The command line of a nodelet binary: `nodelet run …` starts the daemon, every other command is a
//! client command. A binary built with extensions has the same commands as `nodelet`.

use super::Error;
use crate::{cli, client, config, logging};

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// `nodelet run` (or no command): the configuration of the daemon to start; logging is set up.
    Daemon(NodeConfig),
    /// A client command (`get`, `logs`, `exec`, …); logging is set up.
    Client(ClientCommand),
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

/// A client command, ready to run.
#[derive(Debug)]
pub struct ClientCommand(Box<cli::Command>);

impl Invocation {
    /// Parses the process's arguments (exits with clap's usage error or help like any CLI), loads the
    /// daemon's configuration and sets up logging.
    pub fn from_args() -> Result<Self, Error> {
        let command = cli::try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
        if let cli::Command::Run(args) = &command {
            // The daemon logs as its configuration says (`--logging-format`, `logging:`): read it first.
            let loaded = config::Config::load(args).map_err(|e| Error::Config(e.into()))?;
            logging::init(loaded.config.logging.format, loaded.config.logging.verbosity)
                .map_err(|e| Error::Config(e.into()))?;
            // as the kubelet prints them: `Flag --NAME has been deprecated, …`
            for warning in &args.deprecation_warnings {
                tracing::warn!("{warning}");
            }
            return Ok(Invocation::Daemon(NodeConfig { loaded: Box::new(loaded) }));
        }
        cli::init_tracing(command.verbosity(), "warn").map_err(|e| Error::Config(e.into()))?;
        Ok(Invocation::Client(ClientCommand(Box::new(command))))
    }
}

impl ClientCommand {
    /// Runs the command and exits the process: 0 on success; on failure a one-line `error: …` and exit
    /// code 1 (like kubectl), or the remote command's code for `exec`, `attach` and `debug`.
    pub fn run(self) -> ! {
        let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => exit_error(&format!("cannot start the async runtime: {e}")),
        };
        let result = rt.block_on(async move {
            match *self.0 {
                cli::Command::Get(args) => client::run_get(&args).await.map_err(|e| e.to_string()),
                cli::Command::Logs(args) => client::run_logs(&args).await.map_err(|e| e.to_string()),
                cli::Command::PortForward(args) => {
                    client::run_port_forward(&args).await.map_err(|e| e.to_string())
                }
                // The command's exit code; exiting here also ends a blocked read of stdin.
                cli::Command::Exec(args) => exit_with(client::run_exec(&args).await),
                cli::Command::Attach(args) => exit_with(client::run_attach(&args).await),
                cli::Command::Debug(args) => exit_with(client::run_debug(&args).await),
                cli::Command::Cp(args) => client::run_cp(&args).await.map_err(|e| e.to_string()),
                cli::Command::Describe(args) => client::run_describe(&args).await.map_err(|e| e.to_string()),
                cli::Command::Hollow(args) => crate::hollow::run(&args).await.map_err(|e| e.to_string()),
                cli::Command::Completion(args) => cli::completion(&args.shell, &mut std::io::stdout().lock()),
                cli::Command::Man(args) => match &args.dir {
                    Some(dir) => {
                        cli::man_pages_to(dir).map_err(|e| format!("cannot write the man pages: {e}"))
                    }
                    None => cli::man_page(&mut std::io::stdout().lock()).map_err(|e| e.to_string()),
                },
                cli::Command::Run(_) => Err("`run` is not a client command".to_owned()),
            }
        });
        match result {
            Ok(()) => std::process::exit(0),
            Err(e) => exit_error(&e),
        }
    }
}

fn exit_error(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}

/// Exits with the exit code of `nodelet exec` / `nodelet attach`, or 1 after printing the error.
fn exit_with(result: Result<i32, client::StreamError>) -> ! {
    let code = result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        1
    });
    std::process::exit(code)
}

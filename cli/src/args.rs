//! The client commands' command line (clap): `get`, `describe`, `logs`, `exec`, `attach`, `cp`, `debug`,
//! `port-forward`, as [`Command`]. A binary puts them beside its own commands with
//! `#[command(flatten)]` (the `nodelet` binary: beside `run`, `hollow`, `completion` and `man`).

// The field docs below are the command-line help texts: plain text with <placeholders>, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, Args, Subcommand};
use nodelet_shared::log::LogArgs;
use nodelet_shared::units::GoDuration;

/// nodelet's client commands: they ask the nodelet on this machine over HTTP(S), or read its log files.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Display pods like `kubectl get pods`, from the nodelet on this machine.
    Get(GetArgs),
    /// Print the logs of a container like `kubectl logs`, read from the CRI log files on this machine.
    Logs(LogsArgs),
    /// Run a command in a container like `kubectl exec`, through the local nodelet's main port.
    Exec(ExecArgs),
    /// Attach to a container's main process like `kubectl attach`, through the local nodelet's main port.
    Attach(AttachArgs),
    /// Copy files and directories to and from containers like `kubectl cp` (tar over exec).
    Cp(CpArgs),
    /// Add an ephemeral (debug) container to a static pod like `kubectl debug`, through the local
    /// nodelet's main port; with -i, attach to it.
    Debug(DebugArgs),
    /// Forward local ports to a pod like `kubectl port-forward`, through the local nodelet's main port.
    PortForward(PortForwardArgs),
    /// Show the details of pods like `kubectl describe pod`, with their events.
    Describe(DescribeArgs),
}

impl Command {
    /// The `-v` level given to this command.
    pub fn verbosity(&self) -> Option<u8> {
        match self {
            Command::Get(g) => g.log.verbosity,
            Command::Logs(l) => l.log.verbosity,
            Command::Exec(e) => e.log.verbosity,
            Command::Attach(a) => a.log.verbosity,
            Command::Cp(c) => c.log.verbosity,
            Command::Debug(d) => d.log.verbosity,
            Command::PortForward(p) => p.log.verbosity,
            Command::Describe(d) => d.log.verbosity,
        }
    }
}

/// `nodelet get pods`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Server: --server, else $NODELET_SERVER, else http://127.0.0.1:10255 (the read-only \
    port, if nodelet serves it) and then https://127.0.0.1:10250 (the main port, with a bearer token from \
    --token, --token-file or $NODELET_TOKEN). The main port's certificate is checked against \
    --certificate-authority, else /var/lib/nodelet/pki/nodelet.crt when that file exists (nodelet's \
    self-signed certificate).")]
pub struct GetArgs {
    /// Resource type: pods (also pod, po), nodes (node, no), events (event, ev), pv (persistentvolumes),
    /// pvc (persistentvolumeclaims), storageclass (sc, storageclasses), csinodes (csinode), or the name of
    /// an extension of the node (its status table, from /extensions/NAME).
    #[arg(value_name = "TYPE")]
    pub(crate) resource: String,
    /// Names of the pods to show (all when none).
    #[arg(value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// Output format: wide, json, yaml, name, jsonpath=TEMPLATE, jsonpath-file=FILE,
    /// custom-columns=HEADER:PATH[,...], custom-columns-file=FILE.
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = parse_output)]
    pub(crate) output: Option<OutputFormat>,
    /// Label selector, e.g. 'app=web,tier!=db', 'env in (a,b)', '!canary' (Kubernetes syntax).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub(crate) selector: Option<String>,
    /// Field selector, e.g. 'status.phase=Running' or, for events, 'involvedObject.name=web'.
    #[arg(long, value_name = "SELECTOR")]
    pub(crate) field_selector: Option<String>,
    /// After listing, watch for changes and print a line (or object) for each. nodelet polls its
    /// read-only endpoints every second and compares the objects (it has no watch stream); Ctrl-C ends it.
    #[arg(short = 'w', long)]
    pub(crate) watch: bool,
    /// Do not print the table's header line (also of custom-columns).
    #[arg(long)]
    pub(crate) no_headers: bool,
    /// Namespace of the pods.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Pods of every namespace (adds a NAMESPACE column).
    #[arg(short = 'A', long)]
    pub(crate) all_namespaces: bool,
    /// How to reach nodelet.
    #[command(flatten)]
    pub(crate) conn: ServerArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// Output formats of `get` (`-o`), as kubectl spells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputFormat {
    /// The table with more columns (pods: IP, NODE, NOMINATED NODE and READINESS GATES).
    Wide,
    /// The objects as JSON (indented by 4 spaces, as kubectl).
    Json,
    /// The objects as YAML.
    Yaml,
    /// `KIND/NAME` per line.
    Name,
    /// A kubectl JSONPath template (`jsonpath=`, or the content of `jsonpath-file=`).
    JsonPath(String),
    /// Custom columns `HEADER:PATH,…` (`custom-columns=`; `custom-columns-file=` is turned into this form).
    CustomColumns(String),
}

/// Why an `-o` value is refused (kubectl's messages).
#[derive(Debug, thiserror::Error)]
pub enum OutputFormatError {
    /// The file of `jsonpath-file=` or `custom-columns-file=` cannot be read.
    #[error("error reading template {path}, {source}")]
    ReadTemplate {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `jsonpath=` or `jsonpath-file=` without a template.
    #[error("template format specified but no template given")]
    NoTemplate,
    /// `custom-columns=` without columns.
    #[error("custom-columns format specified but no custom columns given")]
    NoColumns,
    /// A `custom-columns-file` that is not two lines of as many fields.
    #[error(transparent)]
    CustomColumnsFile(#[from] crate::output::CustomColumnsFileError),
    /// Not a format kubectl has.
    #[error(
        "unable to match a printer suitable for the output format {0:?}, allowed formats are: \
         custom-columns,custom-columns-file,json,jsonpath,jsonpath-file,name,wide,yaml"
    )]
    Unknown(String),
}

/// Parses `-o`: `wide`, `json`, `yaml`, `name`, `jsonpath=TEMPLATE`, `jsonpath-file=FILE`,
/// `custom-columns=SPEC`, `custom-columns-file=FILE` (kubectl's names).
pub fn parse_output(s: &str) -> Result<OutputFormat, OutputFormatError> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map_err(|source| OutputFormatError::ReadTemplate { path: path.to_owned(), source })
    };
    let (name, arg) = match s.split_once('=') {
        Some((n, a)) => (n, Some(a)),
        None => (s, None),
    };
    match (name, arg) {
        ("wide", None) => Ok(OutputFormat::Wide),
        ("json", None) => Ok(OutputFormat::Json),
        ("yaml", None) => Ok(OutputFormat::Yaml),
        ("name", None) => Ok(OutputFormat::Name),
        ("jsonpath", Some(t)) if !t.is_empty() => Ok(OutputFormat::JsonPath(t.to_owned())),
        ("jsonpath-file", Some(f)) if !f.is_empty() => Ok(OutputFormat::JsonPath(read(f)?)),
        ("jsonpath" | "jsonpath-file", _) => Err(OutputFormatError::NoTemplate),
        ("custom-columns", Some(spec)) if !spec.is_empty() => {
            Ok(OutputFormat::CustomColumns(spec.to_owned()))
        }
        ("custom-columns", _) => Err(OutputFormatError::NoColumns),
        ("custom-columns-file", Some(f)) if !f.is_empty() => {
            Ok(OutputFormat::CustomColumns(crate::output::custom_columns_from_file(&read(f)?)?))
        }
        _ => Err(OutputFormatError::Unknown(s.to_owned())),
    }
}

/// `nodelet describe pod [NAME...]`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Reads /pods and /api/v1/events from the local nodelet (the server flags are those \
    of `nodelet get`) and prints each pod like `kubectl describe pod`, its events last.")]
pub struct DescribeArgs {
    /// Resource type: pods (also pod, po).
    #[arg(value_name = "TYPE", value_parser = ["pods", "pod", "po"])]
    pub(crate) resource: String,
    /// Names of the pods (a name prefix also matches, as in kubectl); all pods of the namespace when none.
    #[arg(value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// Namespace of the pods.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Pods of every namespace.
    #[arg(short = 'A', long)]
    pub(crate) all_namespaces: bool,
    /// Label selector (Kubernetes syntax).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub(crate) selector: Option<String>,
    /// Leave the events out.
    #[arg(long = "show-events", value_name = "BOOL", default_value_t = true, action = ArgAction::Set)]
    pub(crate) show_events: bool,
    /// How to reach nodelet.
    #[command(flatten)]
    pub(crate) conn: ServerArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

impl DescribeArgs {
    /// The same request as `nodelet get pods` with these flags.
    pub(crate) fn get_args(&self) -> GetArgs {
        GetArgs {
            resource: "pods".into(),
            names: Vec::new(),
            output: None,
            selector: self.selector.clone(),
            field_selector: None,
            watch: false,
            no_headers: false,
            namespace: self.namespace.clone(),
            all_namespaces: self.all_namespaces,
            conn: self.conn.clone(),
            log: self.log.clone(),
        }
    }
}

/// `nodelet logs POD`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Reads <pod-logs-dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log directly \
    (run it as root on the node; no API needed). With -f it follows the current log file until the container \
    is restarted (a newer log file appears) or the pod's log directory is removed.")]
pub struct LogsArgs {
    /// Pod name (static pods are named <name>-<node>).
    #[arg(value_name = "POD")]
    pub(crate) pod: String,
    /// Container name; optional when the pod has one container.
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub(crate) container: Option<String>,
    /// Namespace of the pod.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Keep printing new lines as they are written.
    #[arg(short = 'f', long)]
    pub(crate) follow: bool,
    /// Number of most recent lines to print; -1 for all.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub(crate) tail: i64,
    /// Print the logs of the previous instance of the container (before its last restart).
    #[arg(short = 'p', long)]
    pub(crate) previous: bool,
    /// Prefix every line with its RFC 3339 timestamp.
    #[arg(long)]
    pub(crate) timestamps: bool,
    /// Only lines newer than this relative duration, like 5s, 2m or 3h (0: all).
    #[arg(long, value_name = "DURATION", conflicts_with = "since_time")]
    pub(crate) since: Option<GoDuration>,
    /// Only lines logged at or after this RFC 3339 time (e.g. 2024-05-01T12:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub(crate) since_time: Option<String>,
    /// Maximum bytes of output; 0 for no limit.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) limit_bytes: u64,
    /// Directory of the CRI log files (the daemon's --pod-logs-dir).
    #[arg(long, value_name = "DIR", env = "NODELET_POD_LOGS_DIR", default_value = "/var/log/pods")]
    pub(crate) pod_logs_dir: PathBuf,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// How `nodelet get` and `nodelet describe` reach nodelet (the read-only port or the main port).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// nodelet's URL, e.g. http://127.0.0.1:10255 or https://127.0.0.1:10250.
    #[arg(long, value_name = "URL", env = "NODELET_SERVER")]
    pub(crate) server: Option<String>,
    /// Bearer token for the main port (prefer --token-file: a command line is visible to every user).
    #[arg(long, value_name = "TOKEN", env = "NODELET_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// File holding the bearer token for the main port.
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub(crate) token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify the server's certificate with.
    #[arg(long, value_name = "FILE")]
    pub(crate) certificate_authority: Option<PathBuf>,
    /// Do not verify the server's certificate (insecure).
    #[arg(long)]
    pub(crate) insecure_skip_tls_verify: bool,
    /// Timeout of each request.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub(crate) request_timeout: GoDuration,
}

/// How the streaming commands reach the local nodelet's main port (the flags of `nodelet get`).
#[derive(Debug, Clone, Args)]
pub struct MainPortArgs {
    /// nodelet's main port.
    #[arg(long, value_name = "URL", env = "NODELET_SERVER", default_value = "https://127.0.0.1:10250")]
    pub(crate) server: String,
    /// Bearer token for the main port (prefer --token-file: a command line is visible to every user).
    #[arg(long, value_name = "TOKEN", env = "NODELET_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// File holding the bearer token for the main port.
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub(crate) token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify the server's certificate with (default: nodelet's self-signed
    /// certificate under /var/lib/nodelet/pki, when present).
    #[arg(long, value_name = "FILE")]
    pub(crate) certificate_authority: Option<PathBuf>,
    /// Do not verify the server's certificate (insecure).
    #[arg(long)]
    pub(crate) insecure_skip_tls_verify: bool,
}

impl MainPortArgs {
    /// The `nodelet get pods NAMES… -n NAMESPACE` request to this main port (10 s timeout), for the
    /// streaming commands that look a pod up first.
    pub(crate) fn get_pods(&self, namespace: &str, names: Vec<String>) -> GetArgs {
        GetArgs {
            resource: "pods".into(),
            names,
            output: None,
            selector: None,
            field_selector: None,
            watch: false,
            no_headers: false,
            namespace: namespace.to_owned(),
            all_namespaces: false,
            conn: ServerArgs {
                server: Some(self.server.clone()),
                token: self.token.clone(),
                token_file: self.token_file.clone(),
                certificate_authority: self.certificate_authority.clone(),
                insecure_skip_tls_verify: self.insecure_skip_tls_verify,
                request_timeout: GoDuration(std::time::Duration::from_secs(10)),
            },
            log: LogArgs::default(),
        }
    }
}

/// `nodelet exec POD -- COMMAND…`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "With -i talks SPDY/3.1 (v5.channel.k8s.io or v4.channel.k8s.io, as kubectl) to /exec \
    on the main port, and the end of the input reaches the command (echo data | nodelet exec -i POD -- cat \
    ends); without -i a WebSocket (v5.channel.k8s.io, else v4.channel.k8s.io). nodelet proxies either to the \
    container runtime. The exit code is the command's."
)]
pub struct ExecArgs {
    /// Pod name (static pods are named <name>-<node>).
    #[arg(value_name = "POD")]
    pub(crate) pod: String,
    /// The command and its arguments.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    pub(crate) command: Vec<String>,
    /// Container name; default: the pod's kubectl.kubernetes.io/default-container, else its first.
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub(crate) container: Option<String>,
    /// Namespace of the pod.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Pass stdin to the container.
    #[arg(short = 'i', long)]
    pub(crate) stdin: bool,
    /// Stdin is a TTY (raw terminal, window size passed on).
    #[arg(short = 't', long)]
    pub(crate) tty: bool,
    /// The main port.
    #[command(flatten)]
    pub(crate) server: MainPortArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// `nodelet attach POD`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "With -i talks SPDY/3.1 (v5.channel.k8s.io or v4.channel.k8s.io, as kubectl) to \
    /attach on the main port, else a WebSocket (v5.channel.k8s.io, else v4.channel.k8s.io); nodelet proxies \
    either to the container runtime. Shows the output of the container's main process (and passes input with \
    -i) until it exits or the command is interrupted.")]
pub struct AttachArgs {
    /// Pod name (static pods are named <name>-<node>).
    #[arg(value_name = "POD")]
    pub(crate) pod: String,
    /// Container name; default: the pod's kubectl.kubernetes.io/default-container, else its first.
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub(crate) container: Option<String>,
    /// Namespace of the pod.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Pass stdin to the container (it must have `stdin: true`).
    #[arg(short = 'i', long)]
    pub(crate) stdin: bool,
    /// Stdin is a TTY (the container must have `tty: true`).
    #[arg(short = 't', long)]
    pub(crate) tty: bool,
    /// The main port.
    #[command(flatten)]
    pub(crate) server: MainPortArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// `nodelet debug POD --image=IMAGE [-- COMMAND…]`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "POSTs the ephemeral container to /debug/NAMESPACE/POD on the main port (authorized \
    like exec); nodelet keeps it under its root directory, so that it is neither lost nor started twice \
    across restarts, and starts it once in the running pod (never restarted). With --target it shares that \
    container's process namespace. With -i (and -t) it then attaches like `nodelet attach`; output of a \
    container that ended before the attach is printed from its log. Pods from the API server get their \
    ephemeral containers through the API (kubectl debug).")]
pub struct DebugArgs {
    /// Pod name (static pods are named <name>-<node>).
    #[arg(value_name = "POD")]
    pub(crate) pod: String,
    /// The command and its arguments (default: the image's).
    #[arg(value_name = "COMMAND", last = true)]
    pub(crate) command: Vec<String>,
    /// The debug container's image.
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: String,
    /// The debug container's imagePullPolicy (Always, IfNotPresent, Never; default from the image's tag).
    #[arg(long, value_name = "POLICY")]
    pub(crate) image_pull_policy: Option<String>,
    /// The container whose process namespace the debug container joins.
    #[arg(long, value_name = "CONTAINER")]
    pub(crate) target: Option<String>,
    /// The debug container's name (default: debugger-XXXXX).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub(crate) container: Option<String>,
    /// Namespace of the pod.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Keep stdin open on the container and attach to it.
    #[arg(short = 'i', long)]
    pub(crate) stdin: bool,
    /// Allocate a TTY for the container.
    #[arg(short = 't', long)]
    pub(crate) tty: bool,
    /// The main port.
    #[command(flatten)]
    pub(crate) server: MainPortArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// `nodelet cp SRC DEST`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "One of SRC and DEST is [NAMESPACE/]POD:PATH, the other a local path. Like kubectl \
    cp: from a pod, `tar cf - PATH` runs in the container and the archive is unpacked locally (entries that \
    would land outside DEST, symbolic links and special files are skipped with a warning); to a pod, the \
    archive is made locally and unpacked by `tar xmf -` in the container (into DEST when DEST is a \
    directory there, else as DEST). The container needs tar, sh, head and cat (busybox has them).")]
pub struct CpArgs {
    /// Source: a local path or [NAMESPACE/]POD:PATH.
    #[arg(value_name = "SRC")]
    pub(crate) src: String,
    /// Destination: a local path or [NAMESPACE/]POD:PATH.
    #[arg(value_name = "DEST")]
    pub(crate) dest: String,
    /// Container name; default: the pod's kubectl.kubernetes.io/default-container, else its first.
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub(crate) container: Option<String>,
    /// Namespace of the pod (when the pod path does not name one).
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// The main port.
    #[command(flatten)]
    pub(crate) server: MainPortArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// `nodelet port-forward POD [LOCAL:]REMOTE…`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Each local connection is one WebSocket (v4.channel.k8s.io) to /portForward on the \
    main port; nodelet proxies it to the container runtime. LOCAL 0 picks a free port; the chosen ports are \
    printed as `Forwarding from 127.0.0.1:LOCAL -> REMOTE`. Runs until interrupted.")]
pub struct PortForwardArgs {
    /// Pod name (static pods are named <name>-<node>).
    #[arg(value_name = "POD")]
    pub(crate) pod: String,
    /// Ports: REMOTE (same local port), LOCAL:REMOTE, or :REMOTE (a free local port).
    #[arg(value_name = "[LOCAL:]REMOTE", required = true)]
    pub(crate) ports: Vec<String>,
    /// Namespace of the pod.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Local address to listen on.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    pub(crate) address: IpAddr,
    /// The main port.
    #[command(flatten)]
    pub(crate) server: MainPortArgs,
    /// Logging.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// A binary with only the client commands, named `nodelet` as in their help and errors.
#[cfg(test)]
#[derive(Debug, clap::Parser)]
#[command(name = "nodelet")]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[cfg(test)]
impl Cli {
    /// The command given.
    pub(crate) fn into_command(self) -> Command {
        self.command
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, Parser as _};

    fn parse(args: &[&str]) -> Command {
        let mut v = vec!["nodelet"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}")).into_command()
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn get_pods_takes_kubectl_like_flags() {
        let Command::Get(g) = parse(&[
            "get",
            "pods",
            "web",
            "-o",
            "wide",
            "-n",
            "kube-system",
            "--server",
            "http://127.0.0.1:10255",
        ]) else {
            panic!("expected get");
        };
        assert_eq!(g.names, vec!["web".to_owned()]);
        assert_eq!(g.output, Some(OutputFormat::Wide));
        assert_eq!(g.namespace, "kube-system");
        assert_eq!(g.conn.server.as_deref(), Some("http://127.0.0.1:10255"));
        // Any other type names an extension: the server answers, or `get` says it has no such type.
        assert!(matches!(Cli::try_parse_from(["nodelet", "get", "prepull"]).map(Cli::into_command),
                Ok(Command::Get(g)) if g.resource == "prepull"),);
        assert!(
            Cli::try_parse_from(["nodelet", "get", "pods", "--token", "t", "--token-file", "/f"]).is_err(),
            "one token source"
        );
    }

    #[test]
    fn logs_takes_kubectl_like_flags() {
        let Command::Logs(l) =
            parse(&["logs", "web-node1", "-c", "httpd", "-f", "--tail", "10", "--timestamps"])
        else {
            panic!("expected logs");
        };
        assert_eq!((l.pod.as_str(), l.container.as_deref()), ("web-node1", Some("httpd")));
        assert!(l.follow && l.timestamps && !l.previous);
        assert_eq!(l.tail, 10);
        assert_eq!(l.namespace, "default");
        let Command::Logs(l) = parse(&["logs", "x", "--tail=-1", "-p"]) else { panic!("expected logs") };
        let Command::Exec(e) = parse(&["exec", "-it", "web", "-c", "app", "--", "sh", "-c", "exit 3"]) else {
            panic!("expected exec")
        };
        assert!(e.stdin && e.tty);
        assert_eq!((e.pod.as_str(), e.container.as_deref()), ("web", Some("app")));
        assert_eq!(e.command, ["sh", "-c", "exit 3"]);
        assert_eq!(e.server.server, "https://127.0.0.1:10250");
        let Command::PortForward(p) = parse(&["port-forward", "web", "8080:80", ":90", "70"]) else {
            panic!("expected port-forward")
        };
        assert_eq!(p.ports, ["8080:80", ":90", "70"]);
        let Command::Debug(d) = parse(&[
            "debug",
            "web",
            "-n",
            "ns",
            "--image=busybox",
            "--target=app",
            "-c",
            "dbg",
            "-it",
            "--",
            "sh",
            "-c",
            "ps",
        ]) else {
            panic!("debug")
        };
        assert_eq!((d.pod.as_str(), d.namespace.as_str(), d.image.as_str()), ("web", "ns", "busybox"));
        assert_eq!(
            (d.target.as_deref(), d.container.as_deref(), d.stdin, d.tty),
            (Some("app"), Some("dbg"), true, true)
        );
        assert_eq!(d.command, ["sh", "-c", "ps"]);
        let Command::Attach(a) = parse(&["attach", "web", "-c", "ticker", "-it", "-n", "ns"]) else {
            panic!("expected attach")
        };
        assert!(a.stdin && a.tty);
        assert_eq!(
            (a.pod.as_str(), a.container.as_deref(), a.namespace.as_str()),
            ("web", Some("ticker"), "ns")
        );
        let Command::Cp(c) = parse(&["cp", "ns/web:/etc/hosts", "./hosts", "-c", "app"]) else {
            panic!("expected cp")
        };
        assert_eq!(
            (c.src.as_str(), c.dest.as_str(), c.container.as_deref()),
            ("ns/web:/etc/hosts", "./hosts", Some("app"))
        );
        let Command::Logs(l2) = parse(&["logs", "web", "--since", "5m", "--limit-bytes", "100"]) else {
            panic!("expected logs")
        };
        assert_eq!(l2.since.map(|d| d.0), Some(std::time::Duration::from_secs(300)));
        assert_eq!(l2.limit_bytes, 100);
        let Command::Logs(l3) = parse(&["logs", "web", "--since-time", "2024-05-01T12:00:00Z"]) else {
            panic!("expected logs")
        };
        assert_eq!(l3.since_time.as_deref(), Some("2024-05-01T12:00:00Z"));
        assert_eq!(l.tail, -1);
        assert!(l.previous);
    }

    #[test]
    fn get_takes_selectors_watch_and_template_formats() {
        let Command::Get(g) = parse(&[
            "get",
            "events",
            "-l",
            "app=web",
            "--field-selector",
            "type=Warning",
            "-w",
            "--no-headers",
            "-o",
            "jsonpath={.items[*].reason}",
        ]) else {
            panic!("expected get");
        };
        assert_eq!(g.selector.as_deref(), Some("app=web"));
        assert_eq!(g.field_selector.as_deref(), Some("type=Warning"));
        assert!(g.watch && g.no_headers);
        assert_eq!(g.output, Some(OutputFormat::JsonPath("{.items[*].reason}".into())));
        let Command::Describe(d) = parse(&["describe", "pod", "web", "-n", "ns", "--show-events=false"])
        else {
            panic!("expected describe");
        };
        assert_eq!(
            (d.names.as_slice(), d.namespace.as_str(), d.show_events),
            (&["web".to_owned()][..], "ns", false)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cols");
        std::fs::write(&file, "NAME PHASE\n.metadata.name .status.phase\n").expect("write");
        let arg = format!("custom-columns-file={}", file.display());
        let Command::Get(g) = parse(&["get", "pods", "-o", &arg]) else { panic!("expected get") };
        assert_eq!(
            g.output,
            Some(OutputFormat::CustomColumns("NAME:.metadata.name,PHASE:.status.phase".into()))
        );
        let err = Cli::try_parse_from(["nodelet", "get", "pods", "-o", "table"]).expect_err("unknown format");
        assert!(err.to_string().contains("allowed formats are"), "{err}");
        // kubectl's messages
        for (value, message) in [
            ("jsonpath=", "template format specified but no template given"),
            ("custom-columns=", "custom-columns format specified but no custom columns given"),
            ("jsonpath-file=/nonexistent/t", "error reading template /nonexistent/t, "),
            (
                "custom-columns-file=",
                "unable to match a printer suitable for the output format \"custom-columns-file=\", allowed \
                 formats are: custom-columns,custom-columns-file,json,jsonpath,jsonpath-file,name,wide,yaml",
            ),
        ] {
            let err = parse_output(value).expect_err(value);
            assert!(err.to_string().starts_with(message), "{value}: {err}");
        }
    }
}

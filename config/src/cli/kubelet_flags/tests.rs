use super::*;
use crate::cli::{Command as NodeletCommand, RunArgs, command, try_parse_from};

/// `kubelet --help` of v1.28.7, one flag a line: name, value type (`bool` when it takes none) and the
/// deprecation message, tab-separated. Generated once from the reference binary with:
///
/// ```sh
/// /var/cache/nodelet/conformance/v1.28.7/kubelet --help 2>&1 | awk '
///   function out() { if (name != "") { d = ""; sub(/ +$/, "", text);
///     if (match(text, /\(DEPRECATED: .*\)$/)) d = substr(text, RSTART + 13, RLENGTH - 14);
///     print name "\t" type "\t" d } }
///   /^ +(-[a-z], )?--[a-z]/ { out(); text = $0; line = $0; sub(/^ +(-[a-z], )?--/, "", line);
///     split(line, parts, /  +/); n = split(parts[1], w, " "); name = w[1];
///     type = (n > 1) ? w[2] : "bool"; next }
///   name != "" && /^ / { text = text " " $0 }
///   END { out() }' > config/src/cli/kubelet-v1.28.7-flags.tsv
/// ```
const KUBELET_HELP: &str = include_str!("../kubelet-v1.28.7-flags.tsv");

struct HelpFlag {
    name: &'static str,
    ty: &'static str,
    deprecated: Option<&'static str>,
}

fn help_flags() -> Vec<HelpFlag> {
    KUBELET_HELP
        .lines()
        .map(|line| {
            let mut cols = line.split('\t');
            let name = cols.next().unwrap_or_default();
            let ty = cols.next().unwrap_or_else(|| panic!("no type column: {line:?}"));
            let deprecated = cols.next().filter(|d| !d.is_empty());
            HelpFlag { name, ty, deprecated }
        })
        .collect()
}

fn parse(args: &[&str]) -> Result<NodeletCommand, clap::Error> {
    try_parse_from(std::iter::once("nodelet").chain(args.iter().copied()))
}

fn run(args: &[&str]) -> RunArgs {
    match parse(args) {
        Ok(NodeletCommand::Run(r)) => *r,
        Ok(other) => panic!("{args:?}: expected run, got {other:?}"),
        Err(e) => panic!("{args:?}: {e}"),
    }
}

/// The table and `kubelet --help` list the same flags, in the same order, with the same deprecations.
#[test]
fn the_table_lists_every_kubelet_flag_of_v1_28() {
    let help = help_flags();
    assert_eq!(help.len(), 150, "the v1.28.7 kubelet has 150 flags");
    let missing: Vec<&str> = help.iter().map(|h| h.name).filter(|n| lookup(n).is_none()).collect();
    assert!(missing.is_empty(), "kubelet flags missing from KUBELET_FLAGS: {missing:?}");
    let extra: Vec<&str> =
        KUBELET_FLAGS.iter().map(|f| f.name).filter(|n| !help.iter().any(|h| h.name == *n)).collect();
    assert!(extra.is_empty(), "not kubelet v1.28 flags: {extra:?}");
    let table: Vec<&str> = KUBELET_FLAGS.iter().map(|f| f.name).collect();
    let listed: Vec<&str> = help.iter().map(|h| h.name).collect();
    assert_eq!(table, listed, "one entry per flag, in the order of kubelet --help");
    for h in &help {
        let f = lookup(h.name).unwrap_or_else(|| panic!("{}", h.name));
        assert_eq!(f.deprecated, h.deprecated, "--{}: the kubelet's deprecation message", h.name);
        // pflag names a boolean's type after a backquoted word of its help (`RuntimeDefault`), and
        // --version takes an optional value
        let is_bool = h.ty == "bool" || matches!(h.name, "seccomp-default" | "version");
        assert_eq!(f.value == Value::Bool, is_bool, "--{} is a {}", h.name, h.ty);
    }
}

#[test]
fn every_flag_is_one_of_the_three_kinds_and_refusals_say_why() {
    for f in KUBELET_FLAGS {
        match f.handling {
            Handling::Accepted => assert!(f.refusal().is_none()),
            Handling::Refused(reason) => {
                assert!(reason.len() > 20, "--{}: a reason, not a stub: {reason:?}", f.name);
                let message = f.refusal().unwrap_or_default();
                assert!(message.contains(&format!("--{}", f.name)), "{message}");
                if let Some(field) = f.field {
                    assert!(message.contains(field), "{message}");
                }
            }
        }
        if let Some(field) = f.field {
            assert!(!field.is_empty() && !field.starts_with('-'), "--{}: field {field:?}", f.name);
        }
    }
    let refused = KUBELET_FLAGS.iter().filter(|f| matches!(f.handling, Handling::Refused(_))).count();
    let accepted = KUBELET_FLAGS.len() - refused;
    assert_eq!((accepted, refused), (69, 81), "update the counts in the report and docs on purpose");
}

/// An accepted flag is one of the daemon's own arguments (so it is acted on through [`RunArgs`]), at the
/// top level and under `run`; a refused one is only the hidden argument generated from the table.
#[test]
fn accepted_flags_are_daemon_flags_and_refused_ones_are_generated() {
    let mut cmd = command();
    cmd.build();
    let run_cmd = cmd.find_subcommand("run").cloned().expect("run");
    for c in [&cmd, &run_cmd] {
        for f in KUBELET_FLAGS {
            if f.name == "version" && c.get_name() == "run" {
                continue; // `nodelet --version`, as `kubelet --version`; `run` is nodelet's
            }
            let args: Vec<&clap::Arg> = c.get_arguments().filter(|a| a.get_long() == Some(f.name)).collect();
            assert_eq!(args.len(), 1, "--{} in {}", f.name, c.get_name());
            let arg = args[0];
            match f.handling {
                Handling::Accepted => {
                    assert!(!arg.is_hide_set(), "--{} is shown in --help", f.name);
                }
                Handling::Refused(_) => {
                    assert!(arg.is_hide_set(), "--{} is hidden", f.name);
                    assert_eq!(arg.get_id().as_str(), f.name);
                }
            }
        }
    }
}

/// The help of an accepted flag names the field the table gives it (`[config: FIELD]`).
#[test]
fn accepted_flags_set_the_field_the_table_names() {
    let mut cmd = command();
    cmd.build();
    for f in KUBELET_FLAGS.iter().filter(|f| f.handling == Handling::Accepted) {
        let Some(field) = f.field else { continue };
        if f.name == "v" {
            continue; // -v is shared by every command; config.rs merges it with logging.verbosity
        }
        let arg = cmd.get_arguments().find(|a| a.get_long() == Some(f.name)).expect("arg");
        let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains(&format!("[config: {field}]")), "--{}: {help}", f.name);
    }
}

#[test]
fn refused_flags_exit_with_a_message_naming_the_field() {
    for f in KUBELET_FLAGS.iter().filter(|f| matches!(f.handling, Handling::Refused(_))) {
        let flag = match f.value {
            Value::Bool => format!("--{}", f.name),
            Value::One => format!("--{}=x", f.name),
        };
        for args in [vec![flag.as_str()], vec!["run", flag.as_str()], vec!["--port", "1", flag.as_str()]] {
            let err = parse(&args).expect_err(&flag);
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{args:?}: {err}");
            let text = err.to_string();
            assert!(text.contains(&format!("--{} is not supported by nodelet", f.name)), "{text}");
            if let Some(field) = f.field {
                assert!(text.contains(&format!("KubeletConfiguration field {field}:")), "{text}");
            }
            assert!(!text.contains("unexpected argument"), "{text}");
        }
    }
    // the kubelet's value forms: `--flag VALUE`, `--flag=VALUE`, `--bool=false`, repeated
    for args in [
        &["--cgroup-driver", "systemd"][..],
        &["--feature-gates=A=true,B=false", "--feature-gates", "C=true"],
        &["--fail-swap-on=false"],
        &["--cpu-manager-policy", "static", "--port", "10250"],
    ] {
        assert!(parse(args).is_err(), "{args:?}");
    }
    // a value that looks like a flag is the refused flag's value, as in the kubelet
    let err = parse(&["--vmodule", "-x"]).expect_err("refused");
    assert!(err.to_string().contains("--vmodule"), "{err}");
    // every refused flag given is named, in one error
    let err =
        parse(&["--runonce", "--lock-file", "/run/lock", "--cloud-provider=external"]).expect_err("refused");
    let text = err.to_string();
    for name in ["--runonce", "--lock-file", "--cloud-provider"] {
        assert!(text.contains(name), "{text}");
    }
    // a boolean takes its value after `=` only, as with pflag: `false` would be an argument
    assert!(parse(&["--fail-swap-on", "false"]).is_err());
}

#[test]
fn the_client_commands_do_not_take_kubelet_flags() {
    use crate::cli::{Commands, try_parse_with};
    use nodelet_cli::Command as Client;
    let parse = |args: &[&str]| {
        try_parse_with::<Client, _, _>(std::iter::once("nodelet").chain(args.iter().copied()))
    };
    let err = parse(&["get", "pods", "--cgroup-driver", "systemd"]).expect_err("not a get flag");
    assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument, "{err}");
    assert!(parse(&["--cgroup-driver=systemd", "get", "pods"]).is_err());
    assert!(matches!(parse(&["get", "pods"]), Ok(Commands::Client(Client::Get(_)))));
    assert!(matches!(parse(&["logs", "web"]), Ok(Commands::Client(Client::Logs(_)))));
}

#[test]
fn deprecated_flags_are_accepted_with_the_kubelets_warning() {
    let r = run(&["--rotate-certificates"]);
    assert_eq!(r.rotate_certificates, Some(true));
    assert_eq!(
        r.deprecation_warnings,
        ["Flag --rotate-certificates has been deprecated, This parameter should be set via the config file \
          specified by the Kubelet's --config flag. See \
          https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information."]
    );
    let r = run(&["run", "--rotate-certificates=false", "--port", "10250"]);
    assert_eq!(r.rotate_certificates, Some(false));
    assert_eq!(r.port, Some(10250));
    assert_eq!(r.deprecation_warnings.len(), 2, "{:?}", r.deprecation_warnings);
    assert!(r.deprecation_warnings[0].starts_with("Flag --port has been deprecated, This parameter"));
    assert!(r.deprecation_warnings[1].starts_with("Flag --rotate-certificates has been deprecated"));
    let r =
        run(&["--pod-infra-container-image", "registry.k8s.io/pause:3.9", "--maximum-dead-containers=10"]);
    assert_eq!(
        r.deprecation_warnings,
        [
            "Flag --maximum-dead-containers has been deprecated, Use --eviction-hard or --eviction-soft instead. \
             Will be removed in a future version.",
            "Flag --pod-infra-container-image has been deprecated, will be removed in a future release. Image \
             garbage collector will get sandbox image information from CRI.",
        ]
    );
    // not deprecated in the kubelet: no warning; nodelet's own flags: none either
    let r = run(&[
        "--root-dir",
        "/tmp/n",
        "--seccomp-default",
        "--housekeeping-interval=5s",
        "--token-auth-file=/t",
    ]);
    assert!(r.deprecation_warnings.is_empty(), "{:?}", r.deprecation_warnings);
    assert_eq!(r.seccomp_default, Some(true));
    assert!(run(&[]).deprecation_warnings.is_empty());
}

#[test]
fn every_deprecated_accepted_flag_warns_when_given() {
    // a valid value for each accepted flag that takes one
    let value = |name: &str| match name {
        "address" | "healthz-bind-address" => "127.0.0.1",
        "port"
        | "healthz-port"
        | "read-only-port"
        | "max-pods"
        | "kube-api-burst"
        | "image-gc-high-threshold"
        | "image-gc-low-threshold"
        | "eviction-max-pod-grace-period"
        | "pod-max-pids"
        | "kube-api-qps"
        | "container-log-max-files"
        | "maximum-dead-containers"
        | "maximum-dead-containers-per-container" => "7",
        "cluster-dns" => "10.0.0.10",
        "container-log-max-size" => "10Mi",
        "container-runtime-endpoint" => "unix:///run/containerd/containerd.sock",
        "manifest-url-header" => "a:b",
        "register-with-taints" => "k=v:NoSchedule",
        "eviction-hard" | "eviction-soft" => "memory.available<1Gi",
        "eviction-soft-grace-period" => "memory.available=1m",
        "eviction-minimum-reclaim" => "memory.available=1Gi",
        n if n.ends_with("frequency")
            || n.ends_with("ttl")
            || n.ends_with("period")
            || n.ends_with("duration")
            || n.ends_with("timeout") =>
        {
            "10s"
        }
        _ => "x",
    };
    for f in KUBELET_FLAGS.iter().filter(|f| f.handling == Handling::Accepted && f.deprecated.is_some()) {
        let arg = match f.value {
            Value::Bool => format!("--{}", f.name),
            Value::One => format!("--{}={}", f.name, value(f.name)),
        };
        let r = run(&[&arg]);
        assert_eq!(r.deprecation_warnings, [f.deprecation_warning().unwrap_or_default()], "{arg}");
    }
}

/// `docs/kubelet-flags.md` is [`markdown`]; with NODELET_UPDATE_DOCS=1 this test writes it.
#[test]
fn kubelet_flags_doc_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/kubelet-flags.md");
    let want = markdown();
    if std::env::var_os("NODELET_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not generated from KUBELET_FLAGS; regenerate it with\n  \
         NODELET_UPDATE_DOCS=1 cargo nextest run -p nodelet -E 'test(kubelet_flags_doc_is_current)'",
        path.display()
    );
    for f in KUBELET_FLAGS {
        assert!(want.contains(&format!("| `--{}` |", f.name)), "--{}", f.name);
    }
}

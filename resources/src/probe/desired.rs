//! Desired state of probes and lifecycle hooks: what a container's spec asks for, resolved (named
//! ports looked up, kubelet defaults applied) into plain values the prober and hook runners use.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, LifecycleHandler, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The kubelet's default `periodSeconds`.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// The kubelet's default `timeoutSeconds`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The kubelet's default `successThreshold`.
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;
/// The kubelet's default `failureThreshold`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// The kubelet's probe `User-Agent` (`kube-probe/<major>.<minor>` of the Kubernetes version nodelet
/// follows).
pub const PROBE_USER_AGENT: &str = "kube-probe/1.34";
/// How much of an HTTP probe's or hook's response body is read (the kubelet's `maxRespBodyLength`).
pub const MAX_BODY_BYTES: usize = 10 * 1024;

/// The three kinds of probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// Restarts the container when it fails.
    Liveness,
    /// Drives the container's `ready` flag.
    Readiness,
    /// Holds the other two until it succeeds; restarts the container when it fails.
    Startup,
}

impl ProbeKind {
    /// All three, in the order the kubelet lists them.
    pub const ALL: [ProbeKind; 3] = [ProbeKind::Liveness, ProbeKind::Readiness, ProbeKind::Startup];

    /// The `probe_type` metric label and the word in events: `Liveness`, `Readiness`, `Startup`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The probe of this kind in a container spec, if any.
    pub fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => container.liveness_probe.as_ref(),
            ProbeKind::Readiness => container.readiness_probe.as_ref(),
            ProbeKind::Startup => container.startup_probe.as_ref(),
        }
    }
}

/// `httpGet`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// `HTTPS` (certificates are not verified, as by the kubelet) rather than `HTTP`.
    pub https: bool,
    /// The host; `None`: the pod IP.
    pub host: Option<String>,
    /// The port (a named port already looked up).
    pub port: u16,
    /// The path (and query), starting with `/`.
    pub path: String,
    /// Extra request headers, in order.
    pub headers: Vec<(String, String)>,
}

/// What a probe or a lifecycle hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Runs a command in the container (CRI `ExecSync`); success on exit code 0.
    Exec {
        /// The argv (no shell unless the command names one).
        command: Vec<String>,
    },
    /// An HTTP GET; success on a status in 200..400.
    HttpGet(HttpGet),
    /// A TCP connect; success when it connects.
    TcpSocket {
        /// The host; `None`: the pod IP.
        host: Option<String>,
        /// The port.
        port: u16,
    },
    /// A `grpc.health.v1.Health/Check` call; success on `SERVING`.
    Grpc {
        /// The port (on the pod IP).
        port: u16,
        /// The `service` field of the request (`""`: the server as a whole).
        service: String,
    },
    /// Sleeps (lifecycle hooks only).
    Sleep(Duration),
    /// A handler that cannot run (a named port the container does not have, no handler): every run
    /// fails with this message.
    Unusable(String),
}

/// One probe of one container, with the kubelet's defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Which probe.
    pub kind: ProbeKind,
    /// What it runs.
    pub action: Action,
    /// `initialDelaySeconds` (from the container's start; default 0).
    pub initial_delay: Duration,
    /// `periodSeconds` (default 10 s).
    pub period: Duration,
    /// `timeoutSeconds` (default 1 s).
    pub timeout: Duration,
    /// `successThreshold` (default 1).
    pub success_threshold: u32,
    /// `failureThreshold` (default 3).
    pub failure_threshold: u32,
    /// The probe-level `terminationGracePeriodSeconds`: the grace of the kill a liveness or startup
    /// failure causes (the pod's when unset).
    pub termination_grace: Option<Duration>,
}

fn secs(value: Option<i32>, default: Duration) -> Duration {
    match value {
        Some(s) if s > 0 => Duration::from_secs(u64::from(s.unsigned_abs())),
        _ => default,
    }
}

fn count(value: Option<i32>, default: u32) -> u32 {
    match value {
        Some(n) if n > 0 => n.unsigned_abs(),
        _ => default,
    }
}

/// Why a probe's or hook's port does not resolve ([`resolve_port`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// A number outside 1..=65535.
    #[error("invalid port {0}")]
    Invalid(i32),
    /// A name that none of the container's ports has.
    #[error("couldn't find port {0:?} in the container's ports")]
    NoSuchName(String),
}

/// Looks a port up: a number as is, a name among the container's ports.
pub fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, PortError> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok().filter(|p| *p > 0).ok_or(PortError::Invalid(*n)),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<i32>() {
                return resolve_port(&IntOrString::Int(n), ports);
            }
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| PortError::NoSuchName(name.clone()))
        }
    }
}

fn http_get(action: &HTTPGetAction, ports: &[ContainerPort]) -> Action {
    let port = match resolve_port(&action.port, ports) {
        Ok(p) => p,
        Err(e) => return Action::Unusable(e.to_string()),
    };
    let mut path = action.path.clone().unwrap_or_default();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    Action::HttpGet(HttpGet {
        https: action.scheme.as_deref().is_some_and(|s| s.eq_ignore_ascii_case("HTTPS")),
        host: action.host.clone().filter(|h| !h.is_empty()),
        port,
        path,
        headers: action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect(),
    })
}

/// The action of a probe.
pub fn probe_action(probe: &Probe, ports: &[ContainerPort]) -> Action {
    if let Some(exec) = &probe.exec {
        return Action::Exec { command: exec.command.clone().unwrap_or_default() };
    }
    if let Some(http) = &probe.http_get {
        return http_get(http, ports);
    }
    if let Some(tcp) = &probe.tcp_socket {
        return match resolve_port(&tcp.port, ports) {
            Ok(port) => Action::TcpSocket { host: tcp.host.clone().filter(|h| !h.is_empty()), port },
            Err(e) => Action::Unusable(e.to_string()),
        };
    }
    if let Some(grpc) = &probe.grpc {
        return match resolve_port(&IntOrString::Int(grpc.port), ports) {
            Ok(port) => Action::Grpc { port, service: grpc.service.clone().unwrap_or_default() },
            Err(e) => Action::Unusable(e.to_string()),
        };
    }
    Action::Unusable("the probe has no handler".to_string())
}

/// The action of a lifecycle hook (`exec`, `httpGet`, `sleep`; the deprecated `tcpSocket` is
/// unusable, as in the kubelet).
pub fn hook_action(handler: &LifecycleHandler, ports: &[ContainerPort]) -> Action {
    if let Some(exec) = &handler.exec {
        return Action::Exec { command: exec.command.clone().unwrap_or_default() };
    }
    if let Some(http) = &handler.http_get {
        return http_get(http, ports);
    }
    if let Some(sleep) = &handler.sleep {
        return Action::Sleep(Duration::from_secs(u64::try_from(sleep.seconds).unwrap_or(0)));
    }
    if handler.tcp_socket.is_some() {
        return Action::Unusable("tcpSocket lifecycle hooks are not supported".to_string());
    }
    Action::Unusable("the hook has no handler".to_string())
}

impl ProbeSpec {
    /// The probe `probe` of `kind` in a container with `ports`, with the kubelet's defaults.
    pub fn new(kind: ProbeKind, probe: &Probe, ports: &[ContainerPort]) -> Self {
        ProbeSpec {
            kind,
            action: probe_action(probe, ports),
            initial_delay: Duration::from_secs(
                u64::try_from(probe.initial_delay_seconds.unwrap_or(0)).unwrap_or(0),
            ),
            period: secs(probe.period_seconds, DEFAULT_PERIOD),
            timeout: secs(probe.timeout_seconds, DEFAULT_TIMEOUT),
            // successThreshold must be 1 except for readiness (validation); enforce it here too.
            success_threshold: if kind == ProbeKind::Readiness {
                count(probe.success_threshold, DEFAULT_SUCCESS_THRESHOLD)
            } else {
                1
            },
            failure_threshold: count(probe.failure_threshold, DEFAULT_FAILURE_THRESHOLD),
            termination_grace: probe
                .termination_grace_period_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map(Duration::from_secs),
        }
    }
}

/// Every probe of a container, in the order liveness, readiness, startup.
pub fn container_probes(container: &Container) -> Vec<ProbeSpec> {
    let ports = container.ports.as_deref().unwrap_or_default();
    ProbeKind::ALL.iter().filter_map(|kind| Some(ProbeSpec::new(*kind, kind.of(container)?, ports))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(yaml: &str) -> Container {
        match serde_saphyr::from_str(yaml) {
            Ok(c) => c,
            Err(e) => panic!("bad test container: {e}"),
        }
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let c = container("{name: a, livenessProbe: {exec: {command: [true]}}}");
        let probes = container_probes(&c);
        assert_eq!(probes.len(), 1);
        let p = &probes[0];
        assert_eq!(p.kind, ProbeKind::Liveness);
        assert_eq!(p.action, Action::Exec { command: vec!["true".into()] });
        assert_eq!(p.initial_delay, Duration::ZERO);
        assert_eq!(p.period, Duration::from_secs(10));
        assert_eq!(p.timeout, Duration::from_secs(1));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 3));
        assert_eq!(p.termination_grace, None);
    }

    #[test]
    fn fields_and_named_ports_are_resolved() {
        let c = container(
            r#"
name: a
ports: [{name: web, containerPort: 8080}]
readinessProbe:
  httpGet: {port: web, path: healthz, scheme: HTTPS, httpHeaders: [{name: X-A, value: b}]}
  initialDelaySeconds: 5
  periodSeconds: 2
  timeoutSeconds: 3
  successThreshold: 2
  failureThreshold: 4
livenessProbe: {tcpSocket: {port: nope}, terminationGracePeriodSeconds: 7, successThreshold: 5}
startupProbe: {grpc: {port: 9090, service: svc}}
"#,
        );
        let probes = container_probes(&c);
        let kinds: Vec<ProbeKind> = probes.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, ProbeKind::ALL.to_vec());
        assert!(matches!(&probes[0].action, Action::Unusable(m) if m.contains("nope")));
        assert_eq!(probes[0].termination_grace, Some(Duration::from_secs(7)));
        assert_eq!(probes[0].success_threshold, 1, "liveness success threshold is always 1");
        let r = &probes[1];
        assert_eq!(
            r.action,
            Action::HttpGet(HttpGet {
                https: true,
                host: None,
                port: 8080,
                path: "/healthz".into(),
                headers: vec![("X-A".into(), "b".into())],
            })
        );
        assert_eq!(
            (r.initial_delay, r.period, r.timeout, r.success_threshold, r.failure_threshold),
            (Duration::from_secs(5), Duration::from_secs(2), Duration::from_secs(3), 2, 4)
        );
        assert_eq!(probes[2].action, Action::Grpc { port: 9090, service: "svc".into() });
    }

    #[test]
    fn hook_actions() {
        let c = container(
            r#"
name: a
lifecycle:
  postStart: {sleep: {seconds: 2}}
  preStop: {tcpSocket: {port: 80}}
"#,
        );
        let lifecycle = c.lifecycle.as_ref().map(|l| (l.post_start.clone(), l.pre_stop.clone()));
        let Some((Some(post), Some(pre))) = lifecycle else { panic!("no hooks parsed") };
        assert_eq!(hook_action(&post, &[]), Action::Sleep(Duration::from_secs(2)));
        assert!(matches!(hook_action(&pre, &[]), Action::Unusable(_)));
    }
}

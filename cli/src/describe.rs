//! `nodelet describe pod`: a pod's details as `kubectl describe pod` prints them (the same sections,
//! labels and layout, aligned like Go's tabwriter with kubectl's settings), its events last.
//!
//! Names match exactly, else as a prefix (as kubectl describe does), so `nodelet describe pod web`
//! finds the static pod `web-<node>`.

use std::collections::BTreeMap;
use std::io::Write;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, EnvVar, Event, Pod, Probe, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::events::{count, first_seen, last_seen, since};
use super::get::{GetError, fetch_list, fetch_pods};
use crate::args::DescribeArgs;

/// Go's `text/tabwriter` with kubectl describe's settings (minwidth 0, padding 2, spaces): cells end
/// with `\t`; a column is aligned over the consecutive lines that have a cell in it.
#[derive(Debug, Default)]
pub(crate) struct TabWriter {
    lines: Vec<Vec<String>>,
}

impl TabWriter {
    /// Adds text (may hold several lines) indented by `level` (two spaces each), like kubectl's
    /// prefix writer: only the first line gets the indent.
    pub(crate) fn write(&mut self, level: usize, text: &str) {
        let text = format!("{}{text}", "  ".repeat(level));
        for line in text.split_inclusive('\n') {
            let line = line.strip_suffix('\n').unwrap_or(line);
            self.lines.push(line.split('\t').map(str::to_owned).collect());
        }
    }

    fn format(&self, line0: usize, line1: usize, widths: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        let column = widths.len();
        let mut this = line0;
        while this < line1 {
            if column >= self.lines[this].len().saturating_sub(1) {
                out[this] = widths.clone();
                this += 1;
                continue;
            }
            let start = this;
            let mut width = 0;
            while this < line1 && column < self.lines[this].len().saturating_sub(1) {
                width = width.max(self.lines[this][column].chars().count() + 2);
                this += 1;
            }
            widths.push(width);
            self.format(start, this, widths, out);
            widths.pop();
        }
    }

    /// The aligned text.
    pub(crate) fn finish(&self) -> String {
        let mut widths = vec![Vec::new(); self.lines.len()];
        self.format(0, self.lines.len(), &mut Vec::new(), &mut widths);
        let mut out = String::new();
        for (cells, w) in self.lines.iter().zip(&widths) {
            for (i, cell) in cells.iter().enumerate() {
                out.push_str(cell);
                if i + 1 < cells.len() {
                    let pad = w.get(i).copied().unwrap_or(0).saturating_sub(cell.chars().count());
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
        out
    }
}

/// Go's `time.RFC1123Z` in UTC.
fn rfc1123z(t: Timestamp) -> String {
    t.strftime("%a, %d %b %Y %H:%M:%S %z").to_string()
}

fn multiline(w: &mut TabWriter, title: &str, entries: Vec<String>) {
    if entries.is_empty() {
        w.write(0, &format!("{title}:\t<none>\n"));
        return;
    }
    for (i, e) in entries.iter().enumerate() {
        if i == 0 {
            w.write(0, &format!("{title}:\t{e}\n"));
        } else {
            w.write(0, &format!("\t{e}\n"));
        }
    }
}

fn labels(map: Option<&BTreeMap<String, String>>) -> Vec<String> {
    map.into_iter().flatten().map(|(k, v)| format!("{k}={v}")).collect()
}

fn annotations(map: Option<&BTreeMap<String, String>>) -> Vec<String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "kubectl.kubernetes.io/last-applied-configuration")
        .map(|(k, v)| format!("{k}: {v}"))
        .collect()
}

fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// kubectl's `DescribeProbe` (unset fields at the API server's defaults).
fn probe(p: &Probe) -> String {
    let attrs = format!(
        "delay={}s timeout={}s period={}s #success={} #failure={}",
        p.initial_delay_seconds.unwrap_or(0),
        p.timeout_seconds.unwrap_or(1),
        p.period_seconds.unwrap_or(10),
        p.success_threshold.unwrap_or(1),
        p.failure_threshold.unwrap_or(3)
    );
    if let Some(e) = &p.exec {
        return format!("exec [{}] {attrs}", e.command.clone().unwrap_or_default().join(" "));
    }
    if let Some(h) = &p.http_get {
        let scheme = h.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
        let host = h.host.clone().unwrap_or_default();
        let port = int_or_string(&h.port);
        let host = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        return format!("http-get {scheme}://{host}{} {attrs}", h.path.as_deref().unwrap_or_default());
    }
    if let Some(t) = &p.tcp_socket {
        return format!(
            "tcp-socket {}:{} {attrs}",
            t.host.as_deref().unwrap_or_default(),
            int_or_string(&t.port)
        );
    }
    if let Some(g) = &p.grpc {
        return format!("grpc <pod>:{} {} {attrs}", g.port, g.service.as_deref().unwrap_or_default());
    }
    format!("unknown {attrs}")
}

fn state(w: &mut TabWriter, name: &str, s: Option<&ContainerState>) {
    let s = s.cloned().unwrap_or_default();
    if let Some(r) = &s.running {
        w.write(2, &format!("{name}:\tRunning\n"));
        if let Some(t) = &r.started_at {
            w.write(3, &format!("Started:\t{}\n", rfc1123z(t.0)));
        }
    } else if let Some(t) = &s.terminated {
        w.write(2, &format!("{name}:\tTerminated\n"));
        if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
            w.write(3, &format!("Reason:\t{r}\n"));
        }
        if let Some(m) = t.message.as_deref().filter(|m| !m.is_empty()) {
            w.write(3, &format!("Message:\t{m}\n"));
        }
        w.write(3, &format!("Exit Code:\t{}\n", t.exit_code));
        if let Some(sig) = t.signal.filter(|s| *s > 0) {
            w.write(3, &format!("Signal:\t{sig}\n"));
        }
        let time = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
            t.map_or_else(|| "Mon, 01 Jan 0001 00:00:00 +0000".to_owned(), |t| rfc1123z(t.0))
        };
        w.write(3, &format!("Started:\t{}\n", time(t.started_at.as_ref())));
        w.write(3, &format!("Finished:\t{}\n", time(t.finished_at.as_ref())));
    } else {
        w.write(2, &format!("{name}:\tWaiting\n"));
        if let Some(r) = s.waiting.as_ref().and_then(|w| w.reason.as_deref()).filter(|r| !r.is_empty()) {
            w.write(3, &format!("Reason:\t{r}\n"));
        }
    }
}

fn env_line(e: &EnvVar) -> String {
    let Some(from) = &e.value_from else {
        return format!("{}:\t{}", e.name, e.value.as_deref().unwrap_or_default());
    };
    if let Some(f) = &from.field_ref {
        let api = f.api_version.as_deref().unwrap_or("v1");
        return format!("{}:\t ({api}:{})", e.name, f.field_path);
    }
    if let Some(r) = &from.resource_field_ref {
        return format!("{}:\t{} ({})", e.name, r.container_name.as_deref().unwrap_or_default(), r.resource);
    }
    if let Some(s) = &from.secret_key_ref {
        return format!(
            "{}:\t<set to the key '{}' in secret '{}'>\tOptional: {}",
            e.name,
            s.key,
            s.name,
            s.optional.unwrap_or(false)
        );
    }
    if let Some(c) = &from.config_map_key_ref {
        return format!(
            "{}:\t<set to the key '{}' of config map '{}'>\tOptional: {}",
            e.name,
            c.key,
            c.name,
            c.optional.unwrap_or(false)
        );
    }
    format!("{}:\t<unknown>", e.name)
}

fn containers(w: &mut TabWriter, title: &str, specs: &[Container], statuses: &[ContainerStatus]) {
    w.write(0, &format!("{title}:\n"));
    for c in specs {
        let status = statuses.iter().find(|s| s.name == c.name);
        w.write(1, &format!("{}:\n", c.name));
        if let Some(s) = status {
            w.write(2, &format!("Container ID:\t{}\n", s.container_id.as_deref().unwrap_or_default()));
        }
        w.write(2, &format!("Image:\t{}\n", c.image.as_deref().unwrap_or_default()));
        if let Some(s) = status {
            w.write(2, &format!("Image ID:\t{}\n", s.image_id));
        }
        let ports = c.ports.iter().flatten();
        let container_ports: Vec<String> = ports
            .clone()
            .map(|p| format!("{}/{}", p.container_port, p.protocol.as_deref().unwrap_or("TCP")))
            .collect();
        let host_ports: Vec<String> = ports
            .map(|p| format!("{}/{}", p.host_port.unwrap_or(0), p.protocol.as_deref().unwrap_or("TCP")))
            .collect();
        let or_none = |v: &[String]| if v.is_empty() { "<none>".to_owned() } else { v.join(",") };
        let plural =
            |base: &str, v: &[String]| if v.len() > 1 { format!("{base}s") } else { base.to_owned() };
        w.write(2, &format!("{}:\t{}\n", plural("Port", &container_ports), or_none(&container_ports)));
        w.write(2, &format!("{}:\t{}\n", plural("Host Port", &host_ports), or_none(&host_ports)));
        for (label, items) in [("Command", &c.command), ("Args", &c.args)] {
            if let Some(items) = items.as_ref().filter(|i| !i.is_empty()) {
                w.write(2, &format!("{label}:\n"));
                for item in items {
                    for line in item.split('\n') {
                        w.write(3, &format!("{line}\n"));
                    }
                }
            }
        }
        if let Some(s) = status {
            state(w, "State", s.state.as_ref());
            if s.last_state.as_ref().is_some_and(|l| l.terminated.is_some()) {
                state(w, "Last State", s.last_state.as_ref());
            }
            w.write(2, &format!("Ready:\t{}\n", if s.ready { "True" } else { "False" }));
            w.write(2, &format!("Restart Count:\t{}\n", s.restart_count));
        } else {
            w.write(2, "State:\tWaiting\n");
            w.write(2, "Ready:\tFalse\n");
            w.write(2, "Restart Count:\t0\n");
        }
        let resources = c.resources.clone().unwrap_or_default();
        for (label, list) in [("Limits", &resources.limits), ("Requests", &resources.requests)] {
            if let Some(list) = list.as_ref().filter(|l| !l.is_empty()) {
                w.write(2, &format!("{label}:\n"));
                for (name, q) in list {
                    w.write(3, &format!("{name}:\t{}\n", q.0));
                }
            }
        }
        for (label, p) in [
            ("Liveness", &c.liveness_probe),
            ("Readiness", &c.readiness_probe),
            ("Startup", &c.startup_probe),
        ] {
            if let Some(p) = p {
                w.write(2, &format!("{label}:\t{}\n", probe(p)));
            }
        }
        let env = c.env.as_deref().unwrap_or_default();
        let env_from = c.env_from.as_deref().unwrap_or_default();
        if env.is_empty() && env_from.is_empty() {
            w.write(2, "Environment:\t<none>\n");
        } else {
            if !env_from.is_empty() {
                w.write(2, "Environment Variables from:\n");
                for f in env_from {
                    let prefix = f.prefix.as_deref().filter(|p| !p.is_empty());
                    let (name, kind, optional) = match (&f.config_map_ref, &f.secret_ref) {
                        (Some(c), _) => (c.name.clone(), "ConfigMap", c.optional.unwrap_or(false)),
                        (None, Some(s)) => (s.name.clone(), "Secret", s.optional.unwrap_or(false)),
                        (None, None) => continue,
                    };
                    match prefix {
                        Some(p) => {
                            w.write(3, &format!("{name}\t{kind} with prefix '{p}'\tOptional: {optional}\n"))
                        }
                        None => w.write(3, &format!("{name}\t{kind}\tOptional: {optional}\n")),
                    }
                }
            }
            if env.is_empty() {
                w.write(2, "Environment:\t<none>\n");
            } else {
                w.write(2, "Environment:\n");
                for e in env {
                    w.write(3, &format!("{}\n", env_line(e)));
                }
            }
        }
        let mut mounts = c.volume_mounts.clone().unwrap_or_default();
        if mounts.is_empty() {
            w.write(2, "Mounts:\t<none>\n");
        } else {
            mounts.sort_by(|a, b| a.mount_path.cmp(&b.mount_path));
            w.write(2, "Mounts:\n");
            for m in mounts {
                let mut flags =
                    vec![if m.read_only == Some(true) { "ro".to_owned() } else { "rw".to_owned() }];
                if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    flags.push(format!("path={sub:?}"));
                }
                w.write(3, &format!("{} from {} ({})\n", m.mount_path, m.name, flags.join(",")));
            }
        }
    }
}

fn volumes(w: &mut TabWriter, volumes: &[Volume]) {
    if volumes.is_empty() {
        w.write(0, "Volumes:\t<none>\n");
        return;
    }
    w.write(0, "Volumes:\n");
    for v in volumes {
        w.write(1, &format!("{}:\n", v.name));
        if let Some(h) = &v.host_path {
            w.write(
                2,
                &format!(
                    "Type:\tHostPath (bare host directory volume)\n    Path:\t{}\n    HostPathType:\t{}\n",
                    h.path,
                    h.type_.as_deref().unwrap_or_default()
                ),
            );
        } else if let Some(e) = &v.empty_dir {
            w.write(
                2,
                &format!(
                    "Type:\tEmptyDir (a temporary directory that shares a pod's lifetime)\n    Medium:\t{}\n    \
                     SizeLimit:\t{}\n",
                    e.medium.as_deref().unwrap_or_default(),
                    e.size_limit.as_ref().map_or("<unset>".to_owned(), |q| q.0.clone())
                ),
            );
        } else if let Some(c) = &v.config_map {
            w.write(
                2,
                &format!(
                    "Type:\tConfigMap (a volume populated by a ConfigMap)\n    Name:\t{}\n    Optional:\t{}\n",
                    c.name,
                    c.optional.unwrap_or(false)
                ),
            );
        } else if let Some(s) = &v.secret {
            w.write(
                2,
                &format!(
                    "Type:\tSecret (a volume populated by a Secret)\n    SecretName:\t{}\n    Optional:\t{}\n",
                    s.secret_name.as_deref().unwrap_or_default(),
                    s.optional.unwrap_or(false)
                ),
            );
        } else if let Some(p) = &v.persistent_volume_claim {
            w.write(
                2,
                &format!(
                    "Type:\tPersistentVolumeClaim (a reference to a PersistentVolumeClaim in the same \
                     namespace)\n    ClaimName:\t{}\n    ReadOnly:\t{}\n",
                    p.claim_name,
                    p.read_only.unwrap_or(false)
                ),
            );
        } else if v.projected.is_some() {
            w.write(2, "Type:\tProjected (a volume that contains injected data from multiple sources)\n");
        } else if v.downward_api.is_some() {
            w.write(2, "Type:\tDownwardAPI (a volume populated by information about the pod)\n");
        } else if let Some(e) = &v.ephemeral {
            let class = e
                .volume_claim_template
                .as_ref()
                .and_then(|t| t.spec.storage_class_name.clone())
                .unwrap_or_default();
            w.write(
                2,
                &format!(
                    "Type:\tEphemeralVolume (an inline specification for a volume that gets created and deleted \
                     with the pod)\n    StorageClassName:\t{class}\n"
                ),
            );
        } else if let Some(c) = &v.csi {
            w.write(
                2,
                &format!(
                    "Type:\tCSI (a Container Storage Interface (CSI) volume source)\n    Driver:\t{}\n    \
                     FSType:\t{}\n    ReadOnly:\t{}\n",
                    c.driver,
                    c.fs_type.as_deref().unwrap_or_default(),
                    c.read_only.unwrap_or(false)
                ),
            );
        } else {
            w.write(1, "<unknown>\n");
        }
    }
}

fn tolerations(pod: &Pod) -> Vec<String> {
    let list = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
    list.iter()
        .map(|t| {
            let mut s = t.key.clone().unwrap_or_default();
            if let Some(v) = t.value.as_deref().filter(|v| !v.is_empty()) {
                s.push('=');
                s.push_str(v);
            }
            if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty()) {
                s.push(':');
                s.push_str(e);
            }
            if t.operator.as_deref() == Some("Exists") && t.value.as_deref().unwrap_or_default().is_empty() {
                s.push_str(if s.is_empty() { "op=Exists" } else { " op=Exists" });
            }
            if let Some(secs) = t.toleration_seconds {
                s.push_str(&format!(" for {secs}s"));
            }
            s
        })
        .collect()
}

/// The events of `pod` as kubectl describe lists them.
fn events_section(events: &[&Event], now: Timestamp) -> String {
    let mut w = TabWriter::default();
    if events.is_empty() {
        w.write(0, "Events:\t<none>\n");
        return w.finish();
    }
    w.write(0, "Events:\n  Type\tReason\tAge\tFrom\tMessage\n");
    w.write(1, "----\t------\t----\t----\t-------\n");
    let mut events = events.to_vec();
    events.sort_by_key(|e| last_seen(e));
    for e in events {
        let first = since(first_seen(e).or_else(|| last_seen(e)), now);
        let n = count(e);
        let age = if n > 1 { format!("{} (x{n} over {first})", since(last_seen(e), now)) } else { first };
        let from = e
            .source
            .as_ref()
            .and_then(|s| s.component.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| e.reporting_component.clone())
            .unwrap_or_default();
        w.write(
            1,
            &format!(
                "{}\t{}\t{age}\t{from}\t{}\n",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default().trim()
            ),
        );
    }
    w.finish()
}

/// Whether `e` is about `pod`.
fn is_about(e: &Event, pod: &Pod) -> bool {
    let o = &e.involved_object;
    if o.kind.as_deref().is_some_and(|k| k != "Pod") {
        return false;
    }
    if let (Some(a), Some(b)) = (o.uid.as_deref(), pod.metadata.uid.as_deref()) {
        return a == b;
    }
    o.name == pod.metadata.name
        && o.namespace.as_deref().or(e.metadata.namespace.as_deref())
            == Some(pod.metadata.namespace.as_deref().unwrap_or("default"))
}

/// `kubectl describe pod` of `pod`, with its `events` (`None`: `--show-events=false`).
pub(crate) fn describe_pod(pod: &Pod, events: Option<&[Event]>, now: Timestamp) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let meta = &pod.metadata;
    let mut w = TabWriter::default();
    w.write(0, &format!("Name:\t{}\n", meta.name.as_deref().unwrap_or_default()));
    w.write(0, &format!("Namespace:\t{}\n", meta.namespace.as_deref().unwrap_or("default")));
    if let Some(p) = spec.priority {
        w.write(0, &format!("Priority:\t{p}\n"));
    }
    if let Some(p) = spec.priority_class_name.as_deref().filter(|p| !p.is_empty()) {
        w.write(0, &format!("Priority Class Name:\t{p}\n"));
    }
    if let Some(r) = spec.runtime_class_name.as_deref().filter(|r| !r.is_empty()) {
        w.write(0, &format!("Runtime Class Name:\t{r}\n"));
    }
    if let Some(sa) = spec.service_account_name.as_deref().filter(|s| !s.is_empty()) {
        w.write(0, &format!("Service Account:\t{sa}\n"));
    }
    match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => w.write(0, &format!("Node:\t{n}/{}\n", status.host_ip.as_deref().unwrap_or_default())),
        None => w.write(0, "Node:\t<none>\n"),
    }
    if let Some(t) = &status.start_time {
        w.write(0, &format!("Start Time:\t{}\n", rfc1123z(t.0)));
    }
    multiline(&mut w, "Labels", labels(meta.labels.as_ref()));
    multiline(&mut w, "Annotations", annotations(meta.annotations.as_ref()));
    match &meta.deletion_timestamp {
        Some(t) => {
            w.write(0, &format!("Status:\tTerminating (lasts {})\n", since(Some(t.0), now)));
            w.write(
                0,
                &format!("Termination Grace Period:\t{}s\n", meta.deletion_grace_period_seconds.unwrap_or(0)),
            );
        }
        None => w.write(0, &format!("Status:\t{}\n", status.phase.as_deref().unwrap_or_default())),
    }
    if let Some(r) = status.reason.as_deref().filter(|r| !r.is_empty()) {
        w.write(0, &format!("Reason:\t{r}\n"));
    }
    if let Some(m) = status.message.as_deref().filter(|m| !m.is_empty()) {
        w.write(0, &format!("Message:\t{m}\n"));
    }
    w.write(0, &format!("IP:\t{}\n", status.pod_ip.as_deref().unwrap_or_default()));
    let ips = status.pod_ips.clone().unwrap_or_default();
    if ips.is_empty() {
        w.write(0, "IPs:\t<none>\n");
    } else {
        w.write(0, "IPs:\n");
        for ip in ips {
            w.write(1, &format!("IP:\t{}\n", ip.ip));
        }
    }
    if let Some(owner) = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true)) {
        w.write(0, &format!("Controlled By:\t{}/{}\n", owner.kind, owner.name));
    }
    if let Some(n) = status.nominated_node_name.as_deref().filter(|n| !n.is_empty()) {
        w.write(0, &format!("NominatedNodeName:\t{n}\n"));
    }
    let init = spec.init_containers.clone().unwrap_or_default();
    if !init.is_empty() {
        containers(
            &mut w,
            "Init Containers",
            &init,
            status.init_container_statuses.as_deref().unwrap_or_default(),
        );
    }
    containers(
        &mut w,
        "Containers",
        &spec.containers,
        status.container_statuses.as_deref().unwrap_or_default(),
    );
    let ephemeral: Vec<Container> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| Container {
            name: e.name.clone(),
            image: e.image.clone(),
            command: e.command.clone(),
            args: e.args.clone(),
            env: e.env.clone(),
            volume_mounts: e.volume_mounts.clone(),
            ..Container::default()
        })
        .collect();
    if !ephemeral.is_empty() {
        containers(
            &mut w,
            "Ephemeral Containers",
            &ephemeral,
            status.ephemeral_container_statuses.as_deref().unwrap_or_default(),
        );
    }
    let conditions = status.conditions.clone().unwrap_or_default();
    if !conditions.is_empty() {
        w.write(0, "Conditions:\n  Type\tStatus\n");
        for c in conditions {
            w.write(1, &format!("{} \t{} \n", c.type_, c.status));
        }
    }
    volumes(&mut w, spec.volumes.as_deref().unwrap_or_default());
    w.write(0, &format!("QoS Class:\t{}\n", status.qos_class.as_deref().unwrap_or_default()));
    multiline(&mut w, "Node-Selectors", labels(spec.node_selector.as_ref()));
    multiline(&mut w, "Tolerations", tolerations(pod));
    let mut text = w.finish();
    if let Some(events) = events {
        let mine: Vec<&Event> = events.iter().filter(|e| is_about(e, pod)).collect();
        text.push_str(&events_section(&mine, now));
    }
    text
}

/// `nodelet describe pod [NAME…]`.
pub(crate) async fn run(args: &DescribeArgs, now: Timestamp) -> Result<(), GetError> {
    let get = args.get_args();
    let pods = fetch_pods(&get).await?;
    let pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| {
            get.all_namespaces || p.metadata.namespace.as_deref().unwrap_or("default") == get.namespace
        })
        .collect();
    let mut pods = super::output::select(&get, pods, |p| &p.metadata, super::selector::POD_FIELDS)?;
    pods.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut chosen: Vec<Pod> = Vec::new();
    let mut missing = Vec::new();
    if args.names.is_empty() {
        chosen = pods;
    } else {
        for name in &args.names {
            let exact: Vec<&Pod> =
                pods.iter().filter(|p| p.metadata.name.as_deref() == Some(name.as_str())).collect();
            let found: Vec<&Pod> = if exact.is_empty() {
                pods.iter()
                    .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with(name.as_str())))
                    .collect()
            } else {
                exact
            };
            if found.is_empty() {
                missing.push(name.clone());
            }
            chosen.extend(found.into_iter().cloned());
        }
    }
    let events: Option<Vec<Event>> = if args.show_events {
        // Events are on the main port only: without a token (or with a read-only --server) the pods are
        // described without them, and the reason is said.
        Some(fetch_list(&get, "/api/v1/events").await.unwrap_or_else(|e| {
            eprintln!("warning: events not shown: {e}");
            Vec::new()
        }))
    } else {
        None
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if chosen.is_empty() && missing.is_empty() {
        let msg = if get.all_namespaces {
            "No resources found".to_owned()
        } else {
            format!("No resources found in {} namespace.", get.namespace)
        };
        eprintln!("{msg}");
        return Ok(());
    }
    let texts: Vec<String> = chosen.iter().map(|p| describe_pod(p, events.as_deref(), now)).collect();
    write!(out, "{}", texts.join("\n\n")).map_err(GetError::Output)?;
    out.flush().map_err(GetError::Output)?;
    if missing.is_empty() { Ok(()) } else { Err(GetError::NotFound(missing)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-node1", "namespace": "default", "uid": "u1",
                         "labels": {"app": "web", "tier": "front"},
                         "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"nodeName": "node1", "priority": 0,
                "containers": [{"name": "httpd", "image": "busybox",
                    "command": ["sh", "-c", "httpd -f"],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
                    "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}},
                    "env": [{"name": "MODE", "value": "prod"},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
            "status": {"phase": "Running", "hostIP": "192.0.2.1", "podIP": "198.18.0.5", "podIPs": [{"ip": "198.18.0.5"}],
                "startTime": "2024-05-01T11:56:00Z", "qosClass": "Burstable",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "httpd", "ready": true, "restartCount": 1, "image": "busybox",
                    "imageID": "sha256:abc", "containerID": "containerd://c1",
                    "state": {"running": {"startedAt": "2024-05-01T11:57:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                        "startedAt": "2024-05-01T11:56:00Z", "finishedAt": "2024-05-01T11:56:30Z"}}}]}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn events() -> Vec<Event> {
        serde_json::from_value(serde_json::json!([
            {"metadata": {"name": "a"}, "involvedObject": {"kind": "Pod", "name": "web-node1", "uid": "u1"},
             "type": "Normal", "reason": "Started", "message": "Started container httpd", "count": 2,
             "firstTimestamp": "2024-05-01T11:56:00Z", "lastTimestamp": "2024-05-01T11:57:00Z",
             "source": {"component": "nodelet"}},
            {"metadata": {"name": "b"}, "involvedObject": {"kind": "Pod", "name": "other", "uid": "u2"},
             "type": "Warning", "reason": "BackOff", "message": "not mine"}
        ]))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn describe_pod_has_kubectls_sections_and_layout() {
        let text = describe_pod(&pod(), Some(&events()), now());
        let expected = "\
Name:         web-node1
Namespace:    default
Priority:     0
Node:         node1/192.0.2.1
Start Time:   Wed, 01 May 2024 11:56:00 +0000
Labels:       app=web
              tier=front
Annotations:  kubernetes.io/config.source: file
Status:       Running
IP:           198.18.0.5
IPs:
  IP:  198.18.0.5
Containers:
  httpd:
    Container ID:  containerd://c1
    Image:         busybox
    Image ID:      sha256:abc
    Port:          8080/TCP
    Host Port:     0/TCP
    Command:
      sh
      -c
      httpd -f
    State:          Running
      Started:      Wed, 01 May 2024 11:57:00 +0000
    Last State:     Terminated
      Reason:       Error
      Exit Code:    1
      Started:      Wed, 01 May 2024 11:56:00 +0000
      Finished:     Wed, 01 May 2024 11:56:30 +0000
    Ready:          True
    Restart Count:  1
    Limits:
      cpu:     500m
      memory:  64Mi
    Requests:
      cpu:      100m
    Liveness:   http-get http://:8080/healthz delay=0s timeout=1s period=5s #success=1 #failure=3
    Readiness:  exec [cat /tmp/ready] delay=0s timeout=1s period=10s #success=1 #failure=3
    Environment:
      MODE:  prod
      POD:    (v1:metadata.name)
    Mounts:
      /data from data (ro)
Conditions:
  Type    Status
  Ready   True 
Volumes:
  data:
    Type:        EmptyDir (a temporary directory that shares a pod's lifetime)
    Medium:      
    SizeLimit:   <unset>
QoS Class:       Burstable
Node-Selectors:  <none>
Tolerations:     node.kubernetes.io/not-ready:NoExecute op=Exists for 300s
Events:
  Type    Reason   Age              From     Message
  ----    ------   ----             ----     -------
  Normal  Started  3m (x2 over 4m)  nodelet  Started container httpd
";
        assert_eq!(text, expected, "got:\n{text}");
        let quiet = describe_pod(&pod(), Some(&[]), now());
        assert!(quiet.ends_with("Events:  <none>\n"), "{quiet}");
        assert!(!describe_pod(&pod(), None, now()).contains("Events:"));
    }

    #[test]
    fn the_tabwriter_aligns_column_blocks_like_gos() {
        let mut w = TabWriter::default();
        w.write(0, "a:\t1\nlonger:\t2\nno tabs here\nb:\t3\n");
        assert_eq!(w.finish(), "a:       1\nlonger:  2\nno tabs here\nb:  3\n");
    }
}

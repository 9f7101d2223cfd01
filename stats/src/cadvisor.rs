//! `/metrics/cadvisor`: the cAdvisor `container_*` and `machine_*` series the kubelet serves there, built
//! from the summary (no reader of its own: [`families`] is a pure function of a [`Summary`], so a cached
//! summary serves as well as a fresh one).
//!
//! The "containers" are cAdvisor's: the machine (`id="/"`), each pod's cgroup (`container=""`, the
//! pod's `pod` and `namespace`) and each running container. Labels are cAdvisor's as the kubelet sets
//! them (`container`, `id` = the cgroup path, `image`, `name` = the runtime's container ID, `namespace`,
//! `pod`; `cpu="total"` on CPU, `interface` on network series), empty where they do not apply, so every
//! series of a family has the same label names. Samples carry the time of their stats.
//!
//! | Family | From |
//! |---|---|
//! | `container_cpu_usage_seconds_total` | `cpu.usageCoreNanoSeconds` |
//! | `container_memory_usage_bytes`, `_working_set_bytes`, `container_memory_rss` | `memory.usageBytes`, `workingSetBytes`, `rssBytes` |
//! | `container_network_{receive,transmit}_{bytes,errors}_total` | the node's and pods' `network.interfaces` |
//! | `container_start_time_seconds` | `startTime` (the container's creation, the pod sandbox's, the node's boot) |
//! | `container_last_seen` | the scrape time |
//! | `machine_cpu_cores`, `machine_memory_bytes` | the node's capacity (`boot_id`, `machine_id`, `system_uuid` labels) |
//! | `container_scrape_error` | 1 when there was no summary |
//!
//! Only what the summary has is written: a value the runtime did not give is left out, never written
//! as 0. Not written (nodelet does not measure them): filesystem usage per container
//! (`container_fs_*`, which needs the device name), packets, CPU user/system split, throttling, disk
//! I/O, per-CPU usage.

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::summary::{CpuStats, InterfaceStats, MemoryStats, NetworkStats, Summary, Time};

/// The machine, as the `machine_*` series show it (read once at start-up).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    /// Logical CPUs (the node's `cpu` capacity).
    pub cpu_cores: Option<u64>,
    /// Installed memory in bytes (`MemTotal`, the node's `memory` capacity).
    pub memory_bytes: Option<u64>,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// The firmware's system UUID.
    pub system_uuid: String,
}

/// The labels cAdvisor puts on every container series, in the order they are written (sorted by name,
/// as the Prometheus client writes them).
#[derive(Debug, Clone, Copy)]
struct Who<'a> {
    container: &'a str,
    id: &'a str,
    image: &'a str,
    name: &'a str,
    namespace: &'a str,
    pod: &'a str,
}

impl Who<'_> {
    /// The labels, with `extra` (`cpu`, `interface`) put in name order.
    fn labels(&self, extra: Option<(&str, &str)>) -> Vec<LabelPair> {
        let mut pairs = vec![
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ];
        if let Some(e) = extra {
            pairs.push(e);
            pairs.sort_by(|a, b| a.0.cmp(b.0));
        }
        pairs.into_iter().map(|(k, v)| label(k, v)).collect()
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_owned());
    l.set_value(value.to_owned());
    l
}

/// One family being filled.
struct Family {
    family: MetricFamily,
}

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut family = MetricFamily::default();
        family.set_name(name.to_owned());
        family.set_help(help.to_owned());
        family.set_field_type(kind);
        Self { family }
    }

    fn add(&mut self, labels: Vec<LabelPair>, value: f64, time: Option<Time>) {
        let mut m = Metric::default();
        m.set_label(labels);
        match self.family.get_field_type() {
            MetricType::COUNTER => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            _ => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        if let Some(t) = time.filter(|t| t.0 > 0) {
            m.set_timestamp_ms(t.unix_millis());
        }
        self.family.mut_metric().push(m);
    }
}

#[allow(clippy::cast_precision_loss)] // byte and nanosecond counts as floats, as cAdvisor
fn float(v: u64) -> f64 {
    v as f64
}

/// All the families the summary fills.
struct Families {
    cpu: Family,
    mem_usage: Family,
    mem_ws: Family,
    mem_rss: Family,
    rx_bytes: Family,
    rx_errors: Family,
    tx_bytes: Family,
    tx_errors: Family,
    start: Family,
    last_seen: Family,
}

impl Families {
    fn new() -> Self {
        use MetricType::{COUNTER, GAUGE};
        Self {
            cpu: Family::new(
                "container_cpu_usage_seconds_total",
                "Cumulative cpu time consumed in seconds.",
                COUNTER,
            ),
            mem_usage: Family::new(
                "container_memory_usage_bytes",
                "Current memory usage in bytes, including all memory regardless of when it was accessed",
                GAUGE,
            ),
            mem_ws: Family::new("container_memory_working_set_bytes", "Current working set in bytes.", GAUGE),
            mem_rss: Family::new("container_memory_rss", "Size of RSS in bytes.", GAUGE),
            rx_bytes: Family::new(
                "container_network_receive_bytes_total",
                "Cumulative count of bytes received",
                COUNTER,
            ),
            rx_errors: Family::new(
                "container_network_receive_errors_total",
                "Cumulative count of errors encountered while receiving",
                COUNTER,
            ),
            tx_bytes: Family::new(
                "container_network_transmit_bytes_total",
                "Cumulative count of bytes transmitted",
                COUNTER,
            ),
            tx_errors: Family::new(
                "container_network_transmit_errors_total",
                "Cumulative count of errors encountered while transmitting",
                COUNTER,
            ),
            start: Family::new(
                "container_start_time_seconds",
                "Start time of the container since unix epoch in seconds.",
                GAUGE,
            ),
            last_seen: Family::new(
                "container_last_seen",
                "Last time a container was seen by the exporter",
                GAUGE,
            ),
        }
    }

    fn container(
        &mut self,
        who: Who<'_>,
        cpu: Option<&CpuStats>,
        memory: Option<&MemoryStats>,
        start: Time,
        now: Time,
    ) {
        if let Some(c) = cpu
            && let Some(ns) = c.usage_core_nano_seconds
        {
            self.cpu.add(who.labels(Some(("cpu", "total"))), float(ns) / 1e9, Some(c.time));
        }
        if let Some(m) = memory {
            for (family, value) in [
                (&mut self.mem_usage, m.usage_bytes),
                (&mut self.mem_ws, m.working_set_bytes),
                (&mut self.mem_rss, m.rss_bytes),
            ] {
                if let Some(v) = value {
                    family.add(who.labels(None), float(v), Some(m.time));
                }
            }
        }
        if start.0 > 0 {
            self.start.add(who.labels(None), float(u64::try_from(start.unix_seconds()).unwrap_or(0)), None);
        }
        self.last_seen.add(
            who.labels(None),
            float(u64::try_from(now.unix_seconds()).unwrap_or(0)),
            Some(now),
        );
    }

    fn network(&mut self, who: Who<'_>, network: Option<&NetworkStats>) {
        let Some(n) = network else { return };
        // Every interface; a runtime that lists none gives its default one.
        let interfaces: Vec<&InterfaceStats> = if n.interfaces.is_empty() {
            std::iter::once(&n.default).filter(|i| !i.name.is_empty()).collect()
        } else {
            n.interfaces.iter().collect()
        };
        for i in interfaces {
            for (family, value) in [
                (&mut self.rx_bytes, i.rx_bytes),
                (&mut self.rx_errors, i.rx_errors),
                (&mut self.tx_bytes, i.tx_bytes),
                (&mut self.tx_errors, i.tx_errors),
            ] {
                if let Some(v) = value {
                    family.add(who.labels(Some(("interface", &i.name))), float(v), Some(n.time));
                }
            }
        }
    }

    fn into_vec(self) -> Vec<MetricFamily> {
        [
            self.cpu,
            self.last_seen,
            self.mem_rss,
            self.mem_usage,
            self.mem_ws,
            self.rx_bytes,
            self.rx_errors,
            self.tx_bytes,
            self.tx_errors,
            self.start,
        ]
        .into_iter()
        .map(|f| f.family)
        .collect()
    }
}

/// The `/metrics/cadvisor` families of `summary` (`Err`: no summary, only the machine and
/// `container_scrape_error 1`) at scrape time `now`. Families without a series are left out.
pub fn families(
    summary: Result<&Summary, &dyn std::fmt::Display>,
    machine: &Machine,
    now: Time,
) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    let scrape_error = match summary {
        Ok(s) => {
            let mut f = Families::new();
            let node = &s.node;
            let root = Who { container: "", id: "/", image: "", name: "", namespace: "", pod: "" };
            f.container(root, node.cpu.as_ref(), node.memory.as_ref(), node.start_time, now);
            f.network(root, node.network.as_ref());
            for p in &s.pods {
                let (pod, namespace) = (p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str());
                let id = p.cgroup.as_deref().unwrap_or_default();
                let who = Who { container: "", id, image: "", name: "", namespace, pod };
                f.container(who, p.cpu.as_ref(), p.memory.as_ref(), p.start_time, now);
                f.network(who, p.network.as_ref());
                for c in &p.containers {
                    let who = Who {
                        container: &c.name,
                        id: c.runtime.cgroup.as_deref().unwrap_or_default(),
                        image: &c.runtime.image,
                        name: &c.runtime.id,
                        namespace,
                        pod,
                    };
                    f.container(who, c.cpu.as_ref(), c.memory.as_ref(), c.start_time, now);
                }
            }
            out.extend(f.into_vec());
            0.0
        }
        Err(e) => {
            tracing::warn!(error = %e, "cadvisor metrics: no summary");
            1.0
        }
    };
    let mut err = Family::new(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        MetricType::GAUGE,
    );
    err.add(Vec::new(), scrape_error, None);
    out.push(err.family);
    let machine_labels = || {
        vec![
            label("boot_id", &machine.boot_id),
            label("machine_id", &machine.machine_id),
            label("system_uuid", &machine.system_uuid),
        ]
    };
    for (name, help, value) in [
        ("machine_cpu_cores", "Number of logical CPU cores.", machine.cpu_cores),
        ("machine_memory_bytes", "Amount of memory installed on the machine.", machine.memory_bytes),
    ] {
        if let Some(v) = value {
            let mut f = Family::new(name, help, MetricType::GAUGE);
            f.add(machine_labels(), float(v), None);
            out.push(f.family);
        }
    }
    out.retain(|f| !f.get_metric().is_empty());
    out.sort_by(|a, b| a.name().cmp(b.name()));
    out
}

/// `families` in the Prometheus text format (version 0.0.4).
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(families, &mut out) {
        tracing::warn!(error = %e, "could not encode the cadvisor metrics");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::summary::{ContainerRuntimeInfo, ContainerStats, NodeStats, PodReference, PodStats};
    use super::*;

    const T: Time = Time(1_700_000_000_000_000_000);

    fn summary() -> Summary {
        Summary {
            node: NodeStats {
                start_time: Time(1_600_000_000_000_000_000),
                cpu: Some(CpuStats {
                    time: T,
                    usage_nano_cores: None,
                    usage_core_nano_seconds: Some(7_000_000_000),
                }),
                memory: Some(MemoryStats {
                    time: T,
                    usage_bytes: Some(4096),
                    working_set_bytes: Some(2048),
                    ..MemoryStats::default()
                }),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "web".into(), namespace: "default".into(), uid: "u1".into() },
                start_time: Time(1_650_000_000_000_000_000),
                cgroup: Some("/nodelet/podu1".into()),
                cpu: Some(CpuStats {
                    time: T,
                    usage_nano_cores: None,
                    usage_core_nano_seconds: Some(3_000_000_000),
                }),
                network: Some(NetworkStats {
                    time: T,
                    default: InterfaceStats { name: "eth0".into(), ..InterfaceStats::default() },
                    interfaces: vec![InterfaceStats {
                        name: "eth0".into(),
                        rx_bytes: Some(100),
                        rx_errors: Some(0),
                        tx_bytes: Some(200),
                        tx_errors: None,
                    }],
                }),
                containers: vec![ContainerStats {
                    name: "app".into(),
                    start_time: Time(1_660_000_000_000_000_000),
                    cpu: Some(CpuStats {
                        time: T,
                        usage_nano_cores: Some(1),
                        usage_core_nano_seconds: Some(2_500_000_000),
                    }),
                    memory: Some(MemoryStats {
                        time: T,
                        usage_bytes: Some(300),
                        working_set_bytes: Some(200),
                        rss_bytes: Some(100),
                        ..MemoryStats::default()
                    }),
                    runtime: ContainerRuntimeInfo {
                        id: "abc".into(),
                        image: "busybox:1.36".into(),
                        cgroup: Some("/nodelet/podu1/abc".into()),
                    },
                    ..ContainerStats::default()
                }],
                ..PodStats::default()
            }],
        }
    }

    fn machine() -> Machine {
        Machine {
            cpu_cores: Some(2),
            memory_bytes: Some(8 << 30),
            boot_id: "b".into(),
            machine_id: "m".into(),
            system_uuid: String::new(),
        }
    }

    #[test]
    fn series_have_cadvisor_names_labels_and_the_summary_values() {
        let now = Time(1_700_000_005_000_000_000);
        let text = encode(&families(Ok(&summary()), &machine(), now));
        let app = r#"container="app",cpu="total",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web""#;
        for line in [
            format!("container_cpu_usage_seconds_total{{{app}}} 2.5 1700000000000"),
            r#"container_memory_working_set_bytes{container="app",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web"} 200 1700000000000"#.to_owned(),
            r#"container_memory_rss{container="app",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web"} 100 1700000000000"#.to_owned(),
            r#"container_memory_usage_bytes{container="app",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web"} 300 1700000000000"#.to_owned(),
            r#"container_start_time_seconds{container="app",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web"} 1660000000"#.to_owned(),
            r#"container_last_seen{container="app",id="/nodelet/podu1/abc",image="busybox:1.36",name="abc",namespace="default",pod="web"} 1700000005 1700000005000"#.to_owned(),
            // The pod's cgroup: CPU and the network per interface.
            r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/nodelet/podu1",image="",name="",namespace="default",pod="web"} 3 1700000000000"#.to_owned(),
            r#"container_network_receive_bytes_total{container="",id="/nodelet/podu1",image="",interface="eth0",name="",namespace="default",pod="web"} 100 1700000000000"#.to_owned(),
            r#"container_network_transmit_bytes_total{container="",id="/nodelet/podu1",image="",interface="eth0",name="",namespace="default",pod="web"} 200 1700000000000"#.to_owned(),
            // The machine.
            r#"container_cpu_usage_seconds_total{container="",cpu="total",id="/",image="",name="",namespace="",pod=""} 7 1700000000000"#.to_owned(),
            r#"container_memory_working_set_bytes{container="",id="/",image="",name="",namespace="",pod=""} 2048 1700000000000"#.to_owned(),
            r#"machine_cpu_cores{boot_id="b",machine_id="m",system_uuid=""} 2"#.to_owned(),
            r#"machine_memory_bytes{boot_id="b",machine_id="m",system_uuid=""} 8589934592"#.to_owned(),
            "container_scrape_error 0".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"), "{text}");
        assert!(text.contains("# TYPE container_memory_working_set_bytes gauge\n"), "{text}");
    }

    #[test]
    fn what_is_not_measured_is_left_out() {
        let mut s = summary();
        s.pods[0].containers[0].memory = None;
        s.pods[0].network = None;
        s.node.memory = None;
        let text = encode(&families(Ok(&s), &Machine::default(), T));
        assert!(!text.contains("container_memory_"), "no memory series without memory stats:\n{text}");
        assert!(!text.contains("container_network_"), "{text}");
        assert!(!text.contains("machine_"), "unknown machine facts are left out:\n{text}");
        // The pod's tx_errors was not given: no series, not a 0.
        let text = encode(&families(Ok(&summary()), &machine(), T));
        assert!(!text.contains("container_network_transmit_errors_total{"), "{text}");
        assert!(text.contains("container_network_receive_errors_total{"), "{text}");
    }

    #[test]
    fn without_a_summary_only_the_error_and_the_machine() {
        let text = encode(&families(Err(&"runtime down"), &machine(), T));
        assert!(text.contains("container_scrape_error 1\n"), "{text}");
        assert!(text.contains("machine_cpu_cores{"), "{text}");
        assert!(!text.contains("container_cpu_usage_seconds_total"), "{text}");
    }
}

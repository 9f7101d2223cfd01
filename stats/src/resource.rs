//! `/metrics/resource`: the kubelet's resource metrics (`pkg/kubelet/metrics/collectors/resource_metrics.go`),
//! computed from the summary, in the Prometheus text format with the samples' own timestamps.

use std::fmt::Write as _;

use super::summary::{CpuStats, MemoryStats, Summary, Time};

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64, time: Option<Time>) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = match time {
            Some(t) if t.0 > 0 => writeln!(self.out, " {value} {}", t.unix_millis()),
            _ => writeln!(self.out, " {value}"),
        };
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn header<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    Family { out }
}

fn cpu_seconds(c: &Option<CpuStats>) -> Option<(f64, Time)> {
    let c = c.as_ref()?;
    #[allow(clippy::cast_precision_loss)] // nanoseconds as float seconds, as the kubelet
    Some((c.usage_core_nano_seconds? as f64 / 1e9, c.time))
}

fn working_set(m: &Option<MemoryStats>) -> Option<(f64, Time)> {
    let m = m.as_ref()?;
    #[allow(clippy::cast_precision_loss)]
    Some((m.working_set_bytes? as f64, m.time))
}

/// The resource metrics of `summary`; on an error only the scrape error gauges (set to 1).
pub fn encode(summary: Result<&Summary, &dyn std::fmt::Display>) -> String {
    let mut out = String::new();
    let s = match summary {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "resource metrics: no summary");
            None
        }
    };
    if let Some(s) = s {
        let containers = || {
            s.pods.iter().flat_map(|p| {
                p.containers.iter().map(move |c| (c, p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str()))
            })
        };
        let mut f = header(
            &mut out,
            "container_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        );
        for (c, pod, ns) in containers() {
            if let Some((v, t)) = cpu_seconds(&c.cpu) {
                f.sample(
                    "container_cpu_usage_seconds_total",
                    &[("container", &c.name), ("namespace", ns), ("pod", pod)],
                    v,
                    Some(t),
                );
            }
        }
        let mut f = header(
            &mut out,
            "container_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the container in bytes",
        );
        for (c, pod, ns) in containers() {
            if let Some((v, t)) = working_set(&c.memory) {
                f.sample(
                    "container_memory_working_set_bytes",
                    &[("container", &c.name), ("namespace", ns), ("pod", pod)],
                    v,
                    Some(t),
                );
            }
        }
        let mut f = header(
            &mut out,
            "container_start_time_seconds",
            "gauge",
            "[STABLE] Start time of the container since unix epoch in seconds",
        );
        for (c, pod, ns) in containers() {
            #[allow(clippy::cast_precision_loss)]
            let start = c.start_time.0 as f64 / 1e9;
            f.sample(
                "container_start_time_seconds",
                &[("container", &c.name), ("namespace", ns), ("pod", pod)],
                start,
                None,
            );
        }
        let mut f = header(
            &mut out,
            "node_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        );
        if let Some((v, t)) = cpu_seconds(&s.node.cpu) {
            f.sample("node_cpu_usage_seconds_total", &[], v, Some(t));
        }
        let mut f = header(
            &mut out,
            "node_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the node in bytes",
        );
        if let Some((v, t)) = working_set(&s.node.memory) {
            f.sample("node_memory_working_set_bytes", &[], v, Some(t));
        }
        let mut f = header(
            &mut out,
            "pod_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        );
        for p in &s.pods {
            if let Some((v, t)) = cpu_seconds(&p.cpu) {
                let labels = [("namespace", p.pod_ref.namespace.as_str()), ("pod", p.pod_ref.name.as_str())];
                f.sample("pod_cpu_usage_seconds_total", &labels, v, Some(t));
            }
        }
        let mut f = header(
            &mut out,
            "pod_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the pod in bytes",
        );
        for p in &s.pods {
            if let Some((v, t)) = working_set(&p.memory) {
                let labels = [("namespace", p.pod_ref.namespace.as_str()), ("pod", p.pod_ref.name.as_str())];
                f.sample("pod_memory_working_set_bytes", &labels, v, Some(t));
            }
        }
    }
    let failed = if s.is_some() { 0.0 } else { 1.0 };
    header(
        &mut out,
        "resource_scrape_error",
        "gauge",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    )
    .sample("resource_scrape_error", &[], failed, None);
    header(
        &mut out,
        "scrape_error",
        "gauge",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
    )
    .sample("scrape_error", &[], failed, None);
    out
}

#[cfg(test)]
mod tests {
    use super::super::summary::{ContainerStats, NodeStats, PodReference, PodStats};
    use super::*;

    #[test]
    fn metrics_carry_the_summary_values() {
        let t = Time(1_700_000_000_000_000_000);
        let s = Summary {
            node: NodeStats {
                cpu: Some(CpuStats {
                    time: t,
                    usage_nano_cores: None,
                    usage_core_nano_seconds: Some(2_500_000_000),
                }),
                memory: Some(MemoryStats {
                    time: t,
                    working_set_bytes: Some(1024),
                    ..MemoryStats::default()
                }),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "web".into(), namespace: "default".into(), uid: "u".into() },
                containers: vec![ContainerStats {
                    name: "app\"x".into(),
                    start_time: Time(1_600_000_000_000_000_000),
                    memory: Some(MemoryStats {
                        time: t,
                        working_set_bytes: Some(42),
                        ..MemoryStats::default()
                    }),
                    ..ContainerStats::default()
                }],
                ..PodStats::default()
            }],
        };
        let text = encode(Ok(&s));
        assert!(text.contains("node_cpu_usage_seconds_total 2.5 1700000000000\n"), "{text}");
        assert!(text.contains("node_memory_working_set_bytes 1024 1700000000000\n"), "{text}");
        assert!(
            text.contains(
                "container_memory_working_set_bytes{container=\"app\\\"x\",namespace=\"default\",pod=\"web\"} 42 "
            ),
            "{text}"
        );
        assert!(text.contains("container_start_time_seconds{container=\"app\\\"x\",namespace=\"default\",pod=\"web\"} 1600000000\n"), "{text}");
        assert!(text.contains("resource_scrape_error 0\n"));
        let failed = encode(Err(&"runtime down"));
        assert!(failed.contains("resource_scrape_error 1\n") && !failed.contains("node_cpu"), "{failed}");
    }
}

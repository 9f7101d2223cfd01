//! `nodelet get nodes`: the node with its status and pressure conditions, like `kubectl get nodes`
//! (plus a PRESSURE column: the pressure conditions that are true); `-o wide` adds kubectl's INTERNAL-IP,
//! EXTERNAL-IP, OS-IMAGE, KERNEL-VERSION and CONTAINER-RUNTIME before it.

use std::io::Write;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use super::get::{GetError, fetch_list};
use super::pods::human_duration_since;
use crate::args::{GetArgs, OutputFormat};

/// Whether a `get` resource argument names nodes.
pub(crate) fn is_nodes(resource: &str) -> bool {
    matches!(resource, "nodes" | "node" | "no")
}

fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a str> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind).map(|c| c.status.as_str())
}

/// The table's columns: kubectl's (its `-o wide` columns when `wide`), then PRESSURE.
fn headers(wide: bool) -> Vec<&'static str> {
    let mut h = vec!["NAME", "STATUS", "ROLES", "AGE", "VERSION"];
    if wide {
        h.extend(["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]);
    }
    h.push("PRESSURE");
    h
}

/// The first address of type `kind`, `<none>` without one (as kubectl prints it).
fn address(node: &Node, kind: &str) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == kind))
        .map_or_else(|| "<none>".to_owned(), |a| a.address.clone())
}

/// One table row, the cells of [`headers`].
pub(crate) fn node_row(node: &Node, now: Timestamp, wide: bool) -> Vec<String> {
    let status = match condition(node, "Ready") {
        Some("True") => "Ready",
        Some("False") => "NotReady",
        _ => "Unknown",
    };
    let pressure: Vec<&str> = ["MemoryPressure", "DiskPressure", "PIDPressure"]
        .into_iter()
        .filter(|c| condition(node, c) == Some("True"))
        .collect();
    let roles: Vec<&str> = node
        .metadata
        .labels
        .iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
        .collect();
    let info = node.status.as_ref().and_then(|s| s.node_info.clone()).unwrap_or_default();
    let mut row = vec![
        node.metadata.name.clone().unwrap_or_default(),
        status.to_owned(),
        if roles.is_empty() { "<none>".to_owned() } else { roles.join(",") },
        node.metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(|| "<unknown>".to_owned(), |t| human_duration_since(t.0, now)),
        info.kubelet_version.clone(),
    ];
    if wide {
        let or_unknown = |s: String| if s.is_empty() { "<unknown>".to_owned() } else { s };
        row.extend([
            address(node, "InternalIP"),
            address(node, "ExternalIP"),
            or_unknown(info.os_image),
            or_unknown(info.kernel_version),
            or_unknown(info.container_runtime_version),
        ]);
    }
    row.push(if pressure.is_empty() { "<none>".to_owned() } else { pressure.join(",") });
    row
}

/// Prints `nodes` as `args` asks.
pub(crate) fn print_nodes(
    args: &GetArgs,
    nodes: Vec<Node>,
    now: Timestamp,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), GetError> {
    let mut missing = Vec::new();
    let nodes = super::output::select(args, nodes, |n| &n.metadata, super::selector::META_FIELDS)?;
    let nodes: Vec<Node> = if args.names.is_empty() {
        nodes
    } else {
        let mut picked = Vec::new();
        for name in &args.names {
            match nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name.as_str())) {
                Some(n) => picked.push(n.clone()),
                None => missing.push(name.clone()),
            }
        }
        picked
    };
    let io = GetError::Output;
    match &args.output {
        None | Some(OutputFormat::Wide) => {
            if nodes.is_empty() && missing.is_empty() {
                writeln!(err, "No resources found").map_err(io)?;
            } else if !nodes.is_empty() {
                let wide = args.output == Some(OutputFormat::Wide);
                let rows: Vec<Vec<String>> = nodes.iter().map(|n| node_row(n, now, wide)).collect();
                write!(out, "{}", super::output::table(args, &headers(wide), &rows)).map_err(io)?;
            }
        }
        Some(format) => {
            let text =
                super::output::render(args, format, ("v1", "Node", "node"), super::output::values(&nodes)?)?;
            write!(out, "{text}").map_err(io)?;
        }
    }
    out.flush().map_err(io)?;
    if missing.is_empty() { Ok(()) } else { Err(GetError::Missing { kind: "node", names: missing }) }
}

/// Fetches `/api/v1/nodes` and prints it.
pub(crate) async fn run(args: &GetArgs, now: Timestamp) -> Result<(), GetError> {
    let nodes: Vec<Node> = fetch_list(args, "/api/v1/nodes").await?;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    print_nodes(args, nodes, now, &mut stdout.lock(), &mut stderr.lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> GetArgs {
        let mut v = vec!["nodelet", "get", "nodes"];
        v.extend_from_slice(flags);
        match crate::args::Cli::try_parse_from(v).map(crate::args::Cli::into_command) {
            Ok(crate::args::Command::Get(g)) => g,
            other => panic!("{other:?}"),
        }
    }

    fn node() -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node1", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "status": {
                "nodeInfo": {"kubeletVersion": "nodelet/v0.1.0", "architecture": "", "bootID": "",
                    "containerRuntimeVersion": "containerd://1.7.24", "kernelVersion": "6.1.0-28-amd64",
                    "kubeProxyVersion": "", "machineID": "",
                    "operatingSystem": "", "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": ""},
                "addresses": [
                    {"type": "InternalIP", "address": "192.0.2.7"},
                    {"type": "Hostname", "address": "node1"}
                ],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "DiskPressure", "status": "True"},
                    {"type": "PIDPressure", "status": "False"},
                    {"type": "Ready", "status": "True"}
                ]
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_table_shows_readiness_and_the_pressure_conditions() {
        let now = "2024-05-01T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_nodes(&args(&[]), vec![node()], now, &mut out, &mut err).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "PRESSURE"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["node1", "Ready", "<none>", "60m", "nodelet/v0.1.0", "DiskPressure"]
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_nodes(&args(&["node1", "-o", "yaml"]), vec![node()], now, &mut out, &mut err)
            .unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("type: DiskPressure") && text.contains("status: \"True\""), "{text}");
        let r = print_nodes(&args(&["other"]), vec![node()], now, &mut Vec::new(), &mut Vec::new());
        assert!(matches!(r, Err(GetError::Missing { kind: "node", .. })));
    }

    #[test]
    fn the_wide_table_adds_kubectls_address_and_system_columns() {
        let now = "2024-05-01T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_nodes(&args(&["-o", "wide"]), vec![node()], now, &mut out, &mut err)
            .unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAME",
                "STATUS",
                "ROLES",
                "AGE",
                "VERSION",
                "INTERNAL-IP",
                "EXTERNAL-IP",
                "OS-IMAGE",
                "KERNEL-VERSION",
                "CONTAINER-RUNTIME",
                "PRESSURE"
            ]
        );
        // Columns line up under their headers (the OS image has spaces in it).
        let column = |h: &str| lines[0].find(h).unwrap_or(usize::MAX);
        let cell =
            |h: &str| lines[1].get(column(h)..).and_then(|s| s.split("   ").next()).unwrap_or_default();
        assert_eq!(cell("INTERNAL-IP").trim(), "192.0.2.7");
        assert_eq!(cell("EXTERNAL-IP").trim(), "<none>");
        assert_eq!(cell("OS-IMAGE").trim(), "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(cell("KERNEL-VERSION").trim(), "6.1.0-28-amd64");
        assert_eq!(cell("CONTAINER-RUNTIME").trim(), "containerd://1.7.24");
        assert_eq!(cell("PRESSURE").trim(), "DiskPressure");
        // Without facts (an older nodelet) the wide cells say so.
        let mut bare = node();
        if let Some(s) = bare.status.as_mut() {
            s.addresses = None;
            if let Some(i) = s.node_info.as_mut() {
                i.os_image.clear();
                i.kernel_version.clear();
                i.container_runtime_version.clear();
            }
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_nodes(&args(&["-o", "wide"]), vec![bare], now, &mut out, &mut err)
            .unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out);
        let row: Vec<&str> = text.lines().nth(1).unwrap_or_default().split_whitespace().collect();
        assert_eq!(row[5..], ["<none>", "<none>", "<unknown>", "<unknown>", "<unknown>", "DiskPressure"]);
    }
}

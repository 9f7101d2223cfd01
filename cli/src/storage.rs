//! `nodelet get pv|pvc|storageclass|csinode`: kubectl-like tables of PersistentVolumes, claims, classes
//! and the node's CSINode (its registered CSI drivers).

use std::io::Write;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::get::{GetError, fetch_list, print_warnings};
use super::pods::human_duration_since;
use super::selector::META_FIELDS;
use crate::args::{GetArgs, OutputFormat};

/// The storage kind a `get` resource argument names, if it names one.
pub(crate) fn kind_of(resource: &str) -> Option<&'static str> {
    match resource {
        "pv" | "persistentvolume" | "persistentvolumes" => Some("pv"),
        "pvc" | "persistentvolumeclaim" | "persistentvolumeclaims" => Some("pvc"),
        "sc" | "storageclass" | "storageclasses" => Some("sc"),
        "csinode" | "csinodes" => Some("csinode"),
        _ => None,
    }
}

fn age(meta: &ObjectMeta, now: Timestamp) -> String {
    meta.creation_timestamp
        .as_ref()
        .map(|t| human_duration_since(t.0, now))
        .unwrap_or_else(|| "<unknown>".to_owned())
}

fn modes(modes: Option<&Vec<String>>) -> String {
    modes
        .into_iter()
        .flatten()
        .map(|m| match m.as_str() {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn or_blank(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("").to_owned()
}

/// Prints `items` as `args` asks: the table from `row`, or JSON/YAML/names. Names not found
/// are reported after the others.
#[allow(clippy::too_many_arguments)]
fn print<T: Serialize>(
    args: &GetArgs,
    kind: &'static str,
    api: (&str, &str, &str),
    items: Vec<T>,
    meta: impl Fn(&T) -> &ObjectMeta,
    headers: &[&str],
    row: impl Fn(&T) -> Vec<String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), GetError> {
    let mut missing = Vec::new();
    let items = super::output::select(args, items, &meta, META_FIELDS)?;
    let items: Vec<T> = if args.names.is_empty() {
        items
    } else {
        let mut picked = Vec::new();
        let mut items: Vec<Option<T>> = items.into_iter().map(Some).collect();
        for name in &args.names {
            match items.iter_mut().find(|i| i.as_ref().is_some_and(|i| meta(i).name.as_deref() == Some(name)))
            {
                Some(slot) => picked.extend(slot.take()),
                None => missing.push(name.clone()),
            }
        }
        picked
    };
    let io = GetError::Output;
    match &args.output {
        None | Some(OutputFormat::Wide) => {
            if items.is_empty() && missing.is_empty() {
                writeln!(err, "No resources found").map_err(io)?;
            } else if !items.is_empty() {
                let rows: Vec<Vec<String>> = items.iter().map(&row).collect();
                write!(out, "{}", super::output::table(args, headers, &rows)).map_err(io)?;
            }
        }
        Some(format) => {
            let text = super::output::render(args, format, api, super::output::values(&items)?)?;
            write!(out, "{text}").map_err(io)?;
        }
    }
    if missing.is_empty() { Ok(()) } else { Err(GetError::Missing { kind, names: missing }) }
}

/// Fetches and prints PersistentVolumes, claims or classes (`kind`: `pv`, `pvc`, `sc`).
pub(crate) async fn run(args: &GetArgs, kind: &str, now: Timestamp) -> Result<(), GetError> {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let (mut out, mut err) = (stdout.lock(), stderr.lock());
    let printed = match kind {
        "pv" => {
            let mut items: Vec<PersistentVolume> = fetch_list(args, "/api/v1/persistentvolumes").await?;
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            print(
                args,
                "persistentvolume",
                ("v1", "PersistentVolume", "persistentvolume"),
                items,
                |v| &v.metadata,
                &[
                    "NAME",
                    "CAPACITY",
                    "ACCESS MODES",
                    "RECLAIM POLICY",
                    "STATUS",
                    "CLAIM",
                    "STORAGECLASS",
                    "REASON",
                    "AGE",
                ],
                |v| {
                    let spec = v.spec.clone().unwrap_or_default();
                    let status = v.status.clone().unwrap_or_default();
                    let claim = spec
                        .claim_ref
                        .as_ref()
                        .map(|r| {
                            format!(
                                "{}/{}",
                                r.namespace.as_deref().unwrap_or("default"),
                                r.name.as_deref().unwrap_or_default()
                            )
                        })
                        .unwrap_or_default();
                    vec![
                        or_blank(v.metadata.name.as_deref()),
                        or_blank(spec.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.as_str())),
                        modes(spec.access_modes.as_ref()),
                        spec.persistent_volume_reclaim_policy.clone().unwrap_or_else(|| "Retain".into()),
                        or_blank(status.phase.as_deref()),
                        claim,
                        or_blank(spec.storage_class_name.as_deref()),
                        or_blank(status.reason.as_deref()),
                        age(&v.metadata, now),
                    ]
                },
                &mut out,
                &mut err,
            )
        }
        "pvc" => {
            let mut items: Vec<PersistentVolumeClaim> =
                fetch_list(args, "/api/v1/persistentvolumeclaims").await?;
            if !args.all_namespaces {
                items.retain(|c| c.metadata.namespace.as_deref().unwrap_or("default") == args.namespace);
            }
            items.sort_by(|a, b| {
                (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
            });
            let all = args.all_namespaces;
            let mut headers =
                vec!["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS", "AGE"];
            if all {
                headers.insert(0, "NAMESPACE");
            }
            print(
                args,
                "persistentvolumeclaim",
                ("v1", "PersistentVolumeClaim", "persistentvolumeclaim"),
                items,
                |c| &c.metadata,
                &headers,
                |c| {
                    let spec = c.spec.clone().unwrap_or_default();
                    let status = c.status.clone().unwrap_or_default();
                    let mut row = vec![
                        or_blank(c.metadata.name.as_deref()),
                        or_blank(status.phase.as_deref()),
                        or_blank(spec.volume_name.as_deref()),
                        or_blank(
                            status.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.as_str()),
                        ),
                        modes(status.access_modes.as_ref()),
                        or_blank(spec.storage_class_name.as_deref()),
                        age(&c.metadata, now),
                    ];
                    if all {
                        row.insert(0, or_blank(c.metadata.namespace.as_deref()));
                    }
                    row
                },
                &mut out,
                &mut err,
            )
        }
        "csinode" => {
            let items: Vec<CSINode> = fetch_list(args, "/apis/storage.k8s.io/v1/csinodes").await?;
            print(
                args,
                "csinode",
                ("storage.k8s.io/v1", "CSINode", "csinode"),
                items,
                |c| &c.metadata,
                &["NAME", "DRIVERS", "AGE"],
                |c| {
                    vec![
                        c.metadata.name.clone().unwrap_or_default(),
                        c.spec.drivers.len().to_string(),
                        age(&c.metadata, now),
                    ]
                },
                &mut out,
                &mut err,
            )
        }
        _ => {
            let mut items: Vec<StorageClass> =
                fetch_list(args, "/apis/storage.k8s.io/v1/storageclasses").await?;
            items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            print(
                args,
                "storageclass",
                ("storage.k8s.io/v1", "StorageClass", "storageclass"),
                items,
                |c| &c.metadata,
                &["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"],
                |c| {
                    let default = c
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("storageclass.kubernetes.io/is-default-class"))
                        .is_some_and(|v| v == "true");
                    let name = c.metadata.name.clone().unwrap_or_default();
                    vec![
                        if default { format!("{name} (default)") } else { name },
                        c.provisioner.clone(),
                        c.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
                        c.volume_binding_mode.clone().unwrap_or_else(|| "Immediate".into()),
                        c.allow_volume_expansion.unwrap_or(false).to_string(),
                        age(&c.metadata, now),
                    ]
                },
                &mut out,
                &mut err,
            )
        }
    };
    // Why claims wait and reclaims failed, as warnings after the table.
    if matches!(args.output, None | Some(OutputFormat::Wide)) && (kind == "pv" || kind == "pvc") {
        let wanted = if kind == "pv" { "PersistentVolume" } else { "PersistentVolumeClaim" };
        if let Ok(events) = fetch_list::<Event>(args, "/api/v1/events").await {
            let events: Vec<Event> =
                events.into_iter().filter(|e| e.involved_object.kind.as_deref() == Some(wanted)).collect();
            print_warnings(&events, &mut err);
        }
    }
    printed
}

//! `nodelet get events`: the events nodelet reports (`/api/v1/events`), as `kubectl get events` prints
//! them: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE (`-o wide` adds SUBOBJECT, SOURCE, FIRST SEEN, COUNT
//! and NAME; `-A` a NAMESPACE column first). Sorted by when they were last seen, oldest first (events
//! without a time first), then by name.

use std::io::Write;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;

use super::get::{GetError, fetch_list};
use super::pods::human_duration_since;
use super::selector::EVENT_FIELDS;
use crate::args::{GetArgs, OutputFormat};

/// Whether a `get` resource argument names events.
pub(crate) fn is_events(resource: &str) -> bool {
    matches!(resource, "events" | "event" | "ev")
}

/// When the event was first seen: `firstTimestamp`, else `eventTime`.
pub(crate) fn first_seen(e: &Event) -> Option<Timestamp> {
    e.first_timestamp.as_ref().map(|t| t.0).or_else(|| e.event_time.as_ref().map(|t| t.0))
}

/// When the event was last seen: the series' last observation, `lastTimestamp`, else the first time.
pub(crate) fn last_seen(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| first_seen(e))
}

/// kubectl's `translateTimestampSince`: a human age, `<unknown>` without a time.
pub(crate) fn since(t: Option<Timestamp>, now: Timestamp) -> String {
    t.map_or_else(|| "<unknown>".to_owned(), |t| human_duration_since(t, now))
}

/// How many times it happened (at least 1).
pub(crate) fn count(e: &Event) -> i32 {
    e.series.as_ref().and_then(|s| s.count).or(e.count).filter(|c| *c > 0).unwrap_or(1)
}

/// `kind/name` of the involved object, the kind in lower case.
fn object(e: &Event) -> String {
    let kind = e.involved_object.kind.as_deref().unwrap_or_default().to_lowercase();
    match e.involved_object.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind,
    }
}

/// The table's row for `e` (`wide`: kubectl's wide columns; `namespace`: with NAMESPACE first).
pub(crate) fn event_row(e: &Event, now: Timestamp, wide: bool, namespace: bool) -> Vec<String> {
    let mut row = Vec::new();
    if namespace {
        row.push(e.metadata.namespace.clone().unwrap_or_default());
    }
    row.extend([
        since(last_seen(e), now),
        e.type_.clone().unwrap_or_default(),
        e.reason.clone().unwrap_or_default(),
        object(e),
    ]);
    let message = e.message.as_deref().unwrap_or_default().trim().replace('\n', " ");
    if wide {
        let source = e.source.as_ref();
        let component = source
            .and_then(|s| s.component.clone())
            .or_else(|| e.reporting_component.clone())
            .unwrap_or_default();
        let host = source.and_then(|s| s.host.clone()).or_else(|| e.reporting_instance.clone());
        let source = match host.filter(|h| !h.is_empty()) {
            Some(h) => format!("{component}, {h}"),
            None => component,
        };
        row.extend([
            e.involved_object.field_path.clone().unwrap_or_default(),
            source,
            message,
            since(first_seen(e), now),
            count(e).to_string(),
            e.metadata.name.clone().unwrap_or_default(),
        ]);
    } else {
        row.push(message);
    }
    row
}

fn headers(wide: bool, namespace: bool) -> Vec<&'static str> {
    let mut h = Vec::new();
    if namespace {
        h.push("NAMESPACE");
    }
    h.extend(["LAST SEEN", "TYPE", "REASON", "OBJECT"]);
    if wide {
        h.extend(["SUBOBJECT", "SOURCE", "MESSAGE", "FIRST SEEN", "COUNT", "NAME"]);
    } else {
        h.push("MESSAGE");
    }
    h
}

/// Filters (namespace, names, selectors) and sorts `events` as `args` asks.
pub(crate) fn select(args: &GetArgs, events: Vec<Event>) -> Result<Vec<Event>, GetError> {
    let mut events: Vec<Event> = events
        .into_iter()
        .filter(|e| {
            args.all_namespaces || e.metadata.namespace.as_deref().unwrap_or("default") == args.namespace
        })
        .filter(|e| args.names.is_empty() || e.metadata.name.as_ref().is_some_and(|n| args.names.contains(n)))
        .collect();
    events = super::output::select(args, events, |e| &e.metadata, EVENT_FIELDS)?;
    events.sort_by(|a, b| (last_seen(a), &a.metadata.name).cmp(&(last_seen(b), &b.metadata.name)));
    Ok(events)
}

/// Prints `events` (already selected) as `args` asks.
pub(crate) fn print_events(
    args: &GetArgs,
    events: &[Event],
    now: Timestamp,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), GetError> {
    let io = GetError::Output;
    match &args.output {
        None | Some(OutputFormat::Wide) => {
            if events.is_empty() {
                let msg = if args.all_namespaces {
                    "No resources found".to_owned()
                } else {
                    format!("No resources found in {} namespace.", args.namespace)
                };
                writeln!(err, "{msg}").map_err(io)?;
                return Ok(());
            }
            let wide = args.output == Some(OutputFormat::Wide);
            let rows: Vec<Vec<String>> =
                events.iter().map(|e| event_row(e, now, wide, args.all_namespaces)).collect();
            let text = super::output::table(args, &headers(wide, args.all_namespaces), &rows);
            write!(out, "{text}").map_err(io)?;
        }
        Some(format) => {
            let text = super::output::render(
                args,
                format,
                ("v1", "Event", "event"),
                super::output::values(events)?,
            )?;
            write!(out, "{text}").map_err(io)?;
        }
    }
    out.flush().map_err(io)
}

/// `nodelet get events`.
pub(crate) async fn run(args: &GetArgs, now: Timestamp) -> Result<(), GetError> {
    let events = select(args, fetch_list(args, "/api/v1/events").await?)?;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    print_events(args, &events, now, &mut stdout.lock(), &mut stderr.lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn args(flags: &[&str]) -> GetArgs {
        let mut v = vec!["nodelet", "get", "events"];
        v.extend_from_slice(flags);
        match Cli::try_parse_from(v).map(Cli::into_command) {
            Ok(Command::Get(g)) => g,
            other => panic!("{other:?}"),
        }
    }

    fn events() -> Vec<Event> {
        serde_json::from_value(serde_json::json!([
            {"metadata": {"name": "web.started", "namespace": "default"},
             "involvedObject": {"kind": "Pod", "name": "web-node1", "namespace": "default", "fieldPath": "spec.containers{app}"},
             "reason": "Started", "message": "Started container app", "type": "Normal", "count": 2,
             "firstTimestamp": "2024-05-01T11:50:00Z", "lastTimestamp": "2024-05-01T11:59:00Z",
             "source": {"component": "nodelet", "host": "node1"}},
            {"metadata": {"name": "bad.invalid", "namespace": "default"},
             "involvedObject": {"kind": "Pod", "name": "bad"},
             "reason": "InvalidManifest", "message": "bad.yaml: no containers\n", "type": "Warning",
             "source": {"component": "nodelet", "host": "node1"}},
            {"metadata": {"name": "dns.pulled", "namespace": "kube-system"},
             "involvedObject": {"kind": "Pod", "name": "dns-node1"},
             "reason": "Pulled", "message": "pulled", "type": "Normal", "lastTimestamp": "2024-05-01T11:00:00Z"}
        ]))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn print(flags: &[&str]) -> (String, String) {
        let a = args(flags);
        let now: Timestamp = "2024-05-01T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
        let selected = select(&a, events()).unwrap_or_else(|e| panic!("{e}"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        print_events(&a, &selected, now, &mut out, &mut err).unwrap_or_else(|e| panic!("{e}"));
        (String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned())
    }

    #[test]
    fn the_table_is_kubectls() {
        let (out, _) = print(&[]);
        assert_eq!(
            out,
            "LAST SEEN   TYPE      REASON            OBJECT          MESSAGE\n\
             <unknown>   Warning   InvalidManifest   pod/bad         bad.yaml: no containers\n\
             60s         Normal    Started           pod/web-node1   Started container app\n"
        );
        let (out, _) = print(&["-A"]);
        assert!(out.starts_with("NAMESPACE     LAST SEEN"), "{out}");
        assert!(out.contains("kube-system   60m         Normal    Pulled"), "{out}");
        let (out, _) = print(&["-o", "wide", "--field-selector", "involvedObject.name=web-node1"]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>().join(" "),
            "LAST SEEN TYPE REASON OBJECT SUBOBJECT SOURCE MESSAGE FIRST SEEN COUNT NAME"
        );
        assert!(
            lines[1].contains("spec.containers{app}   nodelet, node1")
                && lines[1].ends_with("10m          2       web.started"),
            "{out}"
        );
        let (out, err) = print(&["-n", "empty"]);
        assert!(out.is_empty());
        assert_eq!(err, "No resources found in empty namespace.\n");
        let (out, _) = print(&["--field-selector", "type=Warning", "-o", "jsonpath={.items[*].reason}"]);
        assert_eq!(out, "InvalidManifest");
        assert!(select(&args(&["--field-selector", "spec.x=1"]), events()).is_err());
    }
}

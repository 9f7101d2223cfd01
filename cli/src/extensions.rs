//! `nodelet get NAME` for an extension of the node: fetches its status table (`/extensions/NAME`, a
//! `meta.k8s.io/v1` `Table`) and prints it like the other `get` tables; `-o json|yaml` print the `Table`.

use serde::Deserialize;
use serde_json::Value;

use super::get::{GetError, fetch_body};
use super::output::{table, to_json};
use crate::args::{GetArgs, OutputFormat};

/// The parts of a `meta.k8s.io/v1` `Table` nodelet reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Table {
    #[serde(default)]
    column_definitions: Vec<ColumnDefinition>,
    #[serde(default)]
    rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
struct ColumnDefinition {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Row {
    #[serde(default)]
    cells: Vec<Value>,
}

/// `nodelet get NAME [ROW…]`: the rows whose first cell is one of the given names (all when none).
pub(crate) async fn run(args: &GetArgs) -> Result<(), GetError> {
    if args.watch {
        return Err(GetError::Usage(format!("watch is not supported for {}", args.resource)));
    }
    let (url, body) = match fetch_body(args, &format!("/extensions/{}", args.resource)).await {
        Err(GetError::Http { status: 404, .. }) => {
            return Err(GetError::Usage(format!(
                "the server doesn't have a resource type {:?}",
                args.resource
            )));
        }
        other => other?,
    };
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    print(args, &url, &body, &mut out, &mut err)
}

fn print(
    args: &GetArgs,
    url: &str,
    body: &str,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> Result<(), GetError> {
    let mut document: Value = serde_json::from_str(body)
        .map_err(|e| GetError::Decode { url: url.to_owned(), message: e.to_string() })?;
    let parsed: Table = serde_json::from_value(document.clone())
        .map_err(|e| GetError::Decode { url: url.to_owned(), message: e.to_string() })?;
    let cell = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let keep: Vec<bool> = parsed
        .rows
        .iter()
        .map(|r| args.names.is_empty() || r.cells.first().is_some_and(|c| args.names.contains(&cell(c))))
        .collect();
    let mut missing: Vec<String> = args
        .names
        .iter()
        .filter(|n| !parsed.rows.iter().any(|r| r.cells.first().map(cell).as_deref() == Some(n.as_str())))
        .cloned()
        .collect();
    missing.dedup();
    if let Some(rows) = document.get_mut("rows").and_then(Value::as_array_mut) {
        let mut flags = keep.iter();
        rows.retain(|_| flags.next().copied().unwrap_or(false));
    }
    let rows: Vec<Vec<String>> = parsed
        .rows
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(r, _)| r.cells.iter().map(cell).collect())
        .collect();
    let text = match &args.output {
        None | Some(OutputFormat::Wide) => {
            if rows.is_empty() {
                String::new()
            } else {
                let headers: Vec<String> =
                    parsed.column_definitions.iter().map(|c| c.name.to_uppercase()).collect();
                table(args, &headers.iter().map(String::as_str).collect::<Vec<_>>(), &rows)
            }
        }
        Some(OutputFormat::Json) => to_json(&document)?,
        Some(OutputFormat::Yaml) => {
            nodelet_shared::yaml::to_string(&document).map_err(|e| GetError::Usage(e.to_string()))?
        }
        Some(OutputFormat::Name) => rows
            .iter()
            .map(|r| format!("{}/{}\n", args.resource, r.first().cloned().unwrap_or_default()))
            .collect(),
        Some(other) => {
            return Err(GetError::Usage(format!(
                "output format {other:?} is not supported for {}",
                args.resource
            )));
        }
    };
    out.write_all(text.as_bytes()).map_err(GetError::Output)?;
    if rows.is_empty() && missing.is_empty() {
        err.write_all(b"No resources found\n").map_err(GetError::Output)?;
    }
    if !missing.is_empty() {
        return Err(GetError::Missing { kind: "row", names: missing });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn args(argv: &[&str]) -> GetArgs {
        let mut v = vec!["nodelet", "get"];
        v.extend_from_slice(argv);
        match Cli::try_parse_from(v).map(Cli::into_command) {
            Ok(Command::Get(g)) => g,
            other => panic!("{other:?}"),
        }
    }

    const BODY: &str = r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},
        "columnDefinitions":[{"name":"Image","type":"string"},{"name":"Status","type":"string"}],
        "rows":[{"cells":["busybox:1","Present"]},{"cells":["nginx:2","Pulling"]}]}"#;

    fn run(argv: &[&str]) -> (Result<(), GetError>, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let r = print(&args(argv), "http://x/extensions/prepull", BODY, &mut out, &mut err);
        (r, String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned())
    }

    #[test]
    fn a_status_table_should_print_like_a_kubectl_table() {
        let (r, out, _) = run(&["prepull"]);
        assert!(r.is_ok());
        assert_eq!(out, "IMAGE       STATUS\nbusybox:1   Present\nnginx:2     Pulling\n");
    }

    #[test]
    fn named_rows_should_be_selected_and_missing_ones_reported() {
        let (r, out, _) = run(&["prepull", "nginx:2", "redis:7", "--no-headers"]);
        assert_eq!(out, "nginx:2   Pulling\n");
        assert_eq!(
            r.map_err(|e| e.to_string()),
            Err("Error from server (NotFound): row \"redis:7\" not found".to_owned())
        );
    }

    #[test]
    fn json_output_should_be_the_table_with_the_selected_rows() {
        let (r, out, _) = run(&["prepull", "busybox:1", "-o", "json"]);
        assert!(r.is_ok());
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(v["kind"], "Table");
        assert_eq!(v["rows"].as_array().map(Vec::len), Some(1));
    }
}

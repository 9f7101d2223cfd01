//! What `get` does for every kind alike: the `-l`/`--field-selector` filter, and the non-table output
//! formats as kubectl prints them: `-o json` (indented by 4 spaces, a single object for one named
//! resource, else a `List`), `-o yaml`, `-o name`, `-o jsonpath=`, `-o custom-columns=`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;

use super::get::GetError;
use super::jsonpath::{Template, go_format, relaxed};
use super::pods::render_table;
use super::selector::{FieldSelector, LabelSelector};
use crate::args::{GetArgs, OutputFormat};

fn encode(e: impl std::fmt::Display) -> GetError {
    GetError::Output(std::io::Error::other(e.to_string()))
}

/// Keeps the objects `args.selector` and `args.field_selector` select (`fields`: the kind's field labels).
pub(crate) fn select<T: Serialize>(
    args: &GetArgs,
    items: Vec<T>,
    meta: impl Fn(&T) -> &ObjectMeta,
    fields: &[&str],
) -> Result<Vec<T>, GetError> {
    if args.selector.is_some() && !args.names.is_empty() {
        return Err(GetError::Usage("name cannot be provided when a selector is specified".into()));
    }
    let labels = LabelSelector::parse(args.selector.as_deref().unwrap_or_default())?;
    let field = FieldSelector::parse(args.field_selector.as_deref().unwrap_or_default(), fields)?;
    let mut kept = Vec::new();
    for item in items {
        if !labels.matches(meta(&item).labels.as_ref()) {
            continue;
        }
        if args.field_selector.is_some() && !field.matches(&serde_json::to_value(&item).map_err(encode)?) {
            continue;
        }
        kept.push(item);
    }
    Ok(kept)
}

/// JSON as kubectl prints it: indented by 4 spaces, `<`, `>` and `&` escaped (Go's encoder), a final
/// newline.
pub(crate) fn to_json(value: &Value) -> Result<String, GetError> {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    value.serialize(&mut ser).map_err(encode)?;
    let text = String::from_utf8(buf).map_err(encode)?;
    let mut text = text.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
    text.push('\n');
    Ok(text)
}

/// The object a structured format prints: the one object for one named resource, else a `List`.
pub(crate) fn document(api_version: &str, kind: &str, items: Vec<Value>, single: bool) -> Value {
    let mut items: Vec<Value> = items
        .into_iter()
        .map(|mut v| {
            if let Some(o) = v.as_object_mut() {
                o.entry("apiVersion").or_insert_with(|| api_version.into());
                o.entry("kind").or_insert_with(|| kind.into());
            }
            v
        })
        .collect();
    if single && items.len() == 1 {
        return items.remove(0);
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}})
}

/// One column of `-o custom-columns`.
#[derive(Debug)]
pub(crate) struct Column {
    header: String,
    path: Template,
}

/// Parses `HEADER:PATH[,HEADER:PATH…]` (kubectl's relaxed paths: `.a.b`, `a.b`, `{.a.b}`).
pub(crate) fn columns(spec: &str) -> Result<Vec<Column>, GetError> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let Some((header, path)) = part.split_once(':') else {
            return Err(GetError::Usage(format!(
                "unexpected custom-columns spec: {part}, expected <header>:<json-path-expr>"
            )));
        };
        let path = relaxed(path).map_err(|e| GetError::Usage(e.to_string()))?;
        out.push(Column { header: header.to_owned(), path: Template::parse(&path)? });
    }
    Ok(out)
}

/// Why a `custom-columns-file` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CustomColumnsFileError {
    /// The file has no line of headers.
    #[error("custom-columns-file: no headers")]
    NoHeaders,
    /// The two lines have different numbers of fields.
    #[error("number of headers ({headers}) and field specifications ({paths}) don't match")]
    Mismatch {
        /// Fields of the header line.
        headers: usize,
        /// Fields of the path line.
        paths: usize,
    },
}

/// A `custom-columns-file`: a line of headers and a line of paths, separated by white space, turned
/// into the `HEADER:PATH,…` form.
pub(crate) fn custom_columns_from_file(text: &str) -> Result<String, CustomColumnsFileError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let headers: Vec<&str> = lines.next().map(|l| l.split_whitespace().collect()).unwrap_or_default();
    let paths: Vec<&str> = lines.next().map(|l| l.split_whitespace().collect()).unwrap_or_default();
    if headers.is_empty() {
        return Err(CustomColumnsFileError::NoHeaders);
    }
    if headers.len() != paths.len() {
        return Err(CustomColumnsFileError::Mismatch { headers: headers.len(), paths: paths.len() });
    }
    Ok(headers.iter().zip(&paths).map(|(h, p)| format!("{h}:{p}")).collect::<Vec<_>>().join(","))
}

/// The rows of `-o custom-columns` for `items`: each cell the path's values joined by `,`, `<none>`
/// without one.
pub(crate) fn custom_columns_rows(cols: &[Column], items: &[Value]) -> Result<Vec<Vec<String>>, GetError> {
    let mut rows = Vec::new();
    for item in items {
        let mut row = Vec::new();
        for c in cols {
            let values = c.path.values(item)?;
            row.push(if values.is_empty() {
                "<none>".to_owned()
            } else {
                values.iter().map(go_format).collect::<Vec<_>>().join(",")
            });
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Renders `items` (already selected and sorted) in a non-table `format`; `resource` is the
/// lowercase kind of `-o name` (`pod`), `api_version`/`kind` are added to items without them.
pub(crate) fn render(
    args: &GetArgs,
    format: &OutputFormat,
    (api_version, kind, resource): (&str, &str, &str),
    items: Vec<Value>,
) -> Result<String, GetError> {
    let single = args.names.len() == 1 && items.len() == 1;
    match format {
        OutputFormat::Json => to_json(&document(api_version, kind, items, single)),
        OutputFormat::Yaml => {
            nodelet_shared::yaml::to_string(&document(api_version, kind, items, single)).map_err(encode)
        }
        OutputFormat::Name => Ok(items
            .iter()
            .map(|i| format!("{resource}/{}\n", i["metadata"]["name"].as_str().unwrap_or_default()))
            .collect()),
        OutputFormat::JsonPath(t) => {
            Ok(Template::parse(t)?.render(&document(api_version, kind, items, single))?)
        }
        OutputFormat::CustomColumns(spec) => {
            let cols = columns(spec)?;
            let rows = custom_columns_rows(&cols, &items)?;
            Ok(table(args, &cols.iter().map(|c| c.header.as_str()).collect::<Vec<_>>(), &rows))
        }
        OutputFormat::Wide => Err(GetError::Usage("wide is a table format".into())),
    }
}

/// kubectl's table, without its header line under `--no-headers`.
pub(crate) fn table(args: &GetArgs, headers: &[&str], rows: &[Vec<String>]) -> String {
    let text = render_table(headers, rows);
    if args.no_headers {
        text.split_once('\n').map(|(_, rest)| rest.to_owned()).unwrap_or_default()
    } else {
        text
    }
}

/// Serializes typed objects for [`render`].
pub(crate) fn values<T: Serialize>(items: &[T]) -> Result<Vec<Value>, GetError> {
    items.iter().map(|i| serde_json::to_value(i).map_err(encode)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn args(flags: &[&str]) -> GetArgs {
        let mut v = vec!["nodelet", "get", "pods"];
        v.extend_from_slice(flags);
        match Cli::try_parse_from(v).map(Cli::into_command) {
            Ok(Command::Get(g)) => g,
            other => panic!("{other:?}"),
        }
    }

    fn pods() -> Vec<Value> {
        vec![
            serde_json::json!({"metadata": {"name": "a", "labels": {"app": "web"}}, "status": {"phase": "Running",
                "podIPs": [{"ip": "198.18.0.1"}, {"ip": "fd00::1"}]}}),
            serde_json::json!({"metadata": {"name": "b"}, "status": {"phase": "Pending"}}),
        ]
    }

    fn out(flags: &[&str]) -> String {
        let a = args(flags);
        let format = a.output.clone().unwrap_or(OutputFormat::Json);
        render(&a, &format, ("v1", "Pod", "pod"), pods()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn json_is_indented_by_four_spaces_like_kubectl() {
        let text = out(&["-o", "json"]);
        assert!(text.starts_with("{\n    \"apiVersion\": \"v1\",\n    \"items\": [\n        {\n"), "{text}");
        assert!(text.ends_with("}\n"), "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"][0]["kind"], "Pod");
        assert_eq!(v["metadata"]["resourceVersion"], "");
        let a = args(&["a", "-o", "json"]);
        let one = render(&a, &OutputFormat::Json, ("v1", "Pod", "pod"), pods()[..1].to_vec()).expect("one");
        assert!(one.starts_with("{\n    \"apiVersion\": \"v1\",\n    \"kind\": \"Pod\",\n"), "{one}");
        assert_eq!(
            to_json(&serde_json::json!({"m": "<b>&"})).expect("json"),
            "{\n    \"m\": \"\\u003cb\\u003e\\u0026\"\n}\n"
        );
    }

    #[test]
    fn custom_columns_and_jsonpath() {
        assert_eq!(
            out(&[
                "-o",
                "custom-columns=NAME:.metadata.name,IPS:status.podIPs[*].ip,APP:{.metadata.labels.app}"
            ]),
            "NAME   IPS                  APP\na      198.18.0.1,fd00::1   web\nb      <none>               <none>\n"
        );
        assert_eq!(out(&["-o", "custom-columns=NAME:.metadata.name", "--no-headers"]), "a\nb\n");
        assert_eq!(out(&["-o", "jsonpath={.items[*].metadata.name}"]), "a b");
        assert_eq!(
            out(&["-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase}{\"\\n\"}{end}"]),
            "a=Running\nb=Pending\n"
        );
        assert_eq!(out(&["-o", "name"]), "pod/a\npod/b\n");
        let e = columns("NAME").expect_err("no path").to_string();
        assert_eq!(e, "unexpected custom-columns spec: NAME, expected <header>:<json-path-expr>");
        assert_eq!(
            custom_columns_from_file("NAME   PHASE\n.metadata.name .status.phase\n").as_deref(),
            Ok("NAME:.metadata.name,PHASE:.status.phase")
        );
        let mismatch = custom_columns_from_file("A B\n.x\n").expect_err("two headers, one path");
        assert_eq!(mismatch, CustomColumnsFileError::Mismatch { headers: 2, paths: 1 });
        assert_eq!(mismatch.to_string(), "number of headers (2) and field specifications (1) don't match");
        assert_eq!(custom_columns_from_file("\n"), Err(CustomColumnsFileError::NoHeaders));
        assert!(Cli::try_parse_from(["nodelet", "get", "pods", "-o", "table"]).is_err());
        assert!(Cli::try_parse_from(["nodelet", "get", "pods", "-o", "jsonpath="]).is_err());
    }

    #[test]
    fn selectors_filter_and_refuse_names() {
        #[derive(Serialize)]
        struct O {
            metadata: ObjectMeta,
        }
        let items = || {
            pods()
                .into_iter()
                .map(|p| O { metadata: serde_json::from_value(p["metadata"].clone()).expect("meta") })
                .collect::<Vec<_>>()
        };
        let kept = select(&args(&["-l", "app=web"]), items(), |o| &o.metadata, &[]).expect("select");
        assert_eq!(kept.len(), 1);
        let kept = select(&args(&["-l", "!app"]), items(), |o| &o.metadata, &[]).expect("select");
        assert_eq!(kept[0].metadata.name.as_deref(), Some("b"));
        let kept = select(
            &args(&["--field-selector", "metadata.name!=a"]),
            items(),
            |o| &o.metadata,
            &["metadata.name"],
        )
        .expect("select");
        assert_eq!(kept[0].metadata.name.as_deref(), Some("b"));
        let e = select(&args(&["a", "-l", "x"]), items(), |o| &o.metadata, &[]).err().expect("refused");
        assert_eq!(e.to_string(), "name cannot be provided when a selector is specified");
        let e = select(&args(&["-l", "a in"]), items(), |o| &o.metadata, &[]).err().expect("refused");
        assert_eq!(e.to_string(), "unable to parse requirement: found '', expected: '('");
    }
}

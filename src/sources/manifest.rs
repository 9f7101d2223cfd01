//! Reading manifests: one byte string (a file, a URL's body, a request body) in, validated pods,
//! per-document problems and the documents of other kinds out.
//!
//! A manifest is YAML or JSON (JSON when its first non-blank character is `{` or `[`), with one or
//! more documents (`---` between YAML documents; JSON objects one after another). A document is a
//! `Pod`, a `PodList` or `List` of pods, or another kind, which is kept aside ([`Parsed::others`])
//! for the sources that will read ConfigMaps, Secrets and volumes.

use std::collections::{BTreeMap, HashSet};

use nodelet_resources::pod::desired::{DesiredPod, PodSource};
use nodelet_resources::pod::validation::{self, FieldError, ValidationError};
use serde::Deserialize;

/// The largest manifest read, from any source (a file, a URL's body, a request body).
pub(crate) const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;

/// A pod read from a manifest, with the key that identifies it in that manifest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedPod {
    /// `namespace/name` as written in the manifest (without a static pod's node suffix).
    pub(crate) key: String,
    /// The validated, defaulted pod.
    pub(crate) pod: DesiredPod,
}

/// A document of a manifest that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DocProblem {
    /// `namespace/name` of the pod it is about, when the document says.
    pub(crate) object: Option<String>,
    /// What is wrong, for people (names the document and the field).
    pub(crate) message: String,
    /// The field errors, when the document is a pod that failed validation.
    pub(crate) field_errors: Vec<FieldError>,
}

/// What a manifest holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Parsed {
    /// The valid pods, in document order.
    pub(crate) pods: Vec<ParsedPod>,
    /// The documents that could not be used.
    pub(crate) problems: Vec<DocProblem>,
    /// Documents of other kinds, by kind, in document order.
    pub(crate) others: BTreeMap<String, Vec<serde_json::Value>>,
}

impl Parsed {
    fn problem(&mut self, object: Option<String>, message: String) {
        self.problems.push(DocProblem { object, message, field_errors: Vec::new() });
    }
}

/// Parses and validates the manifest `bytes` from `source` for this node.
pub(crate) fn parse(bytes: &[u8], source: &PodSource, node_name: &str) -> Parsed {
    let mut parsed = Parsed::default();
    if bytes.len() > MAX_MANIFEST_BYTES {
        parsed.problem(None, format!("manifest is larger than {MAX_MANIFEST_BYTES} bytes"));
        return parsed;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        parsed.problem(None, "manifest is not UTF-8 text".into());
        return parsed;
    };
    let documents = match read_documents(text) {
        Ok(documents) => documents,
        Err((documents, message)) => {
            // Keep what was read before the syntax error; the rest is unknown.
            let mut parsed = classify(documents, source, node_name);
            parsed.problem(None, message);
            return parsed;
        }
    };
    parsed = classify(documents, source, node_name);
    parsed
}

/// Splits `text` into documents. On a syntax error, returns the documents read before it and the
/// error.
fn read_documents(text: &str) -> Result<Vec<serde_json::Value>, (Vec<serde_json::Value>, String)> {
    let mut documents = Vec::new();
    let first = text.trim_start().chars().next();
    if matches!(first, Some('{' | '[')) {
        for value in serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>() {
            match value {
                Ok(value) => documents.push(value),
                Err(e) => return Err((documents, format!("invalid JSON: {e}"))),
            }
        }
    } else {
        for document in serde_yaml::Deserializer::from_str(text) {
            match serde_json::Value::deserialize(document) {
                Ok(serde_json::Value::Null) => {}
                Ok(value) => documents.push(value),
                Err(e) => return Err((documents, format!("invalid YAML: {e}"))),
            }
        }
    }
    Ok(documents)
}

fn classify(documents: Vec<serde_json::Value>, source: &PodSource, node_name: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let numbered = documents.len() > 1;
    for (i, document) in documents.into_iter().enumerate() {
        let label = if numbered { format!("document {}: ", i + 1) } else { String::new() };
        classify_one(document, &label, None, source, node_name, &mut parsed);
    }
    parsed
}

fn classify_one(
    document: serde_json::Value,
    label: &str,
    default_kind: Option<&str>,
    source: &PodSource,
    node_name: &str,
    parsed: &mut Parsed,
) {
    if !document.is_object() {
        parsed.problem(None, format!("{label}Invalid value: expected a Kubernetes object (a mapping)"));
        return;
    }
    let kind = document.get("kind").and_then(|k| k.as_str()).map(str::to_owned);
    match kind.as_deref().or(default_kind) {
        Some("Pod") => match validation::prepare_value(document, source.clone(), node_name) {
            Ok(pod) => {
                let key = format!("{}/{}", pod.namespace(), manifest_name(&pod, node_name));
                parsed.pods.push(ParsedPod { key, pod });
            }
            Err(error) => parsed.problems.push(problem_of(error, label)),
        },
        Some("PodList" | "List") => {
            let items = match document {
                serde_json::Value::Object(mut map) => map.remove("items"),
                _ => None,
            };
            let items = match items {
                Some(serde_json::Value::Array(items)) => items,
                None | Some(serde_json::Value::Null) => Vec::new(),
                Some(_) => {
                    parsed.problem(None, format!("{label}items: Invalid value: must be a list"));
                    return;
                }
            };
            let item_default = if kind.as_deref() == Some("PodList") { Some("Pod") } else { None };
            for (j, item) in items.into_iter().enumerate() {
                classify_one(item, &format!("{label}items[{j}]: "), item_default, source, node_name, parsed);
            }
        }
        Some(other) => {
            tracing::debug!(kind = other, "manifest document of another kind kept aside");
            parsed.others.entry(other.to_owned()).or_default().push(document);
        }
        None => {
            let object = object_key(&document);
            parsed.problem(object, format!("{label}kind: Required value"));
        }
    }
}

/// The name a static pod had in its manifest (without the node suffix).
fn manifest_name<'a>(pod: &'a DesiredPod, node_name: &str) -> &'a str {
    let name = pod.name();
    if matches!(pod.source, PodSource::Api) || node_name.is_empty() {
        return name;
    }
    name.strip_suffix(&format!("-{}", node_name.to_lowercase())).unwrap_or(name)
}

fn object_key(document: &serde_json::Value) -> Option<String> {
    let metadata = document.get("metadata")?;
    let name = metadata.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let namespace = metadata.get("namespace").and_then(|n| n.as_str()).filter(|n| !n.is_empty());
    Some(format!("{}/{name}", namespace.unwrap_or("default")))
}

fn problem_of(error: ValidationError, label: &str) -> DocProblem {
    let errors = error.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    DocProblem {
        object: error.object.name.as_ref().map(|_| error.object.key()),
        message: format!("{label}{errors}"),
        field_errors: error.errors,
    }
}

/// "Nothing a user wrote is lost": what a manifest contributes after a new reading, given what it
/// contributed before (`previous`).
///
/// A manifest without problems contributes exactly its pods. A manifest with problems contributes
/// its valid pods plus the previous version of every pod it may still mean: the pods named by an
/// invalid document, or, when a problem cannot be tied to a pod (a syntax error, a document
/// without a name), every previous pod the new reading does not supersede. Returns the pods and how
/// many of them were kept from before. (The kubelet drops every pod of a file that fails to
/// parse.)
pub(crate) fn keep_last_good(new: &Parsed, previous: &[ParsedPod]) -> (Vec<ParsedPod>, usize) {
    let mut pods = new.pods.clone();
    if new.problems.is_empty() {
        return (pods, 0);
    }
    let anonymous = new.problems.iter().any(|p| p.object.is_none());
    let broken: HashSet<&str> = new.problems.iter().filter_map(|p| p.object.as_deref()).collect();
    let superseded: HashSet<&str> = new.pods.iter().map(|p| p.key.as_str()).collect();
    let mut kept = 0;
    for old in previous {
        let key = old.key.as_str();
        if !superseded.contains(key) && (anonymous || broken.contains(key)) {
            pods.push(old.clone());
            kept += 1;
        }
    }
    (pods, kept)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn source() -> PodSource {
        PodSource::File(PathBuf::from("/m/pods.yaml"))
    }

    fn pod_yaml(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
        )
    }

    fn keys(pods: &[ParsedPod]) -> Vec<&str> {
        pods.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn multi_document_yaml_is_split_and_other_kinds_kept_aside() {
        let text = format!(
            "{}---\n{}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: b\n---\n",
            pod_yaml("a", "nginx"),
            pod_yaml("b", "nginx")
        );
        let parsed = parse(text.as_bytes(), &source(), "node1");
        assert_eq!(keys(&parsed.pods), ["default/a", "default/b"]);
        assert_eq!(parsed.pods[0].pod.name(), "a-node1");
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let config_maps = parsed.others.get("ConfigMap").map(Vec::len);
        assert_eq!(config_maps, Some(1));
        assert_eq!(parsed.others["ConfigMap"][0]["data"]["a"], "b");
    }

    #[test]
    fn json_documents_pod_lists_and_lists_are_read() {
        let one = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        let parsed = parse(format!("  {one}\n{one}").as_bytes(), &source(), "n");
        assert_eq!(keys(&parsed.pods), ["default/j", "default/j"]);

        let list = r#"{"kind":"PodList","items":[{"metadata":{"name":"p1","namespace":"ns"},"spec":{"containers":[{"name":"c","image":"x"}]}}]}"#;
        let parsed = parse(list.as_bytes(), &source(), "n");
        assert_eq!(keys(&parsed.pods), ["ns/p1"]);

        let yaml_list = "kind: List\nitems:\n- kind: Pod\n  metadata: {name: l1}\n  spec: {containers: [{name: c, image: x}]}\n- kind: Secret\n  metadata: {name: s}\n";
        let parsed = parse(yaml_list.as_bytes(), &source(), "n");
        assert_eq!(keys(&parsed.pods), ["default/l1"]);
        assert_eq!(parsed.others.get("Secret").map(Vec::len), Some(1));
    }

    #[test]
    fn invalid_documents_name_document_object_and_field() {
        let text = format!("{}---\n{}", pod_yaml("good", "nginx"), pod_yaml("bad", "''"));
        let parsed = parse(text.as_bytes(), &source(), "n");
        assert_eq!(keys(&parsed.pods), ["default/good"]);
        assert_eq!(parsed.problems.len(), 1);
        let problem = &parsed.problems[0];
        assert_eq!(problem.object.as_deref(), Some("default/bad"));
        assert_eq!(problem.message, "document 2: spec.containers[0].image: Required value");
        assert_eq!(problem.field_errors[0].path, "spec.containers[0].image");
    }

    #[test]
    fn syntax_errors_keep_the_documents_before_them() {
        let text = format!("{}---\nkind: Pod\nmetadata: [unclosed\n", pod_yaml("a", "nginx"));
        let parsed = parse(text.as_bytes(), &source(), "n");
        assert_eq!(keys(&parsed.pods), ["default/a"]);
        assert_eq!(parsed.problems.len(), 1);
        assert!(parsed.problems[0].message.starts_with("invalid YAML: "), "{:?}", parsed.problems);
        assert_eq!(parsed.problems[0].object, None);
        let parsed = parse(b"{\"kind\": ", &source(), "n");
        assert!(parsed.problems[0].message.starts_with("invalid JSON: "), "{:?}", parsed.problems);
    }

    #[test]
    fn documents_without_kind_or_not_objects_are_problems() {
        let parsed = parse(b"metadata:\n  name: x\n", &source(), "n");
        assert_eq!(parsed.problems[0].message, "kind: Required value");
        assert_eq!(parsed.problems[0].object.as_deref(), Some("default/x"));
        let parsed = parse(b"- 1\n- 2\n", &source(), "n");
        assert_eq!(parsed.problems[0].object, None);
        let parsed = parse(&[0xff, 0xfe], &source(), "n");
        assert_eq!(parsed.problems[0].message, "manifest is not UTF-8 text");
        let parsed = parse(b"", &source(), "n");
        assert_eq!(parsed, Parsed::default(), "an empty manifest has no pods and no problems");
    }

    #[test]
    fn keep_last_good_keeps_only_what_may_still_be_meant() {
        let v1 = parse(
            format!("{}---\n{}", pod_yaml("a", "nginx:1"), pod_yaml("b", "nginx:1")).as_bytes(),
            &source(),
            "n",
        );
        assert_eq!(keep_last_good(&v1, &[]).1, 0);

        // b broken (named), a changed: the new a and the old b.
        let v2 = parse(
            format!("{}---\n{}", pod_yaml("a", "nginx:2"), pod_yaml("b", "''")).as_bytes(),
            &source(),
            "n",
        );
        let (pods, kept) = keep_last_good(&v2, &v1.pods);
        assert_eq!((keys(&pods), kept), (vec!["default/a", "default/b"], 1));
        assert_eq!(pods[0].pod, v2.pods[0].pod);
        assert_eq!(pods[1].pod, v1.pods[1].pod);

        // b removed, a broken: only a is kept.
        let v3 = parse(pod_yaml("a", "''").as_bytes(), &source(), "n");
        let (pods, _) = keep_last_good(&v3, &v1.pods);
        assert_eq!(keys(&pods), ["default/a"]);

        // A syntax error: everything previous that is not superseded stays.
        let v4 = parse(b"kind: [", &source(), "n");
        let (pods, kept) = keep_last_good(&v4, &v1.pods);
        assert_eq!((keys(&pods), kept), (vec!["default/a", "default/b"], 2));
    }
}

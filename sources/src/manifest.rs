//! Reading manifests: one byte string (a file, a URL's body, a request body) in, validated pods,
//! per-document problems and the documents of other kinds out.
//!
//! A manifest is YAML or JSON (JSON when its first non-blank character is `{` or `[`), with one or
//! more documents (`---` between YAML documents; JSON objects one after another). A document is a
//! `Pod`, a `PodList` or `List` of pods, or another kind, which is kept aside ([`Parsed::others`])
//! for the sources that will read ConfigMaps, Secrets and volumes. Empty documents are skipped.
//!
//! # What is accepted, and the limits
//!
//! - At most `MAX_MANIFEST_BYTES` of UTF-8 text and at most [`yaml::MAX_DOCUMENTS`] documents
//!   (YAML or JSON; empty YAML documents count).
//! - YAML is read as Kubernetes reads manifests (YAML 1.1 scalars, see [`nodelet_shared::yaml`]):
//!   `defaultMode: 0644` is the octal 420 (`'0644'` is a string), anchors, aliases and merge keys
//!   are expanded, a repeated key keeps its last value; booleans are only `true` and `false`
//!   (`name: y` is the string `y`, unlike in the kubelet).
//! - YAML nesting is at most [`yaml::MAX_DEPTH`] deep (JSON: serde_json's 128), aliases expand to
//!   at most twice the manifest's size in nodes and scalar bytes: a manifest past a limit is
//!   refused as a whole, with a problem that says which limit and where (line, column), and no
//!   document of it is used.
//! - A syntax error keeps the documents before it and reports the error (line, column).
//!
//! The problems do not name the manifest: the sources add where they read it (the file, the URL,
//! the HTTP endpoint) to each [`super::Problem`].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use nodelet_resources::model::pod::{DesiredPod, PodSource};
use nodelet_resources::pod::validation::{self, FieldError, ValidationError};

use super::admission::SourcePolicy;
use nodelet_shared::yaml;

/// The largest manifest read, from any source (a file, a URL's body, a request body).
pub(crate) const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;

/// A pod read from a manifest, with the key that identifies it in that manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedPod {
    /// `namespace/name` as written in the manifest (without a static pod's node suffix).
    pub key: String,
    /// The validated, defaulted pod, shared with what the source reports (a source keeps its last
    /// reading and the pod config keeps its last report: one copy of the pod, not two).
    pub pod: Arc<DesiredPod>,
}

/// A document of a manifest that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocProblem {
    /// `namespace/name` of the pod it is about, when the document says.
    pub object: Option<String>,
    /// What is wrong, for people (names the document and the field).
    pub message: String,
    /// The field errors, when the document is a pod that failed validation.
    pub(crate) field_errors: Vec<FieldError>,
    /// The pod is valid but the node's security settings refuse it.
    pub forbidden: bool,
}

/// What a manifest holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// The valid pods, in document order.
    pub pods: Vec<ParsedPod>,
    /// The documents that could not be used.
    pub problems: Vec<DocProblem>,
    /// Documents of other kinds, by kind, in document order.
    pub others: BTreeMap<String, Vec<serde_json::Value>>,
}

impl Parsed {
    fn problem(&mut self, object: Option<String>, message: String) {
        self.problems.push(DocProblem { object, message, field_errors: Vec::new(), forbidden: false });
    }
}

/// Parses and validates the manifest `bytes` from `source` for this node, and admits its pods with `security`
/// (a refused pod is a problem naming the pod and the check).
pub fn parse(bytes: &[u8], source: &PodSource, node_name: &str, security: &SourcePolicy) -> Parsed {
    let ctx = Ctx { source, node_name, security };
    let mut parsed = Parsed::default();
    if bytes.len() > MAX_MANIFEST_BYTES {
        parsed.problem(None, format!("manifest is larger than {MAX_MANIFEST_BYTES} bytes"));
        return parsed;
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        parsed.problem(None, "manifest is not UTF-8 text".into());
        return parsed;
    };
    // A panic in the YAML or JSON reader (a bug, not a manifest's fault) refuses the manifest, not the node.
    let read = std::panic::catch_unwind(|| read_documents(text)).unwrap_or_else(|payload| {
        let message = nodelet_shared::panic_message(payload.as_ref());
        tracing::error!(panic = %message, "reading a manifest panicked; the manifest is refused");
        Err((Vec::new(), format!("the manifest could not be read (nodelet panicked reading it: {message})")))
    });
    let documents = match read {
        Ok(documents) => documents,
        Err((documents, message)) => {
            // Keep what was read before the syntax error; the rest is unknown.
            let mut parsed = classify(documents, &ctx);
            parsed.problem(None, message);
            return parsed;
        }
    };
    parsed = classify(documents, &ctx);
    parsed
}

/// Splits `text` into documents. On a syntax error, returns the documents read before it and the
/// error; past a limit, no document and the limit.
fn read_documents(text: &str) -> Result<Vec<serde_json::Value>, (Vec<serde_json::Value>, String)> {
    let mut documents = Vec::new();
    let first = text.trim_start().chars().next();
    if matches!(first, Some('{' | '[')) {
        for value in serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>() {
            match value {
                Ok(_) if documents.len() == yaml::MAX_DOCUMENTS => {
                    let message = format!("invalid JSON: more than {} documents", yaml::MAX_DOCUMENTS);
                    return Err((Vec::new(), message));
                }
                Ok(value) => documents.push(value),
                Err(e) => return Err((documents, format!("invalid JSON: {e}"))),
            }
        }
    } else {
        documents = yaml::documents(text).map_err(|(before, e)| (before, format!("invalid YAML: {e}")))?;
    }
    Ok(documents)
}

/// Where a manifest came from and what its pods are held to.
struct Ctx<'a> {
    source: &'a PodSource,
    node_name: &'a str,
    security: &'a SourcePolicy,
}

fn classify(documents: Vec<serde_json::Value>, ctx: &Ctx<'_>) -> Parsed {
    let mut parsed = Parsed::default();
    let numbered = documents.len() > 1;
    for (i, document) in documents.into_iter().enumerate() {
        let label = if numbered { format!("document {}: ", i + 1) } else { String::new() };
        classify_guarded(document, &label, None, ctx, &mut parsed);
    }
    parsed
}

/// [`classify_one`] with a panic boundary: a panic while decoding, validating or admitting one document (a
/// bug that input reached) refuses that document, as a problem naming it, and the other documents of the
/// manifest are used; the source's task, and the node, keep running.
fn classify_guarded(
    document: serde_json::Value,
    label: &str,
    default_kind: Option<&str>,
    ctx: &Ctx<'_>,
    parsed: &mut Parsed,
) {
    let object = object_key(&document);
    let mut one = Parsed::default();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        classify_one(document, label, default_kind, ctx, &mut one);
    }));
    match outcome {
        Ok(()) => {
            parsed.pods.append(&mut one.pods);
            parsed.problems.append(&mut one.problems);
            for (kind, mut values) in std::mem::take(&mut one.others) {
                parsed.others.entry(kind).or_default().append(&mut values);
            }
        }
        Err(payload) => {
            // What the document produced before the panic is dropped with it: none of it is trusted.
            let message = nodelet_shared::panic_message(payload.as_ref());
            let name = object.as_deref().unwrap_or("(unnamed)");
            tracing::error!(object = name, panic = %message, "handling a manifest document panicked; the document is refused");
            parsed.problem(
                object,
                format!("{label}the document could not be handled (nodelet panicked on it: {message}); it is refused"),
            );
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Test hook: a pod document with this name makes [`classify_one`] panic (on this thread only).
    static PANIC_ON_POD: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

fn classify_one(
    document: serde_json::Value,
    label: &str,
    default_kind: Option<&str>,
    ctx: &Ctx<'_>,
    parsed: &mut Parsed,
) {
    let Ctx { source, node_name, security } = *ctx;
    if !document.is_object() {
        parsed.problem(None, format!("{label}Invalid value: expected a Kubernetes object (a mapping)"));
        return;
    }
    let kind = document.get("kind").and_then(|k| k.as_str()).map(str::to_owned);
    #[cfg(test)]
    if kind.as_deref().or(default_kind) == Some("Pod") {
        PANIC_ON_POD.with_borrow(|name| {
            if let Some(name) = name
                && object_key(&document).is_some_and(|key| key.ends_with(&format!("/{name}")))
            {
                panic!("test hook: panicking on pod {name}");
            }
        });
    }
    match kind.as_deref().or(default_kind) {
        Some("Pod") => match validation::prepare_value(document, source.clone(), node_name) {
            Ok(pod) => {
                let key = format!("{}/{}", pod.namespace(), manifest_name(&pod, node_name));
                match security.admit(&pod.pod) {
                    Ok(()) => parsed.pods.push(ParsedPod { key, pod: Arc::new(pod) }),
                    Err(refusal) => {
                        tracing::warn!(pod = %key, %refusal, "pod refused by the node's security settings");
                        parsed.problems.push(DocProblem {
                            object: Some(key),
                            message: format!("{label}{refusal}"),
                            field_errors: Vec::new(),
                            forbidden: true,
                        });
                    }
                }
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
                classify_guarded(item, &format!("{label}items[{j}]: "), item_default, ctx, parsed);
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
        forbidden: false,
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
        let parsed = parse(text.as_bytes(), &source(), "node1", &SourcePolicy::default());
        assert_eq!(keys(&parsed.pods), ["default/a", "default/b"]);
        assert_eq!(parsed.pods[0].pod.name(), "a-node1");
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let config_maps = parsed.others.get("ConfigMap").map(Vec::len);
        assert_eq!(config_maps, Some(1));
        assert_eq!(parsed.others["ConfigMap"][0]["data"]["a"], "b");
    }

    /// A panic while handling one document (the test hook stands for any bug input could reach) is a
    /// problem naming that document; the other documents, and the pods of a list, are used.
    #[test]
    fn a_panic_on_one_document_refuses_that_document_only() {
        PANIC_ON_POD.with_borrow_mut(|name| *name = Some("bad".to_owned()));
        let text = format!(
            "{}---\n{}---\nkind: List\nitems:\n- {{kind: Pod, metadata: {{name: bad, namespace: ns}}}}\n- {}\n",
            pod_yaml("good", "nginx"),
            pod_yaml("bad", "nginx"),
            r#"{kind: Pod, metadata: {name: other}, spec: {containers: [{name: c, image: x}]}}"#,
        );
        let parsed = parse(text.as_bytes(), &source(), "node1", &SourcePolicy::default());
        PANIC_ON_POD.with_borrow_mut(|name| *name = None);
        assert_eq!(keys(&parsed.pods), ["default/good", "default/other"]);
        let problems: Vec<(Option<&str>, &str)> =
            parsed.problems.iter().map(|p| (p.object.as_deref(), p.message.as_str())).collect();
        assert_eq!(
            problems,
            [
                (
                    Some("default/bad"),
                    "document 2: the document could not be handled (nodelet panicked on it: test hook: panicking on \
                     pod bad); it is refused"
                ),
                (
                    Some("ns/bad"),
                    "document 3: items[0]: the document could not be handled (nodelet panicked on it: test hook: \
                     panicking on pod bad); it is refused"
                ),
            ]
        );
    }

    /// The quantity of issue 37: an exponent at the limit of an `i64` once panicked (`i64::MIN.abs()`), which
    /// stopped the node; now it is a problem naming the pod and the field.
    #[test]
    fn a_quantity_exponent_at_the_i64_limit_is_a_problem_naming_the_field() {
        for cpu in ["1e-9223372036854775808", "1e9223372036854775807", "-1e-9223372036854775808"] {
            let text = format!(
                "{}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: bad}}\nspec:\n  containers:\n  - name: c\n    image: x\n    resources: {{limits: {{cpu: '{cpu}'}}}}\n",
                pod_yaml("good", "nginx")
            );
            let parsed = parse(text.as_bytes(), &source(), "node1", &SourcePolicy::default());
            assert_eq!(keys(&parsed.pods), ["default/good"], "{cpu}");
            assert_eq!(parsed.problems.len(), 1, "{cpu}: {:?}", parsed.problems);
            assert_eq!(parsed.problems[0].object.as_deref(), Some("default/bad"));
            let message = &parsed.problems[0].message;
            assert!(message.contains("spec.containers[0].resources.limits[cpu]"), "{cpu}: {message}");
            assert!(message.contains("too large") || message.contains("greater than"), "{cpu}: {message}");
        }
    }

    #[test]
    fn a_pod_the_security_level_refuses_is_a_forbidden_problem_naming_it() {
        let host = r#"{"kind":"Pod","metadata":{"name":"h"},"spec":{"hostNetwork":true,"containers":[{"name":"c","image":"x"}]}}"#;
        let plain =
            r#"{"kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        let baseline = SourcePolicy {
            security: nodelet_resources::pod::security::PodSecurity {
                level: nodelet_resources::pod::security::Level::Baseline,
                restrictions: None,
            },
            placement: None,
        };
        let parsed = parse(format!("{host}\n{plain}").as_bytes(), &source(), "n", &baseline);
        assert_eq!(keys(&parsed.pods), ["default/p"]);
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        let problem = &parsed.problems[0];
        assert!(problem.forbidden);
        assert_eq!(problem.object.as_deref(), Some("default/h"));
        assert_eq!(
            problem.message,
            r#"document 1: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
        );
        let privileged = parse(host.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(keys(&privileged.pods), ["default/h"]);
    }

    #[test]
    fn json_documents_pod_lists_and_lists_are_read() {
        let one = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"x"}]}}"#;
        let parsed = parse(format!("  {one}\n{one}").as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(keys(&parsed.pods), ["default/j", "default/j"]);

        let list = r#"{"kind":"PodList","items":[{"metadata":{"name":"p1","namespace":"ns"},"spec":{"containers":[{"name":"c","image":"x"}]}}]}"#;
        let parsed = parse(list.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(keys(&parsed.pods), ["ns/p1"]);

        let yaml_list = "kind: List\nitems:\n- kind: Pod\n  metadata: {name: l1}\n  spec: {containers: [{name: c, image: x}]}\n- kind: Secret\n  metadata: {name: s}\n";
        let parsed = parse(yaml_list.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(keys(&parsed.pods), ["default/l1"]);
        assert_eq!(parsed.others.get("Secret").map(Vec::len), Some(1));
    }

    #[test]
    fn invalid_documents_name_document_object_and_field() {
        let text = format!("{}---\n{}", pod_yaml("good", "nginx"), pod_yaml("bad", "''"));
        let parsed = parse(text.as_bytes(), &source(), "n", &SourcePolicy::default());
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
        let parsed = parse(text.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(keys(&parsed.pods), ["default/a"]);
        assert_eq!(parsed.problems.len(), 1);
        assert!(parsed.problems[0].message.starts_with("invalid YAML: "), "{:?}", parsed.problems);
        assert_eq!(parsed.problems[0].object, None);
        let parsed = parse(b"{\"kind\": ", &source(), "n", &SourcePolicy::default());
        assert!(parsed.problems[0].message.starts_with("invalid JSON: "), "{:?}", parsed.problems);
    }

    #[test]
    fn documents_without_kind_or_not_objects_are_problems() {
        let parsed = parse(b"metadata:\n  name: x\n", &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems[0].message, "kind: Required value");
        assert_eq!(parsed.problems[0].object.as_deref(), Some("default/x"));
        let parsed = parse(b"- 1\n- 2\n", &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems[0].object, None);
        let parsed = parse(&[0xff, 0xfe], &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems[0].message, "manifest is not UTF-8 text");
        let parsed = parse(b"", &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed, Parsed::default(), "an empty manifest has no pods and no problems");
    }

    /// A "billion laughs": 9 levels of 9 aliases, a few hundred bytes that would expand to 9^9
    /// scalars.
    fn billion_laughs() -> String {
        let mut text = String::from(
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        );
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for pair in names.windows(2) {
            let refs = vec![format!("*{}", pair[0]); 9].join(", ");
            text.push_str(&format!("  {}: &{} [{refs}]\n", pair[1], pair[1]));
        }
        text
    }

    #[test]
    fn a_billion_laughs_manifest_is_refused_quickly_with_the_file_named() {
        let text = format!("{}---\n{}", pod_yaml("a", "nginx"), billion_laughs());
        assert!(text.len() < 600, "{}", text.len());
        let started = std::time::Instant::now();
        let parsed = parse(text.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(parsed.pods.is_empty() && parsed.others.is_empty(), "nothing of it is used: {parsed:?}");
        assert_eq!(parsed.problems.len(), 1);
        let message = &parsed.problems[0].message;
        assert!(message.starts_with("invalid YAML: the "), "{message}");
        assert!(message.contains("aliases expand"), "{message}");
        assert!(message.contains(" at line "), "{message}");
        let problems = super::super::file::problems_of("/m/pods.yaml", &parsed, &[], 0);
        assert!(problems[0].to_string().starts_with("/m/pods.yaml: invalid YAML: the "), "{}", problems[0]);
    }

    #[test]
    fn document_count_and_nesting_are_capped() {
        let parsed = parse("---\n".repeat(10_000).as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(
            parsed.problems[0].message,
            "invalid YAML: more than 1000 YAML documents at line 1001, column 1"
        );
        let many_pods = (0..1001).map(|i| pod_yaml(&format!("p{i}"), "x")).collect::<Vec<_>>().join("---\n");
        let parsed = parse(many_pods.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert!(parsed.pods.is_empty(), "a manifest past a limit is refused as a whole");
        assert!(parsed.problems[0].message.starts_with("invalid YAML: more than 1000 YAML documents"));
        let json = "{}".repeat(1001);
        let parsed = parse(json.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(parsed.problems[0].message, "invalid JSON: more than 1000 documents");

        let deep = format!("kind: Pod\nspec: {}", "[".repeat(10_000));
        let parsed = parse(deep.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert_eq!(parsed.problems.len(), 1);
        let message = &parsed.problems[0].message;
        assert!(
            message.starts_with("invalid YAML: nested more than 64 levels deep at line 2, column "),
            "{message}"
        );
        // JSON (first character `[`) has serde_json's limit.
        let parsed = parse("[".repeat(10_000).as_bytes(), &source(), "n", &SourcePolicy::default());
        let message = &parsed.problems[0].message;
        assert!(message.starts_with("invalid JSON: recursion limit exceeded"), "{message}");
    }

    #[test]
    fn yaml_1_1_octal_modes_are_read_as_kubernetes_reads_them() {
        // The volumes of the Kubernetes docs (configMap defaultMode 0400, secret items mode 0511).
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: modes\nspec:\n  containers:\n  - name: app\n    image: busybox\n    volumeMounts:\n    - {name: config, mountPath: /etc/config}\n    - {name: secret, mountPath: /etc/secret}\n  volumes:\n  - name: config\n    configMap:\n      name: log-config\n      defaultMode: 0400\n  - name: secret\n    secret:\n      secretName: mysecret\n      defaultMode: 0o644\n      items:\n      - key: username\n        path: my-group/my-username\n        mode: 0511\n";
        let parsed = parse(text.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let volumes =
            parsed.pods[0].pod.pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        let config_map = volumes[0].config_map.as_ref().and_then(|c| c.default_mode);
        assert_eq!(config_map, Some(0o400));
        let secret = volumes[1].secret.as_ref().expect("secret volume");
        assert_eq!(secret.default_mode, Some(0o644));
        assert_eq!(secret.items.as_ref().map(|items| items[0].mode), Some(Some(0o511)));
        // Quoted, it is a string, which a mode is not.
        let quoted = text.replace("defaultMode: 0400", "defaultMode: '0400'");
        let parsed = parse(quoted.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert!(parsed.pods.is_empty());
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
    }

    #[test]
    fn anchors_and_aliases_within_the_limits_are_expanded() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: anchors\nspec:\n  containers:\n  - &app {name: a, image: nginx, env: [{name: X, value: \"1\"}]}\n  - <<: *app\n    name: b\n";
        let parsed = parse(text.as_bytes(), &source(), "n", &SourcePolicy::default());
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let containers =
            parsed.pods[0].pod.pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
        let summary: Vec<_> = containers.iter().map(|c| (c.name.as_str(), c.image.as_deref())).collect();
        assert_eq!(summary, [("a", Some("nginx")), ("b", Some("nginx"))]);
        assert_eq!(containers[1].env, containers[0].env);
    }

    #[test]
    fn keep_last_good_keeps_only_what_may_still_be_meant() {
        let v1 = parse(
            format!("{}---\n{}", pod_yaml("a", "nginx:1"), pod_yaml("b", "nginx:1")).as_bytes(),
            &source(),
            "n",
            &SourcePolicy::default(),
        );
        assert_eq!(keep_last_good(&v1, &[]).1, 0);

        // b broken (named), a changed: the new a and the old b.
        let v2 = parse(
            format!("{}---\n{}", pod_yaml("a", "nginx:2"), pod_yaml("b", "''")).as_bytes(),
            &source(),
            "n",
            &SourcePolicy::default(),
        );
        let (pods, kept) = keep_last_good(&v2, &v1.pods);
        assert_eq!((keys(&pods), kept), (vec!["default/a", "default/b"], 1));
        assert_eq!(pods[0].pod, v2.pods[0].pod);
        assert_eq!(pods[1].pod, v1.pods[1].pod);

        // b removed, a broken: only a is kept.
        let v3 = parse(pod_yaml("a", "''").as_bytes(), &source(), "n", &SourcePolicy::default());
        let (pods, _) = keep_last_good(&v3, &v1.pods);
        assert_eq!(keys(&pods), ["default/a"]);

        // A syntax error: everything previous that is not superseded stays.
        let v4 = parse(b"kind: [", &source(), "n", &SourcePolicy::default());
        let (pods, kept) = keep_last_good(&v4, &v1.pods);
        assert_eq!((keys(&pods), kept), (vec!["default/a", "default/b"], 2));
    }
}

//! YAML as nodelet reads and writes it: one decoder for everything nodelet reads as YAML (the
//! manifests of the manifest directory, the manifest URL and the HTTP source; the
//! KubeletConfiguration file) and one encoder for the client's `-o yaml`. Both use `serde-saphyr`.
//!
//! # What the decoder accepts
//!
//! YAML as Kubernetes reads manifests (go-yaml v2 behind `sigs.k8s.io/yaml`, YAML 1.1 scalars):
//! - plain integers with a leading `0` are octal (`defaultMode: 0644` is 420, `mode: 0400` is
//!   256), as are `0o644` and `-0644`; `0x1F` is hexadecimal; `1_000` is 1000. Quoted scalars
//!   (`'0644'`, `"0644"`) are always strings;
//! - booleans are only `true` and `false` (`True`, `TRUE`, ...): unlike go-yaml v2, the YAML 1.1
//!   spellings `yes`/`no`/`on`/`off`/`y`/`n` stay strings, so `name: y` or `value: on` mean what
//!   they say (the kubelet refuses such manifests);
//! - anchors and aliases, and merge keys (`<<: *base`), which are expanded;
//! - a key repeated in one mapping keeps its last value;
//! - `.nan` and `.inf` become `null` in the untyped values manifests are read into.
//!
//! # Limits
//!
//! Work and memory are bounded by the input's size (`n` bytes); a document past a limit is
//! refused, not partly read, with an error that says which limit it hit and where (line, column):
//! - at most [`MAX_DOCUMENTS`] documents (`---`) in one input, empty documents included;
//! - nesting at most [`MAX_DEPTH`] collections deep;
//! - aliases expand to at most `2n` nodes in all, and the scalar text, counting every expansion,
//!   is at most `2n + 1 KiB` bytes: a "billion laughs" of a few hundred bytes is refused after a
//!   few thousand nodes, without building them;
//! - at most `4n + 1 KiB` nodes (parser events) and anchor copies in all.
//!
//! The size of the input itself is the caller's limit (manifests: 8 MiB).

use serde::Serialize;
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::granit_parser::ErrorKind;
use serde_saphyr::options::NonFiniteFloatPolicy;
use serde_saphyr::{Budget, DuplicateKeyPolicy, ExternalMessageSource, Options};

/// The most documents one input may hold (empty ones included).
pub const MAX_DOCUMENTS: usize = 1000;
/// The deepest nesting of sequences and mappings. Decoding recurses per level: 64 levels fit the
/// 2 MiB stack of a test or tokio worker thread even in a debug build (about 90 do not).
pub const MAX_DEPTH: usize = 64;
/// Added to the size-proportional limits, so that tiny inputs with a tag or an alias still fit.
const SLACK: usize = 1024;

/// Why YAML could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input is past one of the limits (see the module docs).
    #[error("{limit}{at}")]
    Limit {
        /// Which limit, for people.
        limit: String,
        /// ` at line L, column C`, when known.
        at: String,
    },
    /// Not YAML, or not of the expected shape.
    #[error("{message}")]
    Invalid {
        /// What is wrong and where, for people.
        message: String,
    },
    /// More than one document where one is read.
    #[error("holds more than one YAML document{at}")]
    MultipleDocuments {
        /// ` at line L, column C`, where the second document starts.
        at: String,
    },
}

impl DecodeError {
    /// Whether the input was refused for a limit (rather than for its syntax or shape).
    pub fn is_limit(&self) -> bool {
        matches!(self, Self::Limit { .. })
    }

    /// Translates a serde-saphyr error for an input of `input_len` bytes.
    pub fn new(error: &serde_saphyr::Error, input_len: usize) -> Self {
        let limits = Limits::of(input_len);
        let at = match error.location() {
            Some(l) if l.line() > 0 => format!(" at line {}, column {}", l.line(), l.column()),
            _ => String::new(),
        };
        let limit = |limit: String| Self::Limit { limit, at: at.clone() };
        match root(error) {
            serde_saphyr::Error::Budget { breach, .. } => limit(match breach {
                BudgetBreach::Documents { .. } => format!("more than {MAX_DOCUMENTS} YAML documents"),
                BudgetBreach::Depth { .. } => format!("nested more than {MAX_DEPTH} levels deep"),
                BudgetBreach::ScalarBytes { .. } => format!(
                    "the scalars, with aliases expanded, are longer than {} bytes (twice the input's size)",
                    limits.scalar_bytes
                ),
                BudgetBreach::Events { .. } | BudgetBreach::Nodes { .. } => format!(
                    "more than {} YAML nodes with aliases expanded (four times the input's size)",
                    limits.events
                ),
                BudgetBreach::RecordedAnchorEvents { .. } | BudgetBreach::RecordedAnchorBytes { .. } => {
                    format!("the anchors copy more than {} nodes or bytes", limits.events)
                }
                other => format!("past a YAML limit: {other:?}"),
            }),
            serde_saphyr::Error::AliasReplayLimitExceeded { .. }
            | serde_saphyr::Error::AliasReplayCounterOverflow { .. } => limit(format!(
                "the aliases expand to more than {} nodes (twice the input's size)",
                limits.alias_replays
            )),
            serde_saphyr::Error::AliasReplayStackDepthExceeded { max_depth, .. } => {
                limit(format!("aliases nested more than {max_depth} levels deep"))
            }
            serde_saphyr::Error::ExternalMessage { source, .. } if nesting_limit(source) => {
                limit(format!("nested more than {MAX_DEPTH} levels deep"))
            }
            serde_saphyr::Error::MultipleDocuments { .. } => Self::MultipleDocuments { at },
            _ => Self::Invalid { message: error.without_snippet().to_string() },
        }
    }
}

/// The error under the wrappers that add a snippet or an alias's locations.
fn root(error: &serde_saphyr::Error) -> &serde_saphyr::Error {
    let mut error = error;
    loop {
        match error {
            serde_saphyr::Error::WithSnippet { error: inner, .. }
            | serde_saphyr::Error::AliasError { error: inner, .. } => error = inner,
            other => return other,
        }
    }
}

/// Whether the parser stopped at its nesting limit.
fn nesting_limit(source: &ExternalMessageSource) -> bool {
    matches!(source, ExternalMessageSource::Parser(e) if matches!(e.kind(), ErrorKind::RecursionLimitExceeded))
}

/// The size-proportional limits for an input of some size.
#[derive(Debug, Clone, Copy)]
struct Limits {
    alias_replays: usize,
    scalar_bytes: usize,
    events: usize,
}

impl Limits {
    fn of(input_len: usize) -> Self {
        Self {
            alias_replays: input_len.saturating_mul(2),
            scalar_bytes: input_len.saturating_mul(2).saturating_add(SLACK),
            events: input_len.saturating_mul(4).saturating_add(SLACK),
        }
    }
}

/// The decoder's options for an input of `input_len` bytes (see the module docs).
pub fn options(input_len: usize) -> Options {
    let limits = Limits::of(input_len);
    let mut budget = Budget::default();
    budget.max_documents = MAX_DOCUMENTS;
    budget.max_depth = MAX_DEPTH;
    // The parser's own limit for flow collections (`[[[…`): its scanner reads them ahead of the
    // events the budget counts.
    budget.flow_nesting_limit = MAX_DEPTH;
    budget.max_events = limits.events;
    budget.max_nodes = limits.events;
    budget.max_total_scalar_bytes = limits.scalar_bytes;
    budget.max_recorded_anchor_events = limits.events;
    budget.max_recorded_anchor_bytes = limits.scalar_bytes;
    budget.max_total_comment_bytes = limits.scalar_bytes;
    // The size-proportional limits bound alias expansion; the ratio heuristic would also refuse
    // ordinary manifests that reuse a few anchors a hundred times.
    budget.enforce_alias_anchor_ratio = false;
    let mut options = Options::default();
    options.budget = Some(budget);
    options.alias_limits.max_total_replayed_events = limits.alias_replays;
    options.legacy_octal_numbers = true;
    // YAML 1.2 booleans only: `name: y` or `value: on` stay strings (go-yaml v2 makes them
    // booleans, which breaks such manifests in the kubelet).
    options.strict_booleans = true;
    options.duplicate_keys = DuplicateKeyPolicy::LastWins;
    options.non_finite_float_policy = NonFiniteFloatPolicy::PassThrough;
    options.with_snippet = false;
    options
}

/// The documents of `text` as JSON values, empty (null) documents left out.
///
/// On an error, returns the documents before the one with the error (none when a limit was hit:
/// the limits are over the whole input) and the error.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, (Vec<serde_json::Value>, DecodeError)> {
    let error = match serde_saphyr::from_multiple_with_options(text, options(text.len())) {
        Ok(documents) => return Ok(documents),
        Err(e) => DecodeError::new(&e, text.len()),
    };
    if error.is_limit() {
        return Err((Vec::new(), error));
    }
    // A syntax error: read again document by document to keep those before it. The whole input
    // is within the limits up to the error, so this second reading is too.
    let mut before = Vec::new();
    let mut reader = std::io::Cursor::new(text.as_bytes());
    for document in serde_saphyr::read_with_options::<_, serde_json::Value>(&mut reader, options(text.len()))
    {
        match document {
            Ok(document) if before.len() < MAX_DOCUMENTS => before.push(document),
            _ => break,
        }
    }
    Err((before, error))
}

/// One document of `text` as a `T`, within the limits (the tests read their manifests and configs, and the
/// client's `-o yaml` output, with it).
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, DecodeError> {
    serde_saphyr::from_str_with_options(text, options(text.len()))
        .map_err(|e| DecodeError::new(&e, text.len()))
}

/// Why a value could not be written as YAML.
#[derive(Debug, thiserror::Error)]
#[error("cannot write YAML: {0}")]
pub struct EncodeError(#[from] serde_saphyr::SerializeError);

/// `value` as YAML, the way kubectl writes it: block style, list items at their key's
/// indentation, strings quoted only when they would read as another type (`"True"`, `"0644"`,
/// `"yes"`), multi-line strings as `|` blocks, long strings on one line.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, EncodeError> {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.folded_wrap_chars = usize::MAX;
    Ok(serde_saphyr::to_string_with_options(value, options)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn billion_laughs() -> String {
        let mut text = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (name, previous) in
            ["b", "c", "d", "e", "f", "g", "h", "i"].iter().zip(["a", "b", "c", "d", "e", "f", "g", "h"])
        {
            let refs = vec![format!("*{previous}"); 9].join(", ");
            text.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        text
    }

    #[test]
    fn yaml_1_1_octal_and_booleans_are_read_as_kubernetes_reads_them() {
        let v: serde_json::Value =
            from_str("a: 0644\nb: 0o644\nc: 0400\nd: '0644'\ne: \"0400\"\nf: 0\ng: 0x1F\nh: yes\ni: off\nj: 10\nk: True\nl: y\n")
                .expect("decodes");
        assert_eq!(
            v,
            serde_json::json!({"a": 420, "b": 420, "c": 256, "d": "0644", "e": "0400", "f": 0, "g": 31,
                               "h": "yes", "i": "off", "j": 10, "k": true, "l": "y"})
        );
    }

    #[test]
    fn anchors_aliases_and_merge_keys_within_the_limits_are_expanded() {
        let v: serde_json::Value =
            from_str("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\nlist: &l [1, 2]\nagain: *l\nk: 1\nk: 2\n")
                .expect("decodes");
        assert_eq!(
            v,
            serde_json::json!({"base": {"x": 1}, "other": {"x": 1, "y": 2}, "list": [1, 2], "again": [1, 2], "k": 2})
        );
    }

    #[test]
    fn a_billion_laughs_is_refused_quickly() {
        let text = billion_laughs();
        assert!(text.len() < 400, "{}", text.len());
        let started = std::time::Instant::now();
        let (before, error) = documents(&text).expect_err("refused");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(before.is_empty());
        assert!(error.is_limit(), "{error}");
        assert!(
            error.to_string().contains("aliases expanded") || error.to_string().contains("aliases expand"),
            "{error}"
        );
        assert!(error.to_string().contains(" at line "), "{error}");
    }

    #[test]
    fn large_scalars_repeated_by_aliases_are_refused() {
        let text = format!("a: &big {}\nb: [{}]\n", "x".repeat(4096), vec!["*big"; 16].join(", "));
        let error = from_str::<serde_json::Value>(&text).expect_err("refused");
        assert!(
            error.to_string().starts_with("the scalars, with aliases expanded, are longer than"),
            "{error}"
        );
    }

    #[test]
    fn document_count_and_depth_are_capped() {
        let (_, error) = documents(&"---\n".repeat(10_000)).expect_err("refused");
        assert_eq!(error.to_string(), "more than 1000 YAML documents at line 1001, column 1");
        assert!(documents(&"---\n".repeat(MAX_DOCUMENTS)).is_ok(), "exactly the limit is fine");

        let (_, error) = documents(&"[".repeat(10_000)).expect_err("refused");
        assert!(error.to_string().starts_with("nested more than 64 levels deep at line 1"), "{error}");
        let mut nested = String::new();
        for depth in 0..200 {
            nested.push_str(&format!("{}a:\n", " ".repeat(depth)));
        }
        let error = from_str::<serde_json::Value>(&nested).expect_err("refused");
        assert!(error.to_string().starts_with("nested more than 64 levels deep"), "{error}");
        let ok = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(from_str::<serde_json::Value>(&ok).is_ok(), "exactly the limit is fine");
    }

    #[test]
    fn syntax_errors_keep_the_documents_before_them() {
        let (before, error) = documents("a: 1\n---\n---\nb: 2\n---\nc: [unclosed\n").expect_err("refused");
        assert_eq!(before, [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]);
        assert!(!error.is_limit());
        assert!(error.to_string().contains("line 6"), "{error}");
    }

    #[test]
    fn output_is_like_kubectls() {
        let long = format!("{} end", "x".repeat(100));
        let value = serde_json::json!({
            "kind": "List",
            "items": [{"status": "True", "mode": "0644", "n": 1, "text": "a\nb\n", "long": long, "empty": []}],
        });
        let text = to_string(&value).expect("encodes");
        let expected = format!(
            "items:\n- empty: []\n  long: {long}\n  mode: \"0644\"\n  \"n\": 1\n  status: \"True\"\n  text: |\n    a\n    b\nkind: List\n"
        );
        assert_eq!(text, expected);
        let back: serde_json::Value = from_str(&text).expect("reads back");
        assert_eq!(back, value);
    }
}

//! Kubernetes label selectors (`-l`/`--selector`) and the simple field selectors of
//! `--field-selector`, parsed and matched on the client like the API server does it.
//!
//! Label selector syntax (k8s.io/apimachinery `labels.Parse`): comma-separated requirements, each
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`,
//! `key>N` or `key<N`. Errors carry the apimachinery parser's words.

use std::collections::BTreeMap;

/// Why a selector could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector is malformed (apimachinery's message).
    #[error("unable to parse requirement: {0}")]
    Requirement(#[from] RequirementError),
    /// The text after a requirement is not `,` or the end.
    #[error("{0}")]
    Syntax(String),
    /// A field selector names a field the resource cannot be selected by.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    /// A field selector term is not `field=value`, `field==value` or `field!=value`.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    BadField(String, String),
}

/// Why one requirement of a label selector is malformed: apimachinery's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    /// A token other than the expected ones.
    #[error("found '{found}', expected: {expected}")]
    Unexpected {
        /// The token as written.
        found: String,
        /// What the grammar allows there.
        expected: &'static str,
    },
    /// The key's prefix is not a DNS-1123 subdomain.
    #[error(
        "key: Invalid value: \"{0}\": prefix part a lowercase RFC 1123 subdomain must consist of lower \
             case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
    )]
    KeyPrefix(String),
    /// The key's name part is not a qualified name.
    #[error(
        "key: Invalid value: \"{0}\": name part must consist of alphanumeric characters, '-', '_' or \
             '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
             '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )]
    KeyName(String),
    /// A value is not a label value.
    #[error(
        "values[0][{key}]: Invalid value: \"{value}\": a valid label must be an empty string or consist of \
         alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character \
         (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is \
         '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    )]
    Value {
        /// The requirement's key.
        key: String,
        /// The value as written.
        value: String,
    },
    /// The value of a `gt` or `lt` requirement is not an integer.
    #[error("values[0]: Invalid value: \"{0}\": for 'Gt', 'Lt' operators, the value must be an integer")]
    NotInteger(String),
}

impl RequirementError {
    fn unexpected(found: &Token, expected: &'static str) -> Self {
        Self::Unexpected { found: found.literal(), expected }
    }
}

/// An operator of a label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    In,
    NotIn,
    GreaterThan,
    LessThan,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    DoesNotExist,
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
    End,
    Error(String),
}

impl Token {
    fn literal(&self) -> String {
        match self {
            Token::Ident(s) | Token::Error(s) => s.clone(),
            Token::DoesNotExist => "!".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Comma => ",".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits the selector into tokens like apimachinery's lexer (`in`/`notin` are keywords; in value
/// position the parser reads them back as identifiers).
fn lex(s: &str) -> Vec<Token> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_special(c) {
            let mut j = i;
            while j < chars.len() && is_special(chars[j]) {
                j += 1;
            }
            // The longest run of special characters that is a token.
            let mut matched = None;
            for end in (i + 1..=j).rev() {
                let text: String = chars[i..end].iter().collect();
                let t = match text.as_str() {
                    "!" => Token::DoesNotExist,
                    "!=" => Token::NotEquals,
                    "=" => Token::Equals,
                    "==" => Token::DoubleEquals,
                    "(" => Token::Open,
                    ")" => Token::Close,
                    "," => Token::Comma,
                    ">" => Token::Gt,
                    "<" => Token::Lt,
                    _ => continue,
                };
                matched = Some((t, end));
                break;
            }
            match matched {
                Some((t, end)) => {
                    out.push(t);
                    i = end;
                }
                None => {
                    out.push(Token::Error(chars[i..j].iter().collect()));
                    i = j;
                }
            }
        } else {
            let mut j = i;
            while j < chars.len() && !chars[j].is_whitespace() && !is_special(chars[j]) {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            out.push(match word.as_str() {
                "in" => Token::In,
                "notin" => Token::NotIn,
                _ => Token::Ident(word),
            });
            i = j;
        }
    }
    out.push(Token::End);
    out
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    /// The next token in value position, where `in`/`notin` are plain identifiers.
    fn next_value(&mut self) -> Token {
        match self.next() {
            Token::In => Token::Ident("in".into()),
            Token::NotIn => Token::Ident("notin".into()),
            t => t,
        }
    }

    fn peek_value(&self) -> Token {
        match self.peek() {
            Token::In => Token::Ident("in".into()),
            Token::NotIn => Token::Ident("notin".into()),
            t => t.clone(),
        }
    }

    fn requirement(&mut self) -> Result<Requirement, RequirementError> {
        let mut op = None;
        let mut t = self.next_value();
        if t == Token::DoesNotExist {
            op = Some(Op::DoesNotExist);
            t = self.next_value();
        }
        let Token::Ident(key) = t else {
            return Err(RequirementError::unexpected(&t, "identifier"));
        };
        validate_key(&key)?;
        if matches!(self.peek_value(), Token::End | Token::Comma) || op == Some(Op::DoesNotExist) {
            return Ok(Requirement { key, op: op.unwrap_or(Op::Exists), values: Vec::new() });
        }
        let op = match self.next() {
            Token::In => Op::In,
            Token::NotIn => Op::NotIn,
            Token::Equals | Token::DoubleEquals => Op::Equals,
            Token::NotEquals => Op::NotEquals,
            Token::Gt => Op::GreaterThan,
            Token::Lt => Op::LessThan,
            other => {
                return Err(RequirementError::unexpected(&other, "in, notin, =, ==, !=, gt, lt"));
            }
        };
        let values = match op {
            Op::In | Op::NotIn => self.value_set()?,
            _ => vec![self.exact_value()?],
        };
        for v in &values {
            validate_value(&key, v)?;
        }
        if matches!(op, Op::GreaterThan | Op::LessThan) && values[0].parse::<i64>().is_err() {
            return Err(RequirementError::NotInteger(values[0].clone()));
        }
        Ok(Requirement { key, op, values })
    }

    fn exact_value(&mut self) -> Result<String, RequirementError> {
        if matches!(self.peek_value(), Token::End | Token::Comma) {
            return Ok(String::new());
        }
        match self.next_value() {
            Token::Ident(v) => Ok(v),
            t => Err(RequirementError::unexpected(&t, "identifier")),
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, RequirementError> {
        let t = self.next();
        if t != Token::Open {
            return Err(RequirementError::unexpected(&t, "'('"));
        }
        let mut values = Vec::new();
        // `()` and `(a,)` hold an empty value, as in apimachinery.
        loop {
            match self.next_value() {
                Token::Ident(v) => {
                    values.push(v);
                    match self.next_value() {
                        Token::Comma => {}
                        Token::Close => return Ok(values),
                        t => return Err(RequirementError::unexpected(&t, "',' or ')'")),
                    }
                    if self.peek_value() == Token::Close {
                        self.next();
                        values.push(String::new());
                        return Ok(values);
                    }
                }
                Token::Close => {
                    values.push(String::new());
                    return Ok(values);
                }
                Token::Comma => {
                    values.push(String::new());
                }
                t => return Err(RequirementError::unexpected(&t, "',', ')' or identifier")),
            }
        }
    }
}

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn validate_key(key: &str) -> Result<(), RequirementError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !nodelet_shared::names::is_dns_subdomain(p)
    {
        return Err(RequirementError::KeyPrefix(key.to_owned()));
    }
    if !name_part_ok(name) {
        return Err(RequirementError::KeyName(key.to_owned()));
    }
    Ok(())
}

fn validate_value(key: &str, value: &str) -> Result<(), RequirementError> {
    if value.is_empty() || name_part_ok(value) {
        return Ok(());
    }
    Err(RequirementError::Value { key: key.to_owned(), value: value.to_owned() })
}

impl LabelSelector {
    /// Parses a label selector; `""` selects everything.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut p = Parser { tokens: lex(s), pos: 0 };
        let mut requirements = Vec::new();
        loop {
            match p.peek_value() {
                Token::End => break,
                Token::Ident(_) | Token::DoesNotExist => {
                    let r = p.requirement()?;
                    requirements.push(r);
                    match p.next() {
                        Token::End => break,
                        Token::Comma => {
                            if !matches!(p.peek_value(), Token::Ident(_) | Token::DoesNotExist) {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{}', expected: identifier after ','",
                                    p.peek().literal()
                                )));
                            }
                        }
                        t => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            )));
                        }
                    }
                }
                t => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    )));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether an object with `labels` is selected.
    pub(crate) fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        self.requirements.iter().all(|r| {
            let v = get(&r.key);
            match r.op {
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Equals | Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::NotEquals | Op::NotIn => v.is_none_or(|v| r.values.iter().all(|x| x != v)),
                Op::GreaterThan | Op::LessThan => {
                    let (Some(have), Ok(want)) =
                        (v.and_then(|v| v.parse::<i64>().ok()), r.values[0].parse::<i64>())
                    else {
                        return false;
                    };
                    if r.op == Op::GreaterThan { have > want } else { have < want }
                }
            }
        })
    }
}

/// A field selector: `field=value`, `field==value` or `field!=value` terms, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses `s`, accepting only the fields in `supported` (the API server's field labels for the kind).
    pub fn parse(s: &str, supported: &[&str]) -> Result<FieldSelector, SelectorError> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(SelectorError::BadField(s.to_owned(), term.to_owned()));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(SelectorError::UnsupportedField(field.to_owned()));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether the object (as JSON) is selected: a missing field counts as `""`.
    pub(crate) fn matches(&self, object: &serde_json::Value) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            // The API server's `source` field label of events is the source's component.
            let path = if field == "source" { "source.component" } else { field.as_str() };
            let mut cur = Some(object);
            for part in path.split('.') {
                cur = cur.and_then(|c| c.get(part));
            }
            let have = match cur {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (have == *value) == *equal
        })
    }
}

/// The field labels the API server accepts for pods.
pub const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

/// The field labels the API server accepts for events.
pub(crate) const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The field labels of every other kind.
pub(crate) const META_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn equality_and_set_based_requirements_match_like_the_api_server() {
        let web = labels(&[("app", "web"), ("tier", "front"), ("replicas", "3")]);
        let db = labels(&[("app", "db")]);
        let cases: &[(&str, bool, bool)] = &[
            ("", true, true),
            ("app=web", true, false),
            ("app==web", true, false),
            ("app!=web", false, true),
            ("app in (web, db)", true, true),
            ("app notin (web)", false, true),
            ("tier", true, false),
            ("!tier", false, true),
            ("app=web,tier=front", true, false),
            ("app,!tier", false, true),
            ("tier!=back", true, true),
            ("replicas>2", true, false),
            ("replicas<3", false, false),
            ("app in (in, notin)", false, false),
            ("tier=", false, false),
        ];
        for (s, on_web, on_db) in cases {
            let s2 = sel(s);
            assert_eq!(s2.matches(Some(&web)), *on_web, "{s} on web");
            assert_eq!(s2.matches(Some(&db)), *on_db, "{s} on db");
        }
        assert!(sel("a!=b").matches(None), "no labels: != matches");
        assert!(!sel("a").matches(None));
        assert!(sel("example.com/role=x").matches(Some(&labels(&[("example.com/role", "x")]))));
    }

    #[test]
    fn malformed_selectors_are_refused_in_apimachinerys_words() {
        let err = |s: &str| LabelSelector::parse(s).expect_err(s).to_string();
        assert_eq!(err("app in"), "unable to parse requirement: found '', expected: '('");
        assert_eq!(err("app in (a"), "unable to parse requirement: found '', expected: ',' or ')'");
        assert_eq!(err("app = = b"), "unable to parse requirement: found '=', expected: identifier");
        assert_eq!(
            err("app web"),
            "unable to parse requirement: found 'web', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(err("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(err("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(err("=b"), "found '=', expected: !, identifier, or 'end of string'");
        assert!(err("!a=b").contains("expected: ',' or 'end of string'"), "!key takes no value");
        assert!(err("a>x").contains("must be an integer"));
        assert!(err("-a=b").contains("name part must consist of alphanumeric characters"));
        assert!(err("a=-b").contains("a valid label must be an empty string"));
        assert!(err("Bad_Prefix/a=b").contains("prefix part"));
    }

    #[test]
    fn field_selectors_accept_only_the_kinds_fields() {
        let f = FieldSelector::parse("involvedObject.name=web,type!=Normal", EVENT_FIELDS).expect("parse");
        let warn = serde_json::json!({"involvedObject": {"name": "web"}, "type": "Warning"});
        let normal = serde_json::json!({"involvedObject": {"name": "web"}, "type": "Normal"});
        let other = serde_json::json!({"involvedObject": {"name": "db"}, "type": "Warning"});
        assert!(f.matches(&warn) && !f.matches(&normal) && !f.matches(&other));
        let by_source = FieldSelector::parse("source=nodelet", EVENT_FIELDS).expect("parse");
        assert!(by_source.matches(&serde_json::json!({"source": {"component": "nodelet", "host": "n1"}})));
        assert_eq!(
            FieldSelector::parse("spec.foo=x", POD_FIELDS).expect_err("unknown").to_string(),
            "field label not supported: spec.foo"
        );
        assert!(FieldSelector::parse("status.phase", POD_FIELDS).is_err());
        let p = FieldSelector::parse("status.phase==Running", POD_FIELDS).expect("parse");
        assert!(p.matches(&serde_json::json!({"status": {"phase": "Running"}})));
    }
}

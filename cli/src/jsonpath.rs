//! kubectl's JSONPath templates (`-o jsonpath=…`, and the columns of `-o custom-columns=…`), the
//! dialect of k8s.io/client-go/util/jsonpath: text with `{…}` actions; in an action a path
//! (`.a.b`, `['a.b']`, `[0]`, `[-1:]`, `[0:4:2]`, `[*]`, `.*`, `..name`, `[?(@.x=="y")]`,
//! `[0,2]`, `['a','b']`, optional leading `$`/`@`), a quoted string (`{"\t"}`), or
//! `range PATH` … `end`. Missing keys print nothing (kubectl's `--allow-missing-template-keys`).
//! Strings print as they are, numbers and booleans as text, objects and arrays as compact JSON;
//! several results of one action are separated by a space.
//!
//! No Rust crate implements this dialect (the JSONPath crates implement RFC 9535, without
//! templates, `range`, or kubectl's output rules), hence this module.

use serde_json::Value;

/// A template that could not be parsed or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonPathError {
    /// The template is malformed.
    #[error("error parsing jsonpath {template}, {message}")]
    Parse {
        /// The template.
        template: String,
        /// What is wrong.
        message: PathError,
    },
    /// Evaluation failed (e.g. an index out of bounds).
    #[error("error executing jsonpath {template:?}: Error executing template: {message}")]
    Execute {
        /// The template.
        template: String,
        /// What failed.
        message: PathError,
    },
}

/// What is wrong with one action of a template, or why evaluating a path failed; the messages are
/// client-go's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// An action `{` without its `}`.
    #[error("unclosed action")]
    UnclosedAction,
    /// An `{end}` outside a `range`.
    #[error("not in range, nothing to end")]
    NothingToEnd,
    /// A `range` without its `{end}`.
    #[error("unexpected EOF: range without end")]
    RangeWithoutEnd,
    /// A quoted string without its closing quote.
    #[error("unterminated quoted string {0}")]
    UnterminatedString(String),
    /// An unknown `\` escape (`escape` is what follows the backslash) in the quoted string `text`.
    #[error("invalid escape \\{escape} in {text}")]
    InvalidEscape {
        /// What follows the backslash.
        escape: String,
        /// The quoted string.
        text: String,
    },
    /// An empty or unquoted field name in the given path or bracket.
    #[error("invalid field name in {0}")]
    InvalidFieldName(String),
    /// A character (or path) a path cannot hold.
    #[error("unrecognized character in action: {0}")]
    UnrecognizedCharacter(String),
    /// A `[` without its `]` in the given path.
    #[error("unterminated array in {0}")]
    UnterminatedArray(String),
    /// An array index that is not an integer (as written, with or without its brackets).
    #[error("invalid array index {0}")]
    InvalidIndex(String),
    /// A filter operand that is neither a path, a string, a number nor a boolean.
    #[error("unrecognized filter operand {0}")]
    UnrecognizedOperand(String),
    /// An index outside the array.
    #[error("array index out of bounds: index {index}, length {length}")]
    OutOfBounds {
        /// The index.
        index: i64,
        /// The array's length.
        length: i64,
    },
    /// A slice whose start is after its end.
    #[error("starting index {start} is greater than ending index {end}")]
    StartAfterEnd {
        /// The start.
        start: i64,
        /// The end.
        end: i64,
    },
    /// A `custom-columns` expression that is not a single path (kubectl's `RelaxedJSONPathExpression`).
    #[error(
        "unexpected path string, expected a 'name1.name2' or '.name1.name2' or '{{name1.name2}}' or '{{.name1.name2}}'"
    )]
    NotRelaxedPath,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `.name` / `['name']`.
    Field(String),
    /// `.*` / `[*]`: every value of an object or element of an array.
    Wildcard,
    /// `..`: the value and all its descendants (pre-order), before the next step.
    Recursive,
    /// `[start:end:step]` or `[i]` (`single`).
    Slice { start: Option<i64>, end: Option<i64>, step: Option<i64>, single: bool },
    /// `[0,2]`.
    Indexes(Vec<i64>),
    /// `['a.b', 'c']`: each a path of its own.
    Union(Vec<Vec<Step>>),
    /// `[?(…)]`.
    Filter(Box<Filter>),
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Path(Vec<Step>),
    Str(String),
    Num(f64),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    left: Operand,
    /// `None`: the left path exists.
    cmp: Option<(String, Operand)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Path(Vec<Step>),
    Range(Vec<Step>, Vec<Node>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    source: String,
    nodes: Vec<Node>,
}

impl Template {
    /// Parses `template`.
    pub(crate) fn parse(template: &str) -> Result<Template, JsonPathError> {
        let err = |message: PathError| JsonPathError::Parse { template: template.to_owned(), message };
        let chars: Vec<char> = template.chars().collect();
        // Stack of open ranges: (path, nodes so far); the bottom is the template itself.
        let mut stack: Vec<(Option<Vec<Step>>, Vec<Node>)> = vec![(None, Vec::new())];
        let mut text = String::new();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] != '{' {
                text.push(chars[i]);
                i += 1;
                continue;
            }
            if !text.is_empty()
                && let Some((_, nodes)) = stack.last_mut()
            {
                nodes.push(Node::Text(std::mem::take(&mut text)));
            }
            // The action: up to the matching `}`, skipping quoted strings.
            let mut j = i + 1;
            let mut quote: Option<char> = None;
            while j < chars.len() {
                let c = chars[j];
                match quote {
                    Some(_) if c == '\\' => j += 1,
                    Some(q) if c == q => quote = None,
                    Some(_) => {}
                    None if c == '"' || c == '\'' => quote = Some(c),
                    None if c == '}' => break,
                    None => {}
                }
                j += 1;
            }
            if j >= chars.len() {
                return Err(err(PathError::UnclosedAction));
            }
            let action: String = chars[i + 1..j].iter().collect();
            let action = action.trim();
            i = j + 1;
            if action == "end" {
                if stack.len() < 2 {
                    return Err(err(PathError::NothingToEnd));
                }
                let Some((Some(path), body)) = stack.pop() else {
                    return Err(err(PathError::NothingToEnd));
                };
                if let Some((_, nodes)) = stack.last_mut() {
                    nodes.push(Node::Range(path, body));
                }
            } else if let Some(rest) = action.strip_prefix("range ") {
                let path = parse_path(rest.trim()).map_err(err)?;
                stack.push((Some(path), Vec::new()));
            } else if action.starts_with('"') {
                let s = unquote(action).map_err(err)?;
                if let Some((_, nodes)) = stack.last_mut() {
                    nodes.push(Node::Text(s));
                }
            } else {
                let path = parse_path(action).map_err(err)?;
                if let Some((_, nodes)) = stack.last_mut() {
                    nodes.push(Node::Path(path));
                }
            }
        }
        if !text.is_empty()
            && let Some((_, nodes)) = stack.last_mut()
        {
            nodes.push(Node::Text(text));
        }
        if stack.len() != 1 {
            return Err(err(PathError::RangeWithoutEnd));
        }
        let nodes = stack.pop().map(|(_, n)| n).unwrap_or_default();
        Ok(Template { source: template.to_owned(), nodes })
    }

    /// Renders the template against `data`.
    pub(crate) fn render(&self, data: &Value) -> Result<String, JsonPathError> {
        let mut out = String::new();
        render_nodes(&self.nodes, data, &mut out)
            .map_err(|message| JsonPathError::Execute { template: self.source.clone(), message })?;
        Ok(out)
    }

    /// The values of each path action at the top level (what a custom column shows).
    pub(crate) fn values(&self, data: &Value) -> Result<Vec<Value>, JsonPathError> {
        let mut all = Vec::new();
        for node in &self.nodes {
            if let Node::Path(steps) = node {
                let found = eval(steps, vec![data.clone()])
                    .map_err(|message| JsonPathError::Execute { template: self.source.clone(), message })?;
                all.extend(found);
            }
        }
        Ok(all)
    }
}

fn render_nodes(nodes: &[Node], cur: &Value, out: &mut String) -> Result<(), PathError> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Path(steps) => {
                let values = eval(steps, vec![cur.clone()])?;
                let texts: Vec<String> = values.iter().map(to_text).collect();
                out.push_str(&texts.join(" "));
            }
            Node::Range(steps, body) => {
                for v in eval(steps, vec![cur.clone()])? {
                    render_nodes(body, &v, out)?;
                }
            }
        }
    }
    Ok(())
}

/// How a result prints: strings as they are, objects and arrays as compact JSON (Go's
/// `json.Marshal`, which escapes `<`, `>` and `&`).
pub(crate) fn to_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(_) | Value::Number(_) => v.to_string(),
        Value::Array(_) | Value::Object(_) => {
            v.to_string().replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
        }
    }
}

/// Go's `fmt.Sprint` of an unstructured value (what `-o custom-columns` prints): `map[k:v]`, `[a b]`.
pub(crate) fn go_format(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        Value::Bool(_) | Value::Number(_) => v.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_format).collect::<Vec<_>>().join(" ")),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let parts: Vec<String> =
                keys.into_iter().map(|k| format!("{k}:{}", go_format(&o[k.as_str()]))).collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// Go's `strconv.Unquote` of a double-quoted string.
fn unquote(s: &str) -> Result<String, PathError> {
    let inner = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| PathError::UnterminatedString(s.to_owned()))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).ok_or_else(|| {
                    PathError::InvalidEscape { escape: format!("u{hex}"), text: s.to_owned() }
                })?;
                out.push(c);
            }
            other => {
                return Err(PathError::InvalidEscape {
                    escape: other.unwrap_or(' ').to_string(),
                    text: s.to_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// Reads a field name up to `.` or `[` (a `\.` is a literal dot).
fn read_name(chars: &[char], i: &mut usize) -> String {
    let mut name = String::new();
    while *i < chars.len() {
        let c = chars[*i];
        if c == '\\' && chars.get(*i + 1) == Some(&'.') {
            name.push('.');
            *i += 2;
            continue;
        }
        if c == '.' || c == '[' {
            break;
        }
        name.push(c);
        *i += 1;
    }
    name
}

/// Parses a path such as `.items[*].metadata.name`.
fn parse_path(s: &str) -> Result<Vec<Step>, PathError> {
    let chars: Vec<char> = s.chars().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    if matches!(chars.first(), Some('$' | '@')) {
        i = 1;
    }
    while i < chars.len() {
        match chars[i] {
            '.' if chars.get(i + 1) == Some(&'.') => {
                i += 2;
                steps.push(Step::Recursive);
                let name = read_name(&chars, &mut i);
                if name == "*" {
                    steps.push(Step::Wildcard);
                } else if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
            }
            '.' => {
                i += 1;
                let name = read_name(&chars, &mut i);
                if name.is_empty() {
                    if i >= chars.len() {
                        // `{.}`: the current object.
                        continue;
                    }
                    return Err(PathError::InvalidFieldName(s.to_owned()));
                }
                if name.chars().any(char::is_whitespace) {
                    return Err(PathError::UnrecognizedCharacter(s.to_owned()));
                }
                steps.push(if name == "*" { Step::Wildcard } else { Step::Field(name) });
            }
            '[' => {
                let start = i + 1;
                let mut j = start;
                let mut quote = None;
                let mut depth = 0;
                while j < chars.len() {
                    let c = chars[j];
                    match quote {
                        Some(_) if c == '\\' => j += 1,
                        Some(q) if c == q => quote = None,
                        Some(_) => {}
                        None if c == '"' || c == '\'' => quote = Some(c),
                        None if c == '(' => depth += 1,
                        None if c == ')' => depth -= 1,
                        None if c == ']' && depth <= 0 => break,
                        None => {}
                    }
                    j += 1;
                }
                if j >= chars.len() {
                    return Err(PathError::UnterminatedArray(s.to_owned()));
                }
                let inner: String = chars[start..j].iter().collect();
                steps.push(parse_bracket(inner.trim())?);
                i = j + 1;
            }
            c if steps.is_empty() && i == 0 => {
                // A path without a leading dot, as `range items[*]` is sometimes written.
                let name = read_name(&chars, &mut i);
                if name.is_empty() {
                    return Err(PathError::UnrecognizedCharacter(c.to_string()));
                }
                steps.push(Step::Field(name));
            }
            c => return Err(PathError::UnrecognizedCharacter(c.to_string())),
        }
    }
    Ok(steps)
}

/// Splits on commas outside quotes.
fn split_top(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for c in s.chars() {
        match quote {
            Some(q) if c == q => {
                quote = None;
                cur.push(c);
            }
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                cur.push(c);
            }
            None if c == ',' => parts.push(std::mem::take(&mut cur)),
            None => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

fn strip_quotes(s: &str) -> Option<&str> {
    s.strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
}

fn parse_bracket(inner: &str) -> Result<Step, PathError> {
    if inner == "*" {
        return Ok(Step::Wildcard);
    }
    if let Some(f) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
        return parse_filter(f.trim()).map(|f| Step::Filter(Box::new(f)));
    }
    if inner.starts_with('\'') || inner.starts_with('"') {
        let mut paths = Vec::new();
        for part in split_top(inner) {
            let name =
                strip_quotes(part.trim()).ok_or_else(|| PathError::InvalidFieldName(format!("[{inner}]")))?;
            paths.push(parse_path(&format!(".{name}"))?);
        }
        // One plain name is an ordinary field.
        if let [p] = paths.as_slice()
            && let [Step::Field(_)] = p.as_slice()
        {
            return Ok(p[0].clone());
        }
        return Ok(Step::Union(paths));
    }
    let parts = split_top(inner);
    if parts.len() > 1 {
        let idx: Result<Vec<i64>, _> = parts.iter().map(|p| p.trim().parse::<i64>()).collect();
        return idx.map(Step::Indexes).map_err(|_| PathError::InvalidIndex(format!("[{inner}]")));
    }
    let num = |s: &str| -> Result<Option<i64>, PathError> {
        let s = s.trim();
        if s.is_empty() {
            Ok(None)
        } else {
            s.parse::<i64>().map(Some).map_err(|_| PathError::InvalidIndex(s.to_owned()))
        }
    };
    let fields: Vec<&str> = inner.split(':').collect();
    match fields.as_slice() {
        [one] => {
            let i = num(one)?.ok_or_else(|| PathError::InvalidIndex("[]".to_owned()))?;
            Ok(Step::Slice { start: Some(i), end: None, step: None, single: true })
        }
        [a, b] => Ok(Step::Slice { start: num(a)?, end: num(b)?, step: None, single: false }),
        [a, b, c] => Ok(Step::Slice { start: num(a)?, end: num(b)?, step: num(c)?, single: false }),
        _ => Err(PathError::InvalidIndex(format!("[{inner}]"))),
    }
}

fn parse_operand(s: &str) -> Result<Operand, PathError> {
    let s = s.trim();
    if s.starts_with('@') || s.starts_with('$') || s.starts_with('.') {
        return parse_path(s).map(Operand::Path);
    }
    if let Some(q) = strip_quotes(s) {
        return Ok(Operand::Str(q.to_owned()));
    }
    match s {
        "true" => return Ok(Operand::Bool(true)),
        "false" => return Ok(Operand::Bool(false)),
        _ => {}
    }
    s.parse::<f64>().map(Operand::Num).map_err(|_| PathError::UnrecognizedOperand(s.to_owned()))
}

fn parse_filter(f: &str) -> Result<Filter, PathError> {
    // The first comparison operator outside quotes.
    let chars: Vec<char> = f.chars().collect();
    let mut quote = None;
    for (i, &c) in chars.iter().enumerate() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => continue,
            None if c == '"' || c == '\'' => quote = Some(c),
            None => {
                let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
                let op = if ["==", "!=", ">=", "<="].contains(&two.as_str()) {
                    two
                } else if c == '>' || c == '<' {
                    c.to_string()
                } else {
                    continue;
                };
                let left: String = chars[..i].iter().collect();
                let right: String = chars[i + op.chars().count()..].iter().collect();
                return Ok(Filter { left: parse_operand(&left)?, cmp: Some((op, parse_operand(&right)?)) });
            }
        }
    }
    Ok(Filter { left: parse_operand(f)?, cmp: None })
}

fn eval(steps: &[Step], input: Vec<Value>) -> Result<Vec<Value>, PathError> {
    let mut cur = input;
    for step in steps {
        let mut next = Vec::new();
        match step {
            Step::Field(name) => {
                for v in &cur {
                    if let Some(x) = v.get(name.as_str()).filter(|x| !x.is_null()) {
                        next.push(x.clone());
                    }
                }
            }
            Step::Wildcard => {
                for v in &cur {
                    match v {
                        Value::Array(a) => next.extend(a.iter().cloned()),
                        Value::Object(o) => next.extend(o.values().cloned()),
                        _ => {}
                    }
                }
            }
            Step::Recursive => {
                fn walk(v: &Value, out: &mut Vec<Value>) {
                    let children: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        Value::Object(o) => o.values().collect(),
                        _ => Vec::new(),
                    };
                    if !children.is_empty() {
                        out.push(v.clone());
                        for c in children {
                            walk(c, out);
                        }
                    }
                }
                for v in &cur {
                    walk(v, &mut next);
                }
            }
            Step::Slice { start, end, step, single } => {
                for v in &cur {
                    let Value::Array(a) = v else { continue };
                    let len = i64::try_from(a.len()).unwrap_or(i64::MAX);
                    let mut s = start.unwrap_or(0);
                    if s < 0 {
                        s += len;
                    }
                    let mut e = match (end, single) {
                        (_, true) => s + 1,
                        (Some(e), false) => *e,
                        (None, false) => len,
                    };
                    if e < 0 {
                        e += len;
                    }
                    if s == e {
                        continue;
                    }
                    if s >= len || s < 0 {
                        return Err(PathError::OutOfBounds { index: s, length: len });
                    }
                    if e > len || e < 0 {
                        return Err(PathError::OutOfBounds { index: e - 1, length: len });
                    }
                    if s > e {
                        return Err(PathError::StartAfterEnd { start: s, end: e });
                    }
                    let step = step.unwrap_or(1).max(1);
                    let mut i = s;
                    while i < e {
                        if let Some(x) = usize::try_from(i).ok().and_then(|i| a.get(i)) {
                            next.push(x.clone());
                        }
                        i += step;
                    }
                }
            }
            Step::Indexes(idx) => {
                for v in &cur {
                    let Value::Array(a) = v else { continue };
                    let len = i64::try_from(a.len()).unwrap_or(i64::MAX);
                    for &i in idx {
                        let k = if i < 0 { i + len } else { i };
                        match usize::try_from(k).ok().and_then(|k| a.get(k)) {
                            Some(x) => next.push(x.clone()),
                            None => {
                                return Err(PathError::OutOfBounds { index: i, length: len });
                            }
                        }
                    }
                }
            }
            Step::Union(paths) => {
                for p in paths {
                    next.extend(eval(p, cur.clone())?);
                }
            }
            Step::Filter(f) => {
                for v in &cur {
                    let Value::Array(a) = v else { continue };
                    for item in a {
                        if filter_matches(f, item)? {
                            next.push(item.clone());
                        }
                    }
                }
            }
        }
        cur = next;
    }
    Ok(cur)
}

fn operand_value(o: &Operand, item: &Value) -> Result<Option<Value>, PathError> {
    Ok(match o {
        Operand::Path(p) => eval(p, vec![item.clone()])?.into_iter().next(),
        Operand::Str(s) => Some(Value::String(s.clone())),
        Operand::Num(n) => serde_json::Number::from_f64(*n).map(Value::Number),
        Operand::Bool(b) => Some(Value::Bool(*b)),
    })
}

fn filter_matches(f: &Filter, item: &Value) -> Result<bool, PathError> {
    let Some(left) = operand_value(&f.left, item)? else { return Ok(false) };
    let Some((op, right)) = &f.cmp else { return Ok(true) };
    let Some(right) = operand_value(right, item)? else { return Ok(false) };
    use std::cmp::Ordering;
    let ord: Option<Ordering> = match (&left, &right) {
        (Value::Number(a), Value::Number(b)) => {
            a.as_f64().zip(b.as_f64()).and_then(|(a, b)| a.partial_cmp(&b))
        }
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    };
    Ok(match (op.as_str(), ord) {
        ("==", o) => o == Some(Ordering::Equal),
        ("!=", o) => o != Some(Ordering::Equal),
        ("<", Some(o)) => o == Ordering::Less,
        (">", Some(o)) => o == Ordering::Greater,
        ("<=", Some(o)) => o != Ordering::Greater,
        (">=", Some(o)) => o != Ordering::Less,
        _ => false,
    })
}

/// kubectl's `RelaxedJSONPathExpression`: `a.b`, `.a.b`, `{a.b}` and `{.a.b}` all become `{.a.b}`.
pub(crate) fn relaxed(expr: &str) -> Result<String, PathError> {
    if expr.is_empty() {
        return Ok(String::new());
    }
    let inner = expr.strip_prefix('{').and_then(|e| e.strip_suffix('}')).unwrap_or(expr);
    let inner = inner.strip_prefix('.').unwrap_or(inner);
    if inner.is_empty() || inner.contains('{') || inner.contains('}') {
        return Err(PathError::NotRelaxedPath);
    }
    Ok(format!("{{.{inner}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The input of the examples on kubernetes.io/docs/reference/kubectl/jsonpath/.
    fn doc() -> Value {
        serde_json::json!({
          "kind": "List",
          "items":[
            {"kind":"None","metadata":{"name":"127.0.0.1","labels":{"kubernetes.io/hostname":"127.0.0.1"}},
             "status":{"capacity":{"cpu":"4"},"addresses":[{"type": "LegacyHostIP", "address":"127.0.0.1"}]}},
            {"kind":"None","metadata":{"name":"127.0.0.2"},
             "status":{"capacity":{"cpu":"8"},"addresses":[
               {"type": "LegacyHostIP", "address":"127.0.0.2"},{"type": "another", "address":"127.0.0.3"}]}}
          ],
          "users":[{"name": "myself","user": {}},{"name": "e2e","user": {"username": "admin", "password": "secret"}}]
        })
    }

    fn run(t: &str) -> String {
        Template::parse(t)
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .render(&doc())
            .unwrap_or_else(|e| panic!("{t}: {e}"))
    }

    #[test]
    fn the_kubectl_documentation_examples() {
        assert_eq!(run("kind is {.kind}"), "kind is List");
        assert_eq!(run("{$.kind}"), "List");
        assert_eq!(run("{.kind}"), "List");
        assert_eq!(run("{['kind']}"), "List");
        assert_eq!(run("{.items[0].metadata.labels['kubernetes\\.io/hostname']}"), "127.0.0.1");
        assert_eq!(run("{..name}"), "127.0.0.1 127.0.0.2 myself e2e");
        assert_eq!(run("{.items[*].metadata.name}"), "127.0.0.1 127.0.0.2");
        assert_eq!(run("{.users[0].name}"), "myself");
        assert_eq!(
            run("{.items[*]['metadata.name', 'status.capacity']}"),
            "127.0.0.1 127.0.0.2 {\"cpu\":\"4\"} {\"cpu\":\"8\"}"
        );
        assert_eq!(run("{.users[?(@.name==\"e2e\")].user.password}"), "secret");
        assert_eq!(
            run("{range .items[*]}[{.metadata.name}, {.status.capacity}] {end}"),
            "[127.0.0.1, {\"cpu\":\"4\"}] [127.0.0.2, {\"cpu\":\"8\"}] "
        );
        assert_eq!(run("{\"{\"}"), "{");
        assert_eq!(run("{.items[-1:].metadata.name}"), "127.0.0.2");
        assert_eq!(run("{range .items[*]}{.metadata.name}{\"\\t\"}{end}"), "127.0.0.1\t127.0.0.2\t");
        assert_eq!(run("{.items[*].status.addresses[?(@.type=='another')].address}"), "127.0.0.3");
    }

    #[test]
    fn slices_unions_filters_and_missing_keys() {
        assert_eq!(run("{.items[0:1].metadata.name}"), "127.0.0.1");
        assert_eq!(run("{.items[0:2:2].metadata.name}"), "127.0.0.1");
        assert_eq!(run("{.items[0,1].metadata.name}"), "127.0.0.1 127.0.0.2");
        assert_eq!(run("{.items[?(@.status.capacity.cpu=='8')].metadata.name}"), "127.0.0.2");
        assert_eq!(run("{.users[?(@.user.username)].name}"), "e2e");
        assert_eq!(run("{.users[?(@.name!='e2e')].name}"), "myself");
        assert_eq!(run("{.nope.deeper}"), "", "missing keys print nothing");
        assert_eq!(run("{.users[*].user}"), "{} {\"password\":\"secret\",\"username\":\"admin\"}");
        assert_eq!(
            run("{.items[*].metadata.*}"),
            "{\"kubernetes.io/hostname\":\"127.0.0.1\"} 127.0.0.1 127.0.0.2"
        );
        let numbers = serde_json::json!({"a": [{"n": 1}, {"n": 5}, {"n": 10}], "b": true, "s": "<x>"});
        let t = Template::parse("{.a[?(@.n>=5)].n} {.b} {.a[1]}").expect("parse");
        assert_eq!(t.render(&numbers).expect("render"), "5 10 true {\"n\":5}");
        let t = Template::parse("{.a[?(@.n<5)].n}").expect("parse");
        assert_eq!(t.render(&numbers).expect("render"), "1");
        let t = Template::parse("{@}").expect("parse");
        assert_eq!(
            t.render(&serde_json::json!({"s": "<&>"})).expect("render"),
            "{\"s\":\"\\u003c\\u0026\\u003e\"}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let parse = |t: &str| Template::parse(t).expect_err(t).to_string();
        assert_eq!(parse("{.items"), "error parsing jsonpath {.items, unclosed action");
        assert!(parse("{end}").contains("not in range, nothing to end"));
        assert!(parse("{range .items[*]}{.x}").contains("range without end"));
        assert!(parse("{.items[}").contains("unterminated array"));
        assert!(parse("{.items[a]}").contains("invalid array index"));
        let e = Template::parse("{.items[5]}").expect("parse").render(&doc()).expect_err("out of bounds");
        assert!(e.to_string().contains("array index out of bounds: index 5, length 2"), "{e}");
    }

    #[test]
    fn typed_errors_keep_client_gos_messages() {
        let parse = |t: &str| Template::parse(t).expect_err(t).to_string();
        assert_eq!(parse(r#"{"\q"}"#), r#"error parsing jsonpath {"\q"}, invalid escape \q in "\q""#);
        assert_eq!(
            parse(r#"{"\uzzzz"}"#),
            r#"error parsing jsonpath {"\uzzzz"}, invalid escape \uzzzz in "\uzzzz""#
        );
        assert_eq!(parse("{.items[]}"), "error parsing jsonpath {.items[]}, invalid array index []");
        assert_eq!(
            parse("{.items[?(@.a==x)]}"),
            "error parsing jsonpath {.items[?(@.a==x)]}, unrecognized filter operand x"
        );
        let render = |t: &str| Template::parse(t).expect("parse").render(&doc()).expect_err(t).to_string();
        assert_eq!(
            render("{.items[1:0]}"),
            r#"error executing jsonpath "{.items[1:0]}": Error executing template: starting index 1 is greater than ending index 0"#
        );
        assert_eq!(
            relaxed("{a}{b}").map_err(|e| e.to_string()),
            Err("unexpected path string, expected a 'name1.name2' or '.name1.name2' or '{name1.name2}' or \
                 '{.name1.name2}'"
                .to_owned())
        );
    }

    #[test]
    fn relaxed_paths_and_go_formatting() {
        assert_eq!(relaxed("metadata.name").as_deref(), Ok("{.metadata.name}"));
        assert_eq!(relaxed(".metadata.name").as_deref(), Ok("{.metadata.name}"));
        assert_eq!(relaxed("{.metadata.name}").as_deref(), Ok("{.metadata.name}"));
        assert!(relaxed("{a}{b}").is_err());
        assert_eq!(go_format(&serde_json::json!({"b": 1, "a": ["x", "y"]})), "map[a:[x y] b:1]");
        assert_eq!(go_format(&Value::Null), "<nil>");
    }
}

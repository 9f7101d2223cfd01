//! The daemon's log output: the kubelet's `--logging-format` (`logging.format`), `text` (the default,
//! tracing's human-readable lines) or `json`, one JSON object per line in the shape of the kubelet's
//! JSON logs (component-base's zap/logr encoder):
//!
//! ```json
//! {"ts":1733106000.123456,"caller":"server/routes.rs:120","msg":"serving","v":0,"main":"127.0.0.1:10250"}
//! {"ts":1733106001.5,"caller":"cluster/node.rs:210","msg":"updating the node status failed","err":"timed out"}
//! ```
//!
//! - `ts`: seconds since the Unix epoch, as a float;
//! - `caller`: the source file's last directory and name, and the line;
//! - `msg`: the message;
//! - `v`: the verbosity of an info line: 0 for `INFO` and `WARN` (the kubelet logs warnings as info), 4 for
//!   `DEBUG`, 6 for `TRACE` (the `-v` levels that show them); `ERROR` lines have no `v`, like the
//!   kubelet's error lines;
//! - the event's fields and those of the spans it is in, flattened as top-level keys; the field `error`
//!   is written as `err`, the key of the kubelet's errors.
//!
//! The verbosity (`-v` / `logging.verbosity`) and `RUST_LOG` choose what is logged in either format.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// `--logging-format` / `logging.format` (the configuration's: `nodelet_config::LogFormat`).
pub(crate) use crate::config::LogFormat;

/// Why logging cannot be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoggingError {
    /// `RUST_LOG` is not a valid filter (the reason is in the message, as the binary prints it).
    #[error("invalid RUST_LOG {value:?}: {reason}")]
    Filter { value: String, reason: tracing_subscriber::filter::ParseError },
    /// A global subscriber is already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// Installs the global subscriber on stderr: `RUST_LOG` when set, else the `verbosity` level (see
/// [`nodelet_shared::log::filter_directive`]), in `format`.
pub(crate) fn init(format: LogFormat, verbosity: Option<u8>) -> Result<(), LoggingError> {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).map_err(|reason| LoggingError::Filter { value: v.clone(), reason })?
        }
        _ => EnvFilter::new(nodelet_shared::log::filter_directive(verbosity)),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => {
            builder.with_ansi(false).fmt_fields(JsonFields).event_format(KlogJson::default()).try_init()
        }
    };
    installed.map_err(LoggingError::Install)
}

/// The kubelet's JSON line format (see the [module docs](self)).
#[derive(Debug, Default)]
pub(crate) struct KlogJson {
    /// A fixed time for tests; `None`: now.
    fixed_time: Option<f64>,
}

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ts = self.fixed_time.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        });
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        // Events from the `log` crate carry their origin as fields.
        let file = fields.take_str("log.file").or_else(|| meta.file().map(str::to_owned));
        let line = fields.take_u64("log.line").or_else(|| meta.line().map(u64::from));
        for key in ["log.target", "log.module_path"] {
            fields.take_str(key);
        }
        let mut line_out: Vec<(String, Value)> = Vec::with_capacity(fields.values.len() + 4);
        line_out.push(("ts".into(), Value::from(ts)));
        if let Some(file) = file {
            let caller = match line {
                Some(n) => format!("{}:{n}", short_path(&file)),
                None => short_path(&file).to_owned(),
            };
            line_out.push(("caller".into(), Value::from(caller)));
        }
        line_out.push(("msg".into(), Value::from(fields.message.take().unwrap_or_default())));
        if let Some(v) = verbosity(*meta.level()) {
            line_out.push(("v".into(), Value::from(v)));
        }
        // The spans' fields, outermost first, then the event's own.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(formatted) = ext.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&formatted.fields)
                {
                    line_out.extend(map);
                }
            }
        }
        line_out.extend(fields.values);
        writer.write_char('{')?;
        for (i, (key, value)) in line_out.iter().enumerate() {
            if i > 0 {
                writer.write_char(',')?;
            }
            let key = serde_json::to_string(key).map_err(|_| fmt::Error)?;
            let value = serde_json::to_string(value).map_err(|_| fmt::Error)?;
            write!(writer, "{key}:{value}")?;
        }
        writeln!(writer, "}}")
    }
}

/// The `v` of a line: the `-v` level that shows it; `None` for errors.
fn verbosity(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(6),
    }
}

/// `a/b/c/routes.rs` → `c/routes.rs` (zap's short caller).
fn short_path(path: &str) -> &str {
    let mut slashes = path.rmatch_indices('/');
    match (slashes.next(), slashes.next()) {
        (Some(_), Some((i, _))) => &path[i + 1..],
        _ => path,
    }
}

/// Span fields as a JSON object (what [`KlogJson`] merges into each line).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct JsonFields;

impl<'writer> FormatFields<'writer> for JsonFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = Fields::default();
        fields.record(&mut visitor);
        writer.write_str(&Value::Object(visitor.into_object()).to_string())
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut map = match serde_json::from_str::<Value>(&current.fields) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let mut visitor = Fields::default();
        fields.record(&mut visitor);
        map.extend(visitor.into_object());
        current.fields = Value::Object(map).to_string();
        Ok(())
    }
}

/// An event's or span's fields as JSON values, in order; the message apart.
#[derive(Debug, Default)]
struct Fields {
    message: Option<String>,
    values: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => self.message = Some(value.as_str().map_or_else(|| value.to_string(), str::to_owned)),
            "error" => self.values.push(("err".to_owned(), value)),
            name => self.values.push((name.to_owned(), value)),
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        let i = self.values.iter().position(|(k, _)| k == key)?;
        Some(self.values.remove(i).1)
    }

    fn take_str(&mut self, key: &str) -> Option<String> {
        match self.take(key)? {
            Value::String(s) => Some(s),
            other => Some(other.to_string()),
        }
    }

    fn take_u64(&mut self, key: &str) -> Option<u64> {
        self.take(key)?.as_u64()
    }

    fn into_object(self) -> Map<String, Value> {
        self.values.into_iter().collect()
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Captures what the subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(f: impl FnOnce()) -> Vec<Value> {
        capture_text(f)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    fn capture_text(f: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields)
            .event_format(KlogJson { fixed_time: Some(1_700_000_000.25) })
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8")
    }

    #[test]
    fn lines_carry_the_kubelets_keys() {
        let lines = capture(|| {
            tracing::info!(node = "n1", pods = 3_u64, ready = true, "starting");
            tracing::debug!(path = ?std::path::Path::new("/x"), "detail");
            tracing::trace!("very detailed");
            tracing::warn!("careful");
            let e = std::io::Error::other("disk on fire");
            tracing::error!(error = %e, "cannot write");
        });
        assert_eq!(lines.len(), 5, "{lines:?}");
        let first = &lines[0];
        assert_eq!(first["ts"], 1_700_000_000.25);
        assert_eq!(first["msg"], "starting");
        assert_eq!(first["v"], 0);
        assert_eq!(first["node"], "n1");
        assert_eq!(first["pods"], 3);
        assert_eq!(first["ready"], true);
        let caller = first["caller"].as_str().expect("caller");
        assert!(caller.starts_with("src/logging.rs:"), "{caller}");
        assert_eq!(lines[1]["v"], 4);
        assert_eq!(lines[1]["path"], "\"/x\"");
        assert_eq!(lines[2]["v"], 6);
        assert_eq!(lines[3]["v"], 0, "warnings are info lines");
        assert_eq!(lines[4]["err"], "disk on fire");
        assert_eq!(lines[4]["msg"], "cannot write");
        assert!(lines[4].get("v").is_none(), "error lines have no v: {}", lines[4]);
    }

    #[test]
    fn the_kubelets_keys_come_first() {
        let text = capture_text(|| tracing::info!(a = 1_u64, "m"));
        assert!(text.starts_with("{\"ts\":1700000000.25,\"caller\":\"src/logging.rs:"), "{text}");
        assert!(text.ends_with(",\"msg\":\"m\",\"v\":0,\"a\":1}\n"), "{text}");
    }

    #[test]
    fn span_fields_are_flattened_and_messages_escaped() {
        let lines = capture(|| {
            let span = tracing::info_span!("operation", reconciler = "pods", attempt = 1_u64);
            let _entered = span.enter();
            span.record("attempt", 2_u64);
            tracing::info!(key = "a\"b\nc", "line\nbreak");
        });
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["reconciler"], "pods");
        assert_eq!(lines[0]["attempt"], 2);
        assert_eq!(lines[0]["key"], "a\"b\nc");
        assert_eq!(lines[0]["msg"], "line\nbreak");
    }

    #[test]
    fn callers_are_short() {
        assert_eq!(short_path("/a/b/src/server/routes.rs"), "server/routes.rs");
        assert_eq!(short_path("src/main.rs"), "src/main.rs");
        assert_eq!(short_path("main.rs"), "main.rs");
    }
}

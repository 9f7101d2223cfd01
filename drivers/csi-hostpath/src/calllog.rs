//! The optional call log: one JSON line per CSI call, so tests can check the order of calls.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// Appends `{"method":…,"volume_id":…,"code":…}` lines to a file, when configured.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    file: Option<Mutex<File>>,
}

impl CallLog {
    /// A log appending to `path` (created if missing), or a disabled one.
    pub(crate) fn open(path: Option<&Path>) -> io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(p)?)),
            None => None,
        };
        Ok(CallLog { file })
    }

    /// Records one finished call; `code` is the gRPC code name (`"Ok"`, `"NotFound"`, …).
    pub(crate) fn record(&self, method: &str, volume_id: &str, code: tonic::Code) {
        let Some(file) = &self.file else { return };
        let line = serde_json::json!({
            "method": method,
            "volume_id": volume_id,
            "code": format!("{code:?}"),
        });
        let mut text = line.to_string();
        text.push('\n');
        // One write of the whole line: O_APPEND keeps lines whole even with several writers.
        let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(error = %e, "cannot write the call log");
        }
    }
}

//! `/containerLogs`: opens a container's CRI log file and streams the container's output the way the
//! kubelet does (the parsing and rendering are in [`nodelet_shared::cri_log`], shared with `nodelet logs`): the last
//! N lines, lines since a time, optional timestamps, a byte limit, and following the file as it grows.
//!
//! Each chunk goes out on its own before the next chunk or the end of the body, as the kubelet's flushing
//! writer sends it: the body stream yields once between chunks, so the server writes (and flushes) one chunk
//! before it learns that the body has ended. A client that reads a chunk and the end of the body in one `Read`
//! can lose the chunk: the v1.28 API server's WebSocket log streaming (`wsstream.messageCopy`) drops data that
//! comes with `io.EOF`, and Go's chunked reader returns both at once when the terminating chunk is already
//! buffered (the upstream spec "should support retrieving logs from the container over websockets").

use std::io::{self, SeekFrom};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::io::AsyncSeekExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use nodelet_shared::cri_log::{LineReader, Renderer, tail_start};

/// How often a followed log file is checked for new lines.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How often a follower asks whether the container still runs while the file does not grow.
const RUNNING_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Output is sent in chunks of about this size.
const CHUNK_BYTES: usize = 32 * 1024;

/// The query parameters of `/containerLogs` that nodelet serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `follow=true`: keep streaming new lines until the container stops or the client goes away.
    pub follow: bool,
    /// `tailLines=N`: start with the last N lines (N ≥ 0).
    pub tail_lines: Option<u64>,
    /// `timestamps=true`: prefix each line with its timestamp (RFC 3339, 9 fractional digits).
    pub timestamps: bool,
    /// `limitBytes=N`: stop after N bytes of output (N > 0).
    pub limit_bytes: Option<u64>,
    /// `previous=true`: the log of the container's previous instance.
    pub previous: bool,
    /// `sinceSeconds=N` / `sinceTime=T`: only lines logged at or after this time.
    pub since: Option<k8s_openapi::jiff::Timestamp>,
}

/// Why the query of a log request is refused (the message of its 400 response).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A number parameter that is not an integer.
    #[error("{key}: {value:?} is not an integer")]
    NotAnInteger {
        /// The parameter.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// A negative `tailLines`.
    #[error("tailLines: must be 0 or more, got {0}")]
    NegativeTail(i64),
    /// A `limitBytes` or `sinceSeconds` that is not positive.
    #[error("{key}: must be greater than 0, got {value}")]
    NotPositive {
        /// The parameter.
        key: &'static str,
        /// Its value.
        value: i64,
    },
    /// Both `sinceTime` and `sinceSeconds`.
    #[error("at most one of sinceTime or sinceSeconds may be specified")]
    BothSince,
    /// A `sinceTime` that is not an RFC 3339 time.
    #[error("sinceTime: {0:?} is not an RFC 3339 time")]
    NotATime(String),
    /// A parameter nodelet does not implement (`stream`).
    #[error("{0} is not supported by nodelet yet")]
    Unsupported(String),
    /// A flag that is not one of Go's booleans.
    #[error("{key}: {value:?} is not a boolean")]
    NotABoolean {
        /// The parameter.
        key: String,
        /// Its value.
        value: String,
    },
}

impl LogOptions {
    /// Parses the query parameters; the error is the message of a 400 response. Unknown parameters are
    /// ignored (as the kubelet does); `stream` is refused rather than silently ignored, because ignoring
    /// it would return other lines than asked for. `sinceSeconds` counts back from `now`.
    pub fn from_query(
        params: &[(String, String)],
        now: k8s_openapi::jiff::Timestamp,
    ) -> Result<Self, QueryError> {
        let mut options = Self::default();
        let mut since_given = false;
        for (key, value) in params {
            match key.as_str() {
                "follow" => options.follow = parse_bool(key, value)?,
                "timestamps" => options.timestamps = parse_bool(key, value)?,
                "tailLines" => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| QueryError::NotAnInteger { key: "tailLines", value: value.clone() })?;
                    let n = u64::try_from(n).map_err(|_| QueryError::NegativeTail(n))?;
                    options.tail_lines = Some(n);
                }
                "limitBytes" => {
                    let n: i64 = value
                        .parse()
                        .map_err(|_| QueryError::NotAnInteger { key: "limitBytes", value: value.clone() })?;
                    match u64::try_from(n) {
                        Ok(n) if n > 0 => options.limit_bytes = Some(n),
                        _ => return Err(QueryError::NotPositive { key: "limitBytes", value: n }),
                    }
                }
                "previous" => options.previous = parse_bool(key, value)?,
                "sinceSeconds" | "sinceTime" => {
                    if std::mem::replace(&mut since_given, true) {
                        return Err(QueryError::BothSince);
                    }
                    options.since = Some(if key == "sinceSeconds" {
                        let n: i64 = value.parse().map_err(|_| QueryError::NotAnInteger {
                            key: "sinceSeconds",
                            value: value.clone(),
                        })?;
                        if n <= 0 {
                            return Err(QueryError::NotPositive { key: "sinceSeconds", value: n });
                        }
                        let span = k8s_openapi::jiff::SignedDuration::from_secs(n);
                        now.checked_sub(span).unwrap_or(k8s_openapi::jiff::Timestamp::MIN)
                    } else {
                        value.parse().map_err(|_| QueryError::NotATime(value.clone()))?
                    });
                }
                "stream" => {
                    return Err(QueryError::Unsupported(key.clone()));
                }
                _ => {}
            }
        }
        Ok(options)
    }
}

/// Go's `strconv.ParseBool`, which the kubelet uses for query flags.
fn parse_bool(key: &str, value: &str) -> Result<bool, QueryError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(QueryError::NotABoolean { key: key.to_owned(), value: value.to_owned() }),
    }
}

/// Why a log file could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// The file does not exist.
    #[error("the log file does not exist")]
    NotFound,
    /// The path's final component is a symbolic link (never followed: a container with a writable
    /// hostPath to the log directory could point it at any host file).
    #[error("the log file is a symbolic link; refusing to follow it")]
    Symlink,
    /// The path is not a regular file.
    #[error("the log file is not a regular file")]
    NotRegular,
    /// Any other I/O error.
    #[error("cannot read the log file: {0}")]
    Io(#[from] io::Error),
}

/// Opens a container's log file without following a final symbolic link, checks it is a regular file,
/// and positions it at the first of the last `tail_lines` lines (or at the start).
pub(crate) async fn open(path: &Path, options: &LogOptions) -> Result<LogFile, LogError> {
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .await
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => LogError::Symlink,
            Some(libc::ENOENT) => LogError::NotFound,
            _ => LogError::Io(e),
        })?;
    if !file.metadata().await?.is_file() {
        return Err(LogError::NotRegular);
    }
    let start = match options.tail_lines {
        None => 0,
        Some(n) => tail_start(file.try_clone().await?, n).await?,
    };
    let mut file = file;
    file.seek(SeekFrom::Start(start)).await?;
    Ok(LogFile { lines: LineReader::new(file, start) })
}

/// An opened, positioned log file.
pub(crate) struct LogFile {
    lines: LineReader,
}

impl std::fmt::Debug for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFile").field("pos", &self.lines.pos()).finish_non_exhaustive()
    }
}

impl LogFile {
    /// The response body: the container's output, in chunks. When following, it ends once `running`
    /// says the container stopped and the file has been read to its end, or when `stopping` is cancelled.
    pub(crate) fn into_stream(
        self,
        options: LogOptions,
        running: Box<dyn Fn() -> bool + Send + Sync>,
        stopping: CancellationToken,
        poll_interval: Duration,
    ) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
        let follower = Follower {
            lines: self.lines,
            renderer: Renderer::new(options.timestamps, options.since, options.limit_bytes),
            follow: options.follow,
            running,
            stopping,
            poll_interval,
            last_running_check: None,
            finished: false,
            sent: false,
        };
        futures::stream::unfold(follower, |mut f| async move { f.next_chunk().await.map(|chunk| (chunk, f)) })
    }
}

struct Follower {
    lines: LineReader,
    renderer: Renderer,
    follow: bool,
    running: Box<dyn Fn() -> bool + Send + Sync>,
    stopping: CancellationToken,
    poll_interval: Duration,
    last_running_check: Option<Instant>,
    finished: bool,
    /// A chunk has been handed out: yield once before the next one (see the module doc).
    sent: bool,
}

impl Follower {
    async fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        if std::mem::take(&mut self.sent) {
            tokio::task::yield_now().await;
        }
        let chunk = self.read_chunk().await;
        self.sent = matches!(chunk, Some(Ok(_)));
        chunk
    }

    async fn read_chunk(&mut self) -> Option<io::Result<Bytes>> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        let mut last_pass = !self.follow;
        loop {
            loop {
                let line = match self.lines.next_line().await {
                    Ok(Some((_, line))) => line,
                    Ok(None) => break,
                    Err(e) => {
                        self.finished = true;
                        return Some(Err(e));
                    }
                };
                if self.renderer.render(&line, &mut out) {
                    self.finished = true;
                    return Some(Ok(out.into()));
                }
                if out.len() >= CHUNK_BYTES {
                    return Some(Ok(out.into()));
                }
            }
            // At the end of the file.
            if !out.is_empty() {
                return Some(Ok(out.into()));
            }
            if last_pass {
                self.finished = true;
                if let Some(line) = self.lines.take_incomplete() {
                    self.renderer.render(&line, &mut out);
                }
                return (!out.is_empty()).then(|| Ok(out.into()));
            }
            if self.last_running_check.is_none_or(|t| t.elapsed() >= RUNNING_CHECK_INTERVAL) {
                self.last_running_check = Some(Instant::now());
                if !(self.running)() {
                    debug!("container stopped; reading its log to the end");
                    last_pass = true;
                    continue;
                }
            }
            tokio::select! {
                () = self.stopping.cancelled() => {
                    self.finished = true;
                    return None;
                }
                () = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn query_parameters() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap_or_default();
        let parse = |pairs: &[(&str, &str)]| LogOptions::from_query(&q(pairs), now);
        assert_eq!(
            parse(&[("follow", "true"), ("tailLines", "10"), ("timestamps", "1"), ("limitBytes", "5")]),
            Ok(LogOptions {
                follow: true,
                tail_lines: Some(10),
                timestamps: true,
                limit_bytes: Some(5),
                ..LogOptions::default()
            })
        );
        assert_eq!(parse(&[("pretty", "x"), ("previous", "false")]), Ok(LogOptions::default()));
        assert_eq!(parse(&[("previous", "true")]).map(|o| o.previous), Ok(true));
        assert_eq!(
            parse(&[("sinceSeconds", "5")]).map(|o| o.since.map(|t| t.to_string())),
            Ok(Some("2026-01-02T03:04:00Z".to_owned()))
        );
        assert_eq!(
            parse(&[("sinceTime", "2026-01-01T00:00:00.5Z")]).map(|o| o.since.map(|t| t.to_string())),
            Ok(Some("2026-01-01T00:00:00.5Z".to_owned()))
        );
        for bad in [
            vec![("follow", "yes")],
            vec![("tailLines", "-1")],
            vec![("tailLines", "ten")],
            vec![("limitBytes", "0")],
            vec![("previous", "maybe")],
            vec![("sinceSeconds", "0")],
            vec![("sinceTime", "yesterday")],
            vec![("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")],
            vec![("stream", "Stdout")],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?} should be refused");
        }
        // The messages of the 400 responses.
        let message = |pairs: &[(&str, &str)]| parse(pairs).map_err(|e| e.to_string()).err();
        for (bad, expected) in [
            (vec![("follow", "yes")], r#"follow: "yes" is not a boolean"#),
            (vec![("tailLines", "-1")], "tailLines: must be 0 or more, got -1"),
            (vec![("tailLines", "ten")], r#"tailLines: "ten" is not an integer"#),
            (vec![("limitBytes", "0")], "limitBytes: must be greater than 0, got 0"),
            (vec![("sinceSeconds", "0")], "sinceSeconds: must be greater than 0, got 0"),
            (vec![("sinceTime", "yesterday")], r#"sinceTime: "yesterday" is not an RFC 3339 time"#),
            (
                vec![("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")],
                "at most one of sinceTime or sinceSeconds may be specified",
            ),
            (vec![("stream", "Stdout")], "stream is not supported by nodelet yet"),
        ] {
            assert_eq!(message(&bad).as_deref(), Some(expected), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn since_skips_earlier_lines_partial_continuations_included() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("0.log");
        let text = "2026-01-01T00:00:01.000000000Z stdout F old\n\
                    2026-01-01T00:00:02.000000000Z stdout P old-partial-\n\
                    2026-01-01T00:00:03.000000000Z stdout F continued\n\
                    2026-01-01T00:00:03.500000000Z stderr F new\n\
                    2026-01-01T00:00:04.000000000Z stdout F newer\n";
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write: {e}"));
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap_or_default();
        let options =
            LogOptions::from_query(&q(&[("sinceTime", "2026-01-01T00:00:03Z")]), now).unwrap_or_default();
        let file = open(&path, &options).await.unwrap_or_else(|e| panic!("open: {e}"));
        let stream =
            file.into_stream(options, Box::new(|| false), CancellationToken::new(), DEFAULT_POLL_INTERVAL);
        let chunks: Vec<io::Result<Bytes>> = futures::StreamExt::collect(stream).await;
        let out: Vec<u8> =
            chunks.into_iter().flat_map(|c| c.map(|b| b.to_vec()).unwrap_or_default()).collect();
        assert_eq!(String::from_utf8_lossy(&out), "new\nnewer\n");
    }

    #[tokio::test]
    async fn the_end_of_the_body_comes_after_a_yield_never_with_the_last_chunk() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2026-01-01T00:00:01.000000000Z stdout F container is alive\n")
            .unwrap_or_else(|e| panic!("write: {e}"));
        let options = LogOptions::default();
        let file = open(&path, &options).await.unwrap_or_else(|e| panic!("open: {e}"));
        let stream =
            file.into_stream(options, Box::new(|| false), CancellationToken::new(), DEFAULT_POLL_INTERVAL);
        let mut stream = std::pin::pin!(stream);
        let first = futures::StreamExt::next(&mut stream).await;
        assert_eq!(first.and_then(Result::ok).as_deref(), Some(&b"container is alive\n"[..]));
        // the server gets to write out the chunk before it polls the body again
        assert!(futures::poll!(futures::StreamExt::next(&mut stream)).is_pending());
        assert!(futures::StreamExt::next(&mut stream).await.is_none());
    }
}

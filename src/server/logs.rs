//! `/containerLogs`: reads a CRI log file (`<RFC3339Nano> <stdout|stderr> <P|F> <content>` per line) and
//! returns the container's output the way the kubelet does: partial (`P`) segments joined into one line,
//! optional timestamps, the last N lines, a byte limit, and following the file as it grows.

use std::collections::VecDeque;
use std::io::{self, SeekFrom};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::fs::File;
use tokio::io::{AsyncBufReadExt as _, AsyncSeekExt as _, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// How often a followed log file is checked for new lines.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How often a follower asks whether the container still runs while the file does not grow.
const RUNNING_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Output is sent in chunks of about this size.
const CHUNK_BYTES: usize = 32 * 1024;
/// A raw line longer than this is dropped (containerd splits lines at 16 KiB, so only a damaged or forged
/// file has such lines); it would otherwise grow without bound in memory.
const MAX_RAW_LINE: usize = 1024 * 1024;

/// The query parameters of `/containerLogs` that nodelet serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogOptions {
    /// `follow=true`: keep streaming new lines until the container stops or the client goes away.
    pub(crate) follow: bool,
    /// `tailLines=N`: start with the last N lines (N ≥ 0).
    pub(crate) tail_lines: Option<u64>,
    /// `timestamps=true`: prefix each line with its timestamp (RFC 3339, 9 fractional digits).
    pub(crate) timestamps: bool,
    /// `limitBytes=N`: stop after N bytes of output (N > 0).
    pub(crate) limit_bytes: Option<u64>,
    /// `previous=true`: the log of the container's previous instance.
    pub(crate) previous: bool,
    /// `sinceSeconds=N` / `sinceTime=T`: only lines logged at or after this time.
    pub(crate) since: Option<k8s_openapi::jiff::Timestamp>,
}

impl LogOptions {
    /// Parses the query parameters; the error is the message of a 400 response. Unknown parameters are
    /// ignored (as the kubelet does); `stream` is refused rather than silently ignored, because ignoring
    /// it would return other lines than asked for. `sinceSeconds` counts back from `now`.
    pub(crate) fn from_query(
        params: &[(String, String)],
        now: k8s_openapi::jiff::Timestamp,
    ) -> Result<Self, String> {
        let mut options = Self::default();
        let mut since_given = false;
        for (key, value) in params {
            match key.as_str() {
                "follow" => options.follow = parse_bool(key, value)?,
                "timestamps" => options.timestamps = parse_bool(key, value)?,
                "tailLines" => {
                    let n: i64 =
                        value.parse().map_err(|_| format!("tailLines: {value:?} is not an integer"))?;
                    let n = u64::try_from(n).map_err(|_| format!("tailLines: must be 0 or more, got {n}"))?;
                    options.tail_lines = Some(n);
                }
                "limitBytes" => {
                    let n: i64 =
                        value.parse().map_err(|_| format!("limitBytes: {value:?} is not an integer"))?;
                    match u64::try_from(n) {
                        Ok(n) if n > 0 => options.limit_bytes = Some(n),
                        _ => return Err(format!("limitBytes: must be greater than 0, got {n}")),
                    }
                }
                "previous" => options.previous = parse_bool(key, value)?,
                "sinceSeconds" | "sinceTime" => {
                    if std::mem::replace(&mut since_given, true) {
                        return Err("at most one of sinceTime or sinceSeconds may be specified".into());
                    }
                    options.since = Some(if key == "sinceSeconds" {
                        let n: i64 = value
                            .parse()
                            .map_err(|_| format!("sinceSeconds: {value:?} is not an integer"))?;
                        if n <= 0 {
                            return Err(format!("sinceSeconds: must be greater than 0, got {n}"));
                        }
                        let span = k8s_openapi::jiff::SignedDuration::from_secs(n);
                        now.checked_sub(span).unwrap_or(k8s_openapi::jiff::Timestamp::MIN)
                    } else {
                        value.parse().map_err(|_| format!("sinceTime: {value:?} is not an RFC 3339 time"))?
                    });
                }
                "stream" => {
                    return Err(format!("{key} is not supported by nodelet yet"));
                }
                _ => {}
            }
        }
        Ok(options)
    }
}

/// Go's `strconv.ParseBool`, which the kubelet uses for query flags.
fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{key}: {value:?} is not a boolean")),
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

/// Reads raw lines (without the `\n`) and tracks the offset of each.
struct LineReader {
    reader: BufReader<File>,
    /// Bytes of the line being read (no `\n` seen yet).
    raw: Vec<u8>,
    /// Dropping an over-long line until its `\n`.
    discarding: bool,
    /// File offset just past what has been consumed.
    pos: u64,
    /// File offset where `raw` started.
    line_start: u64,
}

impl LineReader {
    fn new(file: File, pos: u64) -> Self {
        Self { reader: BufReader::new(file), raw: Vec::new(), discarding: false, pos, line_start: pos }
    }

    /// The next complete line and its starting offset, or `None` at the end of the file (an incomplete
    /// last line stays buffered until its `\n` arrives).
    async fn next_line(&mut self) -> io::Result<Option<(u64, Vec<u8>)>> {
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                return Ok(None);
            }
            if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                if !self.discarding {
                    self.raw.extend_from_slice(&buf[..i]);
                }
                self.reader.consume(i + 1);
                self.pos += i as u64 + 1;
                let start = self.line_start;
                self.line_start = self.pos;
                if std::mem::take(&mut self.discarding) {
                    self.raw.clear();
                    continue;
                }
                return Ok(Some((start, std::mem::take(&mut self.raw))));
            }
            let n = buf.len();
            if !self.discarding {
                self.raw.extend_from_slice(buf);
            }
            self.reader.consume(n);
            self.pos += n as u64;
            if self.raw.len() > MAX_RAW_LINE {
                warn!(offset = self.line_start, "log line longer than {MAX_RAW_LINE} bytes; dropped");
                self.raw = Vec::new();
                self.discarding = true;
            }
        }
    }

    /// What is left of an incomplete last line (for a reader that stops at the end of the file).
    fn take_incomplete(&mut self) -> Option<Vec<u8>> {
        (!self.raw.is_empty() && !self.discarding).then(|| std::mem::take(&mut self.raw))
    }
}

/// One parsed CRI log line.
#[derive(Debug, PartialEq, Eq)]
struct CriLine<'a> {
    timestamp: &'a str,
    stream: &'a str,
    partial: bool,
    content: &'a [u8],
}

/// Parses `<timestamp> <stdout|stderr> <tag[:tag…]> <content>` (the kubelet's `parseCRILog`); a line
/// that does not parse is skipped by the readers, as the kubelet does.
fn parse_cri_line(line: &[u8]) -> Option<CriLine<'_>> {
    let mut rest = line;
    let mut field = || {
        let i = rest.iter().position(|b| *b == b' ')?;
        let (f, r) = (&rest[..i], &rest[i + 1..]);
        rest = r;
        Some(f)
    };
    let timestamp = std::str::from_utf8(field()?).ok()?;
    normalize_timestamp(timestamp)?;
    let stream = std::str::from_utf8(field()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let tags = field()?;
    let partial = tags.split(|b| *b == b':').next() == Some(b"P");
    Some(CriLine { timestamp, stream, partial, content: rest })
}

/// Re-formats an RFC 3339 timestamp the way the kubelet prints it (`RFC3339NanoFixed`: exactly nine
/// fractional digits, `Z` for a zero offset), or `None` if it is not RFC 3339.
fn normalize_timestamp(ts: &str) -> Option<String> {
    let b = ts.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(digits(0..4) && at(4, b'-') && digits(5..7) && at(7, b'-') && digits(8..10) && at(10, b'T'))
        || !(digits(11..13) && at(13, b':') && digits(14..16) && at(16, b':') && digits(17..19))
    {
        return None;
    }
    let mut i = 19;
    let mut fraction = String::new();
    if at(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        fraction.push_str(&ts[start..i]);
    }
    fraction.truncate(9);
    while fraction.len() < 9 {
        fraction.push('0');
    }
    let zone = match b.get(i) {
        Some(b'Z') if i + 1 == b.len() => "Z",
        Some(b'+' | b'-')
            if i + 6 == b.len() && digits(i + 1..i + 3) && at(i + 3, b':') && digits(i + 4..i + 6) =>
        {
            if &ts[i + 1..] == "00:00" { "Z" } else { &ts[i..] }
        }
        _ => return None,
    };
    Some(format!("{}.{fraction}{zone}", &ts[..19]))
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

/// The offset where the last `n` lines (partial segments joined) begin.
async fn tail_start(file: File, n: u64) -> io::Result<u64> {
    let mut reader = LineReader::new(file, 0);
    let mut starts: VecDeque<u64> = VecDeque::new();
    let mut at_line_start = true;
    let mut end = 0;
    while let Some((offset, line)) = reader.next_line().await? {
        end = reader.pos;
        let Some(parsed) = parse_cri_line(&line) else { continue };
        if at_line_start && n > 0 {
            if starts.len() as u64 == n {
                starts.pop_front();
            }
            starts.push_back(offset);
        }
        at_line_start = !parsed.partial;
    }
    Ok(if n == 0 { end } else { starts.front().copied().unwrap_or(0) })
}

/// An opened, positioned log file.
pub(crate) struct LogFile {
    lines: LineReader,
}

impl std::fmt::Debug for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFile").field("pos", &self.lines.pos).finish_non_exhaustive()
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
            remaining: options.limit_bytes,
            options,
            at_line_start: true,
            running,
            stopping,
            poll_interval,
            last_running_check: None,
            finished: false,
            skipping: false,
        };
        futures::stream::unfold(follower, |mut f| async move { f.next_chunk().await.map(|chunk| (chunk, f)) })
    }
}

struct Follower {
    lines: LineReader,
    options: LogOptions,
    remaining: Option<u64>,
    /// The next output starts a new line (gets a timestamp prefix).
    at_line_start: bool,
    running: Box<dyn Fn() -> bool + Send + Sync>,
    stopping: CancellationToken,
    poll_interval: Duration,
    last_running_check: Option<Instant>,
    finished: bool,
    /// The current line is before `since`.
    skipping: bool,
}

impl Follower {
    async fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        let mut last_pass = !self.options.follow;
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
                if self.render(&line, &mut out) {
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
                    self.render(&line, &mut out);
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

    /// Appends one raw line's output; true when the byte limit is reached.
    fn render(&mut self, line: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(parsed) = parse_cri_line(line) else {
            debug!(line = %String::from_utf8_lossy(&line[..line.len().min(200)]), "skipping a malformed CRI log line");
            return false;
        };
        if let Some(since) = self.options.since {
            // A line (its first segment decides for its partial continuation) before `since` is skipped.
            if self.at_line_start {
                self.skipping =
                    parsed.timestamp.parse::<k8s_openapi::jiff::Timestamp>().is_ok_and(|t| t < since);
            }
            if self.skipping {
                self.at_line_start = !parsed.partial;
                return false;
            }
        }
        let start = out.len();
        if self.options.timestamps
            && self.at_line_start
            && let Some(ts) = normalize_timestamp(parsed.timestamp)
        {
            out.extend_from_slice(ts.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(parsed.content);
        if !parsed.partial {
            out.push(b'\n');
        }
        self.at_line_start = !parsed.partial;
        if let Some(remaining) = &mut self.remaining {
            let added = (out.len() - start) as u64;
            if added >= *remaining {
                out.truncate(start + usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining = 0;
                return true;
            }
            *remaining -= added;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn parses_cri_lines_like_the_kubelet() {
        assert_eq!(
            parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout P log content 1"),
            Some(CriLine {
                timestamp: "2016-10-06T00:17:09.669794202Z",
                stream: "stdout",
                partial: true,
                content: b"log content 1"
            })
        );
        let full =
            parse_cri_line(b"2016-10-06T00:17:09.669794203+02:00 stderr F:x  two spaces").expect("valid");
        assert!(!full.partial);
        assert_eq!(full.content, b" two spaces");
        assert_eq!(parse_cri_line(b"2016-10-06T00:17:09Z stdout F ").map(|l| l.content), Some(&b""[..]));
        assert!(parse_cri_line(b"2016-10-06T00:17:09Z stdout F").is_none(), "the tag needs its delimiter");
        assert!(parse_cri_line(b"2016-10-06T00:17:09Z stdin F x").is_none());
        assert!(parse_cri_line(b"yesterday stdout F x").is_none());
        assert!(parse_cri_line(b"").is_none());
    }

    #[test]
    fn timestamps_are_printed_with_nine_fraction_digits() {
        assert_eq!(
            normalize_timestamp("2016-10-06T00:17:09.6697942Z").as_deref(),
            Some("2016-10-06T00:17:09.669794200Z")
        );
        assert_eq!(
            normalize_timestamp("2016-10-06T00:17:09Z").as_deref(),
            Some("2016-10-06T00:17:09.000000000Z")
        );
        assert_eq!(
            normalize_timestamp("2016-10-06T02:17:09.1234567891+02:00").as_deref(),
            Some("2016-10-06T02:17:09.123456789+02:00")
        );
        assert_eq!(
            normalize_timestamp("2016-10-06T00:17:09.5+00:00").as_deref(),
            Some("2016-10-06T00:17:09.500000000Z")
        );
        assert_eq!(normalize_timestamp("2016-10-06T00:17:09."), None);
        assert_eq!(normalize_timestamp("2016-10-06 00:17:09Z"), None);
        assert_eq!(normalize_timestamp("2016-10-06T00:17:09+0200"), None);
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
}

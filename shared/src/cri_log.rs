//! CRI container log files, shared by the daemon's `/containerLogs` and `nodelet logs`:
//! the line parser (`<RFC3339Nano> <stdout|stderr> <P|F>[:tags] <content>`, the
//! kubelet's `parseCRILog`), a reader of raw lines that tracks file offsets, the offset where the last N
//! lines start, and a [`Renderer`] that turns records into the container's output the way the kubelet
//! serves it: partial (`P`) segments joined into one line, optional timestamps, lines before a time
//! skipped, and a byte limit.

use std::io;

use tokio::fs::File;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tracing::{debug, warn};

/// A raw line longer than this is dropped (containerd splits lines at 16 KiB, so only a damaged or forged
/// file has such lines); it would otherwise grow without bound in memory.
const MAX_RAW_LINE: usize = 1024 * 1024;

/// Reads raw lines (without the `\n`) and tracks the offset of each.
pub struct LineReader {
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

impl std::fmt::Debug for LineReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineReader").field("pos", &self.pos).finish_non_exhaustive()
    }
}

impl LineReader {
    /// A reader of `file`, which is positioned at offset `pos`.
    pub fn new(file: File, pos: u64) -> Self {
        Self { reader: BufReader::new(file), raw: Vec::new(), discarding: false, pos, line_start: pos }
    }

    /// The file offset just past what has been read (an incomplete last line included).
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The next complete line and its starting offset, or `None` at the end of the file (an incomplete
    /// last line stays buffered until its `\n` arrives).
    pub async fn next_line(&mut self) -> io::Result<Option<(u64, Vec<u8>)>> {
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
    pub fn take_incomplete(&mut self) -> Option<Vec<u8>> {
        (!self.raw.is_empty() && !self.discarding).then(|| std::mem::take(&mut self.raw))
    }
}

/// One parsed CRI log line.
#[derive(Debug, PartialEq, Eq)]
pub struct CriLine<'a> {
    /// The timestamp as written.
    pub timestamp: &'a str,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// `P`: the line continues in the next record.
    pub partial: bool,
    /// The content, without the newline.
    pub content: &'a [u8],
}

/// Parses `<timestamp> <stdout|stderr> <tag[:tag…]> <content>` (the kubelet's `parseCRILog`); a line
/// that does not parse is skipped by the readers, as the kubelet does.
pub fn parse_cri_line(line: &[u8]) -> Option<CriLine<'_>> {
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
pub fn normalize_timestamp(ts: &str) -> Option<String> {
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

/// The offset where the last `n` lines (partial segments joined) of `file` begin (its end for 0).
///
/// Reads the file backwards from its end in chunks of 64 KiB, so memory stays bounded whatever `n` and the
/// file's size, and only the bytes after the start found are read.
pub async fn tail_start(file: File, n: u64) -> io::Result<u64> {
    tail_start_chunked(file, n, BACKWARDS_CHUNK).await
}

async fn tail_start_chunked(mut file: File, n: u64, chunk: usize) -> io::Result<u64> {
    let len = file.metadata().await?.len();
    let mut backwards = Backwards::new(len, chunk);
    // Records are complete lines: ignore an incomplete last one (it is read when its `\n` arrives).
    let Some(last_newline) = backwards.previous_newline(&mut file).await? else {
        return Ok(0);
    };
    if n == 0 {
        return Ok(last_newline + 1);
    }
    let mut record_end = last_newline;
    // The start of the nearest parseable record after the one being looked at.
    let mut later: Option<u64> = None;
    let mut lines = 0;
    loop {
        let newline = backwards.previous_newline(&mut file).await?;
        let record_start = newline.map_or(0, |p| p + 1);
        let header = backwards.header(&mut file, record_start, record_end).await?;
        let parsed =
            (record_end - record_start <= MAX_RAW_LINE as u64).then(|| parse_cri_line(&header)).flatten();
        if let Some(record) = parsed {
            // The record after a full (`F`) record starts a line.
            if !record.partial
                && let Some(start) = later
            {
                lines += 1;
                if lines == n {
                    return Ok(start);
                }
            }
            later = Some(record_start);
        }
        match newline {
            Some(p) => record_end = p,
            // The first parseable record starts a line too; fewer than n lines: all of them.
            None => return Ok(later.unwrap_or(0)),
        }
    }
}

/// Bytes of a record's start that [`tail_start`] parses (timestamp, stream and tags fit).
const RECORD_HEADER: usize = 128;
/// How much [`Backwards`] reads at a time.
const BACKWARDS_CHUNK: usize = 64 * 1024;

/// Finds newlines from the end of a file towards its start, one bounded chunk in memory.
struct Backwards {
    /// The chunk in memory and the file offset of its first byte.
    chunk: Vec<u8>,
    chunk_start: u64,
    /// Newlines before this offset are still to be found.
    cursor: u64,
    /// Bytes read at a time.
    chunk_size: usize,
}

impl Backwards {
    fn new(len: u64, chunk_size: usize) -> Self {
        Self { chunk: Vec::new(), chunk_start: len, cursor: len, chunk_size: chunk_size.max(1) }
    }

    /// The offset of the last newline before the cursor, which moves there; `None` at the file's start.
    async fn previous_newline(&mut self, file: &mut File) -> io::Result<Option<u64>> {
        use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
        loop {
            if self.cursor > self.chunk_start {
                let upto = usize::try_from(self.cursor - self.chunk_start).unwrap_or(self.chunk.len());
                if let Some(i) = self.chunk[..upto.min(self.chunk.len())].iter().rposition(|b| *b == b'\n') {
                    self.cursor = self.chunk_start + i as u64;
                    return Ok(Some(self.cursor));
                }
                self.cursor = self.chunk_start;
            }
            if self.chunk_start == 0 {
                return Ok(None);
            }
            let size = self.chunk_start.min(self.chunk_size as u64);
            self.chunk_start -= size;
            self.chunk.resize(usize::try_from(size).unwrap_or(self.chunk_size), 0);
            file.seek(io::SeekFrom::Start(self.chunk_start)).await?;
            file.read_exact(&mut self.chunk).await?;
        }
    }

    /// Up to [`RECORD_HEADER`] bytes of the record `[start, end)`.
    async fn header(&self, file: &mut File, start: u64, end: u64) -> io::Result<Vec<u8>> {
        use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
        let want = usize::try_from(end - start).unwrap_or(usize::MAX).min(RECORD_HEADER);
        let chunk_end = self.chunk_start + self.chunk.len() as u64;
        if start >= self.chunk_start && start + want as u64 <= chunk_end {
            let from = usize::try_from(start - self.chunk_start).unwrap_or(0);
            return Ok(self.chunk[from..from + want].to_vec());
        }
        // The header crosses into the chunk read before this one: read it on its own.
        let mut header = vec![0; want];
        file.seek(io::SeekFrom::Start(start)).await?;
        file.read_exact(&mut header).await?;
        Ok(header)
    }
}

/// Turns raw CRI lines into the container's output (see the module docs).
#[derive(Debug)]
pub struct Renderer {
    timestamps: bool,
    since: Option<k8s_openapi::jiff::Timestamp>,
    /// Bytes still allowed, when limited.
    remaining: Option<u64>,
    /// The next output starts a new line (gets a timestamp prefix).
    at_line_start: bool,
    /// The current line is before `since`.
    skipping: bool,
}

impl Renderer {
    /// A renderer: `timestamps` prefixes each line with its first record's timestamp (nine fractional
    /// digits), `since` skips the lines logged before it, `limit_bytes` stops after that many bytes.
    pub fn new(
        timestamps: bool,
        since: Option<k8s_openapi::jiff::Timestamp>,
        limit_bytes: Option<u64>,
    ) -> Self {
        Self { timestamps, since, remaining: limit_bytes, at_line_start: true, skipping: false }
    }

    /// Whether the byte limit has been reached (nothing more is rendered).
    pub fn exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Appends one raw line's output to `out`; true when the byte limit is reached.
    pub fn render(&mut self, line: &[u8], out: &mut Vec<u8>) -> bool {
        if self.exhausted() {
            return true;
        }
        let Some(parsed) = parse_cri_line(line) else {
            debug!(line = %String::from_utf8_lossy(&line[..line.len().min(200)]), "skipping a malformed CRI log line");
            return false;
        };
        if let Some(since) = self.since {
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
        if self.timestamps
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
        assert!(parse_cri_line(b"garbage").is_none());
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
    fn the_renderer_joins_partials_and_applies_since_and_the_byte_limit() {
        let lines: &[&[u8]] = &[
            b"2026-01-01T00:00:01Z stdout F old",
            b"2026-01-01T00:00:02Z stdout P old-",
            b"2026-01-01T00:00:03Z stdout F continued",
            b"not a cri line",
            b"2026-01-01T00:00:04Z stderr P new-",
            b"2026-01-01T00:00:05Z stderr F line",
            b"2026-01-01T00:00:06Z stdout F last",
        ];
        let render = |r: &mut Renderer| {
            let mut out = Vec::new();
            for l in lines {
                if r.render(l, &mut out) {
                    break;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        };
        assert_eq!(render(&mut Renderer::new(false, None, None)), "old\nold-continued\nnew-line\nlast\n");
        let since = "2026-01-01T00:00:03Z".parse().ok();
        assert_eq!(render(&mut Renderer::new(false, since, None)), "new-line\nlast\n");
        assert_eq!(
            render(&mut Renderer::new(true, since, None)),
            "2026-01-01T00:00:04.000000000Z new-line\n2026-01-01T00:00:06.000000000Z last\n"
        );
        let mut limited = Renderer::new(false, None, Some(6));
        assert_eq!(render(&mut limited), "old\nol");
        assert!(limited.exhausted());
    }

    use std::collections::VecDeque;

    /// The forward reading of [`tail_start`] (what it did before it read backwards): the oracle.
    async fn tail_start_forward(file: File, n: u64) -> io::Result<u64> {
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

    /// A log file's records: full or partial records of some length, lines that do not parse, empty
    /// lines, and maybe an incomplete last record.
    fn log_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let record = prop_oneof![
            4 => (any::<bool>(), 0usize..200).prop_map(|(partial, len)| {
                format!("2026-01-01T00:00:01.5Z stdout {} {}\n", if partial { "P" } else { "F" }, "x".repeat(len))
            }),
            1 => Just("not a cri line\n".to_owned()),
            1 => Just("\n".to_owned()),
            1 => Just("2026-01-01T00:00:02Z stderr F:extra e\n".to_owned()),
        ];
        (proptest::collection::vec(record, 0..60), proptest::option::of("[a-z ]{0,20}"))
            .prop_map(|(records, tail)| records.concat() + &tail.unwrap_or_default())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        #[test]
        fn reading_backwards_finds_the_same_start_as_reading_forwards(
            text in log_text(),
            n in 0u64..70,
            chunk in 1usize..300,
        ) {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
            let path = dir.path().join("0.log");
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("write: {e}"));
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("rt: {e}"));
            let (backwards, forwards) = runtime.block_on(async {
                let open = || async { File::open(&path).await.unwrap_or_else(|e| panic!("open: {e}")) };
                (
                    tail_start_chunked(open().await, n, chunk).await.unwrap_or_else(|e| panic!("tail: {e}")),
                    tail_start_forward(open().await, n).await.unwrap_or_else(|e| panic!("tail: {e}")),
                )
            });
            proptest::prop_assert_eq!(backwards, forwards, "n={} chunk={} text={:?}", n, chunk, text);
        }
    }

    #[tokio::test]
    async fn tail_start_counts_whole_lines() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("0.log");
        let text = "2026-01-01T00:00:01Z stdout F a\n\
                    2026-01-01T00:00:02Z stdout P b1\n\
                    2026-01-01T00:00:02Z stdout F b2\n\
                    2026-01-01T00:00:03Z stdout F c\n";
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write: {e}"));
        let start = |n| {
            let path = path.clone();
            async move {
                let file = File::open(&path).await.unwrap_or_else(|e| panic!("open: {e}"));
                tail_start(file, n).await.unwrap_or_else(|e| panic!("tail: {e}"))
            }
        };
        let b1 = text.find("2026-01-01T00:00:02Z stdout P").map(|i| i as u64);
        assert_eq!(Some(start(2).await), b1, "the last two lines start at b1 (b1+b2 are one line)");
        assert_eq!(start(10).await, 0);
        assert_eq!(start(0).await, text.len() as u64);
    }
}

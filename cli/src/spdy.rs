//! SPDY/3.1 framing, the subset Kubernetes' streaming uses (moby/spdystream, which client-go, the kubelet
//! and the CRI runtimes' streaming servers use): the frames and their header blocks, for the client side
//! of `nodelet exec -i`, `nodelet attach -i` and `nodelet cp` ([`super::session`]).
//!
//! A frame is 8 bytes of head and up to 2^24-1 bytes of payload. A control frame's head is the control
//! bit, the version (3), the type, flags and the length; a data frame's is the stream ID (31 bits), flags
//! (`FLAG_FIN` ends the sender's half of the stream) and the length. The control frames are SYN_STREAM,
//! SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS and WINDOW_UPDATE; other types are read and
//! ignored, as SPDY/3 asks. Header blocks (of SYN_STREAM, SYN_REPLY, HEADERS) are a count and
//! length-prefixed names and values, zlib-compressed with the SPDY/3 dictionary, one compression context
//! per direction for the whole connection ([`HeaderEncoder`] for what is sent, [`HeaderDecoder`] for what
//! is received; each block ends with a sync flush), so every received header block must be decoded in
//! order even when its headers do not matter.
//!
//! Bounds: a received frame may have at most [`MAX_FRAME`] bytes of payload (the streaming servers send
//! data in pieces of 32 KiB), a header block at most [`MAX_HEADER_BLOCK`] bytes once decompressed and
//! [`MAX_HEADERS`] entries; anything else malformed (a short payload, a bad length, stream ID 0 where one is
//! needed, another version) is a [`SpdyError`].

use std::sync::LazyLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The SPDY version spoken.
pub(crate) const VERSION: u16 = 3;
/// The flag that ends the sender's half of a stream (DATA, SYN_STREAM, SYN_REPLY, HEADERS).
pub(crate) const FLAG_FIN: u8 = 0x01;
/// The initial flow-control window of every stream and of the connection (SPDY/3.1).
pub(crate) const INITIAL_WINDOW: u32 = 64 * 1024;
/// The SETTINGS ID of the initial stream window size.
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;
/// RST_STREAM status: the stream is refused.
pub(crate) const REFUSED_STREAM: u32 = 3;
/// The largest payload of a received frame.
pub(crate) const MAX_FRAME: usize = 1024 * 1024;
/// The largest decompressed header block.
pub(crate) const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The most entries in one header block.
pub(crate) const MAX_HEADERS: u32 = 256;
/// The largest length that fits a frame's 24-bit length field.
const MAX_LENGTH: usize = (1 << 24) - 1;
/// The largest stream ID (31 bits).
const MAX_STREAM_ID: u32 = 0x7fff_ffff;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// The names and values of a header block, in order (several values of one name are NUL-separated).
pub(crate) type Headers = Vec<(String, String)>;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    /// A control frame of another SPDY version.
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    /// A received frame larger than 1 MiB (`MAX_FRAME`), or one to send larger than the length field.
    #[error("SPDY frame of {len} bytes is too large (at most {max})")]
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A frame whose payload does not fit its type.
    #[error("malformed SPDY {kind} frame: {reason}")]
    Malformed {
        /// The frame type.
        kind: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A header block that cannot be (de)compressed or parsed.
    #[error("SPDY header block: {0}")]
    HeaderBlock(String),
    /// The connection ended inside a frame.
    #[error("the SPDY connection ended inside a frame")]
    Truncated,
    /// Reading from the connection failed.
    #[error("reading the SPDY connection: {0}")]
    Io(#[from] std::io::Error),
}

/// A SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Opens a stream.
    SynStream {
        /// The new stream (odd from a client).
        stream: u32,
        /// Its headers.
        headers: Headers,
        /// The sender's half is closed at once.
        fin: bool,
    },
    /// Accepts a stream.
    SynReply {
        /// The stream.
        stream: u32,
        /// The reply's headers.
        headers: Headers,
        /// The replier's half is closed at once.
        fin: bool,
    },
    /// Ends a stream abnormally.
    RstStream {
        /// The stream.
        stream: u32,
        /// Why (1 protocol error, 3 refused, 5 cancel, …).
        status: u32,
    },
    /// Settings of the sender.
    Settings {
        /// The entries: flags, ID, value.
        entries: Vec<(u8, u32, u32)>,
    },
    /// A ping (IDs of the client odd, of the server even); answered by echoing it.
    Ping {
        /// The ping's ID.
        id: u32,
    },
    /// The sender takes no new streams.
    GoAway {
        /// The last stream the sender accepted.
        last_good: u32,
        /// 0 OK, 1 protocol error, 2 internal error.
        status: u32,
    },
    /// More headers of a stream.
    Headers {
        /// The stream.
        stream: u32,
        /// The headers.
        headers: Headers,
        /// The sender's half ends with them.
        fin: bool,
    },
    /// The receiver of `stream` (0: the connection) takes `delta` more bytes.
    WindowUpdate {
        /// The stream, or 0 for the connection.
        stream: u32,
        /// Bytes added to the window.
        delta: u32,
    },
    /// Data of a stream.
    Data {
        /// The stream.
        stream: u32,
        /// The sender's half ends with this frame.
        fin: bool,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A control frame of a type not used here (ignored).
    Unknown {
        /// Its type.
        kind: u16,
    },
}

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): length-prefixed header names and
/// common values, then a run of status codes, dates and media types.
pub(crate) static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
        203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized\
        403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable\
        Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT\
        chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,\
        text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
    let mut dictionary = Vec::with_capacity(1424);
    for word in WORDS {
        // every word is shorter than 256 bytes
        dictionary.extend_from_slice(&[0, 0, 0, word.len() as u8]);
        dictionary.extend_from_slice(word.as_bytes());
    }
    dictionary.extend_from_slice(TAIL.as_bytes());
    dictionary
});

/// Compresses the header blocks sent on one connection (one zlib context for all of them).
pub(crate) struct HeaderEncoder(Compress);

impl std::fmt::Debug for HeaderEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderEncoder").field("total_out", &self.0.total_out()).finish()
    }
}

impl HeaderEncoder {
    /// A compressor primed with the SPDY/3 dictionary.
    pub(crate) fn new() -> Result<Self, SpdyError> {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&DICTIONARY).map_err(|e| SpdyError::HeaderBlock(format!("dictionary: {e}")))?;
        Ok(Self(z))
    }

    /// The compressed header block of `headers`, ended with a sync flush.
    pub(crate) fn encode(&mut self, headers: &[(String, String)]) -> Result<Vec<u8>, SpdyError> {
        let plain = header_block(headers)?;
        let mut out = Vec::with_capacity(plain.len() / 2 + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(1024);
            }
            let before = self.0.total_in();
            self.0
                .compress_vec(&plain[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::HeaderBlock(format!("compression: {e}")))?;
            consumed += usize::try_from(self.0.total_in() - before).unwrap_or(usize::MAX);
            // The flush is complete when all input is taken and the output was not filled.
            if consumed >= plain.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// Decompresses the header blocks received on one connection (one zlib context for all of them).
pub(crate) struct HeaderDecoder(Decompress);

impl std::fmt::Debug for HeaderDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderDecoder").field("total_in", &self.0.total_in()).finish()
    }
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        Self(Decompress::new(true))
    }
}

impl HeaderDecoder {
    /// The headers of one compressed block (the dictionary is set when the stream asks for it).
    pub(crate) fn decode(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(1024);
        let mut consumed = 0;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(SpdyError::HeaderBlock(format!(
                        "more than {MAX_HEADER_BLOCK} bytes decompressed"
                    )));
                }
                out.reserve((MAX_HEADER_BLOCK - out.len()).min(out.len().max(1024)));
            }
            let (in_before, out_before) = (self.0.total_in(), out.len());
            match self.0.decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync) {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0
                        .set_dictionary(&DICTIONARY)
                        .map_err(|e| SpdyError::HeaderBlock(format!("dictionary: {e}")))?;
                }
                Err(e) => return Err(SpdyError::HeaderBlock(format!("decompression: {e}"))),
            }
            let taken = usize::try_from(self.0.total_in() - in_before).unwrap_or(usize::MAX);
            consumed = consumed.saturating_add(taken).min(block.len());
            if consumed == block.len() && out.len() < out.capacity() {
                return parse_header_block(&out);
            }
            if taken == 0 && out.len() == out_before && out.len() < out.capacity() {
                return Err(SpdyError::HeaderBlock("the compressed block does not decode".into()));
            }
        }
    }
}

/// The uncompressed header block: the count, then each name and value with a 32-bit length.
fn header_block(headers: &[(String, String)]) -> Result<Vec<u8>, SpdyError> {
    let too_long = || SpdyError::HeaderBlock("a header does not fit a header block".into());
    let mut block = Vec::new();
    block.extend_from_slice(&u32::try_from(headers.len()).map_err(|_| too_long())?.to_be_bytes());
    for (name, value) in headers {
        for part in [name.as_bytes(), value.as_bytes()] {
            block.extend_from_slice(&u32::try_from(part.len()).map_err(|_| too_long())?.to_be_bytes());
            block.extend_from_slice(part);
        }
    }
    Ok(block)
}

/// Reads big-endian fields from a payload; running out is an error naming the frame type.
struct Fields<'a> {
    kind: &'static str,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn malformed(&self, reason: impl Into<String>) -> SpdyError {
        SpdyError::Malformed { kind: self.kind, reason: reason.into() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SpdyError> {
        if self.rest.len() < n {
            return Err(self.malformed(format!("needs {n} more bytes, has {}", self.rest.len())));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, SpdyError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A 31-bit stream ID (the top bit is reserved); 0 is refused.
    fn stream(&mut self) -> Result<u32, SpdyError> {
        let id = self.u32()? & MAX_STREAM_ID;
        if id == 0 {
            return Err(self.malformed("stream ID 0"));
        }
        Ok(id)
    }

    fn end(&self) -> Result<(), SpdyError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} bytes too many", self.rest.len())))
        }
    }
}

fn parse_header_block(block: &[u8]) -> Result<Headers, SpdyError> {
    let bad = |e: SpdyError| SpdyError::HeaderBlock(e.to_string());
    let mut f = Fields { kind: "header block", rest: block };
    let count = f.u32().map_err(bad)?;
    if count > MAX_HEADERS {
        return Err(SpdyError::HeaderBlock(format!("{count} headers (at most {MAX_HEADERS})")));
    }
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut text = || -> Result<String, SpdyError> {
            let len = f.u32().map_err(bad)? as usize;
            let bytes = f.take(len).map_err(bad)?;
            String::from_utf8(bytes.to_vec())
                .map_err(|_| SpdyError::HeaderBlock("a header is not UTF-8".into()))
        };
        let name = text()?;
        let value = text()?;
        if name.is_empty() {
            return Err(SpdyError::HeaderBlock("an empty header name".into()));
        }
        headers.push((name, value));
    }
    f.end().map_err(bad)?;
    Ok(headers)
}

fn control_head(kind: u16, flags: u8, len: usize) -> Result<Vec<u8>, SpdyError> {
    if len > MAX_LENGTH {
        return Err(SpdyError::TooLarge { len, max: MAX_LENGTH });
    }
    let mut out = Vec::with_capacity(8 + len);
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    Ok(out)
}

fn check_stream(stream: u32, zero_ok: bool) -> Result<u32, SpdyError> {
    if stream > MAX_STREAM_ID || (stream == 0 && !zero_ok) {
        return Err(SpdyError::Malformed { kind: "outgoing", reason: format!("stream ID {stream}") });
    }
    Ok(stream)
}

/// The bytes of `frame`; header blocks are compressed with `encoder` (so frames must be sent in the order
/// they are encoded).
pub(crate) fn encode(frame: &Frame, encoder: &mut HeaderEncoder) -> Result<Vec<u8>, SpdyError> {
    let fin = |fin: bool| if fin { FLAG_FIN } else { 0 };
    let with_block = |kind: u16, flags: u8, prefix: &[u8], block: &[u8]| {
        let mut out = control_head(kind, flags, prefix.len() + block.len())?;
        out.extend_from_slice(prefix);
        out.extend_from_slice(block);
        Ok(out)
    };
    let fixed = |kind: u16, words: &[u32]| {
        let mut out = control_head(kind, 0, words.len() * 4)?;
        for w in words {
            out.extend_from_slice(&w.to_be_bytes());
        }
        Ok(out)
    };
    match frame {
        Frame::SynStream { stream, headers, fin: f } => {
            let mut prefix = check_stream(*stream, false)?.to_be_bytes().to_vec();
            // associated-to stream 0, priority 0, slot 0
            prefix.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            with_block(SYN_STREAM, fin(*f), &prefix, &encoder.encode(headers)?)
        }
        Frame::SynReply { stream, headers, fin: f } => {
            let prefix = check_stream(*stream, false)?.to_be_bytes();
            with_block(SYN_REPLY, fin(*f), &prefix, &encoder.encode(headers)?)
        }
        Frame::Headers { stream, headers, fin: f } => {
            let prefix = check_stream(*stream, false)?.to_be_bytes();
            with_block(HEADERS, fin(*f), &prefix, &encoder.encode(headers)?)
        }
        Frame::RstStream { stream, status } => fixed(RST_STREAM, &[check_stream(*stream, false)?, *status]),
        Frame::Settings { entries } => {
            let mut out = control_head(SETTINGS, 0, 4 + entries.len() * 8)?;
            out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
            for &(flags, id, value) in entries {
                if id > 0x00ff_ffff {
                    return Err(SpdyError::Malformed { kind: "SETTINGS", reason: format!("ID {id}") });
                }
                out.extend_from_slice(&(u32::from(flags) << 24 | id).to_be_bytes());
                out.extend_from_slice(&value.to_be_bytes());
            }
            Ok(out)
        }
        Frame::Ping { id } => fixed(PING, &[*id]),
        Frame::GoAway { last_good, status } => fixed(GOAWAY, &[check_stream(*last_good, true)?, *status]),
        Frame::WindowUpdate { stream, delta } => {
            if *delta == 0 || *delta > MAX_STREAM_ID {
                return Err(SpdyError::Malformed { kind: "WINDOW_UPDATE", reason: format!("delta {delta}") });
            }
            fixed(WINDOW_UPDATE, &[check_stream(*stream, true)?, *delta])
        }
        Frame::Data { stream, fin: f, data } => {
            if data.len() > MAX_LENGTH {
                return Err(SpdyError::TooLarge { len: data.len(), max: MAX_LENGTH });
            }
            let mut out = Vec::with_capacity(8 + data.len());
            out.extend_from_slice(&check_stream(*stream, false)?.to_be_bytes());
            out.push(fin(*f));
            out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(data);
            Ok(out)
        }
        Frame::Unknown { kind } => {
            Err(SpdyError::Malformed { kind: "outgoing", reason: format!("cannot send frame type {kind}") })
        }
    }
}

/// The payload length a frame head announces.
fn payload_len(head: &[u8; 8]) -> usize {
    usize::from(head[5]) << 16 | usize::from(head[6]) << 8 | usize::from(head[7])
}

/// Parses a frame from its head and payload; header blocks are decompressed with `decoder`.
pub(crate) fn parse(head: &[u8; 8], payload: &[u8], decoder: &mut HeaderDecoder) -> Result<Frame, SpdyError> {
    let flags = head[4];
    let fin = flags & FLAG_FIN != 0;
    if head[0] & 0x80 == 0 {
        let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        if stream == 0 {
            return Err(SpdyError::Malformed { kind: "DATA", reason: "stream ID 0".into() });
        }
        return Ok(Frame::Data { stream, fin, data: payload.to_vec() });
    }
    let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
    if version != VERSION {
        return Err(SpdyError::Version(version));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let name = match kind {
        SYN_STREAM => "SYN_STREAM",
        SYN_REPLY => "SYN_REPLY",
        RST_STREAM => "RST_STREAM",
        SETTINGS => "SETTINGS",
        PING => "PING",
        GOAWAY => "GOAWAY",
        HEADERS => "HEADERS",
        WINDOW_UPDATE => "WINDOW_UPDATE",
        _ => return Ok(Frame::Unknown { kind }),
    };
    let mut f = Fields { kind: name, rest: payload };
    let frame = match kind {
        SYN_STREAM => {
            let stream = f.stream()?;
            f.take(6)?;
            let headers = decoder.decode(std::mem::take(&mut f.rest))?;
            Frame::SynStream { stream, headers, fin }
        }
        SYN_REPLY => {
            let stream = f.stream()?;
            let headers = decoder.decode(std::mem::take(&mut f.rest))?;
            Frame::SynReply { stream, headers, fin }
        }
        HEADERS => {
            let stream = f.stream()?;
            let headers = decoder.decode(std::mem::take(&mut f.rest))?;
            Frame::Headers { stream, headers, fin }
        }
        RST_STREAM => Frame::RstStream { stream: f.stream()?, status: f.u32()? },
        SETTINGS => {
            let count = f.u32()? as usize;
            if f.rest.len() != count.saturating_mul(8) {
                return Err(f.malformed(format!("{count} entries in {} bytes", f.rest.len())));
            }
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                let word = f.u32()?;
                entries.push(((word >> 24) as u8, word & 0x00ff_ffff, f.u32()?));
            }
            Frame::Settings { entries }
        }
        PING => Frame::Ping { id: f.u32()? },
        GOAWAY => Frame::GoAway { last_good: f.u32()? & MAX_STREAM_ID, status: f.u32()? },
        _ => {
            let stream = f.u32()? & MAX_STREAM_ID;
            let delta = f.u32()? & MAX_STREAM_ID;
            if delta == 0 {
                return Err(f.malformed("delta 0"));
            }
            Frame::WindowUpdate { stream, delta }
        }
    };
    f.end()?;
    Ok(frame)
}

/// Reads the next frame; `None` when the connection ends cleanly between frames.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    decoder: &mut HeaderDecoder,
) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0_u8; 8];
    let mut filled = 0;
    while filled < head.len() {
        match reader.read(&mut head[filled..]).await? {
            0 if filled == 0 => return Ok(None),
            0 => return Err(SpdyError::Truncated),
            n => filled += n,
        }
    }
    let len = payload_len(&head);
    if len > MAX_FRAME {
        return Err(SpdyError::TooLarge { len, max: MAX_FRAME });
    }
    let mut payload = vec![0_u8; len];
    reader.read_exact(&mut payload).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SpdyError::Truncated,
        _ => SpdyError::Io(e),
    })?;
    parse(&head, &payload, decoder).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect()
    }

    fn split(bytes: &[u8]) -> ([u8; 8], &[u8]) {
        let head: [u8; 8] = bytes[..8].try_into().expect("a head");
        assert_eq!(payload_len(&head), bytes.len() - 8, "the length field");
        (head, &bytes[8..])
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        // 1423 bytes, Adler-32 0xe3c6a7c2: the DICTID every SPDY/3 peer's zlib stream names
        assert_eq!(DICTIONARY.len(), 1423);
        let (mut a, mut b) = (1_u32, 0_u32);
        for &byte in DICTIONARY.iter() {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(b << 16 | a, 0xe3c6_a7c2);
        assert!(DICTIONARY.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(DICTIONARY.ends_with(b"utf-,*,enq=0."));
    }

    #[test]
    fn frames_round_trip_with_one_compression_context_per_direction() {
        let mut enc = HeaderEncoder::new().expect("encoder");
        let mut dec = HeaderDecoder::default();
        let frames = [
            Frame::SynStream { stream: 1, headers: h(&[("streamtype", "error")]), fin: false },
            Frame::SynStream { stream: 3, headers: h(&[("streamtype", "stdin")]), fin: false },
            Frame::SynReply { stream: 3, headers: vec![], fin: false },
            Frame::Headers { stream: 5, headers: h(&[("a", "1\u{0}2"), ("bb", "")]), fin: true },
            Frame::Data { stream: 3, fin: false, data: b"data\n".to_vec() },
            Frame::Data { stream: 3, fin: true, data: vec![] },
            Frame::RstStream { stream: 7, status: REFUSED_STREAM },
            Frame::Settings { entries: vec![(0, SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20), (1, 4, 100)] },
            Frame::Settings { entries: vec![] },
            Frame::Ping { id: 2 },
            Frame::GoAway { last_good: 0, status: 0 },
            Frame::WindowUpdate { stream: 0, delta: 32768 },
            Frame::WindowUpdate { stream: 1, delta: MAX_STREAM_ID },
            // the same headers again: the shared context compresses them as a back-reference
            Frame::SynStream { stream: 9, headers: h(&[("streamtype", "error")]), fin: false },
        ];
        for frame in &frames {
            let bytes = encode(frame, &mut enc).expect("encode");
            let (head, payload) = split(&bytes);
            assert_eq!(&parse(&head, payload, &mut dec).expect("parse"), frame);
        }
    }

    #[test]
    fn the_wire_format_is_spdy3s() {
        let mut enc = HeaderEncoder::new().expect("encoder");
        let data =
            encode(&Frame::Data { stream: 3, fin: true, data: b"ab".to_vec() }, &mut enc).expect("data");
        assert_eq!(data, [0, 0, 0, 3, 1, 0, 0, 2, b'a', b'b']);
        let ping = encode(&Frame::Ping { id: 1 }, &mut enc).expect("ping");
        assert_eq!(ping, [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
        let update = encode(&Frame::WindowUpdate { stream: 5, delta: 0x100 }, &mut enc).expect("update");
        assert_eq!(update, [0x80, 3, 0, 9, 0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 1, 0]);
        // a SYN_STREAM's block is a zlib stream naming the SPDY dictionary (FDICT, DICTID 0xe3c6a7c2)
        let syn = encode(
            &Frame::SynStream { stream: 1, headers: h(&[("streamtype", "error")]), fin: false },
            &mut enc,
        )
        .expect("syn");
        assert_eq!(&syn[..5], [0x80, 3, 0, 1, 0]);
        assert_eq!(&syn[8..18], [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(syn[19] & 0x20, 0x20, "FDICT");
        assert_eq!(&syn[20..24], [0xe3, 0xc6, 0xa7, 0xc2]);
        // a reference zlib inflater with the dictionary reads the block
        let mut z = Decompress::new(true);
        let mut out = Vec::with_capacity(256);
        let err =
            z.decompress_vec(&syn[18..], &mut out, FlushDecompress::Sync).expect_err("needs the dictionary");
        assert_eq!(err.needs_dictionary(), Some(0xe3c6_a7c2));
        z.set_dictionary(&DICTIONARY).expect("dictionary");
        let taken = z.total_in() as usize;
        z.decompress_vec(&syn[18 + taken..], &mut out, FlushDecompress::Sync).expect("inflate");
        assert_eq!(out, b"\0\0\0\x01\0\0\0\x0astreamtype\0\0\0\x05error");
    }

    #[test]
    fn malformed_frames_are_errors() {
        let mut dec = HeaderDecoder::default();
        let mut parse_bytes = |bytes: &[u8]| {
            let head: [u8; 8] = bytes[..8].try_into().expect("head");
            parse(&head, &bytes[8..], &mut dec)
        };
        // SPDY/2
        assert!(matches!(parse_bytes(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]), Err(SpdyError::Version(2))));
        // a PING of 3 bytes, of 5 bytes
        assert!(matches!(
            parse_bytes(&[0x80, 3, 0, 6, 0, 0, 0, 3, 0, 0, 1]),
            Err(SpdyError::Malformed { .. })
        ));
        assert!(matches!(
            parse_bytes(&[0x80, 3, 0, 6, 0, 0, 0, 5, 0, 0, 0, 1, 9]),
            Err(SpdyError::Malformed { .. })
        ));
        // RST_STREAM of stream 0; DATA of stream 0; WINDOW_UPDATE of 0 bytes
        assert!(parse_bytes(&[0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(parse_bytes(&[0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(parse_bytes(&[0x80, 3, 0, 9, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0]).is_err());
        // SETTINGS announcing 2 entries with 1
        assert!(parse_bytes(&[0x80, 3, 0, 4, 0, 0, 0, 12, 0, 0, 0, 2, 0, 0, 0, 7, 0, 1, 0, 0]).is_err());
        // a SYN_REPLY whose header block is not zlib
        assert!(matches!(
            parse_bytes(&[0x80, 3, 0, 2, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4]),
            Err(SpdyError::HeaderBlock(_))
        ));
        // an unknown control type is ignored, as SPDY/3 asks
        assert_eq!(parse_bytes(&[0x80, 3, 0, 0x42, 0, 0, 0, 0]).ok(), Some(Frame::Unknown { kind: 0x42 }));
    }

    #[test]
    fn malformed_header_blocks_are_errors() {
        // well-compressed blocks whose content is wrong
        let compressed = |plain: &[u8]| {
            let mut z = Compress::new(Compression::default(), true);
            z.set_dictionary(&DICTIONARY).expect("dictionary");
            let mut out = Vec::with_capacity(plain.len() + 1024);
            z.compress_vec(plain, &mut out, FlushCompress::Sync).expect("compress");
            out
        };
        for (plain, why) in [
            (&b"\0\0\0\x01\0\0\0\x04ab"[..], "a name longer than the block"),
            (&b"\0\0\0\x01\0\0\0\x01a"[..], "no value"),
            (&b"\0\0\0\x00x"[..], "trailing bytes"),
            (&b"\0\0\x10\x00"[..], "too many headers"),
            (&b"\0\0\0\x01\0\0\0\0\0\0\0\0"[..], "an empty name"),
            (&b"\0\0\0\x01\0\0\0\x01\xff\0\0\0\0"[..], "not UTF-8"),
            (&b"\0\0"[..], "a short count"),
        ] {
            let mut dec = HeaderDecoder::default();
            assert!(matches!(dec.decode(&compressed(plain)), Err(SpdyError::HeaderBlock(_))), "{why}");
        }
        // a block that inflates to more than the limit
        let mut big = b"\0\0\0\x01\0\0\0\x01a".to_vec();
        big.extend_from_slice(&((MAX_HEADER_BLOCK as u32) + 1).to_be_bytes());
        big.resize(big.len() + MAX_HEADER_BLOCK + 1, b'x');
        let mut dec = HeaderDecoder::default();
        assert!(
            matches!(dec.decode(&compressed(&big)), Err(SpdyError::HeaderBlock(m)) if m.contains("more than"))
        );
        // a header block cut short
        let mut enc = HeaderEncoder::new().expect("encoder");
        let block = enc.encode(&h(&[("streamtype", "stdout")])).expect("encode");
        let mut dec = HeaderDecoder::default();
        assert!(dec.decode(&block[..block.len() / 2]).is_err());
    }

    #[tokio::test]
    async fn frames_are_read_from_a_connection_with_bounds() {
        let mut enc = HeaderEncoder::new().expect("encoder");
        let mut wire =
            encode(&Frame::SynReply { stream: 1, headers: vec![], fin: false }, &mut enc).expect("reply");
        wire.extend(
            encode(&Frame::Data { stream: 1, fin: true, data: vec![7; 40_000] }, &mut enc).expect("data"),
        );
        let mut dec = HeaderDecoder::default();
        let mut reader = &wire[..];
        assert!(matches!(
            read_frame(&mut reader, &mut dec).await,
            Ok(Some(Frame::SynReply { stream: 1, .. }))
        ));
        match read_frame(&mut reader, &mut dec).await {
            Ok(Some(Frame::Data { stream: 1, fin: true, data })) => assert_eq!(data.len(), 40_000),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_frame(&mut reader, &mut dec).await, Ok(None)));
        // cut inside the head, inside the payload
        assert!(matches!(read_frame(&mut &wire[..5], &mut dec).await, Err(SpdyError::Truncated)));
        let data_at = wire.len() - 40_008;
        assert!(matches!(
            read_frame(&mut &wire[data_at..data_at + 100], &mut dec).await,
            Err(SpdyError::Truncated)
        ));
        // a frame announcing 16 MiB is refused before anything is allocated
        let huge = [0_u8, 0, 0, 1, 0, 0xff, 0xff, 0xff];
        assert!(matches!(read_frame(&mut &huge[..], &mut dec).await, Err(SpdyError::TooLarge { .. })));
    }
}

//! nodelet's own WebSocket port-forward: `/portForward` without the runtime's streaming server.
//!
//! For a WebSocket request that negotiates the binary channel protocol (`v4.channel.k8s.io`, or no
//! subprotocol at all, which the kubelet serves the same way), [`super::streaming::port_forward`] finds the
//! sandbox's network ([`nodelet_cri::SandboxNetwork`]), dials each requested port on `localhost` inside it
//! ([`nodelet_cri::NetnsDialer`]: a dedicated thread enters the pod's network namespace, so a listener bound
//! to 127.0.0.1 in the pod is reached; a `hostNetwork` pod is dialled on the host's loopback), answers
//! `101 Switching Protocols` itself and relays with [`serve`]. When the network cannot be found or entered
//! (no `CAP_SYS_ADMIN`, a runtime that does not say), the request goes to CRI `PortForward` as before; so do
//! SPDY and `v4.base64.channel.k8s.io` requests.
//!
//! The protocol is the kubelet's (`pkg/kubelet/cri/streaming/portforward/websocket.go`, which containerd
//! runs too): port *i* of the `port` parameters has channels `2i` (data, both ways) and `2i+1` (errors,
//! server to client); each binary message starts with its channel byte; the server first sends each
//! channel the port number (2 bytes, little endian). A port whose connect fails gets the error text on its
//! error channel (worded as containerd words it, e.g. `…: dial tcp4 127.0.0.1:9999: connect: connection
//! refused`). Client data on an error channel or an unknown channel is dropped, as the kubelet drops it.
//!
//! The session ends when the client closes (a close frame, which is answered, or the end of its
//! connection), when every port's pod connection has ended and the client sent nothing more for
//! [`CLOSE_GRACE`] (containerd's one second after the first direction ends), when nothing has gone either
//! way on the client's connection for `streamingConnectionIdleTimeout`, or when the servers stop.
//! Then nodelet sends a close frame, closes the TLS connection and the pod connections.
//!
//! Copies: pod → client, each read from the pod lands in a buffer behind room for the frame header, which is
//! written in front of it, and the frame goes to TLS in one write; client → pod, frames are parsed and
//! unmasked in place in one read buffer and written to the pod as they arrive (a frame is never collected
//! whole), so any frame size is fine.

use std::io;
use std::ops::Range;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::FutureExt as _;
use hyper_util::rt::TokioIo;
use nodelet_cri::{NetnsDialer, NetnsError, SandboxNetwork};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::streaming::{Activity, SessionPermit, Tracked, UPGRADE_WAIT, idle};

/// The binary channel protocol served here.
pub(crate) const CHANNEL_V4: &str = "v4.channel.k8s.io";
/// The base64 channel protocol (left to the runtime).
const BASE64_V4: &str = "v4.base64.channel.k8s.io";
/// How long the client may still send after every pod connection ended (containerd waits one second for the
/// other direction).
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// The most read from a pod connection into one frame.
const POD_READ: usize = 256 * 1024;
/// The client read buffer (frames are parsed in place in it).
const CLIENT_READ: usize = 512 * 1024;
/// How much of a client frame is gathered (when already readable) before it is written to the pod.
const GATHER: usize = 128 * 1024;
/// The most unread data [`FrameReader::gather`] moves to the front of its buffer to make room.
const COMPACT_AT_MOST: usize = 16 * 1024;
/// Room for the longest server frame header (2 + 8 bytes, unmasked).
const HEADER_ROOM: usize = 10;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// Whether nodelet serves a port-forward WebSocket itself: `Some(protocol)` (the subprotocol to answer,
/// `None` for none) for a version-13 WebSocket request with a key whose first supported subprotocol is
/// the binary channel protocol (or that offers none); `None` otherwise (the runtime answers it).
pub(crate) fn negotiate(headers: &HeaderMap) -> Option<Option<&'static str>> {
    let version = headers.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok());
    if version.map(str::trim) != Some("13") || !headers.contains_key(header::SEC_WEBSOCKET_KEY) {
        return None;
    }
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Some(None);
    }
    match offered.into_iter().find(|p| *p == CHANNEL_V4 || *p == BASE64_V4) {
        Some(CHANNEL_V4) => Some(Some(CHANNEL_V4)),
        _ => None,
    }
}

/// The `101 Switching Protocols` answer to a WebSocket request with `key`.
pub(crate) fn switching_protocols(key: &HeaderValue, protocol: Option<&'static str>) -> Response {
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Some(p) = protocol {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    response
}

/// One requested port: its connection, or why it could not be made (the text of its error channel).
#[derive(Debug)]
pub(crate) struct Dialed {
    port: u16,
    conn: Result<TcpStream, DialError>,
}

/// A port of the pod that could not be connected to, in containerd's words (the pod is the sandbox ID,
/// the UID is empty, as the runtime sees them): what the client reads on the port's error channel.
#[derive(Debug, thiserror::Error)]
#[error(
    "error forwarding port {port} to pod {sandbox_id}, uid : failed to execute portforward in network namespace \
     \"{network}\": failed to connect to localhost:{port} inside namespace \"{sandbox_id}\": {source}"
)]
pub(crate) struct DialError {
    /// The port.
    port: u16,
    /// The sandbox.
    sandbox_id: String,
    /// The sandbox's network namespace, as shown.
    network: String,
    /// Why the connection failed.
    source: NetnsError,
}

/// Dials every port in `network`. `Err` when the namespace itself cannot be used (then nothing was kept
/// and the runtime should forward); a refused or timed-out port is an `Ok` entry with its error text.
pub(crate) async fn dial_all(
    dialer: &NetnsDialer,
    network: &SandboxNetwork,
    sandbox_id: &str,
    ports: &[u16],
) -> Result<Vec<Dialed>, NetnsError> {
    let dials = ports.iter().map(|&port| async move { (port, dialer.dial(network, port).await) });
    let mut out = Vec::with_capacity(ports.len());
    for (port, result) in futures::future::join_all(dials).await {
        let conn = match result {
            Ok(conn) => Ok(conn),
            Err(e) if e.is_namespace_unusable() => return Err(e),
            Err(source) => Err(DialError {
                port,
                sandbox_id: sandbox_id.to_owned(),
                network: network.to_string(),
                source,
            }),
        };
        out.push(Dialed { port, conn });
    }
    Ok(out)
}

/// Serves one port-forward WebSocket on the client's upgraded connection until it ends (see the module
/// docs), or until nothing has gone either way for `idle_timeout`; holds `permit` meanwhile.
pub(crate) async fn serve(
    client: hyper::upgrade::OnUpgrade,
    dialed: Vec<Dialed>,
    permit: SessionPermit,
    stopping: CancellationToken,
    idle_timeout: Option<Duration>,
    what: String,
) {
    let _permit = permit;
    let activity = Activity::new();
    let session = async {
        let client = tokio::time::timeout(UPGRADE_WAIT, client)
            .await
            .map_err(|_| format!("the client did not take up the connection within {UPGRADE_WAIT:?}"))?
            .map_err(|e| format!("client side: {e}"))?;
        debug!(%what, "client side upgraded; forwarding");
        let (read, write) = tokio::io::split(Tracked::new(TokioIo::new(client), activity.clone()));
        run(read, write, dialed).await.map_err(|e| format!("client connection: {e}"))
    };
    tokio::select! {
        result = session => match result {
            Ok(how) => debug!(%what, %how, "port-forward session ended"),
            Err(error) => debug!(%what, %error, "port-forward session ended"),
        },
        () = idle(&activity, idle_timeout) => {
            info!(%what, ?idle_timeout, "port-forward session closed: idle (streamingConnectionIdleTimeout)")
        }
        () = stopping.cancelled() => info!(%what, "port-forward session closed: the servers are stopping"),
    }
}

/// The session on the upgraded connection; `Ok` says how it ended.
async fn run<R, W>(read: R, write: W, dialed: Vec<Dialed>) -> io::Result<String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let writer = Mutex::new(write);
    let mut pod_writers: Vec<Option<OwnedWriteHalf>> = Vec::with_capacity(dialed.len());
    let mut pod_readers = Vec::new();
    for (i, d) in dialed.into_iter().enumerate() {
        let (data, error) = channels(i);
        let prefix = d.port.to_le_bytes();
        for channel in [data, error] {
            write_message(&writer, channel, &prefix).await?;
        }
        match d.conn {
            Ok(conn) => {
                let (r, w) = conn.into_split();
                pod_readers.push((data, r));
                pod_writers.push(Some(w));
            }
            Err(failed) => {
                let text = failed.to_string();
                debug!(port = d.port, error = %text, "port-forward connect failed");
                write_message(&writer, error, text.as_bytes()).await?;
                pod_writers.push(None);
            }
        }
    }
    let connected = !pod_readers.is_empty();
    let pumps =
        futures::future::join_all(pod_readers.into_iter().map(|(channel, r)| pump(r, channel, &writer)));
    let from_client = from_client(read, &mut pod_writers, &writer);
    tokio::pin!(pumps, from_client);
    let (how, close_sent) = tokio::select! {
        ended = &mut from_client => ended?,
        sent = &mut pumps => {
            let sent: u64 = sent.into_iter().map(|r| r.unwrap_or(0)).sum();
            if connected {
                // The pod side is done; the client may still be sending (containerd waits the same).
                if let Ok(ended) = tokio::time::timeout(CLOSE_GRACE, &mut from_client).await {
                    let (how, close_sent) = ended?;
                    return finish(&writer, close_sent, how).await;
                }
            }
            (format!("the pod side ended after sending {sent} bytes"), false)
        }
    };
    finish(&writer, close_sent, how).await
}

/// Ends the session: a normal closure (unless the client's close was answered already), then the end of the
/// connection (a TLS close_notify).
async fn finish<W: AsyncWrite + Unpin>(
    writer: &Mutex<W>,
    close_sent: bool,
    how: String,
) -> io::Result<String> {
    let mut w = writer.lock().await;
    if !close_sent {
        let _ = write_frame(&mut *w, OP_CLOSE, &1000_u16.to_be_bytes()).await;
    }
    let _ = w.shutdown().await;
    Ok(how)
}

/// The data and error channels of the `i`-th port (the protocol has 256 channels; ports beyond 127 cannot
/// be addressed and share the last ones, as the kubelet's byte arithmetic does).
fn channels(i: usize) -> (u8, u8) {
    let data = (i * 2) as u8;
    (data, data.wrapping_add(1))
}

/// Copies a pod connection into frames on `channel` until it ends; the bytes sent.
async fn pump<W: AsyncWrite + Unpin>(
    mut from: OwnedReadHalf,
    channel: u8,
    writer: &Mutex<W>,
) -> io::Result<u64> {
    let mut buf = vec![0_u8; HEADER_ROOM + 1 + POD_READ];
    buf[HEADER_ROOM] = channel;
    let mut total = 0_u64;
    loop {
        let n = from.read(&mut buf[HEADER_ROOM + 1..]).await?;
        if n == 0 {
            return Ok(total);
        }
        let start = put_header(&mut buf[..HEADER_ROOM], OP_BINARY, n + 1);
        let mut w = writer.lock().await;
        w.write_all(&buf[start..HEADER_ROOM + 1 + n]).await?;
        w.flush().await?;
        total += n as u64;
    }
}

/// Writes a final server frame header for `len` payload bytes at the end of `room` (at least
/// [`HEADER_ROOM`] long); returns where it starts.
fn put_header(room: &mut [u8], opcode: u8, len: usize) -> usize {
    let end = room.len();
    let (start, first_len) = if len < 126 {
        (end - 2, len as u8)
    } else if let Ok(short) = u16::try_from(len) {
        room[end - 2..].copy_from_slice(&short.to_be_bytes());
        (end - 4, 126)
    } else {
        room[end - 8..].copy_from_slice(&(len as u64).to_be_bytes());
        (end - 10, 127)
    };
    room[start] = 0x80 | opcode;
    room[start + 1] = first_len;
    start
}

/// Writes one whole (unmasked, final) frame.
async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, opcode: u8, payload: &[u8]) -> io::Result<()> {
    let mut frame = vec![0_u8; HEADER_ROOM + payload.len()];
    let start = put_header(&mut frame[..HEADER_ROOM], opcode, payload.len());
    frame[HEADER_ROOM..].copy_from_slice(payload);
    w.write_all(&frame[start..]).await?;
    w.flush().await
}

/// Writes one binary message on `channel`.
async fn write_message<W: AsyncWrite + Unpin>(
    writer: &Mutex<W>,
    channel: u8,
    payload: &[u8],
) -> io::Result<()> {
    let mut message = Vec::with_capacity(1 + payload.len());
    message.push(channel);
    message.extend_from_slice(payload);
    write_frame(&mut *writer.lock().await, OP_BINARY, &message).await
}

/// Reads the client's frames and writes each data channel's bytes to its pod connection until the client
/// closes; answers pings and the close frame. How it ended, and whether a close frame was sent.
async fn from_client<R, W>(
    read: R,
    pods: &mut [Option<OwnedWriteHalf>],
    writer: &Mutex<W>,
) -> io::Result<(String, bool)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frames = FrameReader::new(read);
    let mut received = 0_u64;
    loop {
        match frames.next().await? {
            Event::Data { channel, range } => {
                let port = usize::from(channel / 2);
                if channel % 2 != 0 || range.is_empty() {
                    continue;
                }
                let Some(slot) = pods.get_mut(port) else { continue };
                let Some(pod) = slot else { continue };
                if let Err(error) = pod.write_all(frames.bytes(range.clone())).await {
                    // The pod closed its side: later data for this port is dropped.
                    debug!(%error, port, "writing to the pod connection failed");
                    *slot = None;
                    continue;
                }
                received += range.len() as u64;
            }
            Event::Ping(payload) => write_frame(&mut *writer.lock().await, OP_PONG, &payload).await?,
            Event::Close(payload) => {
                // Echo the status code (an empty close is answered empty).
                let code = payload.get(..2).unwrap_or_default().to_vec();
                let mut w = writer.lock().await;
                let _ = write_frame(&mut *w, OP_CLOSE, &code).await;
                return Ok((format!("the client closed after sending {received} bytes"), true));
            }
            Event::End => return Ok((format!("the client went away after sending {received} bytes"), false)),
        }
    }
}

/// What the client sent next.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// Payload bytes of a data message on `channel`, in [`FrameReader::bytes`]`(range)`, unmasked.
    Data {
        channel: u8,
        range: Range<usize>,
    },
    Ping(Vec<u8>),
    Close(Vec<u8>),
    /// The connection ended (also in the middle of a frame).
    End,
}

/// The data frame being read.
#[derive(Debug)]
struct Frame {
    left: u64,
    mask: Option<[u8; 4]>,
    /// Payload bytes already consumed (the mask's phase).
    done: usize,
}

/// Parses client frames in place in one buffer.
#[derive(Debug)]
struct FrameReader<R> {
    io: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    frame: Option<Frame>,
    /// The current data message's channel, once its first byte was read.
    channel: Option<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(io: R) -> Self {
        Self { io, buf: vec![0; CLIENT_READ], start: 0, end: 0, frame: None, channel: None }
    }

    fn bytes(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// Buffers at least `n` (at most the buffer's size) unread bytes; false at the end of the input.
    async fn fill(&mut self, n: usize) -> io::Result<bool> {
        while self.end - self.start < n {
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
            } else if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            }
            let read = self.io.read(&mut self.buf[self.end..]).await?;
            if read == 0 {
                return Ok(false);
            }
            self.end += read;
        }
        Ok(true)
    }

    /// Reads what is already there (without waiting) until `want` bytes are buffered: bigger pieces for the
    /// pod connection than one TLS record (16 KiB) each, so fewer writes and TCP segments. The end of the
    /// input is left for the next [`fill`](Self::fill) to see.
    fn gather(&mut self, want: usize) -> io::Result<()> {
        // Make room only when that is cheap (little unread data to move).
        if self.buf.len() - self.end < want && self.start > 0 && self.end - self.start <= COMPACT_AT_MOST {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        while self.end - self.start < want && self.end < self.buf.len() {
            match self.io.read(&mut self.buf[self.end..]).now_or_never() {
                None | Some(Ok(0)) => break,
                Some(Ok(n)) => self.end += n,
                Some(Err(e)) => return Err(e),
            }
        }
        Ok(())
    }

    async fn next(&mut self) -> io::Result<Event> {
        loop {
            let Some(frame) = &mut self.frame else {
                if let Some(control) = self.header().await? {
                    return Ok(control);
                }
                continue;
            };
            if frame.left == 0 {
                self.frame = None;
                continue;
            }
            if self.start == self.end && !self.fill(1).await? {
                return Ok(Event::End);
            }
            let left = self.frame.as_ref().map_or(0, |f| f.left);
            self.gather(usize::try_from(left).unwrap_or(usize::MAX).min(GATHER))?;
            let Some(frame) = &mut self.frame else { continue };
            let n = usize::try_from(frame.left).unwrap_or(usize::MAX).min(self.end - self.start);
            let range = self.start..self.start + n;
            if let Some(mask) = frame.mask {
                unmask(&mut self.buf[range.clone()], mask, frame.done);
            }
            frame.left -= n as u64;
            frame.done += n;
            self.start += n;
            let mut range = range;
            let channel = match self.channel {
                Some(c) => c,
                None => {
                    let c = self.buf[range.start];
                    self.channel = Some(c);
                    range.start += 1;
                    c
                }
            };
            return Ok(Event::Data { channel, range });
        }
    }

    /// Reads a frame header: a data frame becomes `self.frame` (`None` is returned), a control frame is read
    /// whole and returned (pongs are skipped).
    async fn header(&mut self) -> io::Result<Option<Event>> {
        if !self.fill(2).await? {
            return Ok(Some(Event::End));
        }
        let (b0, b1) = (self.buf[self.start], self.buf[self.start + 1]);
        let opcode = b0 & 0x0F;
        let masked = b1 & 0x80 != 0;
        let extra = match b1 & 0x7F {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let size = 2 + extra + if masked { 4 } else { 0 };
        if !self.fill(size).await? {
            return Ok(Some(Event::End));
        }
        let h = &self.buf[self.start..self.start + size];
        let len = match extra {
            2 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            8 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            _ => u64::from(b1 & 0x7F),
        };
        let mask = masked.then(|| [h[size - 4], h[size - 3], h[size - 2], h[size - 1]]);
        self.start += size;
        match opcode {
            OP_TEXT | OP_BINARY | OP_CONTINUATION => {
                if opcode != OP_CONTINUATION {
                    self.channel = None;
                }
                self.frame = Some(Frame { left: len, mask, done: 0 });
                Ok(None)
            }
            OP_CLOSE | OP_PING | OP_PONG if len <= 125 => {
                let len = len as usize;
                if !self.fill(len).await? {
                    return Ok(Some(Event::End));
                }
                let mut payload = self.buf[self.start..self.start + len].to_vec();
                self.start += len;
                if let Some(mask) = mask {
                    unmask(&mut payload, mask, 0);
                }
                Ok(match opcode {
                    OP_CLOSE => Some(Event::Close(payload)),
                    OP_PING => Some(Event::Ping(payload)),
                    _ => None,
                })
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("WebSocket protocol error: opcode {opcode:#x} with {len} bytes"),
            )),
        }
    }
}

/// XORs `data` with the mask, starting at phase `done` of the payload (in 32-byte blocks the compiler
/// turns into vector instructions).
fn unmask(data: &mut [u8], mask: [u8; 4], done: usize) {
    let mut m = [0_u8; 32];
    for (i, b) in m.iter_mut().enumerate() {
        *b = mask[(done + i) % 4];
    }
    let mut blocks = data.chunks_exact_mut(32);
    for block in &mut blocks {
        for (b, k) in block.iter_mut().zip(m) {
            *b ^= k;
        }
    }
    for (b, k) in blocks.into_remainder().iter_mut().zip(m) {
        *b ^= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_port_reads_as_containerds_error() {
        let error = DialError {
            port: 9999,
            sandbox_id: "sb1".to_owned(),
            network: "/var/run/netns/cni-1".to_owned(),
            source: NetnsError::Connect {
                addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9999)),
                source: io::Error::from(io::ErrorKind::ConnectionRefused),
            },
        };
        assert_eq!(
            error.to_string(),
            "error forwarding port 9999 to pod sb1, uid : failed to execute portforward in network namespace \
             \"/var/run/netns/cni-1\": failed to connect to localhost:9999 inside namespace \"sb1\": dial tcp4 \
             127.0.0.1:9999: connect: connection refused"
        );
    }

    fn masked_frame(opcode: u8, fin: bool, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xFFFF => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    #[test]
    fn negotiation_serves_the_binary_protocol_and_leaves_the_rest_to_the_runtime() {
        let headers = |protocols: &[&str], version: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_str(version).expect("value"));
            h.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="));
            for p in protocols {
                h.append(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(p).expect("value"));
            }
            h
        };
        assert_eq!(negotiate(&headers(&["v4.channel.k8s.io"], "13")), Some(Some(CHANNEL_V4)));
        assert_eq!(negotiate(&headers(&["foo, v4.channel.k8s.io"], "13")), Some(Some(CHANNEL_V4)));
        assert_eq!(negotiate(&headers(&[], "13")), Some(None));
        assert_eq!(negotiate(&headers(&["v4.base64.channel.k8s.io", "v4.channel.k8s.io"], "13")), None);
        assert_eq!(negotiate(&headers(&["SPDY/3.1+portforward.k8s.io"], "13")), None);
        assert_eq!(negotiate(&headers(&["v4.channel.k8s.io"], "8")), None);
        let accept = switching_protocols(&HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="), None);
        // RFC 6455's example
        assert_eq!(accept.headers()[header::SEC_WEBSOCKET_ACCEPT], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(!accept.headers().contains_key(header::SEC_WEBSOCKET_PROTOCOL));
    }

    #[test]
    fn headers_and_masks() {
        let mut room = [0_u8; HEADER_ROOM];
        assert_eq!(put_header(&mut room, OP_BINARY, 5), 8);
        assert_eq!(room[8..], [0x82, 5]);
        assert_eq!(put_header(&mut room, OP_BINARY, 300), 6);
        assert_eq!(room[6..], [0x82, 126, 1, 44]);
        assert_eq!(put_header(&mut room, OP_BINARY, 70000), 0);
        assert_eq!(room[..2], [0x82, 127]);
        assert_eq!(room[2..], 70000_u64.to_be_bytes());
        let mask = [1, 2, 3, 4];
        let plain: Vec<u8> = (0..37).collect();
        for phase in 0..5 {
            let mut data: Vec<u8> =
                plain.iter().enumerate().map(|(i, b)| b ^ mask[(phase + i) % 4]).collect();
            unmask(&mut data, mask, phase);
            assert_eq!(data, plain, "phase {phase}");
        }
    }

    #[tokio::test]
    async fn frames_are_parsed_across_reads_fragments_and_control_frames() {
        let big: Vec<u8> = (0..200_000_u32).map(|i| (i % 251) as u8).collect();
        let mut input = Vec::new();
        let mut message = vec![0_u8];
        message.extend_from_slice(&big);
        input.extend(masked_frame(OP_BINARY, true, &message, [9, 8, 7, 6]));
        input.extend(masked_frame(OP_PING, true, b"hi", [1, 1, 1, 1]));
        // a fragmented message on channel 2: the channel byte is only in the first fragment
        input.extend(masked_frame(OP_BINARY, false, &[2, b'a'], [5, 5, 5, 5]));
        input.extend(masked_frame(OP_PONG, true, b"", [0, 0, 0, 0]));
        input.extend(masked_frame(OP_CONTINUATION, true, b"bc", [3, 3, 3, 3]));
        input.extend(masked_frame(OP_CLOSE, true, &1000_u16.to_be_bytes(), [7, 7, 7, 7]));
        // read in small uneven pieces
        let (mut tx, rx) = tokio::io::duplex(777);
        tokio::spawn(async move { tx.write_all(&input).await });
        let mut frames = FrameReader::new(rx);
        let (mut got, mut fragmented, mut events) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            match frames.next().await.expect("frames") {
                Event::Data { channel: 0, range } => got.extend_from_slice(frames.bytes(range)),
                Event::Data { channel: 2, range } => fragmented.extend_from_slice(frames.bytes(range)),
                Event::End => break,
                other => {
                    let close = matches!(other, Event::Close(_));
                    events.push(other);
                    if close {
                        break;
                    }
                }
            }
        }
        assert!(got == big, "{} of {} bytes", got.len(), big.len());
        assert_eq!(fragmented, b"abc");
        assert_eq!(events, [Event::Ping(b"hi".to_vec()), Event::Close(1000_u16.to_be_bytes().to_vec())]);
    }
}

//! The client side of an exec or attach session, shared by `nodelet exec`, `nodelet attach` and
//! `nodelet cp`, on `/exec` or `/attach` of the local nodelet's main port, which proxies it to the container
//! runtime's streaming server. Two transports carry the Kubernetes remote command protocol:
//!
//! - **WebSocket**, for sessions without stdin: `v5.channel.k8s.io` when the server picks it, else
//!   `v4.channel.k8s.io` (containerd 1.6). Every binary message starts with its stream: 0 stdin, 1 stdout,
//!   2 stderr, 3 the final `Status` (exit code in `details.causes[reason=ExitCode]`), 4 terminal size
//!   (`{"Width":…,"Height":…}`), 255 close (v5: `[255, 0]` ends stdin).
//! - **SPDY/3.1** ([`super::spdy`]), for sessions with stdin, offering `v5.channel.k8s.io` then
//!   `v4.channel.k8s.io` in `X-Stream-Protocol-Version` (over SPDY the two are the same protocol, as in
//!   client-go). The client opens one stream per channel, each with a `streamtype` header, in kubectl's
//!   order: `error`, `stdin`, `stdout`, `stderr` (not with a terminal), `resize` (with one); data is raw
//!   bytes, the `error` stream carries the final `Status` as above, and the end of stdin is a DATA frame
//!   with FLAG_FIN on the stdin stream. Stdin is sent once the server has replied to every stream.
//!
//! Why SPDY for stdin: the end of the input must reach the command (`echo data | nodelet exec -i POD --
//! cat` has to end), and WebSocket `v4.channel.k8s.io`, all that containerd 1.6 speaks over WebSocket,
//! cannot say it. Which WebSocket protocol a server picks is known only from its `101`, and by then the
//! runtime has started the command: trying WebSocket first and falling back would run it twice. Every
//! CRI streaming server serves SPDY (it is what the API server speaks to the kubelet, also when it
//! translates kubectl's WebSocket v5), so sessions with stdin always use SPDY, which passes the end of
//! input on every runtime, in one upgrade, with no state kept between invocations; sessions without
//! stdin have no input to end and keep the WebSocket.
//!
//! SPDY flow control (SPDY/3.1, windows of 64 KiB per stream and per connection): the client answers
//! PINGs and keeps to the server's windows for stdin once the server shows it counts them (a
//! WINDOW_UPDATE or a SETTINGS with the initial window size): moby/spdystream, the SPDY of the kubelet and
//! of containerd's and CRI-O's streaming servers, does no flow control and never sends either, so counting
//! its windows from the start would stall stdin after 64 KiB. For the output, the client opens its
//! windows to [`RECEIVE_WINDOW`] (2^31-1 bytes) at the start (a SETTINGS with the initial window size and
//! a WINDOW_UPDATE of the connection, before any data) and sends a WINDOW_UPDATE for every half of that
//! consumed: a flow-controlling server never waits on it, and nothing is written while the server closes
//! (a frame that a closing peer leaves unread turns its close into a TCP reset, which drops the end of
//! the output: with containerd 1.6 behind nodelet's proxy, WINDOW_UPDATEs every 32 KiB lost the end of a
//! 1 MiB `cat`). Memory stays bounded by TCP's own backpressure: the output is read only as fast as it is
//! written out.
//!
//! For the interactive commands, stdin is the process's, stdout and stderr go to the process's, and with
//! `-t` the local terminal is put in raw mode (restored on exit) and its size is sent at the start and on
//! every SIGWINCH.

use std::io::Write as _;
use std::os::fd::AsFd as _;

use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::spdy::{self, Frame, HeaderDecoder, HeaderEncoder};
use super::stream::{MainPort, SpdyIo, StreamError, Ws, encode};
use crate::args::MainPortArgs;

const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

/// Size of the stdin chunks sent (one message each).
const CHUNK: usize = 32 * 1024;

/// Which endpoint a session talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/exec`: runs a new process.
    Exec,
    /// `/attach`: the container's main process.
    Attach,
}

/// What a session is opened on and with which streams.
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    /// Exec or attach.
    pub(crate) kind: Kind,
    /// Namespace of the pod.
    pub(crate) namespace: &'a str,
    /// The pod.
    pub(crate) pod: &'a str,
    /// The container.
    pub(crate) container: &'a str,
    /// The command (exec only).
    pub(crate) command: &'a [String],
    /// Pass stdin.
    pub(crate) stdin: bool,
    /// A terminal (stderr is then merged into stdout by the runtime).
    pub(crate) tty: bool,
}

/// An open session and its transport.
#[derive(Debug)]
pub(crate) struct Session {
    transport: Transport,
}

#[derive(Debug)]
enum Transport {
    /// A WebSocket (boxed: its buffers make it large), and whether `v5.channel.k8s.io` was chosen.
    WebSocket { ws: Box<Ws>, v5: bool },
    /// A SPDY/3.1 connection, and whether the session has a terminal.
    Spdy { io: SpdyIo, tty: bool },
}

impl Session {
    /// Opens the session on the target's endpoint: SPDY when stdin is passed, else a WebSocket (see the
    /// module docs).
    pub(crate) async fn open(main: &MainPort, target: &Target<'_>) -> Result<Self, StreamError> {
        let mut query: Vec<String> =
            target.command.iter().map(|c| format!("command={}", encode(c))).collect();
        query.push("stdout=1".into());
        if target.stdin {
            query.push("stdin=1".into());
        }
        if target.tty {
            query.push("tty=1".into());
        } else {
            query.push("stderr=1".into());
        }
        let endpoint = match target.kind {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
        };
        let path = format!(
            "/{endpoint}/{}/{}/{}?{}",
            encode(target.namespace),
            encode(target.pod),
            encode(target.container),
            query.join("&")
        );
        if target.stdin {
            let (io, protocol) = main.spdy(&path, &[V5, V4]).await?;
            if protocol != V5 && protocol != V4 {
                return Err(StreamError::Spdy(format!(
                    "the server chose stream protocol {protocol:?}; {V5} or {V4} is needed"
                )));
            }
            debug!(%protocol, endpoint, "SPDY session open");
            return Ok(Self { transport: Transport::Spdy { io, tty: target.tty } });
        }
        let (ws, protocol) = main.websocket(&path, &[V5, V4]).await?;
        debug!(%protocol, endpoint, "WebSocket session open");
        Ok(Self { transport: Transport::WebSocket { ws: Box::new(ws), v5: protocol == V5 } })
    }

    /// Relays `input` (chunks of stdin, ended by closing the channel) to the process and its output to
    /// `output` until the server closes; with `resize`, sends the local terminal's size at the start and on
    /// every SIGWINCH. Returns the final `Status`, if one came. Sending runs in a task of its own, so the
    /// output is read even while the server takes no input; when the server stops taking stdin (the
    /// process exited), the rest of the input is dropped and the output is still read to its end.
    pub(crate) async fn relay<O: Output>(
        self,
        input: Option<mpsc::Receiver<Vec<u8>>>,
        resize: bool,
        output: &mut O,
    ) -> Result<Option<serde_json::Value>, StreamError> {
        match self.transport {
            Transport::WebSocket { ws, v5 } => relay_websocket(*ws, v5, input, resize, output).await,
            Transport::Spdy { io, tty } => relay_spdy(io, tty, input, resize, output).await,
        }
    }
}

async fn relay_websocket<O: Output>(
    ws: Ws,
    v5: bool,
    input: Option<mpsc::Receiver<Vec<u8>>>,
    resize: bool,
    output: &mut O,
) -> Result<Option<serde_json::Value>, StreamError> {
    let (sink, mut stream) = ws.split();
    // Bare spawns in this file: the session's own input and frame pumps, per command, awaited or aborted by it.
    let sender = tokio::spawn(send_input(sink, input, window_changes(resize), resize, v5));
    let mut status: Option<serde_json::Value> = None;
    let result = loop {
        let data = match stream.next().await {
            None | Some(Ok(Message::Close(_))) => break Ok(()),
            Some(Ok(Message::Binary(d))) => d,
            Some(Ok(_)) => continue,
            Some(Err(e)) => break Err(StreamError::WebSocket(e.to_string())),
        };
        let Some((channel, payload)) = data.split_first() else { continue };
        match channel {
            1 | 2 => {
                if let Err(e) = output.write(*channel, payload).await {
                    break Err(e);
                }
            }
            3 if !payload.is_empty() => match serde_json::from_slice(payload) {
                Ok(s) => status = Some(s),
                Err(e) => break Err(StreamError::WebSocket(format!("bad status message: {e}"))),
            },
            _ => {}
        }
    };
    sender.abort();
    result.map(|()| status)
}

/// SIGWINCH, when the terminal's size is passed on.
fn window_changes(resize: bool) -> Option<tokio::signal::unix::Signal> {
    if resize {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    }
}

/// The sending half of a WebSocket session: the terminal size (at the start and on every SIGWINCH) and
/// the input, then (v5) the close of stdin; stops at the first failed send (the server no longer takes
/// input).
async fn send_input(
    mut sink: futures::stream::SplitSink<Ws, Message>,
    input: Option<mpsc::Receiver<Vec<u8>>>,
    mut winch: Option<tokio::signal::unix::Signal>,
    resize: bool,
    v5: bool,
) {
    if resize
        && let Some(frame) = resize_frame()
        && send(&mut sink, frame).await.is_err()
    {
        return;
    }
    let mut input_open = input.is_some();
    let mut input = input.unwrap_or_else(|| mpsc::channel(1).1);
    loop {
        let frame = tokio::select! {
            chunk = input.recv(), if input_open => match chunk {
                Some(chunk) => {
                    let mut frame = Vec::with_capacity(chunk.len() + 1);
                    frame.push(0);
                    frame.extend_from_slice(&chunk);
                    frame
                }
                None => {
                    input_open = false;
                    if !v5 {
                        continue;
                    }
                    vec![255, 0]
                }
            },
            Some(()) = next_window_change(&mut winch) => {
                match resize_frame() {
                    Some(frame) => frame,
                    None => continue,
                }
            }
            else => return,
        };
        if let Err(e) = send(&mut sink, frame).await {
            debug!(error = %e, "the server takes no more input");
            return;
        }
    }
}

/// The next SIGWINCH; never, without a signal stream.
async fn next_window_change(winch: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match winch.as_mut() {
        Some(w) => w.recv().await,
        None => std::future::pending().await,
    }
}

/// How long the server may take to accept (SYN_REPLY) the streams of a SPDY session, as client-go waits.
const STREAM_REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames queued for the SPDY writer task.
const OUTGOING_QUEUE: usize = 32;
/// Frames read ahead by the SPDY reader task.
const INCOMING_QUEUE: usize = 8;
/// The largest final `Status` taken from the error stream.
const MAX_STATUS: usize = 64 * 1024;
/// The receive window the client opens for every stream and for the connection (the largest SPDY allows).
const RECEIVE_WINDOW: u32 = 0x7fff_ffff;

/// The streams a SPDY session opens (client stream IDs are odd and increasing), in kubectl's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SpdyStreams {
    error: u32,
    stdin: u32,
    stdout: u32,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl SpdyStreams {
    /// error 1, stdin 3, stdout 5, then stderr 7 (no terminal) or resize 7 (a terminal).
    fn new(tty: bool) -> Self {
        Self { error: 1, stdin: 3, stdout: 5, stderr: (!tty).then_some(7), resize: tty.then_some(7) }
    }

    /// Each stream with its `streamtype`.
    fn all(&self) -> Vec<(u32, &'static str)> {
        let mut all = vec![(self.error, "error"), (self.stdin, "stdin"), (self.stdout, "stdout")];
        all.extend(self.stderr.map(|id| (id, "stderr")));
        all.extend(self.resize.map(|id| (id, "resize")));
        all
    }

    /// The streams the server sends on; the session ends when all of them have ended.
    fn incoming(&self) -> Vec<u32> {
        let mut ids = vec![self.error, self.stdout];
        ids.extend(self.stderr);
        ids
    }
}

/// What the sending task of a SPDY session may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SendGate {
    /// The server replied to every stream.
    ready: bool,
    /// The server no longer takes stdin (it closed or reset the stream, or the session ended).
    closed: bool,
    /// The server counts flow-control windows (it sent a WINDOW_UPDATE or an initial window size).
    counted: bool,
    /// Bytes the stdin stream's window has granted in all (the initial window and every update).
    stream_granted: i64,
    /// Bytes the connection's window has granted in all.
    connection_granted: i64,
}

impl SendGate {
    /// How many of `want` bytes may be sent now, given what was sent so far.
    fn allowance(&self, want: usize, stream_sent: i64, connection_sent: i64) -> usize {
        if !self.counted {
            return want;
        }
        let room = (self.stream_granted - stream_sent).min(self.connection_granted - connection_sent);
        usize::try_from(room.max(0)).unwrap_or(usize::MAX).min(want)
    }
}

/// Output bytes consumed and not yet acknowledged with a WINDOW_UPDATE, per stream (0: the connection).
#[derive(Debug, Default)]
struct Unacked(Vec<(u32, u32)>);

impl Unacked {
    /// Counts `n` bytes of `stream` (and of the connection) and queues a WINDOW_UPDATE for each that has
    /// reached half of [`RECEIVE_WINDOW`]; one that does not fit the queue now is sent with a later one.
    fn consumed(&mut self, stream: u32, n: usize, out: &mpsc::Sender<Frame>) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        for id in [stream, 0] {
            let entry = match self.0.iter_mut().find(|(s, _)| *s == id) {
                Some(entry) => entry,
                None => {
                    self.0.push((id, 0));
                    let last = self.0.len() - 1;
                    &mut self.0[last]
                }
            };
            entry.1 = entry.1.saturating_add(n);
            if entry.1 >= RECEIVE_WINDOW / 2
                && out.try_send(Frame::WindowUpdate { stream: id, delta: entry.1 }).is_ok()
            {
                entry.1 = 0;
            }
        }
    }
}

async fn relay_spdy<O: Output, S: AsyncRead + AsyncWrite + Send + 'static>(
    io: S,
    tty: bool,
    input: Option<mpsc::Receiver<Vec<u8>>>,
    resize: bool,
    output: &mut O,
) -> Result<Option<serde_json::Value>, StreamError> {
    let streams = SpdyStreams::new(tty);
    let (read_half, mut write_half) = tokio::io::split(io);
    let mut encoder = HeaderEncoder::new()?;
    let window = Frame::Settings { entries: vec![(0, spdy::SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)] };
    let mut opening = spdy::encode(&window, &mut encoder)?;
    for (stream, kind) in streams.all() {
        let headers = vec![("streamtype".to_owned(), kind.to_owned())];
        opening.extend(spdy::encode(&Frame::SynStream { stream, headers, fin: false }, &mut encoder)?);
    }
    let connection_window = Frame::WindowUpdate { stream: 0, delta: RECEIVE_WINDOW - spdy::INITIAL_WINDOW };
    opening.extend(spdy::encode(&connection_window, &mut encoder)?);
    let io_error = |source| StreamError::Io { what: "opening the SPDY streams".into(), source };
    write_half.write_all(&opening).await.map_err(io_error)?;
    write_half.flush().await.map_err(io_error)?;

    let (out_tx, out_rx) = mpsc::channel(OUTGOING_QUEUE);
    let writer = tokio::spawn(write_frames(write_half, encoder, out_rx));
    let (event_tx, mut events) = mpsc::channel(INCOMING_QUEUE);
    let reader = tokio::spawn(read_frames(read_half, event_tx));
    let initial = i64::from(spdy::INITIAL_WINDOW);
    let (gate, gate_rx) = tokio::sync::watch::channel(SendGate {
        ready: false,
        closed: false,
        counted: false,
        stream_granted: initial,
        connection_granted: initial,
    });
    let sender =
        tokio::spawn(send_spdy_input(out_tx.clone(), gate_rx, input, window_changes(resize), streams));

    let expected: Vec<u32> = streams.all().iter().map(|(id, _)| *id).collect();
    let mut replied: Vec<u32> = Vec::new();
    let mut ended: Vec<u32> = Vec::new();
    let mut unacked = Unacked::default();
    let mut initial_window = initial;
    let mut status: Vec<u8> = Vec::new();
    let reply_deadline = tokio::time::Instant::now() + STREAM_REPLY_TIMEOUT;
    let result = loop {
        if streams.incoming().iter().all(|id| ended.contains(id)) {
            break Ok(());
        }
        let waiting_for_replies = !gate.borrow().ready;
        let event = tokio::select! {
            event = events.recv() => event,
            () = tokio::time::sleep_until(reply_deadline), if waiting_for_replies => {
                break Err(StreamError::Spdy(format!(
                    "the server did not accept the streams within {STREAM_REPLY_TIMEOUT:?}"
                )));
            }
        };
        let frame = match event {
            None | Some(Ok(None)) => break Ok(()),
            Some(Err(e)) => break Err(e.into()),
            Some(Ok(Some(frame))) => frame,
        };
        let end = |stream: u32, ended: &mut Vec<u32>| {
            if stream == streams.stdin {
                gate.send_modify(|g| g.closed = true);
            }
            if !ended.contains(&stream) {
                ended.push(stream);
            }
        };
        match frame {
            Frame::SynReply { stream, fin, .. } => {
                if expected.contains(&stream) && !replied.contains(&stream) {
                    replied.push(stream);
                    if replied.len() == expected.len() {
                        gate.send_modify(|g| g.ready = true);
                    }
                }
                if fin {
                    end(stream, &mut ended);
                }
            }
            Frame::Data { stream, fin, data } => {
                if !data.is_empty() {
                    if stream == streams.stdout {
                        if let Err(e) = output.write(1, &data).await {
                            break Err(e);
                        }
                    } else if Some(stream) == streams.stderr {
                        if let Err(e) = output.write(2, &data).await {
                            break Err(e);
                        }
                    } else if stream == streams.error {
                        if status.len() + data.len() > MAX_STATUS {
                            break Err(StreamError::Spdy(format!(
                                "the final status is longer than {MAX_STATUS} bytes"
                            )));
                        }
                        status.extend_from_slice(&data);
                    }
                    unacked.consumed(stream, data.len(), &out_tx);
                }
                if fin {
                    end(stream, &mut ended);
                }
            }
            Frame::Headers { stream, fin, .. } => {
                if fin {
                    end(stream, &mut ended);
                }
            }
            Frame::RstStream { stream, status } => {
                debug!(stream, status, "the server reset a stream");
                end(stream, &mut ended);
            }
            Frame::Ping { id } => {
                // The server's pings have even IDs; odd ones would answer the client's (it sends none).
                if id % 2 == 0 && out_tx.try_send(Frame::Ping { id }).is_err() {
                    debug!(id, "PING not answered: the outgoing queue is full");
                }
            }
            Frame::WindowUpdate { stream, delta } => {
                let delta = i64::from(delta);
                gate.send_modify(|g| {
                    g.counted = true;
                    if stream == 0 {
                        g.connection_granted += delta;
                    } else if stream == streams.stdin {
                        g.stream_granted += delta;
                    }
                });
            }
            Frame::Settings { entries } => {
                for (_, id, value) in entries {
                    if id == spdy::SETTINGS_INITIAL_WINDOW_SIZE {
                        let value = i64::from(value);
                        let change = value - initial_window;
                        initial_window = value;
                        gate.send_modify(|g| {
                            g.counted = true;
                            g.stream_granted += change;
                        });
                    }
                }
            }
            Frame::GoAway { last_good, status } => debug!(last_good, status, "the server sent GOAWAY"),
            Frame::SynStream { stream, .. } => {
                debug!(stream, "refusing a stream the server opened");
                let _ = out_tx.try_send(Frame::RstStream { stream, status: spdy::REFUSED_STREAM });
            }
            Frame::Unknown { kind } => debug!(kind, "ignoring a SPDY control frame of an unknown type"),
        }
    };
    gate.send_modify(|g| g.closed = true);
    sender.abort();
    reader.abort();
    writer.abort();
    result?;
    if status.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&status)
        .map(Some)
        .map_err(|e| StreamError::Spdy(format!("bad status on the error stream: {e}")))
}

/// Writes the frames queued by the session (in order: header blocks share one compression context).
async fn write_frames<S: AsyncWrite>(
    mut io: tokio::io::WriteHalf<S>,
    mut encoder: HeaderEncoder,
    mut frames: mpsc::Receiver<Frame>,
) {
    while let Some(frame) = frames.recv().await {
        let bytes = match spdy::encode(&frame, &mut encoder) {
            Ok(bytes) => bytes,
            Err(error) => {
                debug!(%error, "cannot encode a SPDY frame");
                return;
            }
        };
        if let Err(error) = io.write_all(&bytes).await {
            debug!(%error, "the SPDY connection takes no more frames");
            return;
        }
        if frames.is_empty()
            && let Err(error) = io.flush().await
        {
            debug!(%error, "the SPDY connection takes no more frames");
            return;
        }
    }
}

/// Reads frames for the session until the connection ends or fails (the last event says which).
async fn read_frames<S: AsyncRead>(
    mut io: tokio::io::ReadHalf<S>,
    events: mpsc::Sender<Result<Option<Frame>, spdy::SpdyError>>,
) {
    let mut decoder = HeaderDecoder::default();
    loop {
        let next = spdy::read_frame(&mut io, &mut decoder).await;
        let last = !matches!(next, Ok(Some(_)));
        if events.send(next).await.is_err() || last {
            return;
        }
    }
}

/// The sending half of a SPDY session: once the server accepted the streams, the terminal size (at the
/// start and on every SIGWINCH) on the resize stream and the input on the stdin stream within the
/// server's windows (when it counts them), then FLAG_FIN on the stdin stream; stops when the server no
/// longer takes stdin or the connection takes no more frames.
async fn send_spdy_input(
    out: mpsc::Sender<Frame>,
    mut gate: tokio::sync::watch::Receiver<SendGate>,
    input: Option<mpsc::Receiver<Vec<u8>>>,
    mut winch: Option<tokio::signal::unix::Signal>,
    streams: SpdyStreams,
) {
    match gate.wait_for(|g| g.ready || g.closed).await.map(|g| *g) {
        Ok(g) if !g.closed => {}
        _ => return,
    }
    let resize = |out: &mpsc::Sender<Frame>| {
        let frame = streams.resize.zip(terminal_size_json()).map(|(stream, data)| Frame::Data {
            stream,
            fin: false,
            data,
        });
        let out = out.clone();
        async move {
            match frame {
                Some(frame) => out.send(frame).await.is_ok(),
                None => true,
            }
        }
    };
    if !resize(&out).await {
        return;
    }
    let (mut stream_sent, mut connection_sent) = (0_i64, 0_i64);
    let mut input_open = input.is_some();
    let mut input = input.unwrap_or_else(|| mpsc::channel(1).1);
    if !input_open && out.send(Frame::Data { stream: streams.stdin, fin: true, data: vec![] }).await.is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            chunk = input.recv(), if input_open => match chunk {
                Some(chunk) => {
                    let mut rest = &chunk[..];
                    while !rest.is_empty() {
                        let wait = gate
                            .wait_for(|g| g.closed || g.allowance(rest.len(), stream_sent, connection_sent) > 0)
                            .await
                            .map(|g| *g);
                        let g = match wait {
                            Ok(g) if !g.closed => g,
                            _ => {
                                debug!("the server takes no more input");
                                return;
                            }
                        };
                        let n = g.allowance(rest.len(), stream_sent, connection_sent);
                        let data = rest[..n].to_vec();
                        if out.send(Frame::Data { stream: streams.stdin, fin: false, data }).await.is_err() {
                            return;
                        }
                        let sent = i64::try_from(n).unwrap_or(i64::MAX);
                        stream_sent += sent;
                        connection_sent += sent;
                        rest = &rest[n..];
                    }
                }
                None => {
                    input_open = false;
                    if gate.borrow().closed
                        || out.send(Frame::Data { stream: streams.stdin, fin: true, data: vec![] }).await.is_err()
                    {
                        return;
                    }
                }
            },
            Some(()) = next_window_change(&mut winch) => {
                if !resize(&out).await {
                    return;
                }
            }
            else => return,
        }
    }
}

/// Where a session's output goes.
pub(crate) trait Output: Send {
    /// Takes `data` of stream 1 (stdout) or 2 (stderr).
    fn write(&mut self, stream: u8, data: &[u8]) -> impl Future<Output = Result<(), StreamError>> + Send;
}

/// The process's own stdout and stderr.
#[derive(Debug, Default)]
pub(crate) struct StdOutput;

impl Output for StdOutput {
    async fn write(&mut self, stream: u8, data: &[u8]) -> Result<(), StreamError> {
        let io_error = |what: &str, source| StreamError::Io { what: what.to_owned(), source };
        if stream == 2 {
            let mut err = std::io::stderr().lock();
            err.write_all(data).and_then(|()| err.flush()).map_err(|e| io_error("writing stderr", e))
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(data).and_then(|()| out.flush()).map_err(|e| io_error("writing stdout", e))
        }
    }
}

/// The process's stdin in chunks; the channel closes at its end. The reading task ends with the process
/// (a blocking read of stdin cannot be cancelled).
pub(crate) fn stdin_chunks() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0_u8; CHUNK];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// `nodelet exec` and `nodelet attach`: the session on the process's stdio (raw terminal with `tty` when
/// stdin is one); returns the exit code.
pub(crate) async fn interactive(main: &MainPort, target: &Target<'_>) -> Result<i32, StreamError> {
    let session = Session::open(main, target).await?;
    let _raw = if target.tty { RawTerminal::enter() } else { None };
    if target.kind == Kind::Attach && target.stdin && target.tty {
        eprint!("If you don't see a command prompt, try pressing enter.\r\n");
    }
    let input = target.stdin.then(stdin_chunks);
    let status = session.relay(input, target.tty, &mut StdOutput).await?;
    exit_code(status.as_ref())
}

/// The container to use: `container` when given, else the pod's `kubectl.kubernetes.io/default-container`,
/// else its first container (said on stderr when the pod has several).
pub(crate) async fn container_or_default(
    server: &MainPortArgs,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
) -> Result<String, StreamError> {
    if let Some(c) = container {
        return Ok(c.to_owned());
    }
    let get = server.get_pods(namespace, vec![pod.to_owned()]);
    let pods: Vec<Pod> = super::get::fetch_pods(&get).await?;
    let found = pods.into_iter().find(|p| {
        p.metadata.name.as_deref() == Some(pod)
            && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
    });
    let Some(found) = found else {
        return Err(StreamError::Usage(format!("pods {pod:?} not found in namespace {namespace:?}")));
    };
    let names: Vec<String> = found
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let annotated = found
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
        .filter(|c| names.contains(c))
        .cloned();
    let chosen = annotated
        .or_else(|| names.first().cloned())
        .ok_or_else(|| StreamError::Usage(format!("pod {pod:?} has no containers")))?;
    if names.len() > 1 {
        eprintln!("Defaulted container {chosen:?} out of: {}", names.join(", "));
    }
    Ok(chosen)
}

async fn send(sink: &mut futures::stream::SplitSink<Ws, Message>, frame: Vec<u8>) -> Result<(), StreamError> {
    sink.send(Message::binary(frame)).await.map_err(|e| StreamError::WebSocket(e.to_string()))
}

/// The exit code a final `Status` means: 0 for Success (or none), the `ExitCode` cause of a
/// `NonZeroExitCode`, else an error with the status' message.
pub(crate) fn exit_code(status: Option<&serde_json::Value>) -> Result<i32, StreamError> {
    let Some(status) = status else { return Ok(0) };
    if status["status"] == "Success" {
        return Ok(0);
    }
    let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
    if let Some(code) = causes.iter().find(|c| c["reason"] == "ExitCode").and_then(|c| c["message"].as_str())
    {
        return code.parse().map_err(|_| StreamError::WebSocket(format!("bad exit code {code:?}")));
    }
    Err(StreamError::WebSocket(status["message"].as_str().unwrap_or("the command failed").to_owned()))
}

/// A WebSocket resize message (stream 4) with the local terminal's size.
fn resize_frame() -> Option<Vec<u8>> {
    let json = terminal_size_json()?;
    let mut frame = vec![4_u8];
    frame.extend_from_slice(&json);
    Some(frame)
}

/// The local terminal's size (stdout's, else stdin's) as `{"Width":…,"Height":…}`.
fn terminal_size_json() -> Option<Vec<u8>> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout().as_fd())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin().as_fd()))
        .ok()?;
    Some(serde_json::json!({"Width": size.ws_col, "Height": size.ws_row}).to_string().into_bytes())
}

/// Stdin in raw mode while it lives (only when stdin is a terminal).
struct RawTerminal(rustix::termios::Termios);

impl RawTerminal {
    fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(Self(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use spdy::read_frame;

    /// Output kept in memory.
    #[derive(Debug, Default)]
    struct Kept {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    }

    impl Output for Kept {
        async fn write(&mut self, stream: u8, data: &[u8]) -> Result<(), StreamError> {
            if stream == 2 { &mut self.stderr } else { &mut self.stdout }.extend_from_slice(data);
            Ok(())
        }
    }

    /// A remotecommand server's side of a SPDY connection, for the tests.
    struct FakeServer {
        io: tokio::io::DuplexStream,
        enc: HeaderEncoder,
        dec: HeaderDecoder,
    }

    impl FakeServer {
        async fn send(&mut self, frame: Frame) {
            let bytes = spdy::encode(&frame, &mut self.enc).expect("encode");
            self.io.write_all(&bytes).await.expect("write");
        }

        async fn next(&mut self) -> Frame {
            read_frame(&mut self.io, &mut self.dec).await.expect("a frame").expect("not the end")
        }

        /// Reads the opening frames (`count` SYN_STREAMs and the windows: checked here), sends `first` (if
        /// any), and replies to each stream; returns (ID, streamtype) of each.
        async fn accept(&mut self, count: usize, first: Option<Frame>) -> Vec<(u32, String)> {
            let mut opened = Vec::new();
            let mut others = Vec::new();
            while opened.len() < count || others.len() < 2 {
                match self.next().await {
                    Frame::SynStream { stream, headers, fin: false } => {
                        assert_eq!(headers.len(), 1);
                        assert_eq!(headers[0].0, "streamtype");
                        opened.push((stream, headers[0].1.clone()));
                    }
                    other => others.push(other),
                }
            }
            assert_eq!(
                others,
                [
                    Frame::Settings { entries: vec![(0, spdy::SETTINGS_INITIAL_WINDOW_SIZE, 0x7fff_ffff)] },
                    Frame::WindowUpdate { stream: 0, delta: 0x7fff_ffff - 65_536 }
                ],
                "the client opens its receive windows first"
            );
            if let Some(frame) = first {
                self.send(frame).await;
            }
            for (stream, _) in &opened {
                self.send(Frame::SynReply { stream: *stream, headers: vec![], fin: false }).await;
            }
            opened
        }

        /// The stdin stream's data up to its FIN, with the data frames' sizes; other frames are kept.
        async fn stdin(&mut self, grant: bool) -> (Vec<u8>, Vec<usize>, Vec<Frame>) {
            let (mut data, mut sizes, mut others) = (Vec::new(), Vec::new(), Vec::new());
            loop {
                match self.next().await {
                    Frame::Data { stream: 3, fin, data: d } => {
                        if !d.is_empty() {
                            sizes.push(d.len());
                            if grant {
                                let delta = d.len() as u32;
                                self.send(Frame::WindowUpdate { stream: 3, delta }).await;
                                self.send(Frame::WindowUpdate { stream: 0, delta }).await;
                            }
                        }
                        data.extend_from_slice(&d);
                        if fin {
                            return (data, sizes, others);
                        }
                    }
                    other => others.push(other),
                }
            }
        }

        /// The final status on the error stream and the FIN of every output stream.
        async fn finish(&mut self, status: serde_json::Value) {
            self.send(Frame::Data { stream: 1, fin: true, data: status.to_string().into_bytes() }).await;
            self.send(Frame::Data { stream: 5, fin: true, data: vec![] }).await;
            self.send(Frame::Data { stream: 7, fin: true, data: vec![] }).await;
        }
    }

    fn fake() -> (tokio::io::DuplexStream, FakeServer) {
        let (client, io) = tokio::io::duplex(64 * 1024);
        (
            client,
            FakeServer { io, enc: HeaderEncoder::new().expect("encoder"), dec: HeaderDecoder::default() },
        )
    }

    fn chunks(parts: &[&[u8]]) -> mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = mpsc::channel(parts.len().max(1));
        for part in parts {
            tx.try_send(part.to_vec()).expect("room");
        }
        rx
    }

    #[tokio::test]
    async fn spdy_sessions_pass_stdin_and_its_end_within_the_servers_windows() {
        let (client, mut server) = fake();
        let served = tokio::spawn(async move {
            // a server that counts windows: 10 bytes for each stream
            let settings = Frame::Settings { entries: vec![(0, spdy::SETTINGS_INITIAL_WINDOW_SIZE, 10)] };
            let opened = server.accept(4, Some(settings)).await;
            let (input, sizes, _) = server.stdin(true).await;
            server.send(Frame::Ping { id: 2 }).await;
            let mut echoed = b"echo:".to_vec();
            echoed.extend_from_slice(&input);
            server.send(Frame::Data { stream: 5, fin: false, data: echoed }).await;
            server.send(Frame::Data { stream: 7, fin: false, data: b"err".to_vec() }).await;
            // the PING is answered
            loop {
                match server.next().await {
                    Frame::Ping { id: 2 } => break,
                    Frame::WindowUpdate { .. } => {}
                    other => panic!("expected the PING back, got {other:?}"),
                }
            }
            server
                .finish(json!({"status": "Failure", "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}))
                .await;
            (opened, sizes)
        });
        let mut out = Kept::default();
        let input = chunks(&[b"hello ", b"world, ", b"this is stdin"]);
        let status = relay_spdy(client, false, Some(input), false, &mut out).await.expect("relay");
        let (opened, sizes) = served.await.expect("server");
        let kinds: Vec<(u32, &str)> = opened.iter().map(|(id, k)| (*id, k.as_str())).collect();
        assert_eq!(kinds, [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")]);
        assert!(sizes.iter().all(|&n| n <= 10), "every stdin frame within the window: {sizes:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "echo:hello world, this is stdin");
        assert_eq!(out.stderr, b"err");
        assert_eq!(exit_code(status.as_ref()).ok(), Some(3));
    }

    #[tokio::test]
    async fn spdy_sessions_with_a_server_without_flow_control_pass_more_than_a_window() {
        let (client, mut server) = fake();
        let input: Vec<u8> = (0..200_000_u32).map(|i| (i % 251) as u8).collect();
        let sent = input.clone();
        let served = tokio::spawn(async move {
            let opened = server.accept(4, None).await;
            let (received, _, _) = server.stdin(false).await;
            // more output than SPDY's initial window (the client opened its windows)
            for _ in 0..4 {
                server.send(Frame::Data { stream: 5, fin: false, data: vec![b'x'; 25_000] }).await;
            }
            server.finish(json!({"status": "Success"})).await;
            (opened.len(), received)
        });
        let mut out = Kept::default();
        let (tx, rx) = mpsc::channel(4);
        let feeding = tokio::spawn(async move {
            for chunk in input.chunks(CHUNK) {
                tx.send(chunk.to_vec()).await.expect("the session takes input");
            }
        });
        let status = tokio::time::timeout(
            Duration::from_secs(20),
            relay_spdy(client, false, Some(rx), false, &mut out),
        )
        .await
        .expect("no stall")
        .expect("relay");
        feeding.await.expect("fed");
        let (streams, received) = served.await.expect("server");
        assert_eq!(streams, 4);
        assert!(received == sent, "stdin arrived intact ({} of {} bytes)", received.len(), sent.len());
        assert_eq!(out.stdout.len(), 100_000);
        assert_eq!(exit_code(status.as_ref()).ok(), Some(0));
    }

    #[tokio::test]
    async fn consumed_output_is_acknowledged_every_half_window() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut unacked = Unacked::default();
        unacked.consumed(5, 1 << 29, &tx);
        assert!(rx.try_recv().is_err(), "a quarter of the window: nothing yet");
        unacked.consumed(5, 1 << 29, &tx);
        unacked.consumed(7, 1, &tx);
        assert_eq!(rx.try_recv().ok(), Some(Frame::WindowUpdate { stream: 5, delta: 1 << 30 }));
        assert_eq!(rx.try_recv().ok(), Some(Frame::WindowUpdate { stream: 0, delta: 1 << 30 }));
        assert!(rx.try_recv().is_err(), "stream 7 and the rest of the connection: not yet");
        // a full queue: the update is kept and sent with a later one
        let (tx, mut rx) = mpsc::channel(1);
        tx.try_send(Frame::Ping { id: 2 }).expect("room");
        unacked.consumed(9, 1 << 30, &tx);
        assert_eq!(rx.try_recv().ok(), Some(Frame::Ping { id: 2 }));
        unacked.consumed(9, 3, &tx);
        assert_eq!(rx.try_recv().ok(), Some(Frame::WindowUpdate { stream: 9, delta: (1 << 30) + 3 }));
    }

    #[tokio::test]
    async fn spdy_sessions_with_a_terminal_open_a_resize_stream_and_end_on_a_malformed_frame() {
        let (client, mut server) = fake();
        let served = tokio::spawn(async move {
            let opened = server.accept(4, None).await;
            // a DATA frame announcing more than the limit
            let head = [0_u8, 0, 0, 5, 0, 0x20, 0, 0];
            server.io.write_all(&head).await.expect("write");
            opened
        });
        let mut out = Kept::default();
        let result = relay_spdy(client, true, Some(chunks(&[])), false, &mut out).await;
        let opened = served.await.expect("server");
        let kinds: Vec<&str> = opened.iter().map(|(_, k)| k.as_str()).collect();
        assert_eq!(kinds, ["error", "stdin", "stdout", "resize"]);
        assert!(
            matches!(result, Err(StreamError::SpdyFrame(spdy::SpdyError::TooLarge { .. }))),
            "{result:?}"
        );
    }

    #[test]
    fn exit_codes_come_from_the_status() {
        assert_eq!(exit_code(None).ok(), Some(0));
        assert_eq!(exit_code(Some(&json!({"status": "Success"}))).ok(), Some(0));
        let failed = json!({"status": "Failure", "reason": "NonZeroExitCode", "message": "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}});
        assert_eq!(exit_code(Some(&failed)).ok(), Some(3));
        let other = json!({"status": "Failure", "message": "exec failed: no such file"});
        assert!(
            matches!(exit_code(Some(&other)), Err(StreamError::WebSocket(m)) if m.contains("no such file"))
        );
    }
}

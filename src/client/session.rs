//! The client side of an exec or attach session, shared by `nodelet exec`, `nodelet attach` and
//! `nodelet cp`: a WebSocket to `/exec` or `/attach` on the local nodelet's main port with the Kubernetes
//! channel protocol, `v5.channel.k8s.io` when the server picks it (then the end of stdin is passed on with
//! a close message), else `v4.channel.k8s.io` (containerd 1.6, which has no way to pass the end of stdin
//! on). Every binary message starts with its stream: 0 stdin, 1 stdout, 2 stderr, 3 the final `Status`
//! (exit code in `details.causes[reason=ExitCode]`), 4 terminal size (`{"Width":…,"Height":…}`), 255
//! close (v5).
//!
//! For the interactive commands, stdin is the process's, stdout and stderr go to the process's, and with
//! `-t` the local terminal is put in raw mode (restored on exit) and its size is sent at the start and on
//! every SIGWINCH.

use std::io::Write as _;
use std::os::fd::AsFd as _;

use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::stream::{MainPort, StreamError, Ws, encode};
use crate::cli::MainPortArgs;

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

/// An open session: the WebSocket and whether v5 was chosen.
#[derive(Debug)]
pub(crate) struct Session {
    ws: Ws,
    v5: bool,
}

impl Session {
    /// Opens the WebSocket to the target's endpoint.
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
        let (ws, protocol) = main.websocket(&path, &[V5, V4]).await?;
        debug!(%protocol, endpoint, "session open");
        Ok(Self { ws, v5: protocol == V5 })
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
        let (sink, mut stream) = self.ws.split();
        let winch = if resize {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
        } else {
            None
        };
        let sender = tokio::spawn(send_input(sink, input, winch, resize, self.v5));
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
}

/// The sending half of a session: the terminal size (at the start and on every SIGWINCH) and the input,
/// then (v5) the close of stdin; stops at the first failed send (the server no longer takes input).
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
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
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

/// A resize message with the local terminal's size (stdout's, else stdin's).
fn resize_frame() -> Option<Vec<u8>> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout().as_fd())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin().as_fd()))
        .ok()?;
    let json = serde_json::json!({"Width": size.ws_col, "Height": size.ws_row});
    let mut frame = vec![4_u8];
    frame.extend_from_slice(json.to_string().as_bytes());
    Some(frame)
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

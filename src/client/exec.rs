//! `nodelet exec`: runs a command in a container through `/exec` on the local nodelet's main port, over a
//! WebSocket with the Kubernetes channel protocol: `v5.channel.k8s.io` when the server picks it (then the
//! end of stdin is passed on with a close message), else `v4.channel.k8s.io` (containerd 1.6). Every
//! binary message starts with its stream: 0 stdin, 1 stdout, 2 stderr, 3 the final `Status` (exit code in
//! `details.causes[reason=ExitCode]`), 4 terminal size (`{"Width":…,"Height":…}`), 255 close (v5).
//!
//! With `-t`, the local terminal is put in raw mode (restored on exit) and its size is sent at the start
//! and on every SIGWINCH. The command's exit code is returned for the process to exit with.

use std::io::Write as _;
use std::os::fd::AsFd as _;

use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tracing::debug;

use super::stream::{MainPort, StreamError, encode};
use crate::cli::{ExecArgs, GetArgs, LogArgs, MainPortArgs};

const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

/// Runs `nodelet exec`; returns the command's exit code.
pub(crate) async fn run(args: &ExecArgs) -> Result<i32, StreamError> {
    let main = MainPort::new(&args.server)?;
    let container = match &args.container {
        Some(c) => c.clone(),
        None => default_container(&args.server, &args.namespace, &args.pod).await?,
    };
    let mut query: Vec<String> = args.command.iter().map(|c| format!("command={}", encode(c))).collect();
    query.push("stdout=1".into());
    if args.stdin {
        query.push("stdin=1".into());
    }
    if args.tty {
        query.push("tty=1".into());
    } else {
        query.push("stderr=1".into());
    }
    let path = format!(
        "/exec/{}/{}/{}?{}",
        encode(&args.namespace),
        encode(&args.pod),
        encode(&container),
        query.join("&")
    );
    let (ws, protocol) = main.websocket(&path, &[V5, V4]).await?;
    debug!(%protocol, "exec session open");
    let _raw = if args.tty { RawTerminal::enter() } else { None };
    session(ws, protocol == V5, args.stdin, args.tty).await
}

/// The pod's `kubectl.kubernetes.io/default-container`, else its first container.
async fn default_container(server: &MainPortArgs, namespace: &str, pod: &str) -> Result<String, StreamError> {
    let get = GetArgs {
        resource: "pods".into(),
        names: vec![pod.to_owned()],
        output: None,
        namespace: namespace.to_owned(),
        all_namespaces: false,
        server: Some(server.server.clone()),
        token: server.token.clone(),
        token_file: server.token_file.clone(),
        certificate_authority: server.certificate_authority.clone(),
        insecure_skip_tls_verify: server.insecure_skip_tls_verify,
        request_timeout: crate::config::GoDuration(std::time::Duration::from_secs(10)),
        log: LogArgs::default(),
    };
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

/// Relays stdin, stdout, stderr and terminal sizes until the server closes; returns the exit code.
async fn session(ws: super::stream::Ws, v5: bool, stdin: bool, tty: bool) -> Result<i32, StreamError> {
    let (mut sink, mut stream) = ws.split();
    let (input_tx, mut input_rx) = mpsc::channel::<Vec<u8>>(16);
    if stdin {
        // Ends with the process (a blocking read of stdin cannot be cancelled).
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0_u8; 32 * 1024];
            loop {
                let n = stdin.read(&mut buf[1..]).await.unwrap_or(0);
                let frame = if n == 0 { Vec::new() } else { [&[0_u8][..], &buf[1..=n]].concat() };
                if input_tx.send(frame).await.is_err() || n == 0 {
                    return;
                }
            }
        });
    } else {
        drop(input_tx);
    }
    let mut winch = if tty {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };
    if tty && let Some(frame) = resize_frame() {
        send(&mut sink, frame).await?;
    }
    let mut input_open = stdin;
    let mut status: Option<serde_json::Value> = None;
    let io_error = |what: &str, source| StreamError::Io { what: what.to_owned(), source };
    loop {
        tokio::select! {
            message = stream.next() => {
                let data = match message {
                    None | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(Message::Binary(d))) => d,
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(StreamError::WebSocket(e.to_string())),
                };
                let Some((channel, payload)) = data.split_first() else { continue };
                match channel {
                    1 => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(payload).and_then(|()| out.flush()).map_err(|e| io_error("writing stdout", e))?;
                    }
                    2 => {
                        let mut err = std::io::stderr().lock();
                        err.write_all(payload).and_then(|()| err.flush()).map_err(|e| io_error("writing stderr", e))?;
                    }
                    3 if !payload.is_empty() => {
                        status = Some(serde_json::from_slice(payload).map_err(|e| {
                            StreamError::WebSocket(format!("bad status message: {e}"))
                        })?);
                    }
                    _ => {}
                }
            }
            frame = input_rx.recv(), if input_open => match frame {
                Some(frame) if !frame.is_empty() => send(&mut sink, frame).await?,
                _ => {
                    input_open = false;
                    if v5 {
                        send(&mut sink, vec![255, 0]).await?;
                    }
                }
            },
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                if let Some(frame) = resize_frame() {
                    send(&mut sink, frame).await?;
                }
            }
        }
    }
    let _ = sink.close().await;
    exit_code(status.as_ref())
}

async fn send(
    sink: &mut futures::stream::SplitSink<super::stream::Ws, Message>,
    frame: Vec<u8>,
) -> Result<(), StreamError> {
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

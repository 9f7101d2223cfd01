//! `nodelet port-forward`: listens on local ports and forwards each accepted connection to a port of the pod
//! through `/portForward` on the local nodelet's main port, one WebSocket per connection
//! (`v4.channel.k8s.io`, the port in the `port` query parameter). Stream 0 carries the data and stream 1
//! the error text; each stream's first two bytes are the port number (little endian), which the server
//! sends and this side drops. Each read from the local connection (up to 256 KiB) is one frame.
//!
//! A connection ends when the pod side closes (the WebSocket closes) or the local client goes away. The
//! protocol cannot pass on a half-close, so the end of the local client's data is not seen by the pod.

use std::net::SocketAddr;

use bytes::{BufMut as _, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, warn};

use super::stream::{MainPort, StreamError, encode};
use crate::args::PortForwardArgs;

/// The most read from the local connection into one WebSocket frame.
const LOCAL_READ: usize = 256 * 1024;

/// `LOCAL:REMOTE`, `:REMOTE` (local 0) or `REMOTE` (the same local port).
pub(crate) fn parse_port_spec(spec: &str) -> Result<(u16, u16), StreamError> {
    let bad = || {
        StreamError::Usage(format!(
            "invalid port {spec:?}: use [LOCAL:]REMOTE, ports 1-65535 (LOCAL 0 or empty: any)"
        ))
    };
    let (local, remote) = match spec.split_once(':') {
        Some((l, r)) => (if l.is_empty() { Some(0) } else { l.parse().ok() }, r.parse::<u16>().ok()),
        None => (spec.parse().ok(), spec.parse().ok()),
    };
    match (local, remote) {
        (Some(l), Some(r)) if r > 0 => Ok((l, r)),
        _ => Err(bad()),
    }
}

/// Runs `nodelet port-forward` until interrupted.
pub(crate) async fn run(args: &PortForwardArgs) -> Result<(), StreamError> {
    let main = MainPort::new(&args.server)?;
    let specs = args.ports.iter().map(|s| parse_port_spec(s)).collect::<Result<Vec<_>, _>>()?;
    let path = format!("/portForward/{}/{}", encode(&args.namespace), encode(&args.pod));
    let mut listeners = Vec::new();
    for (local, remote) in specs {
        let addr = SocketAddr::new(args.address, local);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StreamError::Io { what: format!("cannot listen on {addr}"), source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| StreamError::Io { what: format!("cannot listen on {addr}"), source })?;
        println!("Forwarding from {bound} -> {remote}");
        listeners.push((listener, remote));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (listener, remote) in listeners {
        let (main, path) = (main.clone(), path.clone());
        tasks.spawn(async move {
            loop {
                let (conn, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                println!("Handling connection for {remote}");
                let (main, path) = (main.clone(), path.clone());
                // Bare spawn: per forwarded connection, owned by this command.
                tokio::spawn(async move {
                    if let Err(e) = forward(&main, &path, remote, conn).await {
                        eprintln!("error forwarding port {remote} for {peer}: {e}");
                    }
                });
            }
        });
    }
    tokio::select! {
        _ = tasks.join_next() => Ok(()),
        r = tokio::signal::ctrl_c() => r.map_err(|source| StreamError::Io { what: "waiting for Ctrl-C".into(), source }),
    }
}

/// Forwards one local connection through one WebSocket.
async fn forward(main: &MainPort, path: &str, remote: u16, conn: TcpStream) -> Result<(), StreamError> {
    let (ws, _) = main.websocket(&format!("{path}?port={remote}"), &["v4.channel.k8s.io"]).await?;
    let (mut sink, mut stream) = ws.split();
    let (mut local_read, mut local_write) = conn.into_split();
    // The port prefix still to drop on stream 0 and 1.
    let mut prefix = [2_usize, 2];
    let mut error_text = Vec::new();
    // Each read from the local connection becomes one frame: the channel byte, then the data, read straight
    // into the frame's buffer (frozen and handed to the WebSocket without a copy).
    let mut buf = BytesMut::new();
    let mut local_open = true;
    let io = |what: &str, source| StreamError::Io { what: what.to_owned(), source };
    loop {
        tokio::select! {
            message = stream.next() => {
                let data = match message {
                    None | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(Message::Binary(d))) => d,
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(StreamError::WebSocket(e.to_string())),
                };
                let Some((&channel, mut payload)) = data.split_first() else { continue };
                let Some(skip) = prefix.get_mut(usize::from(channel)) else { continue };
                let n = (*skip).min(payload.len());
                payload = &payload[n..];
                *skip -= n;
                if channel == 0 {
                    local_write.write_all(payload).await.map_err(|e| io("writing to the local connection", e))?;
                } else {
                    error_text.extend_from_slice(payload);
                }
            }
            read = read_frame(&mut local_read, &mut buf), if local_open => {
                let n = read.map_err(|e| io("reading the local connection", e))?;
                if n == 0 {
                    local_open = false;
                    continue;
                }
                sink.send(Message::binary(buf.split().freeze())).await.map_err(|e| StreamError::WebSocket(e.to_string()))?;
            }
        }
        if !error_text.is_empty() {
            break;
        }
    }
    let _ = sink.close().await;
    let _ = local_write.shutdown().await;
    if error_text.is_empty() {
        debug!(remote, "connection closed");
        Ok(())
    } else {
        Err(StreamError::WebSocket(String::from_utf8_lossy(&error_text).into_owned()))
    }
}

/// Reads up to [`LOCAL_READ`] bytes into `buf` behind the data channel's byte (0); the bytes read.
async fn read_frame(from: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> std::io::Result<usize> {
    if buf.is_empty() {
        buf.reserve(1 + LOCAL_READ);
        buf.put_u8(0);
    }
    let mut limited = from.take(LOCAL_READ as u64);
    limited.read_buf(buf).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs() {
        assert_eq!(parse_port_spec("8080:80").ok(), Some((8080, 80)));
        assert_eq!(parse_port_spec(":80").ok(), Some((0, 80)));
        assert_eq!(parse_port_spec("0:80").ok(), Some((0, 80)));
        assert_eq!(parse_port_spec("80").ok(), Some((80, 80)));
        for bad in ["", ":", "80:", "x:80", "80:0", "70000", "1:70000"] {
            assert!(parse_port_spec(bad).is_err(), "{bad}");
        }
    }
}

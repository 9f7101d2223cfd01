//! A tiny gRPC health server for nodelet's gRPC probe tests.
//!
//! ```text
//! grpc-health [--port N] [--service NAME]... [--down-file PATH]
//! ```
//!
//! Serves `grpc.health.v1.Health` on `0.0.0.0:N` (default 50051): the server as a whole (`""`) and every
//! `--service` are `SERVING`; any other service is unknown (`NOT_FOUND`). While `PATH` exists (checked every
//! 100 ms), the `--service`s are `NOT_SERVING` (the server as a whole stays `SERVING`), so that tests can flip
//! the answer with `touch`/`rm` through exec.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use tonic_health::ServingStatus;

struct Args {
    port: u16,
    services: Vec<String>,
    down_file: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args { port: 50051, services: Vec::new(), down_file: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--service" => args.services.push(value()?),
            "--down-file" => args.down_file = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grpc-health: {e}");
            std::process::exit(2);
        }
    };
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("", ServingStatus::Serving).await;
    let names = args.services.clone();
    let mut down: Option<bool> = None;
    let poll = {
        let reporter = reporter.clone();
        let names = names.clone();
        async move {
            loop {
                let now_down = args.down_file.as_ref().is_some_and(|p| p.exists());
                if down != Some(now_down) {
                    let status = if now_down { ServingStatus::NotServing } else { ServingStatus::Serving };
                    for name in &names {
                        reporter.set_service_status(name, status).await;
                    }
                    println!("grpc-health: {status:?}");
                    down = Some(now_down);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // A bare spawn: this test image's poller, as long-lived as its process.
    tokio::spawn(poll);
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, args.port));
    println!("grpc-health: serving {names:?} on {addr}");
    if let Err(e) = tonic::transport::Server::builder().add_service(service).serve(addr).await {
        eprintln!("grpc-health: {e}");
        std::process::exit(1);
    }
}

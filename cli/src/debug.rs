//! `nodelet debug`: adds an ephemeral container to a static pod (`POST /debug/{namespace}/{pod}` on the
//! local nodelet's main port, which keeps it and starts it once in the running pod) and, with `-i`, waits for
//! it to run and attaches to it ([`super::session`]), as `kubectl debug -it` does for API pods. A container
//! that ended before the attach has its log printed instead.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, EphemeralContainer, Pod};

use super::get::{fetch_pods, main_port_request};
use super::session::{self, Kind, Target};
use super::stream::{MainPort, StreamError, encode};
use crate::args::{DebugArgs, GetArgs};

/// How long the debug container may take to start (an image pull included).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How often its status is polled meanwhile.
const POLL: Duration = Duration::from_millis(500);

/// Runs `nodelet debug`; returns 0, or with `-i` the exit code the attach session ended with.
pub(crate) async fn run(args: &DebugArgs) -> Result<i32, StreamError> {
    let main = MainPort::new(&args.server)?;
    let name = match &args.container {
        Some(name) => name.clone(),
        None => {
            let name = generated_name();
            eprintln!("Defaulting debug container name to {name}.");
            name
        }
    };
    let interactive = args.stdin || args.tty;
    let container = EphemeralContainer {
        name: name.clone(),
        image: Some(args.image.clone()),
        image_pull_policy: args.image_pull_policy.clone(),
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        target_container_name: args.target.clone(),
        stdin: args.stdin.then_some(true),
        tty: args.tty.then_some(true),
        termination_message_policy: Some("File".to_owned()),
        ..EphemeralContainer::default()
    };
    let body = serde_json::to_vec(&container).map_err(|e| StreamError::Usage(e.to_string()))?;
    let get = args.server.get_pods(&args.namespace, Vec::new());
    let path = format!("/debug/{}/{}", encode(&args.namespace), encode(&args.pod));
    main_port_request(&get, &path, Some(body)).await?;
    if let Some(target) = &args.target {
        eprintln!("Targeting container {target:?}: the debug container shares its process namespace.");
    }
    if !interactive {
        return Ok(0);
    }
    match wait_started(&get, &args.namespace, &args.pod, &name).await? {
        Started::Running => {
            let target = Target {
                kind: Kind::Attach,
                namespace: &args.namespace,
                pod: &args.pod,
                container: &name,
                command: &[],
                stdin: args.stdin,
                tty: args.tty,
            };
            session::interactive(&main, &target).await
        }
        Started::Exited(code) => {
            let path =
                format!("/containerLogs/{}/{}/{}", encode(&args.namespace), encode(&args.pod), encode(&name));
            let log = main_port_request(&get, &path, None).await?;
            print!("{log}");
            Ok(code)
        }
    }
}

/// `debugger-` and five characters, as kubectl names debug containers.
fn generated_name() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5).map(|_| char::from(CHARS[fastrand::usize(..CHARS.len())])).collect();
    format!("debugger-{suffix}")
}

/// What the debug container did first.
enum Started {
    /// It runs: attach.
    Running,
    /// It ended already, with this code.
    Exited(i32),
}

fn ephemeral_status<'a>(
    pods: &'a [Pod],
    namespace: &str,
    pod: &str,
    name: &str,
) -> Option<&'a ContainerStatus> {
    pods.iter()
        .find(|p| {
            p.metadata.name.as_deref() == Some(pod)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })?
        .status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

/// Waits until the debug container runs or has ended; says on stderr why it waits, when that changes.
async fn wait_started(get: &GetArgs, namespace: &str, pod: &str, name: &str) -> Result<Started, StreamError> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let mut said = String::new();
    loop {
        let pods = fetch_pods(get).await?;
        let state = ephemeral_status(&pods, namespace, pod, name).and_then(|s| s.state.clone());
        if let Some(state) = state {
            if state.running.is_some() {
                return Ok(Started::Running);
            }
            if let Some(t) = state.terminated {
                return Ok(Started::Exited(t.exit_code));
            }
            if let Some(w) = state.waiting {
                let why = format!(
                    "{}{}",
                    w.reason.unwrap_or_default(),
                    w.message.map(|m| format!(": {m}")).unwrap_or_default()
                );
                if why != said {
                    eprintln!("Waiting for container {name:?} to start: {why}");
                    said = why;
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StreamError::Usage(format!(
                "container {name:?} of pod {namespace}/{pod} did not start within {}s",
                START_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

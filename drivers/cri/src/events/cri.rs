//! CRI `GetContainerEvents`: the runtime's container events over the CRI itself (the kubelet's EventedPLEG
//! source), for runtimes that serve it (containerd 1.7 and 2.x, CRI-O).
//!
//! Each `ContainerEventResponse` names one container (or sandbox) and carries the pod sandbox's status and
//! the statuses of all of its containers at the time of the event; [`decode_container_event`] turns it into
//! [`RuntimeEvent`]s (`CONTAINER_CREATED_EVENT` → [`RuntimeEvent::ContainerCreated`],
//! `CONTAINER_STARTED_EVENT` → [`RuntimeEvent::ContainerStarted`], `CONTAINER_STOPPED_EVENT` →
//! [`RuntimeEvent::ContainerExited`] with the exit code and finish time of the container's status,
//! preceded by [`RuntimeEvent::ContainerOom`] when that status's reason is `OOMKilled`,
//! `CONTAINER_DELETED_EVENT` → [`RuntimeEvent::ContainerRemoved`]). How the stream is known to be active is
//! in the [parent module's docs](super).

use std::future::Future;
use std::time::{Duration, SystemTime};

use k8s_cri::v1::{ContainerEventResponse, ContainerEventType, GetEventsRequest, VersionRequest};

use super::{Ended, EventSource, RuntimeEvent, VersionError, Worker};

/// The container status reason of a container the kernel's OOM killer ended (the CRI's and the kubelet's).
const OOM_KILLED: &str = "OOMKilled";

/// How long the `Version` call that confirms a fresh stream may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A CRI timestamp (nanoseconds since the epoch) as a time; `None` for 0 (unset) and negative values.
fn nanos(ns: i64) -> Option<SystemTime> {
    let ns = u64::try_from(ns).ok().filter(|n| *n > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
}

/// Turns one CRI container event into the [`RuntimeEvent`]s it means (none for an event type this crate
/// does not know, or one without a container ID).
pub fn decode_container_event(event: &ContainerEventResponse) -> Vec<RuntimeEvent> {
    let id = event.container_id.clone();
    if id.is_empty() {
        tracing::debug!(?event.container_event_type, "CRI container event without a container ID");
        return Vec::new();
    }
    match ContainerEventType::try_from(event.container_event_type) {
        Ok(ContainerEventType::ContainerCreatedEvent) => {
            vec![RuntimeEvent::ContainerCreated { id, pid: None }]
        }
        Ok(ContainerEventType::ContainerStartedEvent) => {
            vec![RuntimeEvent::ContainerStarted { id, pid: None }]
        }
        Ok(ContainerEventType::ContainerStoppedEvent) => {
            // A container's own status is among the statuses; a sandbox's (its ID is the pod sandbox's) is not.
            let status = event.containers_statuses.iter().find(|s| s.id == id);
            let mut out = Vec::with_capacity(2);
            if status.is_some_and(|s| s.reason == OOM_KILLED) {
                out.push(RuntimeEvent::ContainerOom { id: id.clone() });
            }
            out.push(RuntimeEvent::ContainerExited {
                id,
                pid: None,
                exit_status: status.and_then(|s| u32::try_from(s.exit_code).ok()),
                exited_at: status.and_then(|s| nanos(s.finished_at)),
            });
            out
        }
        Ok(ContainerEventType::ContainerDeletedEvent) => vec![RuntimeEvent::ContainerRemoved { id }],
        Err(_) => {
            tracing::debug!(container = %id, kind = event.container_event_type, "unknown CRI container event type");
            Vec::new()
        }
    }
}

impl Worker {
    /// One `GetContainerEvents` attempt: call, confirm (first event, response headers, or a `Version` call
    /// answered after the request went out and [`EventsConfig::confirm_grace`](super::EventsConfig) without an
    /// answer to the call since), forward events until failure.
    pub(super) async fn cri_once(&self) -> Ended {
        let mut client = self.runtime.clone();
        let call = client.get_container_events(GetEventsRequest {});
        tokio::pin!(call);
        // Polled after the call in every round (`biased`), so its request is queued on the connection behind
        // the call's.
        let probe = self.version_probe();
        tokio::pin!(probe);
        let mut probing = true;
        // Armed when the probe is answered: a runtime without the method may still be about to say so.
        let grace = tokio::time::sleep(self.config.confirm_grace);
        tokio::pin!(grace);
        let mut grace_armed = false;
        let mut confirmed = false;

        // Phase 1: until the response headers come (with the first event).
        let mut stream = loop {
            tokio::select! {
                biased;
                _ = self.tx.closed() => return Ended::Closed,
                result = &mut call => match result {
                    Ok(response) => break response.into_inner(),
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        return Ended::Unimplemented { confirmed };
                    }
                    Err(status) => {
                        return Ended::Failed { reason: format!("GetContainerEvents: {status}"), confirmed };
                    }
                },
                answer = &mut probe, if probing => {
                    probing = false;
                    match answer {
                        Ok(()) => {
                            grace.as_mut().reset(tokio::time::Instant::now() + self.config.confirm_grace);
                            grace_armed = true;
                        }
                        Err(reason) => tracing::debug!(
                            %reason,
                            "cannot confirm the CRI event stream by Version; waiting for its first event"
                        ),
                    }
                }
                () = &mut grace, if grace_armed && !confirmed => {
                    confirmed = true;
                    if !self.active("a Version call answered after the request, and no error since").await {
                        return Ended::Closed;
                    }
                }
            }
        };
        // The handler is running: it sent the headers.
        if !confirmed {
            confirmed = true;
            if !self.active("its response headers").await {
                return Ended::Closed;
            }
        }

        // Phase 2: forward events.
        loop {
            tokio::select! {
                _ = self.tx.closed() => return Ended::Closed,
                message = stream.message() => match message {
                    Ok(Some(event)) => {
                        for decoded in decode_container_event(&event) {
                            tracing::trace!(event = ?decoded, "runtime event");
                            if self.tx.send(decoded).await.is_err() {
                                return Ended::Closed;
                            }
                        }
                    }
                    Ok(None) => return Ended::Failed { reason: "CRI event stream ended".into(), confirmed },
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        return Ended::Unimplemented { confirmed };
                    }
                    Err(status) => {
                        return Ended::Failed { reason: format!("CRI event stream: {status}"), confirmed };
                    }
                },
            }
        }
    }

    /// Logs that the CRI stream is active and yields [`RuntimeEvent::Reconnected`]; false when the consumer
    /// is gone.
    async fn active(&self, proof: &str) -> bool {
        tracing::info!(proof, "CRI GetContainerEvents stream active");
        self.tx.send(RuntimeEvent::Reconnected { source: EventSource::Cri }).await.is_ok()
    }

    /// A CRI `Version` call with a deadline; its answer proves the runtime has read every request sent on the
    /// connection before it.
    fn version_probe(&self) -> impl Future<Output = Result<(), VersionError>> + use<> {
        let mut client = self.runtime.clone();
        async move {
            let request = VersionRequest { version: crate::client::CRI_CLIENT_VERSION.to_owned() };
            match tokio::time::timeout(PROBE_TIMEOUT, client.version(request)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(status)) => Err(VersionError::Status(status)),
                Err(_) => Err(VersionError::Timeout(PROBE_TIMEOUT)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1::{ContainerState, ContainerStatus, PodSandboxStatus};

    fn event(id: &str, kind: ContainerEventType, statuses: Vec<ContainerStatus>) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: id.into(),
            container_event_type: kind as i32,
            created_at: 1_700_000_000_000_000_000,
            pod_sandbox_status: Some(PodSandboxStatus { id: "sb".into(), ..Default::default() }),
            containers_statuses: statuses,
        }
    }

    fn exited(id: &str, code: i32, reason: &str) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            state: ContainerState::ContainerExited as i32,
            exit_code: code,
            finished_at: 1_700_000_000_000_000_005,
            reason: reason.into(),
            ..Default::default()
        }
    }

    #[test]
    fn maps_each_event_type() {
        assert_eq!(
            decode_container_event(&event("c1", ContainerEventType::ContainerCreatedEvent, vec![])),
            vec![RuntimeEvent::ContainerCreated { id: "c1".into(), pid: None }]
        );
        assert_eq!(
            decode_container_event(&event("c1", ContainerEventType::ContainerStartedEvent, vec![])),
            vec![RuntimeEvent::ContainerStarted { id: "c1".into(), pid: None }]
        );
        // The stopped container's own status gives the exit code and time, not another container's.
        let statuses = vec![exited("other", 9, "Error"), exited("c1", 3, "Error")];
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(
            decode_container_event(&event("c1", ContainerEventType::ContainerStoppedEvent, statuses)),
            vec![RuntimeEvent::ContainerExited {
                id: "c1".into(),
                pid: None,
                exit_status: Some(3),
                exited_at: Some(at)
            }]
        );
        assert_eq!(
            decode_container_event(&event("c1", ContainerEventType::ContainerDeletedEvent, vec![])),
            vec![RuntimeEvent::ContainerRemoved { id: "c1".into() }]
        );
    }

    #[test]
    fn an_oom_kill_comes_before_the_exit() {
        let statuses = vec![exited("c1", 137, OOM_KILLED)];
        let decoded =
            decode_container_event(&event("c1", ContainerEventType::ContainerStoppedEvent, statuses));
        assert_eq!(decoded.len(), 2, "{decoded:?}");
        assert_eq!(decoded[0], RuntimeEvent::ContainerOom { id: "c1".into() });
        assert!(matches!(decoded[1], RuntimeEvent::ContainerExited { exit_status: Some(137), .. }));
    }

    #[test]
    fn a_sandbox_stop_has_no_exit_status() {
        // containerd sends the sandbox's stop with the sandbox ID, which no container status has.
        let statuses = vec![exited("c1", 0, "Completed")];
        assert_eq!(
            decode_container_event(&event("sb", ContainerEventType::ContainerStoppedEvent, statuses)),
            vec![RuntimeEvent::ContainerExited {
                id: "sb".into(),
                pid: None,
                exit_status: None,
                exited_at: None
            }]
        );
    }

    #[test]
    fn unknown_types_and_missing_ids_are_dropped() {
        let mut unknown = event("c1", ContainerEventType::ContainerStartedEvent, vec![]);
        unknown.container_event_type = 42;
        assert_eq!(decode_container_event(&unknown), vec![]);
        assert_eq!(
            decode_container_event(&event("", ContainerEventType::ContainerStartedEvent, vec![])),
            vec![]
        );
        // A negative exit code (not a process's) and an unset finish time are not reported.
        let statuses = vec![ContainerStatus { finished_at: 0, ..exited("c1", -1, "Error") }];
        assert_eq!(
            decode_container_event(&event("c1", ContainerEventType::ContainerStoppedEvent, statuses)),
            vec![RuntimeEvent::ContainerExited {
                id: "c1".into(),
                pid: None,
                exit_status: None,
                exited_at: None
            }]
        );
    }
}

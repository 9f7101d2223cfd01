//! The sandbox half of [`CriPodRuntime`]: nodelet's [`SandboxRuntime`] on CRI, with the pod's
//! network set up by the runtime (containerd calls the node's CNI plugins in `RunPodSandbox` and
//! tears the network down in `StopPodSandbox`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use nodelet_resources::model::actual::PodSandboxes;
use nodelet_resources::model::pod::DesiredPod;
use nodelet_resources::model::runtime::{RuntimeError, RuntimeResult};
use nodelet_resources::sandbox::desired::SandboxSpec;
use nodelet_resources::sandbox::driver::SandboxRuntime;

use super::{CriPodRuntime, cri_error, spec_error};
use crate::filter::SandboxFilter;
use crate::labels;

/// How long a sandbox for a pod naming a RuntimeClass waits for the classes' first list (the API
/// server's are listed only once a pod names one) before it fails and is tried again with back-off.
const RUNTIME_CLASS_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl CriPodRuntime {
    /// For a `hostUsers: false` pod: the runtime handler must support user namespaces (CRI `Status`
    /// `runtime_handlers[].features.user_namespaces`), else the sandbox is not created and the error names
    /// `spec.hostUsers`: such a pod never runs with the host's users.
    async fn check_userns_support(&self, pod: &DesiredPod, handler: &str) -> RuntimeResult<()> {
        let handlers = self.inner.client.runtime_handlers().await.map_err(|e| {
            cri_error(
                "CreatePodSandboxError",
                format!("pod {}/{}: spec.hostUsers: CRI Status", pod.namespace(), pod.name()),
                &e,
            )
        })?;
        crate::userns::handler_supports(&handlers, handler).map_err(|why| {
            RuntimeError::new(
                "CreatePodSandboxError",
                format!(
                    "pod {}/{}: spec.hostUsers: Forbidden: false needs a user namespace, and {why}; the pod is \
                     not run with the host's users",
                    pod.namespace(),
                    pod.name()
                ),
            )
        })
    }

    /// With `podPidsLimit` set: makes the pod cgroup `<cgroupRoot>/pod<uid>` and writes the limit to its
    /// `pids.max` before the sandbox (and so every container) starts in it; returns whether it did.
    async fn limit_pod_pids(&self, pod: &DesiredPod) -> RuntimeResult<bool> {
        let Some(limit) = self.inner.config.pod_pids_limit else { return Ok(false) };
        let Some(cgroup) = self.pod_cgroup(pod.uid()) else {
            return Err(RuntimeError::new(
                "CreatePodSandboxError",
                format!(
                    "pod {}/{}: podPidsLimit {limit} needs a pod cgroup, and no cgroup root is configured",
                    pod.namespace(),
                    pod.name()
                ),
            ));
        };
        let cgroup_fs = self.inner.config.cgroup_fs.clone();
        let rel = cgroup.clone();
        let written =
            tokio::task::spawn_blocking(move || crate::pod_cgroup::set_pids_limit(&cgroup_fs, &rel, limit))
                .await
                .map_err(|e| {
                    RuntimeError::new("CreatePodSandboxError", format!("pod cgroup task failed: {e}"))
                })?;
        match written {
            Ok(file) => {
                tracing::debug!(pod = %pod.uid(), file = %file.display(), limit, "pod pids limit set");
                Ok(true)
            }
            Err(e) => Err(RuntimeError::new(
                "CreatePodSandboxError",
                format!(
                    "pod {}/{}: cannot limit the processes of pod cgroup {cgroup}: {e}",
                    pod.namespace(),
                    pod.name()
                ),
            )),
        }
    }
}

impl SandboxRuntime for CriPodRuntime {
    async fn run_sandbox(&self, spec: &SandboxSpec, attempt: u32) -> RuntimeResult<String> {
        let pod: &DesiredPod = &spec.pod;
        let started = tokio::time::Instant::now();
        // As the kubelet: the class is looked up at every sandbox creation; a missing one fails it.
        let classes = self.inner.config.runtime_classes.0.as_deref();
        let handler = super::runtime_class::handler_when_listed(pod, classes, RUNTIME_CLASS_LIST_WAIT)
            .await
            .map_err(|e| RuntimeError::new("CreatePodSandboxError", e.to_string()))?
            .unwrap_or_else(|| self.inner.config.runtime_handler.clone());
        let dns = self.dns_config(pod).await?;
        let userns = if pod.spec().host_users == Some(false) {
            self.check_userns_support(pod, &handler).await?;
            self.pod_userns(pod, true, "CreatePodSandboxError").await?
        } else {
            None
        };
        let config =
            crate::spec::sandbox_config(pod, attempt, &self.inner.config, Some(dns), userns.as_ref())
                .map_err(spec_error)?;
        let log_dir = PathBuf::from(&config.log_directory);
        if let Err(e) = tokio::fs::DirBuilder::new().recursive(true).mode(0o755).create(&log_dir).await {
            return Err(RuntimeError::new(
                "CreatePodSandboxError",
                format!("cannot create pod log directory {}: {e}", log_dir.display()),
            ));
        }
        let limited = self.limit_pod_pids(pod).await?;
        let created = self.inner.client.run_pod_sandbox(config, &handler).await;
        {
            let mut caches = self.caches();
            match &created {
                Ok(id) => caches.index.add_sandbox(pod.uid(), id),
                Err(_) => caches.index.creation_failed(pod.uid()),
            }
        }
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                // A cgroup made for a sandbox that never ran goes again (one with processes stays).
                if limited {
                    self.remove_pod_cgroups(pod.uid()).await;
                }
                // A range given for a sandbox that was not made goes again when the pod has no sandbox
                // at all (a pod removed before it ever got one keeps none); the next attempt gets the
                // first free one. An answer that may hide a sandbox (a timeout, no connection) keeps it.
                if userns.is_some() && !e.is_timeout() && !e.is_unavailable() {
                    let mine = SandboxFilter::managed().label(labels::POD_UID, pod.uid().to_owned());
                    if let Ok(0) = self.inner.client.list_sandbox_items(&mine).await.map(|l| l.len()) {
                        self.release_userns(pod.uid()).await;
                    }
                }
                let e = cri_error(
                    "CreatePodSandboxError",
                    format!("pod {}/{}: RunPodSandbox", pod.namespace(), pod.name()),
                    &e,
                );
                return Err(RuntimeError { not_found: false, ..e });
            }
        };
        // Its IPs are read (and kept: they never change) by the sandbox pair's state read that follows
        // every creation, with a `PodSandboxStatus`.
        tracing::info!(
            pod = %pod.uid(), sandbox = %id, attempt, elapsed_ms = started.elapsed().as_millis(), "sandbox running"
        );
        Ok(id)
    }

    async fn stop_sandbox(&self, sandbox_id: &str) -> RuntimeResult<()> {
        match self.inner.client.stop_pod_sandbox(sandbox_id).await {
            Err(e) if !e.is_not_found() => {
                Err(cri_error("KillPodSandboxError", format!("StopPodSandbox {sandbox_id}"), &e))
            }
            _ => Ok(()),
        }
    }

    async fn remove_sandbox(&self, sandbox_id: &str) -> RuntimeResult<()> {
        let client = &self.inner.client;
        let uid = match client.pod_sandbox_status(sandbox_id).await {
            Ok(status) => status.metadata.map(|m| m.uid).filter(|u| !u.is_empty()),
            Err(e) if e.is_not_found() => {
                let mut caches = self.caches();
                caches.sandboxes.remove(sandbox_id);
                caches.index.remove(sandbox_id);
                return Ok(());
            }
            Err(e) => {
                return Err(cri_error("KillPodSandboxError", format!("PodSandboxStatus {sandbox_id}"), &e));
            }
        };
        if let Err(e) = client.remove_pod_sandbox(sandbox_id).await
            && !e.is_not_found()
        {
            return Err(cri_error("KillPodSandboxError", format!("RemovePodSandbox {sandbox_id}"), &e));
        }
        let known = {
            let mut caches = self.caches();
            caches.sandboxes.remove(sandbox_id);
            caches.index.remove(sandbox_id);
            uid.as_deref().and_then(|uid| caches.index.objects(uid))
        };
        // The runtime leaves the pod cgroup behind, and the pod's user namespace range is still recorded:
        // both go once the pod has no sandbox left (the sandbox pair removes the last one only once the pod
        // is gone; a replaced sandbox goes after its successor is made).
        let userns = self.userns_in_use(uid.as_deref());
        if let Some(uid) = uid
            && (self.pod_cgroup(&uid).is_some() || userns)
        {
            let left = match known {
                Some(objects) => Ok(objects.sandboxes.len()),
                None => {
                    let others = SandboxFilter::managed().label(labels::POD_UID, uid.clone());
                    client.list_sandbox_items(&others).await.map(|left| left.len())
                }
            };
            match left {
                Ok(0) => {
                    if self.pod_cgroup(&uid).is_some() {
                        let removed = self.remove_pod_cgroups(&uid).await;
                        tracing::debug!(pod = %uid, removed, "removed pod cgroups");
                    }
                    if userns {
                        self.release_userns(&uid).await;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(pod = %uid, error = %e, "cannot tell whether the pod cgroup is still used")
                }
            }
        }
        Ok(())
    }

    async fn list_sandboxes(&self) -> RuntimeResult<HashMap<String, PodSandboxes>> {
        let pods = self.collect(None).await?;
        Ok(pods
            .into_iter()
            .filter_map(|(uid, listed)| Some((uid, Arc::unwrap_or_clone(listed.sandboxes?))))
            .collect())
    }

    async fn sandboxes_of(&self, uid: &str) -> RuntimeResult<Option<PodSandboxes>> {
        self.collect_sandboxes(uid).await
    }

    /// The pod cgroups of the pods found at start-up get the node's `podPidsLimit` now (`max` without
    /// one): a limit changed while nodelet was down applies to the pods that already run too.
    async fn adopt(&self, pods: &HashMap<String, PodSandboxes>) {
        // Once, at start: the user namespace ranges of pods without a sandbox are freed (removed while
        // nodelet was down, or never got one); those of pods with one are kept.
        if !self.inner.userns_adopted.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let allocator = self.userns();
            let keep: std::collections::HashSet<String> = pods.keys().cloned().collect();
            if let Err(e) =
                tokio::task::spawn_blocking(move || allocator.retain(|uid| keep.contains(uid))).await
            {
                tracing::warn!(error = %e, "the user namespace adoption task failed");
            }
        }
        let cgroups: Vec<(String, String)> =
            pods.keys().filter_map(|uid| Some((uid.clone(), self.pod_cgroup(uid)?))).collect();
        if cgroups.is_empty() {
            return;
        }
        let limit = self.inner.config.pod_pids_limit;
        let cgroup_fs = self.inner.config.cgroup_fs.clone();
        let updated = tokio::task::spawn_blocking(move || {
            let mut updated = 0usize;
            for (uid, rel) in cgroups {
                match crate::pod_cgroup::update_pids_limit(&cgroup_fs, &rel, limit) {
                    Ok(true) => updated += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(pod = %uid, error = %e, "cannot apply podPidsLimit to a running pod")
                    }
                }
            }
            updated
        })
        .await;
        match updated {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(pods = n, limit = ?limit, "applied podPidsLimit to the pod cgroups of running pods")
            }
            Err(e) => tracing::warn!(error = %e, "the podPidsLimit task of running pods failed"),
        }
    }
}

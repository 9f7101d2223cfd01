//! A fake pod and sandbox runtime with fault injection, for unit tests of the pod logic on paused time
//! (feature `testing`).
//!
//! Containers do not run anything; their image name says how they behave:
//! - `fake/exit:<code>` exits with `<code>` as soon as it starts;
//! - `fake/ignore-term` ignores SIGTERM: a stop takes the whole grace period and ends with 137;
//! - anything else runs until stopped (and exits 0 on SIGTERM), or until [`FakeRuntime::exit`];
//! - `fake/hang-post-start` has a postStart hook that never returns: its start ends only when
//!   cancelled, killing the container;
//! - `fake/slow-post-start` has a postStart hook that returns after [`SLOW_POST_START`] (or ends
//!   as above when cancelled first);
//! - `fake/missing` cannot be pulled (`ErrImagePull`) unless [`FakeRuntime::add_image`] adds it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use crate::common::clock::Clock;
use crate::model::actual::{
    ContainerRecord, ContainerState, ListedPod, PodActual, PodSandboxes, SandboxRecord,
};
use crate::model::pod::DesiredPod;
use crate::model::runtime::{RuntimeError, RuntimeResult};
use crate::pod::driver::{ContainerKind, PodRuntime, container_hash};
use crate::sandbox::desired::SandboxSpec;
use crate::sandbox::driver::SandboxRuntime;

/// How long the postStart hook of a `fake/slow-post-start` container takes.
pub const SLOW_POST_START: Duration = Duration::from_secs(30);

/// One recorded runtime call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCall {
    /// The method (`run_sandbox`, `start_container`, `stop_container`, …).
    pub method: &'static str,
    /// Its main argument: a pod UID, or `uid/container`, or an ID.
    pub target: String,
    /// Wall-clock time of the call (the fake's clock).
    pub at: i64,
    /// For `start_container`: the host paths of the volumes the container was given, by name.
    pub volumes: Vec<(String, std::path::PathBuf)>,
    /// For `start_container` of an ephemeral container with a target: the ID of the container
    /// whose process namespace it was given.
    pub pid_target: Option<String>,
}

struct FakeContainer {
    uid: String,
    record: ContainerRecord,
    ignores_term: bool,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: Vec<(String, String, String, SandboxRecord, Option<u64>)>,
    containers: Vec<FakeContainer>,
    faults: HashMap<&'static str, VecDeque<RuntimeError>>,
    calls: Vec<FakeCall>,
    images: HashSet<String>,
    /// The pods of the last `list_pods`.
    listed: HashMap<String, ListedPod>,
    list_delay: Duration,
}

/// The fake runtime.
pub struct FakeRuntime {
    state: Mutex<State>,
    clock: Clock,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRuntime").finish_non_exhaustive()
    }
}

impl FakeRuntime {
    /// A fake runtime stamping times with `clock`.
    pub fn new(clock: Clock) -> Self {
        Self { state: Mutex::new(State::default()), clock }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, state: &mut State, method: &'static str, target: String) -> RuntimeResult<()> {
        state.calls.push(FakeCall {
            method,
            target,
            at: (self.clock)(),
            volumes: Vec::new(),
            pid_target: None,
        });
        match state.faults.get_mut(method).and_then(VecDeque::pop_front) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes the next call of `method` fail with `error`.
    pub fn fail_next(&self, method: &'static str, error: RuntimeError) {
        self.lock().faults.entry(method).or_default().push_back(error);
    }

    /// Makes every `list_pods` take `delay` (of tokio time) before it answers, as a real listing
    /// takes time.
    pub fn set_list_delay(&self, delay: Duration) {
        self.lock().list_delay = delay;
    }

    /// Makes an image pullable.
    pub fn add_image(&self, image: &str) {
        self.lock().images.insert(image.to_string());
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// The calls of `method`.
    pub fn calls_of(&self, method: &str) -> Vec<FakeCall> {
        self.lock().calls.iter().filter(|c| c.method == method).cloned().collect()
    }

    /// Makes the running container `name` of pod `uid` exit with `code` now.
    pub fn exit(&self, uid: &str, name: &str, code: i32) {
        let now = (self.clock)();
        let mut state = self.lock();
        for c in state.containers.iter_mut().filter(|c| c.uid == uid && c.record.name == name) {
            if c.record.state == ContainerState::Running {
                c.record.state = ContainerState::Exited;
                c.record.exit_code = code;
                c.record.finished_at = now;
            }
        }
    }

    /// Adds an exited attempt of pod `uid`'s container `name` under a new ID, as if an operation had
    /// made it and its outcome were not recorded yet; returns the ID (`None`: no such container).
    pub fn add_unreported_attempt(&self, uid: &str, name: &str) -> Option<String> {
        let now = (self.clock)();
        let mut state = self.lock();
        let template = state.containers.iter().rev().find(|c| c.uid == uid && c.record.name == name)?;
        let (mut record, ignores_term) = (template.record.clone(), template.ignores_term);
        state.next_id += 1;
        record.id = format!("container-{}", state.next_id);
        record.state = ContainerState::Exited;
        record.exit_code = 1;
        record.finished_at = now;
        let id = record.id.clone();
        state.containers.push(FakeContainer { uid: uid.to_string(), record, ignores_term });
        Some(id)
    }

    /// Makes the pod's newest sandbox not ready (as if its network died).
    pub fn break_sandbox(&self, uid: &str) {
        let mut state = self.lock();
        if let Some(s) = state.sandboxes.iter_mut().rev().find(|s| s.0 == uid) {
            s.3.ready = false;
        }
    }

    /// Containers of a pod that exist now (any state).
    pub fn container_count(&self, uid: &str) -> usize {
        self.lock().containers.iter().filter(|c| c.uid == uid).count()
    }

    /// Containers (attempts) named `name` of pod `uid` that exist now.
    pub fn containers_named(&self, uid: &str, name: &str) -> usize {
        self.lock().containers.iter().filter(|c| c.uid == uid && c.record.name == name).count()
    }

    /// What the runtime has of pod `uid`: its containers, and its sandboxes apart (`None`: nothing).
    fn snapshot(state: &State, uid: &str) -> Option<(PodActual, Option<PodSandboxes>)> {
        let mut sandboxes: Vec<&(String, String, String, SandboxRecord, Option<u64>)> =
            state.sandboxes.iter().filter(|s| s.0 == uid).collect();
        let containers: Vec<ContainerRecord> =
            state.containers.iter().filter(|c| c.uid == uid).map(|c| c.record.clone()).collect();
        if sandboxes.is_empty() && containers.is_empty() {
            return None;
        }
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.3.created_at));
        let first = sandboxes.first();
        let (namespace, name) =
            (first.map(|s| s.1.clone()).unwrap_or_default(), first.map(|s| s.2.clone()).unwrap_or_default());
        let pod_sandboxes = first.map(|_| PodSandboxes {
            uid: uid.to_string(),
            namespace: namespace.clone(),
            name: name.clone(),
            sandboxes: sandboxes.iter().map(|s| s.3.clone()).collect(),
            needs_refresh: false,
        });
        let pod = PodActual {
            uid: uid.to_string(),
            namespace,
            name,
            termination_grace_secs: first.and_then(|s| s.4),
            containers,
            needs_refresh: false,
        };
        Some((pod, pod_sandboxes))
    }

    /// Pod `uid`'s sandboxes alone (`None`: it has none).
    fn sandbox_snapshot(state: &State, uid: &str) -> Option<PodSandboxes> {
        Self::snapshot(state, uid).and_then(|(_, sandboxes)| sandboxes)
    }
}

impl FakeRuntime {
    /// Creates a container as `start_container` does, without its hook.
    fn create_container(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        volumes: &crate::model::volumes::PodVolumes,
    ) -> RuntimeResult<String> {
        let now = (self.clock)();
        let mut state = self.lock();
        // An ephemeral container joins its target's process namespace: the target must exist.
        let target = match pod.ephemeral_target(&container.name).filter(|_| kind == ContainerKind::Ephemeral)
        {
            Some(name) => {
                let found = state.containers.iter().rev().find(|c| {
                    c.uid == pod.uid() && c.record.name == name && c.record.sandbox_id == sandbox_id
                });
                match found {
                    Some(c) => Some(c.record.id.clone()),
                    None => {
                        return Err(RuntimeError::new(
                            "CreateContainerConfigError",
                            format!("unable to find target container {name:?}"),
                        ));
                    }
                }
            }
            None => None,
        };
        let recorded =
            self.record(&mut state, "start_container", format!("{}/{}", pod.uid(), container.name));
        if let Some(call) = state.calls.last_mut() {
            call.pid_target = target;
        }
        if let Some(call) = state.calls.last_mut() {
            call.volumes = volumes.iter().map(|(name, v)| (name.clone(), v.path.clone())).collect();
        }
        recorded?;
        let image = container.image.clone().unwrap_or_default();
        if image.starts_with("fake/missing") && !state.images.contains(&image) {
            return Err(RuntimeError::new("ErrImagePull", format!("pull of {image} failed: not found")));
        }
        if !state.sandboxes.iter().any(|s| s.3.id == sandbox_id && s.3.ready) {
            return Err(RuntimeError::new(
                "CreateContainerError",
                format!("sandbox {sandbox_id} is not ready"),
            ));
        }
        state.next_id += 1;
        let id = format!("container-{}", state.next_id);
        let exit = image.strip_prefix("fake/exit:").and_then(|c| c.parse::<i32>().ok());
        let record = ContainerRecord {
            id: id.clone(),
            name: container.name.clone(),
            sandbox_id: sandbox_id.to_string(),
            restart_count,
            spec_hash: Some(container_hash(container)),
            spec_hash_without_resources: Some(crate::pod::resize::container_hash_without_resources(
                container,
            )),
            applied: Some(crate::model::cgroup::CgroupResources::of(container)),
            state: if exit.is_some() { ContainerState::Exited } else { ContainerState::Running },
            image: image.clone(),
            image_ref: format!("{image}@sha256:fake"),
            created_at: now,
            started_at: now,
            finished_at: if exit.is_some() { now } else { 0 },
            exit_code: exit.unwrap_or(0),
            log_path: format!("{}/{restart_count}.log", container.name),
            sidecar: pod
                .sidecars()
                .find(|(_, c)| c.name == container.name)
                .and_then(|(i, _)| u32::try_from(i).ok()),
            ..ContainerRecord::default()
        };
        state.containers.push(FakeContainer {
            uid: pod.uid().to_string(),
            record,
            ignores_term: image == "fake/ignore-term",
        });
        Ok(id)
    }
}

impl PodRuntime for FakeRuntime {
    async fn start_container(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        backoff_since: u32,
        volumes: &crate::model::volumes::PodVolumes,
        cancel: &crate::pod::driver::CancellationToken,
    ) -> RuntimeResult<String> {
        let id = self.create_container(pod, sandbox_id, container, kind, restart_count, volumes)?;
        if let Some(c) = self.lock().containers.iter_mut().find(|c| c.record.id == id) {
            c.record.backoff_since = Some(backoff_since);
        }
        // How long its postStart hook takes (`None`: it never returns).
        let hook = match container.image.as_deref() {
            Some("fake/hang-post-start") => Some(None),
            Some("fake/slow-post-start") => Some(Some(SLOW_POST_START)),
            _ => None,
        };
        if let Some(takes) = hook {
            // A cancellation before the hook returns ends the start, and the container is killed
            // as after a failed hook.
            let returns = async {
                match takes {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = returns => return Ok(id),
                () = cancel.cancelled() => {}
            }
            self.stop_container(&id, pod.grace_period()).await?;
            return Err(RuntimeError::new(
                "PostStartHookError",
                format!("container {:?}: postStart hook abandoned", container.name),
            ));
        }
        Ok(id)
    }

    async fn stop_container(&self, container_id: &str, grace: Duration) -> RuntimeResult<()> {
        let ignores = {
            let mut state = self.lock();
            self.record(&mut state, "stop_container", container_id.to_string())?;
            state.containers.iter().any(|c| {
                c.record.id == container_id && c.ignores_term && c.record.state == ContainerState::Running
            })
        };
        if ignores {
            tokio::time::sleep(grace).await;
        }
        let now = (self.clock)();
        let mut state = self.lock();
        if let Some(c) = state.containers.iter_mut().find(|c| c.record.id == container_id)
            && c.record.state == ContainerState::Running
        {
            c.record.state = ContainerState::Exited;
            c.record.exit_code = if ignores { 137 } else { 0 };
            c.record.finished_at = now;
        }
        Ok(())
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &crate::model::cgroup::CgroupResources,
    ) -> RuntimeResult<()> {
        let mut state = self.lock();
        self.record(&mut state, "update_container_resources", container_id.to_string())?;
        if let Some(c) = state.containers.iter_mut().find(|c| c.record.id == container_id) {
            c.record.applied = Some(*resources);
        }
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> RuntimeResult<()> {
        let mut state = self.lock();
        self.record(&mut state, "remove_container", container_id.to_string())?;
        state.containers.retain(|c| c.record.id != container_id);
        Ok(())
    }

    async fn list_pods(&self) -> RuntimeResult<HashMap<String, ListedPod>> {
        let delay = self.lock().list_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.lock();
        self.record(&mut state, "list_pods", String::new())?;
        let uids: HashSet<String> = state
            .sandboxes
            .iter()
            .map(|s| s.0.clone())
            .chain(state.containers.iter().map(|c| c.uid.clone()))
            .collect();
        // The same `Arc`s for a pod unchanged since the last listing, as the CRI driver's memo does
        // (the PLEG's comparisons take a shortcut on it).
        let listed: HashMap<String, ListedPod> = uids
            .into_iter()
            .filter_map(|uid| {
                let (pod, sandboxes) = Self::snapshot(&state, &uid)?;
                let listed = match state.listed.get(&uid) {
                    Some(last) if *last.pod == pod && last.sandboxes.as_deref() == sandboxes.as_ref() => {
                        last.clone()
                    }
                    _ => ListedPod { pod: Arc::new(pod), sandboxes: sandboxes.map(Arc::new) },
                };
                Some((uid, listed))
            })
            .collect();
        state.listed = listed.clone();
        Ok(listed)
    }

    async fn pod_state(&self, uid: &str) -> RuntimeResult<Option<ListedPod>> {
        let mut state = self.lock();
        self.record(&mut state, "pod_state", uid.to_string())?;
        Ok(Self::snapshot(&state, uid)
            .map(|(pod, sandboxes)| ListedPod { pod: Arc::new(pod), sandboxes: sandboxes.map(Arc::new) }))
    }

    async fn pod_of(&self, id: &str) -> RuntimeResult<Option<String>> {
        let mut state = self.lock();
        self.record(&mut state, "pod_of", id.to_string())?;
        let container = state.containers.iter().find(|c| c.record.id == id).map(|c| c.uid.clone());
        Ok(container.or_else(|| state.sandboxes.iter().find(|s| s.3.id == id).map(|s| s.0.clone())))
    }
}

impl SandboxRuntime for FakeRuntime {
    async fn run_sandbox(&self, spec: &SandboxSpec, attempt: u32) -> RuntimeResult<String> {
        let pod = &spec.pod;
        let now = (self.clock)();
        let mut state = self.lock();
        self.record(&mut state, "run_sandbox", pod.uid().to_string())?;
        state.next_id += 1;
        let id = format!("sandbox-{}", state.next_id);
        let ip = (!pod.host_network()).then(|| format!("198.18.0.{}", 2 + state.next_id % 250));
        let grace = pod.grace_period().as_secs();
        let record = SandboxRecord {
            id: id.clone(),
            ready: true,
            ip,
            created_at: now,
            attempt,
            host_network: pod.host_network(),
            runtime_handler: String::new(),
        };
        state.sandboxes.push((
            pod.uid().to_string(),
            pod.namespace().to_string(),
            pod.name().to_string(),
            record,
            Some(grace),
        ));
        Ok(id)
    }

    async fn stop_sandbox(&self, sandbox_id: &str) -> RuntimeResult<()> {
        let mut state = self.lock();
        self.record(&mut state, "stop_sandbox", sandbox_id.to_string())?;
        if let Some(s) = state.sandboxes.iter_mut().find(|s| s.3.id == sandbox_id) {
            s.3.ready = false;
        }
        Ok(())
    }

    async fn remove_sandbox(&self, sandbox_id: &str) -> RuntimeResult<()> {
        let mut state = self.lock();
        self.record(&mut state, "remove_sandbox", sandbox_id.to_string())?;
        state.sandboxes.retain(|s| s.3.id != sandbox_id);
        Ok(())
    }

    async fn list_sandboxes(&self) -> RuntimeResult<HashMap<String, PodSandboxes>> {
        let mut state = self.lock();
        self.record(&mut state, "list_sandboxes", String::new())?;
        let uids: HashSet<String> = state.sandboxes.iter().map(|s| s.0.clone()).collect();
        Ok(uids
            .into_iter()
            .filter_map(|uid| Some((uid.clone(), Self::sandbox_snapshot(&state, &uid)?)))
            .collect())
    }

    async fn sandboxes_of(&self, uid: &str) -> RuntimeResult<Option<PodSandboxes>> {
        let mut state = self.lock();
        self.record(&mut state, "sandboxes_of", uid.to_string())?;
        Ok(Self::sandbox_snapshot(&state, uid))
    }
}

//! The pod reconciler: from a pod's desired spec and what the runtime has, the next step.
//!
//! It follows the kubelet's pod worker: it waits for the pod's sandbox, which the sandbox pair
//! ([`crate::sandbox`]) makes (the reconciler reads that pair's actual store and never creates,
//! stops or removes sandboxes itself); then the init containers one at a time, each of which
//! must succeed, except sidecars (`restartPolicy: Always`), which only need to be started and
//! then keep running (restarted whenever they exit); then the app containers;
//! restarts by `restartPolicy` with CrashLoopBackOff (10 s doubling to 300 s, reset after 10
//! minutes of running); a container whose spec changed is killed and started again; a pod whose
//! app containers are done is stopped (its sidecars too); a pod whose sandbox died has its containers
//! killed (the sandbox pair then replaces the sandbox); a pod that is gone has its containers
//! stopped and removed (the sandbox pair then removes its sandboxes).
//! Ephemeral containers (`spec.ephemeralContainers`) start once the pod is initialized, after
//! everything else the pod needs, each at most once: never restarted, not counted for anything.
//!
//! Side inputs: [`PodInputs`], read through the [`View`] (the engine is built with them,
//! [`EngineBuilder::build_with`](reconcile_engine::EngineBuilder::build_with), and declares the
//! relations that plan a pod again when they change with
//! [`EngineBuilder::watches`](reconcile_engine::EngineBuilder::watches)); an input that is `None` is
//! a concern the reconciler leaves out:
//! - the verdict store (written by the eviction pair's verdict populator; relation: identity):
//!   admission, eviction and resize decisions;
//! - the volume pair's desired and actual stores (relation on the actual store:
//!   [`pod_of_volume`](crate::volume::reconciler::pod_of_volume)): containers wait for their volumes;
//! - the sandbox pair's actual store and operation status (relation:
//!   [`pod_of_sandboxes`](crate::sandbox::status::pod_of_sandboxes); the engine also waits for the
//!   actual store to be reconstructed before it plans): containers start in its ready sandbox;
//! - the container GC surplus store (relation: identity), when `maxContainers` is set;
//! - this engine's own operation status ([`EngineBuilder::op_status`](reconcile_engine::EngineBuilder::op_status)).
//!
//! Time comes from the view: the crash-loop back-off and container GC compare the runtime's
//! wall-clock timestamps with [`View::wall`], and the ephemeral containers' retry with [`View::now`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::driver::{ContainerKind, container_hash};
use super::ops::PodOp;
use super::resize::{container_hash_without_resources, needs_restart};
use crate::model::actual::{ContainerRecord, ContainerState, PodActual, SandboxRecord, finished};
use crate::model::cgroup::CgroupResources;
use crate::model::pod::{DEFAULT_GRACE_PERIOD, DesiredPod, PodUid, RestartPolicy, is_sidecar};
use crate::model::verdict::Verdict;
use crate::model::volumes::VolumeReadiness;
use crate::probe::status as probe_status;
use crate::volume::status::VolumeGate;

pub use crate::common::clock::{Clock, system_clock};

/// What the pod reconciler reads besides its own stores; status reads the same value
/// ([`pod_status`](super::status::pod_status)). `None` leaves a concern out (the default, for
/// tests of one concern); the node sets every field.
#[derive(Clone, Default)]
pub struct PodInputs {
    /// The pod engine's own operation status ([`EngineBuilder::op_status`](reconcile_engine::EngineBuilder::op_status)):
    /// an ephemeral container whose start keeps failing never delays the pod's other containers, and
    /// no prune replaces a failure on record.
    pub failures: Option<Store<PodUid, super::status::PodOpStatus>>,
    /// The node's verdicts on its pods (written only by the verdict populator): a pod starts only once
    /// admitted; refused and evicted pods never start again. `None`: every pod counts as admitted.
    pub verdicts: Option<Store<PodUid, Verdict>>,
    /// The volume pair's stores: a pod's containers wait for its volumes. `None`: pods get no volumes.
    pub volumes: Option<VolumeGate>,
    /// The sandbox pair's actual store and operation status: containers start in the ready sandbox it
    /// reports. `None`: no pod has a sandbox (nothing creates one), so no container starts.
    pub sandboxes: Option<crate::sandbox::status::SandboxView>,
    /// The node-wide container GC decision per pod ([`SurplusPopulator`](super::gc::SurplusPopulator)),
    /// when `maxContainers` is set.
    pub surplus: Option<Store<PodUid, super::gc::Surplus>>,
}

impl fmt::Debug for PodInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodInputs")
            .field("failures", &self.failures.is_some())
            .field("verdicts", &self.verdicts.is_some())
            .field("volumes", &self.volumes.is_some())
            .field("sandboxes", &self.sandboxes.is_some())
            .field("surplus", &self.surplus.is_some())
            .finish()
    }
}

impl PodInputs {
    /// The sum of the [versions](Store::version) of the stores among them (wrapping): the same
    /// while none of them changed.
    pub fn version(&self) -> u64 {
        [
            self.failures.as_ref().map(Store::version),
            self.verdicts.as_ref().map(Store::version),
            self.volumes.as_ref().map(crate::volume::status::VolumeGate::version),
            self.sandboxes.as_ref().map(crate::sandbox::status::SandboxView::version),
            self.surplus.as_ref().map(Store::version),
        ]
        .into_iter()
        .flatten()
        .fold(0, u64::wrapping_add)
    }
}

/// What one pass of the reconciler shares: the side inputs, the pod's newest sandbox and the view's
/// clocks.
struct Cx<'a> {
    inputs: &'a PodInputs,
    /// The pod's newest sandbox as the sandbox pair has it (see [`PodReconciler::pod_sandboxes`]).
    sandbox: Option<&'a SandboxRecord>,
    /// [`View::wall`] in nanoseconds since the Unix epoch (the runtime's timestamps).
    wall: i64,
    /// [`View::now`].
    now: tokio::time::Instant,
}

/// CrashLoopBackOff timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashLoopBackOff {
    /// Delay before the second restart (the first restart is immediate): the kubelet's 10 s.
    pub initial: Duration,
    /// Cap: the kubelet's 300 s (`MaxContainerBackOff`).
    pub max: Duration,
    /// A container that ran this long before exiting restarts without delay: 10 minutes.
    pub reset_after: Duration,
}

impl Default for CrashLoopBackOff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

impl CrashLoopBackOff {
    /// How long a container that exited must wait before it starts again: nothing after its spec's first
    /// run, then `initial` doubling up to `max` with each restart of the same spec (the kubelet keys its
    /// back-off by the container's spec hash, so a changed image starts afresh).
    pub fn delay(&self, exited: &ContainerRecord) -> Duration {
        let ran = Duration::from_nanos(
            u64::try_from(exited.finished_at.saturating_sub(exited.started_at)).unwrap_or(0),
        );
        let restarts = exited.restart_count.saturating_sub(exited.backoff_since.unwrap_or(0));
        if restarts == 0 || (exited.started_at > 0 && ran >= self.reset_after) {
            return Duration::ZERO;
        }
        let exp = (restarts - 1).min(20);
        self.initial.saturating_mul(1 << exp).min(self.max)
    }
}

/// The pod reconciler.
#[derive(Clone)]
pub struct PodReconciler {
    backoff: CrashLoopBackOff,
    probes: Option<crate::probe::results::ProbeResults>,
    container_gc: Option<super::gc::ContainerGcPolicy>,
}

impl fmt::Debug for PodReconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodReconciler").field("backoff", &self.backoff).finish_non_exhaustive()
    }
}

impl PodReconciler {
    /// A reconciler with the given crash-loop timing. Wall-clock time comes from the engine's
    /// clock ([`View::wall`]; give the engine the runtime's clock with
    /// [`wall_clock`](crate::common::clock::wall_clock)).
    pub fn new(backoff: CrashLoopBackOff) -> Self {
        Self { backoff, probes: None, container_gc: None }
    }

    /// Restarts containers whose liveness or startup probe failed, as `results` says, and lets
    /// status show readiness from it. The engine must be woken when a result changes (the
    /// [`Prober`](crate::probe::worker::Prober) does). Without results, probes are ignored.
    pub fn with_probes(mut self, results: crate::probe::results::ProbeResults) -> Self {
        self.probes = Some(results);
        self
    }

    /// The probe results, if probes are run.
    pub fn probes(&self) -> Option<&crate::probe::results::ProbeResults> {
        self.probes.as_ref()
    }

    /// Whether `pod`'s volumes are ready, and where they are: from the volume pair's stores among
    /// `inputs` (see [`VolumeGate`]; the kubelet's WaitForAttachAndMount). Without them, pods get
    /// no volumes.
    pub fn volumes(&self, inputs: &PodInputs, pod: &DesiredPod) -> VolumeReadiness {
        match &inputs.volumes {
            Some(gate) => gate.check(pod),
            None => VolumeReadiness::Ready(Arc::default()),
        }
    }

    /// The verdict on `uid` in the verdict store among `inputs` (read-only; the
    /// [`VerdictPopulator`](crate::eviction::populator::VerdictPopulator) writes it): a pod
    /// starts only once admitted, pods refused at admission never start, evicted pods are killed
    /// and never start again. `None`: no verdict, or verdicts are not applied.
    pub fn verdict(&self, inputs: &PodInputs, uid: &str) -> Option<Arc<Verdict>> {
        inputs.verdicts.as_ref()?.get(&uid.to_owned())
    }

    /// Admission's word on the requests `pod`'s spec asks for now (see
    /// [`Verdict::resize_for`](crate::model::verdict::Verdict::resize_for)); `None`: not decided
    /// yet. Without a verdict store among `inputs`, always `Accepted`.
    pub fn resize_decision(
        &self,
        inputs: &PodInputs,
        pod: &DesiredPod,
    ) -> Option<crate::model::verdict::ResizeDecision> {
        match &inputs.verdicts {
            Some(store) => store.get(&pod.uid().to_owned())?.resize_for(pod),
            None => Some(crate::model::verdict::ResizeDecision::Accepted),
        }
    }

    /// The sandbox pair's stores among `inputs` (its actual store, and its operation status when
    /// given): containers start in the ready sandbox it reports, and wait while there is none.
    /// Without them, no pod has a sandbox.
    pub fn sandboxes<'a>(&self, inputs: &'a PodInputs) -> Option<&'a crate::sandbox::status::SandboxView> {
        inputs.sandboxes.as_ref()
    }

    /// The pod `uid`'s sandboxes as the sandbox pair has them, newest first (see
    /// [`SandboxView::sandboxes`](crate::sandbox::status::SandboxView::sandboxes): one that no longer
    /// fits `pod` shows as not ready); none without the sandbox pair's stores among `inputs`.
    pub fn pod_sandboxes(
        &self,
        inputs: &PodInputs,
        pod: Option<&DesiredPod>,
        uid: &str,
    ) -> Vec<SandboxRecord> {
        self.sandboxes(inputs).map(|view| view.sandboxes(pod, uid)).unwrap_or_default()
    }

    /// Prunes dead containers of desired pods by `policy` when nothing more urgent is due for the
    /// pod (see [`super::gc`]; dead sandboxes are the sandbox pair's); the node-wide decision
    /// (`maxContainers`) is the surplus store among the inputs
    /// ([`SurplusPopulator`](super::gc::SurplusPopulator)). Without it, only the pod driver's own
    /// clean-up runs.
    pub fn with_container_gc(mut self, policy: super::gc::ContainerGcPolicy) -> Self {
        self.container_gc = Some(policy);
        self
    }

    /// The crash-loop timing.
    pub fn backoff(&self) -> &CrashLoopBackOff {
        &self.backoff
    }
}

/// Where a pod stands, as far as starting it goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Progress {
    /// Needs its sandbox.
    NoSandbox,
    /// Waits for init container `index` (running, or backing off).
    Initializing(usize),
    /// Init containers done; app containers are starting or running.
    Started,
    /// Every container finished for good (restartPolicy Never/OnFailure): the pod is done.
    Finished {
        /// Whether all succeeded.
        succeeded: bool,
    },
}

/// What the reconciler decides for one container.
enum Step {
    /// Start an attempt: its restart count and the restart count its spec first ran at.
    Start(u32, u32),
    Wait(Duration),
    Done,
    Running,
}

impl PodReconciler {
    /// The restart count of the next attempt of `name`.
    fn next_restart(actual: &PodActual, name: &str) -> u32 {
        actual
            .containers
            .iter()
            .filter(|c| c.name == name)
            .map(|c| c.restart_count.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// Whether `record` was created from `container`'s spec as it is now: its hash without `resources`
    /// (resources are resized in place), or its full hash on a container that lacks that one; a record
    /// without either counts as the same.
    fn same_spec(record: &ContainerRecord, container: &Container) -> bool {
        match record.spec_hash_without_resources.as_deref() {
            Some(h) => h == container_hash_without_resources(container),
            None => record.spec_hash.as_deref().is_none_or(|h| h == container_hash(container)),
        }
    }

    /// The attempt after `newest` (the container's newest record, if any) at restart count `restart_count`:
    /// the crash-loop back-off goes on counting from where `newest`'s spec first ran when the spec is the
    /// same, and starts afresh at this attempt when it changed (the kubelet keys its back-off by the
    /// container's spec hash: a new image is not held back by the old one's crashes).
    fn attempt(newest: Option<&ContainerRecord>, container: &Container, restart_count: u32) -> Step {
        let since = match newest {
            Some(prev) if Self::same_spec(prev, container) => {
                prev.backoff_since.unwrap_or(0).min(restart_count)
            }
            _ => restart_count,
        };
        Step::Start(restart_count, since)
    }

    /// For a container that should run (or have run), what to do now.
    fn step(
        &self,
        cx: &Cx<'_>,
        actual: &PodActual,
        container: &Container,
        restarts: impl Fn(i32) -> bool,
    ) -> Step {
        let wall = cx.wall;
        let name = container.name.as_str();
        let sandbox = cx.sandbox.map(|s| s.id.as_str()).unwrap_or_default();
        let newest = actual.container(name);
        match newest {
            // Everything starts afresh in a new sandbox (restart counts go on).
            Some(c) if c.sandbox_id != sandbox => {
                Self::attempt(newest, container, Self::next_restart(actual, name))
            }
            Some(c) if c.state == ContainerState::Running => Step::Running,
            Some(c) if c.state == ContainerState::Exited => {
                if !restarts(c.exit_code) {
                    return Step::Done;
                }
                let since =
                    Duration::from_nanos(u64::try_from(wall.saturating_sub(c.finished_at)).unwrap_or(0));
                // A changed spec restarts at once, as the first exit of a new one does.
                let delay =
                    if Self::same_spec(c, container) { self.backoff.delay(c) } else { Duration::ZERO };
                if since >= delay {
                    Self::attempt(newest, container, c.restart_count.saturating_add(1))
                } else {
                    Step::Wait(delay - since)
                }
            }
            // Missing, only in an older sandbox, or stuck in Created/Unknown: start a new attempt.
            _ => Self::attempt(newest, container, Self::next_restart(actual, name)),
        }
    }

    /// Where `pod` stands, from its containers `actual` and its newest sandbox `sandbox` (as the
    /// sandbox pair has it).
    pub(crate) fn progress(
        &self,
        pod: &DesiredPod,
        actual: &PodActual,
        sandbox: Option<&SandboxRecord>,
    ) -> Progress {
        let policy = pod.restart_policy();
        let Some(sandbox) = sandbox.filter(|s| s.ready) else {
            if let Some(finished) = self.finished(pod, actual) {
                return finished;
            }
            return Progress::NoSandbox;
        };
        let sandbox = sandbox.id.as_str();
        let in_sandbox = |name: &str| actual.container(name).filter(|c| c.sandbox_id == sandbox);
        let inits = pod.init_containers();
        for (i, init) in inits.iter().enumerate() {
            if is_sidecar(init) {
                // A sidecar lets the next container start once it is started (running, past its
                // startup probe). Once a later container exists in this sandbox the sidecar was passed:
                // its exits are restarts beside the others, not a return to initialization.
                let started = in_sandbox(&init.name)
                    .is_some_and(|c| probe_status::container_started(init, c, self.probes.as_ref()));
                let passed =
                    inits[i + 1..].iter().chain(pod.containers()).any(|c| in_sandbox(&c.name).is_some());
                if started || passed {
                    continue;
                }
                return Progress::Initializing(i);
            }
            // Init containers run again in a new sandbox, as the kubelet does.
            let done =
                in_sandbox(&init.name).is_some_and(|c| c.state == ContainerState::Exited && c.exit_code == 0);
            if done {
                continue;
            }
            if policy == RestartPolicy::Never
                && actual.container(&init.name).is_some_and(|c| c.state == ContainerState::Exited)
            {
                return Progress::Finished { succeeded: false };
            }
            return Progress::Initializing(i);
        }
        self.finished(pod, actual).unwrap_or(Progress::Started)
    }

    /// Whether every app container has finished for good (sidecars do not count: they are
    /// stopped once the app containers are done).
    fn finished(&self, pod: &DesiredPod, actual: &PodActual) -> Option<Progress> {
        finished(pod, actual).map(|succeeded| Progress::Finished { succeeded })
    }

    /// A start of the container `name` of kind `kind` in the pod's sandbox, once its volumes are ready.
    fn start_op(
        &self,
        cx: &Cx<'_>,
        pod: &DesiredPod,
        name: &str,
        kind: ContainerKind,
        (restart_count, backoff_since): (u32, u32),
    ) -> Plan<PodOp> {
        let VolumeReadiness::Ready(volumes) = self.volumes(cx.inputs, pod) else {
            // Woken when the volumes change.
            return Plan::Idle;
        };
        Plan::Run(PodOp::StartContainer {
            pod: Arc::new(pod.clone()),
            sandbox_id: cx.sandbox.map(|s| s.id.clone()).unwrap_or_default(),
            name: name.to_owned(),
            kind,
            restart_count,
            backoff_since,
            volumes,
        })
    }

    /// In-place resize: the first running container whose cgroup settings differ from what its
    /// spec asks is updated (or restarted, when its `resizePolicy` says `RestartContainer` for a
    /// changed resource), once admission accepted the pod's new requests (its verdict says
    /// neither `Deferred` nor `Infeasible`; the verdict populator decides again when other pods
    /// change, and the pod is woken when its verdict does). `Err(None)`: nothing to resize now.
    fn resize(
        &self,
        cx: &Cx<'_>,
        pod: &DesiredPod,
        actual: &PodActual,
    ) -> Result<Plan<PodOp>, Option<Duration>> {
        use crate::model::verdict::ResizeDecision;
        let found = pod.long_running().find_map(|c| {
            let r = actual.container(&c.name).filter(|r| r.state == ContainerState::Running)?;
            let applied = r.applied?;
            let wanted = CgroupResources::of(c);
            (wanted.cpu_differs(&applied) || wanted.memory_differs(&applied)).then_some((c, r, applied))
        });
        let Some((c, record, applied)) = found else { return Err(None) };
        match self.resize_decision(cx.inputs, pod) {
            // The container keeps what it has; status says why.
            None | Some(ResizeDecision::Deferred | ResizeDecision::Infeasible) => return Err(None),
            Some(ResizeDecision::Accepted) => {}
        }
        if needs_restart(c, &applied) {
            return Ok(Plan::Run(PodOp::KillContainers {
                ids: vec![record.id.clone()],
                grace: pod.grace_period(),
            }));
        }
        Ok(Plan::Run(PodOp::ResizeContainer { id: record.id.clone(), resources: CgroupResources::of(c) }))
    }

    /// Restarts (after their back-off) the sidecars among the first `upto` init containers that
    /// are not running: a start to run now, or how long until the next one is due.
    fn restart_sidecars(
        &self,
        cx: &Cx<'_>,
        pod: &DesiredPod,
        actual: &PodActual,
        upto: usize,
    ) -> Result<Option<Duration>, Plan<PodOp>> {
        let mut wait: Option<Duration> = None;
        for (_, sidecar) in pod.sidecars().take_while(|(i, _)| *i < upto) {
            match self.step(cx, actual, sidecar, |_| true) {
                Step::Start(restart_count, since) => {
                    return Err(self.start_op(
                        cx,
                        pod,
                        &sidecar.name,
                        ContainerKind::Init,
                        (restart_count, since),
                    ));
                }
                Step::Wait(d) => wait = Some(wait.map_or(d, |w| w.min(d))),
                Step::Running | Step::Done => {}
            }
        }
        Ok(wait)
    }

    /// The start of the first ephemeral container that was never created, as the kubelet's
    /// `computePodActions`: one with any record (in any sandbox, exited or not) is never started
    /// again, whatever its exit, nor after a nodelet restart or a new sandbox.
    ///
    /// A start that failed is retried after the engine's back-off, and a pod whose next operation backs off
    /// is not planned again before it runs; so while something else of the pod is due sooner (`due`: a
    /// container's crash-loop back-off ends), the pod waits for that instead, whose start then goes first.
    fn start_ephemeral(
        &self,
        cx: &Cx<'_>,
        pod: &DesiredPod,
        actual: &PodActual,
        due: Option<Duration>,
    ) -> Option<Plan<PodOp>> {
        let missing = pod.ephemeral_specs().iter().find(|c| actual.container(&c.name).is_none())?;
        if let Some(due) = due
            && self.ephemeral_retry_at(cx.inputs, pod.uid()).is_some_and(|at| at > cx.now + due)
        {
            return None;
        }
        match self.start_op(cx, pod, &missing.name, ContainerKind::Ephemeral, (0, 0)) {
            start @ Plan::Run(_) => Some(start),
            _ => None,
        }
    }

    /// Whether the pod's last operation failed (the engine's operation status among `inputs` keeps it).
    fn has_failure(inputs: &PodInputs, uid: &str) -> bool {
        Self::failures(inputs).is_some_and(|f| f.contains_key(&uid.to_owned()))
    }

    /// The pod engine's last failed operation of each pod, if given as a side input.
    fn failures(inputs: &PodInputs) -> Option<&Store<PodUid, super::status::PodOpStatus>> {
        inputs.failures.as_ref()
    }

    /// When the engine retries the pod's failed ephemeral container start, if that is its last failure.
    fn ephemeral_retry_at(&self, inputs: &PodInputs, uid: &str) -> Option<tokio::time::Instant> {
        let status = Self::failures(inputs)?.get(&uid.to_owned())?;
        match &status.op {
            PodOp::StartContainer { kind: ContainerKind::Ephemeral, .. } => status.retry_at,
            _ => None,
        }
    }

    fn plan_running(&self, cx: &Cx<'_>, pod: &DesiredPod, actual: &PodActual) -> Plan<PodOp> {
        let policy = pod.restart_policy();
        match self.progress(pod, actual, cx.sandbox) {
            Progress::Finished { .. } => {
                // Keep the exited containers (logs, status); the sandbox pair releases the sandbox
                // once none runs.
                if actual.any_running() {
                    return Plan::Run(PodOp::KillPod { grace: pod.grace_period(), remove: false });
                }
                Plan::Idle
            }
            Progress::NoSandbox => {
                if actual.any_running() {
                    // The sandbox died (or no longer fits the pod) under running containers: kill
                    // them; the sandbox pair then replaces it.
                    return Plan::Run(PodOp::KillPod { grace: pod.grace_period(), remove: false });
                }
                // The sandbox pair makes one; woken when its actual store changes.
                Plan::Idle
            }
            // Containers (sidecars too) whose liveness or startup probe failed are killed; they
            // restart as after any exit.
            Progress::Initializing(_) | Progress::Started
                if let Some((ids, grace)) =
                    self.probes.as_ref().and_then(|r| probe_status::unhealthy(pod, actual, r)) =>
            {
                Plan::Run(PodOp::KillContainers { ids, grace })
            }
            Progress::Initializing(i) => {
                let earlier = match self.restart_sidecars(cx, pod, actual, i) {
                    Ok(wait) => wait,
                    Err(start) => return start,
                };
                let init = &pod.init_containers()[i];
                let restarts = |code: i32| is_sidecar(init) || (code != 0 && policy != RestartPolicy::Never);
                match self.step(cx, actual, init, restarts) {
                    Step::Start(restart_count, since) => {
                        self.start_op(cx, pod, &init.name, ContainerKind::Init, (restart_count, since))
                    }
                    Step::Wait(d) => Plan::RecheckAfter(earlier.map_or(d, |w| w.min(d))),
                    Step::Running | Step::Done => earlier.map_or(Plan::Idle, Plan::RecheckAfter),
                }
            }
            Progress::Started => {
                // Containers whose spec changed are killed first; the next pass starts them again.
                let changed: Vec<String> = pod
                    .containers()
                    .iter()
                    .filter_map(|c| {
                        let r = actual.container(&c.name)?;
                        // Resources are left out where the container has that hash: they are resized in place.
                        let stale = r.state == ContainerState::Running && !Self::same_spec(r, c);
                        stale.then(|| r.id.clone())
                    })
                    .collect();
                if !changed.is_empty() {
                    return Plan::Run(PodOp::KillContainers { ids: changed, grace: pod.grace_period() });
                }
                let resize_wait = match self.resize(cx, pod, actual) {
                    Ok(plan) => return plan,
                    Err(wait) => wait,
                };
                // Sidecars that exited are restarted (with back-off) whatever the pod's restart policy.
                let mut wait = match self.restart_sidecars(cx, pod, actual, usize::MAX) {
                    Ok(wait) => wait,
                    Err(start) => return start,
                };
                if let Some(d) = resize_wait {
                    wait = Some(wait.map_or(d, |w| w.min(d)));
                }
                for c in pod.containers() {
                    match self.step(cx, actual, c, |code| policy.restarts(code)) {
                        Step::Start(restart_count, since) => {
                            return self.start_op(
                                cx,
                                pod,
                                &c.name,
                                ContainerKind::App,
                                (restart_count, since),
                            );
                        }
                        Step::Wait(d) => wait = Some(wait.map_or(d, |w| w.min(d))),
                        Step::Running | Step::Done => {}
                    }
                }
                // Ephemeral containers last: nothing of the pod itself waits for them.
                if let Some(start) = self.start_ephemeral(cx, pod, actual, wait) {
                    return start;
                }
                wait.map_or(Plan::Idle, Plan::RecheckAfter)
            }
        }
    }
}

impl Reconciler<DesiredPod, PodActual> for PodReconciler {
    type Key = PodUid;
    type Op = PodOp;
    type Inputs = PodInputs;

    fn reconcile(&self, view: &View<'_, PodUid, DesiredPod, PodActual, PodInputs>) -> Plan<PodOp> {
        if view.actual.is_some_and(|a| a.needs_refresh) {
            return Plan::Run(PodOp::Refresh);
        }
        let inputs = view.inputs;
        // Until the sandbox pair has read the runtime, a pod would look as if its sandbox were gone
        // (the node's engine waits for that store before it plans at all).
        if inputs.sandboxes.as_ref().is_some_and(|s| !s.actual().is_synced()) {
            return Plan::Idle;
        }
        let (actual, sandboxes) = match (view.actual, view.desired) {
            (Some(a), desired) => (Some(Cow::Borrowed(a)), self.pod_sandboxes(inputs, desired, &a.uid)),
            // A pod the runtime listing has not shown yet may already have the sandbox the sandbox
            // pair just made (its own state read put it in its store): start the containers in it
            // now rather than after the next relist. No container of it can exist unseen: every pod
            // with a sandbox is in the listing, and containers are only made by this pair.
            (None, Some(pod)) => match self.pod_sandboxes(inputs, Some(pod), pod.uid()) {
                sandboxes if sandboxes.is_empty() => (None, sandboxes),
                sandboxes => {
                    let unlisted = PodActual {
                        uid: pod.uid().to_owned(),
                        namespace: pod.namespace().to_owned(),
                        name: pod.name().to_owned(),
                        ..PodActual::default()
                    };
                    (Some(Cow::Owned(unlisted)), sandboxes)
                }
            },
            (None, None) => (None, Vec::new()),
        };
        let cx = Cx {
            inputs,
            sandbox: sandboxes.first(),
            wall: reconcile_engine::unix_nanos(view.wall),
            now: view.now,
        };
        match (view.desired, actual.as_deref()) {
            // The containers are removed; the sandbox pair then removes the sandboxes.
            (None, Some(actual)) if !actual.containers.is_empty() => {
                let grace = actual.termination_grace_secs.map_or(DEFAULT_GRACE_PERIOD, Duration::from_secs);
                Plan::Run(PodOp::KillPod { grace, remove: true })
            }
            (None, _) => Plan::Idle,
            (Some(pod), actual) => {
                // Deleted through the API: stop everything with the deletion's grace period and keep
                // the pod (its final status is written, then the API object deleted) until its source
                // drops it.
                if let Some(grace) = pod.deletion_grace() {
                    return match actual {
                        Some(a) if a.any_running() => Plan::Run(PodOp::KillPod { grace, remove: false }),
                        _ => Plan::Idle,
                    };
                }
                // Admission is the verdict populator's: no verdict yet, wait (woken when it comes).
                if let Some(verdicts) = &inputs.verdicts {
                    let Some(verdict) = verdicts.get(&pod.uid().to_owned()) else { return Plan::Idle };
                    if let Some(stopped) = verdict.stopped() {
                        return crate::pod::verdict::plan_stopped(actual, stopped);
                    }
                }
                let empty = PodActual::default();
                let actual = actual.unwrap_or(&empty);
                let next = self.plan_running(&cx, pod, actual);
                match &self.container_gc {
                    // Not while an operation's failure is on record: a prune that succeeded would replace
                    // it, and its event and waiting reason (a failed postStart hook, say) would be lost.
                    Some(policy) if !Self::has_failure(inputs, pod.uid()) => {
                        let gc = super::gc::ContainerGc { policy: *policy, surplus: inputs.surplus.clone() };
                        super::gc::after(&gc, cx.wall, pod, actual, next)
                    }
                    _ => next,
                }
            }
        }
    }

    fn uncertain(&self, _key: &PodUid, _op: &PodOp, actual: Option<&PodActual>) -> Update<PodActual> {
        // Whatever happened, the runtime knows: read it again before the next step.
        let mut next = actual.cloned().unwrap_or_default();
        next.needs_refresh = true;
        Update::Set(next)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use k8s_openapi::api::core::v1::Pod;
    use reconcile_engine::{Plan, Reconciler, View, from_unix_nanos, store};

    use super::{CrashLoopBackOff, PodInputs, PodReconciler};
    use crate::model::actual::{ContainerRecord, ContainerState, PodActual, PodSandboxes, SandboxRecord};
    use crate::model::pod::{DesiredPod, PodSource, PodUid};
    use crate::pod::ops::PodOp;
    use crate::sandbox::status::SandboxView;

    const EXITED_AT: i64 = 1_700_000_000_000_000_000;

    fn pod() -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        }))
        .expect("test pod");
        DesiredPod { pod, source: PodSource::Http }
    }

    /// Inputs with a sandbox pair whose actual store (synced) has pod `u` in the ready sandbox `s`.
    fn in_ready_sandbox() -> PodInputs {
        let (sandboxes, mut writer) = store::<PodUid, PodSandboxes>();
        let sandbox = SandboxRecord { id: "s".into(), ready: true, ..SandboxRecord::default() };
        writer.insert(
            "u".into(),
            PodSandboxes { uid: "u".into(), sandboxes: vec![sandbox], ..PodSandboxes::default() },
        );
        writer.mark_synced();
        PodInputs { sandboxes: Some(SandboxView::new(sandboxes, None)), ..PodInputs::default() }
    }

    /// The pod's container exited (code 1) at `EXITED_AT` after its first restart, in sandbox `s`.
    fn crashed(pod: &DesiredPod) -> PodActual {
        let spec = &pod.containers()[0];
        PodActual {
            uid: "u".into(),
            containers: vec![ContainerRecord {
                id: "c1".into(),
                name: "app".into(),
                sandbox_id: "s".into(),
                state: ContainerState::Exited,
                exit_code: 1,
                restart_count: 1,
                started_at: EXITED_AT - 1_000_000_000,
                finished_at: EXITED_AT,
                spec_hash: Some(super::container_hash(spec)),
                spec_hash_without_resources: Some(super::container_hash_without_resources(spec)),
                ..ContainerRecord::default()
            }],
            ..PodActual::default()
        }
    }

    /// The crash-loop back-off is measured with the view's wall clock, not the system's: the same
    /// record waits while the view's time is 2 s after the exit and restarts once it is 11 s after.
    #[test]
    fn the_crash_loop_back_off_is_measured_with_the_views_wall_clock() {
        let (desired, _dw) = store::<PodUid, DesiredPod>();
        let (actual, _aw) = store::<PodUid, PodActual>();
        let (pod, inputs) = (pod(), in_ready_sandbox());
        let record = crashed(&pod);
        let reconciler = PodReconciler::new(CrashLoopBackOff::default());
        let key: PodUid = "u".into();
        let plan_at = |wall: SystemTime| {
            let view = View::new(&key, Some(&pod), Some(&record), &desired, &actual)
                .with_inputs(&inputs)
                .with_wall(wall);
            reconciler.reconcile(&view)
        };
        // The first restart after a restart waits `initial` (10 s) from the exit.
        assert_eq!(
            plan_at(from_unix_nanos(EXITED_AT + 2_000_000_000)),
            Plan::RecheckAfter(Duration::from_secs(8))
        );
        assert!(matches!(
            plan_at(from_unix_nanos(EXITED_AT + 11_000_000_000)),
            Plan::Run(PodOp::StartContainer { restart_count: 2, .. })
        ));
    }

    /// A pod's sandboxes come from the sandbox pair's store alone: without it no pod has one and
    /// nothing starts; with it, the container starts in the sandbox that store has.
    #[test]
    fn containers_start_only_in_a_sandbox_of_the_sandbox_pairs_store() {
        let (desired, _dw) = store::<PodUid, DesiredPod>();
        let (actual, _aw) = store::<PodUid, PodActual>();
        let pod = pod();
        let listed = PodActual { uid: "u".into(), ..PodActual::default() };
        let reconciler = PodReconciler::new(CrashLoopBackOff::default());
        let key: PodUid = "u".into();
        let plan = |inputs: &PodInputs| {
            let view = View::new(&key, Some(&pod), Some(&listed), &desired, &actual).with_inputs(inputs);
            reconciler.reconcile(&view)
        };
        assert_eq!(plan(&PodInputs::default()), Plan::Idle, "no sandbox pair: no sandbox");
        assert!(matches!(
            plan(&in_ready_sandbox()),
            Plan::Run(PodOp::StartContainer { sandbox_id, .. }) if sandbox_id == "s"
        ));
    }
}

//! The eviction pair's reconciler: pure, it compares the thresholds (desired) with the newest
//! sample of the signals (actual) and plans one step of a pass at a time, which the
//! [`EvictionDriver`](super::driver::EvictionDriver) carries out.
//!
//! A pass over one sample goes through these steps, each an operation on [`EvictionKey::Node`]:
//!
//! 1. [`EvictionOp::Assess`]: the sample compared with the thresholds ([`EvictionState::observe`]:
//!    grace periods, minimum reclaim, the pressure transition period), the node's pressure
//!    conditions published (node status, admission, events, `nodelet_node_pressure`).
//! 2. With `localStorageCapacityIsolation`, every active pod over an emptyDir `sizeLimit` or its
//!    containers' `ephemeral-storage` limits ([`local_storage`](super::local_storage)) is evicted
//!    ([`EvictionOp::Evict`], the hard-eviction grace period); such a pass does nothing else.
//! 3. For the most urgent threshold met past its grace period: for a disk signal, node-level
//!    reclaim first ([`EvictionOp::Reclaim`]: container and image garbage collection, then the
//!    signals observed again) when the shared list of reclaimers ([`EvictionInputs::reclaimers`])
//!    holds one as the step is planned; the pass ends there when the threshold plus its minimum
//!    reclaim is no longer met.
//! 4. The pods' usage measured ([`EvictionOp::MeasureUsage`]), the active pods ranked
//!    ([`rank`](super::rank)) and one evicted ([`EvictionOp::Evict`]).
//!
//! A pass runs to its end (its operations are never given up for a newer sample); the next pass
//! takes the newest sample taken after the last step ended, so an eviction's effect (the driver
//! waits for the evicted pod to stop) shows before the next decision.
//!
//! The wall clock is not read here: grace and transition periods count on the samples' times
//! (`tokio::time`), timestamps are the driver's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{Key, Operation, Plan, Reconciler, Store, Update, View};
use tokio::time::Instant;
use tracing::debug;

use super::local_storage::{LocalStorage, check};
use super::rank::{Candidate, eviction_message, is_critical, rank};
use super::signal::{Observations, PodUsage};
use super::state::{EvictionState, Met, Policy, still_met};
use crate::model::actual::PodActual;
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::pressure::{Condition, Reclaimers};
use crate::model::verdict::Verdict;

/// The grace period of a pod evicted for a hard threshold (the kubelet's
/// `immediateEvictionGracePeriodSeconds`).
pub const HARD_EVICTION_GRACE: Duration = Duration::from_secs(1);

/// How long node-level reclaim may take before the step counts as uncertain (the pass then goes
/// on to rank the pods).
pub const RECLAIM_TIMEOUT: Duration = Duration::from_secs(300);

/// The eviction pair's settings: its desired state, at [`EvictionKey::Node`].
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Thresholds and the pressure transition period.
    pub policy: Policy,
    /// How often signals are sampled (the kubelet's 10 s).
    pub monitoring_period: Duration,
    /// `evictionMaxPodGracePeriod`: the longest grace period of a pod evicted for a soft
    /// threshold (its own period when shorter).
    pub max_pod_grace_period: Duration,
    /// How long to wait for an evicted pod to stop before the next pass (the kubelet's 30 s).
    pub pod_cleanup_timeout: Duration,
    /// `localStorageCapacityIsolation`: evict pods over their emptyDir `sizeLimit` or their
    /// containers' `ephemeral-storage` limits ([`local_storage`](super::local_storage)).
    pub local_storage_capacity_isolation: bool,
}

/// The keys of the eviction pair's stores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EvictionKey {
    /// The node: the thresholds (desired) and what the passes did (actual,
    /// [`NodeEviction`]). Every operation runs on it, one at a time.
    Node,
    /// The newest sample of the signals ([`Sample`], actual only), written by the
    /// [`SignalSampler`](super::sampler::SignalSampler). A child of [`Node`](Self::Node): a new
    /// sample plans the node again.
    Signals,
}

impl Key for EvictionKey {
    fn parent(&self) -> Option<Self> {
        match self {
            Self::Node => None,
            Self::Signals => Some(Self::Node),
        }
    }
}

/// One sample of the node's signals.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its number, counting up from 1.
    pub seq: u64,
    /// When it was taken.
    pub at: Instant,
    /// The signals observed.
    pub observations: Observations,
    /// The pods' local storage usage, newest measurement (with `localStorageCapacityIsolation`).
    pub local_storage: Option<LocalStorage>,
}

/// A pod the pair evicted: why and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRecord {
    /// The signal (`memory.available`) or local storage limit (`emptydirfs.limit`): the
    /// `kubelet_evictions_total` label.
    pub signal: &'static str,
    /// The kubelet's message.
    pub message: String,
    /// The time of the sample of the pass that evicted it.
    pub sample_at: Instant,
}

/// Where a pass stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// The sample was compared and the conditions published.
    Assessed,
    /// Node-level reclaim ran: the bytes freed, and the signals observed after (`None` when they
    /// could not be read).
    Reclaimed {
        /// Bytes freed.
        freed: u64,
        /// The signals after reclaim.
        after: Option<Observations>,
    },
    /// The pods' usage was measured for ranking.
    Measured {
        /// Usage per pod UID (empty when it could not be read).
        usage: BTreeMap<String, PodUsage>,
    },
    /// Pods were evicted: the pass is over.
    Evicted,
}

/// The pass over one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Pass {
    /// The sample's number.
    pub seq: u64,
    /// The sample's time.
    pub at: Instant,
    /// The threshold acted on: met past its grace period, the most urgent.
    pub act_on: Option<Met>,
    /// The pods over a local storage limit in the sample's measurement (with
    /// `localStorageCapacityIsolation`): evicted first, and then nothing else.
    pub over_limit: Vec<PodEviction>,
    /// Where it stands.
    pub stage: Stage,
}

/// What the eviction pair did: its actual state at [`EvictionKey::Node`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeEviction {
    /// What the comparison remembers between samples (first met, last seen, minimum reclaim).
    pub memory: EvictionState,
    /// The pressure conditions of the last pass.
    pub conditions: BTreeSet<Condition>,
    /// The current or last pass.
    pub pass: Option<Pass>,
    /// The pods evicted, while they are still desired.
    pub evicted: BTreeMap<PodUid, EvictionRecord>,
    /// When the last step ended: a new pass takes only a sample taken since.
    pub updated_at: Option<Instant>,
}

/// The eviction pair's actual values.
#[derive(Debug, Clone, PartialEq)]
pub enum EvictionActual {
    /// At [`EvictionKey::Node`].
    Node(Box<NodeEviction>),
    /// At [`EvictionKey::Signals`].
    Signals(Sample),
}

/// A pod to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEviction {
    /// The pod.
    pub uid: PodUid,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The kubelet's message.
    pub message: String,
    /// The grace period its containers are killed with.
    pub grace: Duration,
    /// The signal or local storage limit: the `kubelet_evictions_total` label.
    pub signal: &'static str,
}

/// One step of a pass. Every operation carries the node's actual value it leaves behind when
/// done ([`next`](EvictionOp::next)); the driver fills in what it measured.
#[derive(Debug, Clone, PartialEq)]
pub enum EvictionOp {
    /// Publishes the pressure conditions of a sample and remembers the comparison.
    Assess {
        /// The node's actual value after the step.
        next: Box<NodeEviction>,
        /// Whether the pass acts on a threshold (no pod over a local storage limit): announced
        /// as `EvictionThresholdMet`.
        announce: bool,
    },
    /// Node-level reclaim for a disk threshold, then the signals observed again.
    Reclaim {
        /// The node's actual value after the step (its pass's stage is set by the driver).
        next: Box<NodeEviction>,
        /// The threshold met.
        met: Box<Met>,
    },
    /// Measures the pods' usage, for ranking.
    MeasureUsage {
        /// The node's actual value after the step (its pass's stage is set by the driver).
        next: Box<NodeEviction>,
    },
    /// Evicts pods: their verdicts become `Evicted` (through the verdict populator), then waits
    /// for them to stop.
    Evict {
        /// The node's actual value after the step (the pods recorded, the pass over).
        next: Box<NodeEviction>,
        /// The pods.
        pods: Vec<PodEviction>,
        /// Over a local storage limit rather than under node pressure.
        over_limit: bool,
        /// How long to wait for each pod to stop.
        cleanup_timeout: Duration,
    },
}

impl EvictionOp {
    /// The node's actual value the step leaves behind.
    pub fn next(&self) -> &NodeEviction {
        match self {
            Self::Assess { next, .. }
            | Self::Reclaim { next, .. }
            | Self::MeasureUsage { next }
            | Self::Evict { next, .. } => next,
        }
    }

    /// What the step leaves behind when its result is unknown (it timed out): reclaim as if
    /// nothing was freed and the signals unknown, usage unknown, evictions as done.
    pub fn next_uncertain(&self) -> NodeEviction {
        let mut next = self.next().clone();
        let stage = match self {
            Self::Reclaim { .. } => Some(Stage::Reclaimed { freed: 0, after: None }),
            Self::MeasureUsage { .. } => Some(Stage::Measured { usage: BTreeMap::new() }),
            Self::Assess { .. } | Self::Evict { .. } => None,
        };
        if let (Some(stage), Some(pass)) = (stage, next.pass.as_mut()) {
            pass.stage = stage;
        }
        next
    }
}

impl Operation for EvictionOp {
    fn kind(&self) -> &'static str {
        match self {
            Self::Assess { .. } => "assess",
            Self::Reclaim { .. } => "reclaim",
            Self::MeasureUsage { .. } => "measure",
            Self::Evict { .. } => "evict",
        }
    }

    fn timeout(&self) -> Option<Duration> {
        match self {
            Self::Reclaim { .. } => Some(RECLAIM_TIMEOUT),
            Self::Evict { pods, cleanup_timeout, .. } => {
                let n = u32::try_from(pods.len()).unwrap_or(u32::MAX);
                Some(cleanup_timeout.saturating_mul(n).saturating_add(Duration::from_secs(30)))
            }
            Self::Assess { .. } | Self::MeasureUsage { .. } => None,
        }
    }

    /// A step runs to its end: a newer sample waits for the pass to finish.
    fn given_up_for(&self, _next: Option<&Self>) -> bool {
        false
    }
}

/// What the reconciler reads besides its own stores: the pod stores (which pods are active, what
/// they ask for and use) and the node-level reclaimers there are to try.
#[derive(Debug, Clone)]
pub struct EvictionInputs {
    /// The desired pods.
    pub desired: Store<PodUid, DesiredPod>,
    /// What the runtime runs of them.
    pub actual: Store<PodUid, PodActual>,
    /// Their verdicts (pods already stopped are not candidates).
    pub verdicts: Store<PodUid, Verdict>,
    /// The node-level reclaimers, the list the driver tries (shared: a reclaimer added to it later,
    /// by an extension, counts from then on). Read when a step is planned: reclaim is planned for a
    /// disk signal only while the list holds one.
    pub reclaimers: Reclaimers,
}

/// The eviction reconciler. Its side inputs ([`Reconciler::Inputs`]) are [`EvictionInputs`],
/// given to the engine with
/// [`EngineBuilder::build_with`](reconcile_engine::EngineBuilder::build_with).
#[derive(Debug, Default)]
pub struct EvictionReconciler;

impl EvictionReconciler {
    /// A reconciler.
    pub fn new() -> Self {
        Self
    }

    /// The pods that may be evicted: desired, admitted, not evicted yet, running something.
    fn active_pods(pods: &EvictionInputs, node: &NodeEviction) -> Vec<Arc<DesiredPod>> {
        pods.desired
            .entries()
            .into_iter()
            .filter(|(uid, _)| !node.evicted.contains_key(uid))
            .filter(|(uid, _)| pods.verdicts.get(uid).is_none_or(|v| v.is_admitted()))
            .filter(|(uid, _)| pods.actual.get(uid).is_some_and(|a| a.any_running()))
            .map(|(_, p)| p)
            .collect()
    }

    /// The active pods over a local storage limit of `sample`'s measurement, critical ones left
    /// out.
    fn over_limit(pods: &EvictionInputs, node: &NodeEviction, measured: &LocalStorage) -> Vec<PodEviction> {
        let mut out = Vec::new();
        for pod in Self::active_pods(pods, node) {
            let Some(usage) = measured.pods.get(pod.uid()) else { continue };
            let Some(exceeded) = check(&pod, usage, measured.dedicated_image_fs) else { continue };
            if is_critical(&pod) {
                debug!(pod = %pod.name(), namespace = %pod.namespace(), message = %exceeded.message,
                    "cannot evict a critical pod over its local storage limit");
                continue;
            }
            out.push(PodEviction {
                uid: pod.uid().to_owned(),
                namespace: pod.namespace().to_owned(),
                name: pod.name().to_owned(),
                message: exceeded.message,
                grace: HARD_EVICTION_GRACE,
                signal: exceeded.signal.as_str(),
            });
        }
        out
    }

    /// Compares a new sample: the first step of a pass.
    fn assess(
        pods: &EvictionInputs,
        config: &EvictionConfig,
        node: &NodeEviction,
        sample: &Sample,
    ) -> EvictionOp {
        let mut memory = node.memory.clone();
        let assessment = memory.observe(&config.policy, &sample.observations, sample.at);
        let act_on = assessment.act_on.first().cloned();
        let mut evicted = node.evicted.clone();
        evicted.retain(|uid, _| pods.desired.contains_key(uid));
        let mut next = NodeEviction {
            memory,
            conditions: assessment.conditions,
            pass: None,
            evicted,
            updated_at: node.updated_at,
        };
        let over_limit = match &sample.local_storage {
            Some(measured) if config.local_storage_capacity_isolation => {
                Self::over_limit(pods, &next, measured)
            }
            _ => Vec::new(),
        };
        let announce = act_on.is_some() && over_limit.is_empty();
        next.pass = Some(Pass { seq: sample.seq, at: sample.at, act_on, over_limit, stage: Stage::Assessed });
        EvictionOp::Assess { next: Box::new(next), announce }
    }

    /// The next step of `pass`, if it is not over.
    fn step(
        &self,
        pods: &EvictionInputs,
        config: &EvictionConfig,
        node: &NodeEviction,
        pass: &Pass,
    ) -> Option<EvictionOp> {
        let with_stage = |stage: Stage| {
            let mut next = node.clone();
            if let Some(p) = next.pass.as_mut() {
                p.stage = stage;
            }
            Box::new(next)
        };
        if pass.stage == Stage::Assessed && !pass.over_limit.is_empty() {
            return Some(self.evict(config, node, pass, pass.over_limit.clone(), true));
        }
        let met = pass.act_on.as_ref()?;
        let signal = met.threshold.signal;
        match &pass.stage {
            Stage::Assessed if signal.is_disk() && !pods.reclaimers.is_empty() => Some(EvictionOp::Reclaim {
                next: with_stage(Stage::Reclaimed { freed: 0, after: None }),
                met: Box::new(met.clone()),
            }),
            Stage::Reclaimed { after: Some(after), .. } if !still_met(&met.threshold, after) => None,
            Stage::Assessed | Stage::Reclaimed { .. } => {
                if Self::active_pods(pods, node).is_empty() {
                    return None;
                }
                Some(EvictionOp::MeasureUsage {
                    next: with_stage(Stage::Measured { usage: BTreeMap::new() }),
                })
            }
            Stage::Measured { usage } => {
                let active = Self::active_pods(pods, node);
                let candidates: Vec<Candidate<'_>> = active
                    .iter()
                    .map(|p| Candidate { pod: p, usage: usage.get(p.uid()).cloned().unwrap_or_default() })
                    .collect();
                let ranked = rank(signal, candidates);
                let victim = ranked.first()?;
                let grace = if met.threshold.is_hard() {
                    HARD_EVICTION_GRACE
                } else {
                    victim.pod.grace_period().min(config.max_pod_grace_period)
                };
                let pod = PodEviction {
                    uid: victim.pod.uid().to_owned(),
                    namespace: victim.pod.namespace().to_owned(),
                    name: victim.pod.name().to_owned(),
                    message: eviction_message(met, victim),
                    grace,
                    signal: signal.as_str(),
                };
                Some(self.evict(config, node, pass, vec![pod], false))
            }
            Stage::Evicted => None,
        }
    }

    fn evict(
        &self,
        config: &EvictionConfig,
        node: &NodeEviction,
        pass: &Pass,
        pods: Vec<PodEviction>,
        over_limit: bool,
    ) -> EvictionOp {
        let mut next = node.clone();
        for p in &pods {
            next.evicted.insert(
                p.uid.clone(),
                EvictionRecord { signal: p.signal, message: p.message.clone(), sample_at: pass.at },
            );
        }
        if let Some(p) = next.pass.as_mut() {
            p.stage = Stage::Evicted;
        }
        EvictionOp::Evict {
            next: Box::new(next),
            pods,
            over_limit,
            cleanup_timeout: config.pod_cleanup_timeout,
        }
    }

    /// Plans for the node: the next step of the current pass, else a pass over the newest sample
    /// taken since the last step.
    pub fn plan(
        &self,
        pods: &EvictionInputs,
        config: &EvictionConfig,
        node: &NodeEviction,
        sample: Option<&Sample>,
    ) -> Plan<EvictionOp> {
        if let Some(pass) = &node.pass
            && let Some(op) = self.step(pods, config, node, pass)
        {
            return Plan::Run(op);
        }
        match sample {
            Some(s)
                if node.pass.as_ref().is_none_or(|p| s.seq > p.seq)
                    && node.updated_at.is_none_or(|t| s.at >= t) =>
            {
                Plan::Run(Self::assess(pods, config, node, s))
            }
            _ => Plan::Idle,
        }
    }
}

impl Reconciler<EvictionConfig, EvictionActual> for EvictionReconciler {
    type Key = EvictionKey;
    type Op = EvictionOp;
    type Inputs = EvictionInputs;

    fn reconcile(
        &self,
        view: &View<'_, EvictionKey, EvictionConfig, EvictionActual, EvictionInputs>,
    ) -> Plan<EvictionOp> {
        let (EvictionKey::Node, Some(config)) = (view.key, view.desired) else { return Plan::Idle };
        let none;
        let node = match view.actual {
            Some(EvictionActual::Node(n)) => &**n,
            _ => {
                none = NodeEviction::default();
                &none
            }
        };
        let sample = view.actual_store.get(&EvictionKey::Signals);
        let sample = match sample.as_deref() {
            Some(EvictionActual::Signals(s)) => Some(s),
            _ => None,
        };
        self.plan(view.inputs, config, node, sample)
    }

    fn uncertain(
        &self,
        _key: &EvictionKey,
        op: &EvictionOp,
        _actual: Option<&EvictionActual>,
    ) -> Update<EvictionActual> {
        Update::Set(EvictionActual::Node(Box::new(op.next_uncertain())))
    }
}

//! Pod sources: the populators of the desired pod store.
//!
//! ```text
//!  FileSource (--pod-manifest-path) ──┐ full set of its pods
//!  UrlSource  (--manifest-url)     ───┤
//!  HttpSource (--manifest-http-addr) ─┼──▶ SourceHandle ──▶ PodConfig ──▶ desired Store<PodUid, DesiredPod>
//!  ApiPods    (--kubeconfig;           │    (one each)        (merge)  ──▶ SourceProblems
//!             cluster/src/pods.rs)  ──┘
//! ```
//!
//! [`PodConfig`] owns the single [`reconcile_engine::Writer`] of the desired store. Each source gets
//! a [`SourceHandle`] from [`PodConfig::add_source`] and reports its **full current set** of pods
//! (and problems) every time something changes; the pod config merges every source's set into the
//! store (`replace_all`: a pod its source no longer lists disappears); a pod that a source reports
//! again as the same `Arc` becomes the same store value as last time, neither copied nor compared,
//! so a report costs what changed in it rather than a copy of every pod. After
//! [`PodConfig::seal`], the store is marked synced once every source has reported once, so the
//! engine never tears down a pod because a source has not been read yet (the kubelet's
//! `SeenAllSources`).
//!
//! **Problems** (invalid documents, unreadable files, failed fetches) are logged, served as
//! `InvalidManifest` events and listed by `nodelet get`; at most 20 per location and 200 in all are kept,
//! the rest counted in a `… and N more problems` entry.
//!
//! **Duplicates.** Two pods with the same UID or the same `namespace/name`, in one source or
//! across sources: the one already in the store keeps running; otherwise the first in source
//! order (sources in the order they were added, pods in their source's order) wins. The other is
//! reported as a problem.
//!
//! **Problems** are visible through [`SourceProblems`]: every invalid document, unreadable file,
//! failed fetch and duplicate, with its location (file path or URL), the pod (`namespace/name`)
//! when known, and the message, which names the field like the API server. Each change is logged
//! once, at `warn` (new) or `info` (resolved).
//!
//! **A manifest that becomes broken keeps its last good pods.** The kubelet skips a file that
//! fails to parse, so its pods are stopped; nodelet instead keeps running the last good version of
//! every pod the broken manifest may still mean, and reports the error, so that a typo never stops
//! a running pod ("nothing a user wrote is lost"). Deleting the file (or the pod's document)
//! removes the pod. The last good version lives in memory: after a restart of nodelet a manifest
//! that is still broken contributes only its valid pods.
//!
//! **Ephemeral containers of static pods** (`nodelet debug`, [`PodConfig::add_ephemeral_container`]) are
//! kept in a state file ([`debug`]) and merged here into the static pods they were added to; API pods get
//! theirs from the API server.
//!
//! **Grace periods** above the node's bound (`nodelet.maxTerminationGracePeriodSeconds`,
//! [`PodConfig::with_grace_cap`]) are lowered here, for pods of every source.
//!
//! **`kubernetes.io/config.seen`** is set here, from the first time the pod config saw the UID
//! (RFC 3339, UTC); it stays the same while the pod stays, so rescans never change a desired pod. A
//! source may set it itself ([`SourceHandle::mark_seen`], the API source does): such a pod is written to
//! the store as the source's own `Arc`, not copied, so each desired pod is kept once.
//!
//! This crate (`nodelet-sources`) imports the configuration (`nodelet-config`), the servers' connection
//! limits and the `DebugError` they declare (`nodelet-server`), the pairs' model (`nodelet-resources`), the
//! engine's store and `nodelet-shared`; never the daemon or the cluster client (whose API pod source reports
//! through a [`SourceHandle`] like the others).

pub mod admission;
pub mod debug;
pub mod file;
pub mod http;
pub mod manifest;
pub mod url;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::EphemeralContainer;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::pod::grace::{GraceCap, cap_grace_periods};
use nodelet_resources::pod::validation::{CONFIG_SEEN_ANNOTATION, add_ephemeral_containers};
use reconcile_engine::{Store, Writer};
use tokio::sync::watch;

pub use admission::SecurityPolicies;
pub use file::ManifestObjects;

/// Errors of the pod config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodConfigError {
    /// A source with this name was added already.
    #[error("pod source {0:?} was added twice")]
    DuplicateSource(String),
    /// [`PodConfig::seal`] was called: the set of sources is fixed.
    #[error("pod source {0:?} added after the pod config was sealed")]
    Sealed(String),
}

/// A problem with a source: an invalid manifest, an unreadable file, a failed fetch, a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    /// Where: the file path, the URL, or `http endpoint`.
    pub location: String,
    /// The pod it is about, as `namespace/name`, when known: the name as written in the manifest
    /// (without a static pod's node suffix), except for duplicates, which name the pod as it would
    /// run (with the suffix).
    pub object: Option<String>,
    /// What is wrong; for an invalid pod, the field errors as the API server writes them
    /// (`spec.containers[0].image: Required value`).
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.object {
            Some(object) => write!(f, "{}: pod \"{object}\": {}", self.location, self.message),
            None => write!(f, "{}: {}", self.location, self.message),
        }
    }
}

/// A read-only, cheap-clone view of every source's current problems.
#[derive(Debug, Clone)]
pub struct SourceProblems {
    rx: watch::Receiver<Arc<Vec<Problem>>>,
    /// Counts the changes of the list (bumped after each one is published).
    version: Arc<AtomicU64>,
}

impl SourceProblems {
    /// The current problems, sorted by location, object and message.
    pub fn list(&self) -> Arc<Vec<Problem>> {
        self.rx.borrow().clone()
    }

    /// The number of changes of the list so far. Loaded before a [`list`](Self::list), it tells
    /// later whether the list may have changed since: not while the version is the same.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    #[cfg(test)]
    /// Whether there is no problem.
    pub fn is_empty(&self) -> bool {
        self.rx.borrow().is_empty()
    }

    #[cfg(test)]
    /// Waits until `predicate` holds for the problem list and returns that list (at once if it
    /// holds already). Cancel-safe.
    pub async fn wait_for(&self, mut predicate: impl FnMut(&[Problem]) -> bool) -> Arc<Vec<Problem>> {
        let mut rx = self.rx.clone();
        let found = rx.wait_for(|problems| predicate(problems)).await.map(|problems| problems.clone());
        // The sender lives in the pod config's shared state; if it is gone, report what is there.
        found.unwrap_or_else(|_| self.rx.borrow().clone())
    }
}

/// Merges the pod sources into the desired pod store; see the [module docs](self).
///
/// Cheap to clone; every clone and every [`SourceHandle`] share one store.
#[derive(Debug, Clone)]
pub struct PodConfig {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    node_name: String,
    store: Store<PodUid, DesiredPod>,
    problems: watch::Sender<Arc<Vec<Problem>>>,
    /// [`SourceProblems::version`].
    problems_version: Arc<AtomicU64>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    writer: Writer<PodUid, DesiredPod>,
    sources: Vec<SourceState>,
    sealed: bool,
    synced: bool,
    /// When each UID in the store was first seen (RFC 3339).
    first_seen: HashMap<PodUid, String>,
    /// Duplicates found by the last merge.
    merge_problems: Vec<Problem>,
    /// The ephemeral containers `nodelet debug` added to static pods, merged into them.
    debug: Option<debug::DebugState>,
    /// The security settings each source's pods are held to.
    security: Arc<SecurityPolicies>,
    /// The node's bound on every pod's grace periods (`nodelet.maxTerminationGracePeriodSeconds`).
    grace_cap: GraceCap,
    /// What the last merge wrote for each pod, by UID, with what it was made from.
    built: HashMap<PodUid, Built>,
}

/// A pod the merge wrote to the store, and what it made it from: while a source reports the same
/// `Arc` again (and nothing else it depends on changed) the same pod is written again, without
/// copying or comparing it.
#[derive(Debug)]
struct Built {
    /// The source's pod.
    input: Arc<DesiredPod>,
    /// Its `kubernetes.io/config.seen`.
    seen: String,
    /// The node's grace-period bound it was held to.
    grace_cap: GraceCap,
    /// The pod written to the store.
    output: Arc<DesiredPod>,
}

#[derive(Debug)]
struct SourceState {
    name: String,
    reported: bool,
    /// Shared with the source's own copy (the file and URL sources keep their last reading).
    pods: Vec<Arc<DesiredPod>>,
    problems: Vec<Problem>,
}

impl PodConfig {
    /// A pod config for the node `node_name` (static pods get its lowercased name as suffix),
    /// with an empty, not yet synced desired store.
    pub fn new(node_name: impl Into<String>) -> Self {
        let (store, writer) = reconcile_engine::store();
        let (problems, _) = watch::channel(Arc::new(Vec::new()));
        Self {
            shared: Arc::new(Shared {
                node_name: node_name.into(),
                store,
                problems,
                problems_version: Arc::default(),
                state: Mutex::new(State {
                    writer,
                    sources: Vec::new(),
                    sealed: false,
                    synced: false,
                    first_seen: HashMap::new(),
                    merge_problems: Vec::new(),
                    debug: None,
                    security: Arc::default(),
                    grace_cap: GraceCap::NONE,
                    built: HashMap::new(),
                }),
            }),
        }
    }

    /// The desired pod store (read side), keyed by pod UID.
    pub fn store(&self) -> Store<PodUid, DesiredPod> {
        self.shared.store.clone()
    }

    /// The problems of every source.
    pub fn problems(&self) -> SourceProblems {
        SourceProblems { rx: self.shared.problems.subscribe(), version: self.shared.problems_version.clone() }
    }

    #[cfg(test)]
    /// The node name the sources prepare pods for.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    /// Adds an enabled source named `name` (`file`, `url`, `http`, `api`) and returns the handle
    /// it reports through. Sources take precedence over later ones when pods collide. Add every
    /// source before [`seal`](Self::seal).
    pub fn add_source(&self, name: impl Into<String>) -> Result<SourceHandle, PodConfigError> {
        let name = name.into();
        let mut state = self.shared.lock();
        if state.sealed {
            return Err(PodConfigError::Sealed(name));
        }
        if state.sources.iter().any(|s| s.name == name) {
            return Err(PodConfigError::DuplicateSource(name));
        }
        let index = state.sources.len();
        state.sources.push(SourceState { name, reported: false, pods: Vec::new(), problems: Vec::new() });
        Ok(SourceHandle { shared: self.shared.clone(), index })
    }

    /// Keeps the ephemeral containers `nodelet debug` adds to static pods in `state` (loaded from its
    /// file) and merges them into those pods. Call before any source reports.
    pub fn with_debug_state(self, state: debug::DebugState) -> Self {
        self.shared.lock().debug = Some(state);
        self
    }

    /// Holds every source's pods to `security` (the default holds them to nothing). Call before any source
    /// reads its pods.
    pub fn with_security(self, security: SecurityPolicies) -> Self {
        self.shared.lock().security = Arc::new(security);
        self
    }

    /// Lowers every pod's grace periods to `cap` as it enters the desired store (see
    /// [`nodelet_resources::pod::grace`]). Call before any source reports.
    pub fn with_grace_cap(self, cap: GraceCap) -> Self {
        self.shared.lock().grace_cap = cap;
        self
    }

    /// Adds the ephemeral container `container` to the static pod `namespace/name` (its name with the node
    /// suffix): validated as the API server's `ephemeralcontainers` subresource would, saved (see
    /// [`debug`]), then merged into the desired pod, which the pod reconciler starts it in.
    pub fn add_ephemeral_container(
        &self,
        namespace: &str,
        name: &str,
        container: EphemeralContainer,
    ) -> Result<(), debug::DebugError> {
        let mut state = self.shared.lock();
        if state.debug.is_none() {
            return Err(debug::DebugError::NotSupported);
        }
        let found = self
            .shared
            .store
            .entries()
            .into_iter()
            .find(|(_, p)| p.namespace() == namespace && p.name() == name);
        let Some((uid, pod)) = found else {
            return Err(debug::DebugError::PodNotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        };
        if pod.source == PodSource::Api {
            return Err(debug::DebugError::ApiPod(format!("{namespace}/{name}")));
        }
        // Validated against the pod as it runs, its earlier ephemeral containers included, and admitted
        // with the new container as the pod's source would admit the whole pod (the API server's
        // PodSecurity admission does the same for `pods/ephemeralcontainers`).
        let with = add_ephemeral_containers(&pod, vec![container.clone()])?;
        state.security.for_source(&pod.source).admit(&with.pod).map_err(|refusal| {
            debug::DebugError::Forbidden(format!("pods \"{namespace}/{name}\" is forbidden: {refusal}"))
        })?;
        if let Some(debug) = state.debug.as_mut() {
            debug.add(&uid, container)?;
        }
        tracing::info!(pod = %format!("{namespace}/{name}"), uid = %uid, "ephemeral container added");
        self.shared.merge(&mut state);
        Ok(())
    }

    /// Declares that every source has been added: the store is marked synced as soon as each has
    /// reported once (at once if they all have, or if there is none).
    pub fn seal(&self) {
        let mut state = self.shared.lock();
        state.sealed = true;
        state.maybe_mark_synced();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn merge(&self, state: &mut State) {
        // A pod already in the store (the same UID, or the same name from the same place: an
        // edited manifest) goes first, so that a new duplicate never displaces a running pod.
        let mut current_uids: HashSet<(PodUid, PodSource)> = HashSet::new();
        let mut current_names: HashSet<(String, PodSource)> = HashSet::new();
        self.store.for_each(|uid, pod| {
            current_uids.insert((uid.clone(), pod.source.clone()));
            current_names.insert((full_name(pod), pod.source.clone()));
        });
        let candidates: Vec<&Arc<DesiredPod>> = state.sources.iter().flat_map(|s| s.pods.iter()).collect();
        let is_incumbent = |pod: &DesiredPod| {
            current_uids.contains(&(pod.uid().to_owned(), pod.source.clone()))
                || current_names.contains(&(full_name(pod), pod.source.clone()))
        };
        let ordered = candidates
            .iter()
            .filter(|p| is_incumbent(p))
            .chain(candidates.iter().filter(|p| !is_incumbent(p)));

        let mut accepted: Vec<Arc<DesiredPod>> = Vec::new();
        let mut by_uid: HashMap<String, String> = HashMap::new();
        let mut by_name: HashMap<String, String> = HashMap::new();
        let mut merge_problems = Vec::new();
        for pod in ordered {
            let uid = pod.uid().to_owned();
            let name = full_name(pod);
            let location = location_of(&pod.source);
            let clash = by_uid
                .get(&uid)
                .map(|other| ("UID", other))
                .or_else(|| by_name.get(&name).map(|other| ("name", other)));
            if let Some((what, other)) = clash {
                merge_problems.push(Problem {
                    location,
                    object: Some(format!("{}/{}", pod.namespace(), pod.name())),
                    message: format!(
                        "duplicate pod {what}: the pod from {other} is kept and this one is ignored"
                    ),
                });
                continue;
            }
            by_uid.insert(uid, location.clone());
            by_name.insert(name, location);
            accepted.push(Arc::clone(pod));
        }

        let uids: HashSet<&str> = accepted.iter().map(|pod| pod.uid()).collect();
        state.first_seen.retain(|uid, _| uids.contains(uid.as_str()));
        if let Some(debug) = state.debug.as_mut()
            && state.synced
        {
            // Pods that are gone (deleted or changed manifests) take their ephemeral containers along.
            debug.retain(|uid| uids.contains(uid));
        }
        let mut entries = Vec::with_capacity(accepted.len());
        let mut built = HashMap::with_capacity(accepted.len());
        for input in accepted {
            let uid = input.uid().to_owned();
            let added = (input.source != PodSource::Api)
                .then(|| state.debug.as_ref().map(|d| d.containers(&uid)))
                .flatten()
                .filter(|a| !a.is_empty());
            let seen = state.first_seen.entry(uid.clone()).or_insert_with(now_rfc3339);
            let output = match state.built.remove(&uid) {
                // (a pod with ephemeral containers merged in is never kept in `built`)
                Some(last)
                    if added.is_none()
                        && Arc::ptr_eq(&last.input, &input)
                        && last.seen == *seen
                        && last.grace_cap == state.grace_cap =>
                {
                    last.output
                }
                // A source that marked the pod seen already ([`SourceHandle::mark_seen`]), with nothing to add
                // or lower: the pod is written as the source made it, shared rather than copied, so that
                // it is kept once.
                _ if added.is_none()
                    && state.grace_cap == GraceCap::NONE
                    && seen_mark(&input) == Some(seen.as_str()) =>
                {
                    Arc::clone(&input)
                }
                _ => {
                    let mut pod = DesiredPod::clone(&input);
                    if let Some(added) = added {
                        // Admitted again, as when they were added: the source's settings may have changed
                        // since (a restart with a stricter level, a manifest file that is no longer root's).
                        let admitted = add_ephemeral_containers(&pod, added.to_vec())
                            .map_err(|e| e.to_string())
                            .and_then(|with| {
                                state
                                    .security
                                    .for_source(&pod.source)
                                    .admit(&with.pod)
                                    .map_err(|e| e.to_string())?;
                                Ok(with)
                            });
                        match admitted {
                            Ok(with) => pod = with,
                            Err(error) => {
                                tracing::warn!(pod = %full_name(&pod), %error, "ephemeral containers left out")
                            }
                        }
                    }
                    if cap_grace_periods(&mut pod.pod, state.grace_cap) {
                        tracing::debug!(pod = %full_name(&pod), max = ?state.grace_cap.max(), "grace periods lowered to the node's bound");
                    }
                    pod.pod
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(CONFIG_SEEN_ANNOTATION.into(), seen.clone());
                    Arc::new(pod)
                }
            };
            if added.is_none() {
                let (seen, grace_cap) = (seen.clone(), state.grace_cap);
                built.insert(uid.clone(), Built { input, seen, grace_cap, output: output.clone() });
            }
            entries.push((uid, output));
        }
        state.built = built;
        let changed = state.writer.replace_all_arc(entries);
        if changed > 0 {
            tracing::debug!(changed, pods = self.store.len(), "desired pods updated");
        }
        state.merge_problems = merge_problems;
        self.publish_problems(state);
    }

    fn publish_problems(&self, state: &State) {
        let previous = self.problems.borrow().clone();
        let all: BTreeSet<Problem> = cap_problems(
            state.sources.iter().flat_map(|s| s.problems.iter()).chain(state.merge_problems.iter()),
        );
        let before: BTreeSet<&Problem> = previous.iter().collect();
        let after: BTreeSet<&Problem> = all.iter().collect();
        if before == after {
            return;
        }
        for problem in after.difference(&before) {
            tracing::warn!(location = %problem.location, object = problem.object.as_deref(), "pod source problem: {}", problem.message);
        }
        for problem in before.difference(&after) {
            tracing::info!(location = %problem.location, object = problem.object.as_deref(), "pod source problem resolved: {}", problem.message);
        }
        self.problems.send_replace(Arc::new(all.into_iter().collect()));
        self.problems_version.fetch_add(1, Ordering::Release);
    }
}

/// Problems kept per location (a file, the URL, the HTTP endpoint); the rest are summed up in one more.
pub(crate) const MAX_PROBLEMS_PER_LOCATION: usize = 20;
/// Problems kept in all; the rest are summed up in one more.
pub(crate) const MAX_PROBLEMS: usize = 200;

/// The problems to keep and serve: sorted, at most [`MAX_PROBLEMS_PER_LOCATION`] per location and
/// [`MAX_PROBLEMS`] in all, each cut summed up as `… and N more problems`, so that what a bad manifest
/// costs in logs, `/api/v1/events` and memory stays small whatever its size.
fn cap_problems<'a>(problems: impl Iterator<Item = &'a Problem>) -> BTreeSet<Problem> {
    let mut by_location: BTreeMap<&str, BTreeSet<&Problem>> = BTreeMap::new();
    for p in problems {
        by_location.entry(p.location.as_str()).or_default().insert(p);
    }
    let more = |location: &str, n: usize| Problem {
        location: location.to_owned(),
        object: None,
        message: format!("… and {n} more problem{}", if n == 1 { "" } else { "s" }),
    };
    let mut kept = Vec::new();
    for (location, problems) in &by_location {
        kept.extend(problems.iter().take(MAX_PROBLEMS_PER_LOCATION).map(|p| (*p).clone()));
        if problems.len() > MAX_PROBLEMS_PER_LOCATION {
            kept.push(more(location, problems.len() - MAX_PROBLEMS_PER_LOCATION));
        }
    }
    if kept.len() > MAX_PROBLEMS {
        let cut = kept.len() - (MAX_PROBLEMS - 1);
        kept.truncate(MAX_PROBLEMS - 1);
        kept.push(more("pod sources", cut));
    }
    kept.into_iter().collect()
}

impl State {
    fn maybe_mark_synced(&mut self) {
        if self.sealed && !self.synced && self.sources.iter().all(|s| s.reported) {
            self.synced = true;
            self.writer.mark_synced();
            tracing::info!(
                sources = self.sources.len(),
                pods = self.writer.reader().len(),
                "every pod source has reported"
            );
        }
    }
}

/// Where a pod's source is, for problems.
fn location_of(source: &PodSource) -> String {
    match source {
        PodSource::File(path) => path.display().to_string(),
        PodSource::Url(url) => url::redact_url(url),
        PodSource::Http => http::LOCATION.to_owned(),
        PodSource::Api => "api".to_owned(),
    }
}

/// The pod's `kubernetes.io/config.seen`, if it has one.
fn seen_mark(pod: &DesiredPod) -> Option<&str> {
    pod.pod.metadata.annotations.as_ref()?.get(CONFIG_SEEN_ANNOTATION).map(String::as_str)
}

fn full_name(pod: &DesiredPod) -> String {
    format!("{}/{}", pod.namespace(), pod.name())
}

/// The current time as RFC 3339 (UTC, seconds).
fn now_rfc3339() -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(seconds)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| "1970-01-01T00:00:00Z".to_owned(), |t| t.to_string())
}

/// How one source reports to the [`PodConfig`]. Not `Clone`: one source, one handle.
#[derive(Debug)]
pub struct SourceHandle {
    shared: Arc<Shared>,
    index: usize,
}

impl SourceHandle {
    /// The node name to prepare pods for.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    /// The security settings of every source (a source applies its own, see
    /// `SecurityPolicies::for_source`).
    pub fn security(&self) -> Arc<SecurityPolicies> {
        self.shared.lock().security.clone()
    }

    /// Sets `pod`'s `kubernetes.io/config.seen` to when the pod config first saw its UID (now, if it has
    /// not seen it yet). A pod reported through [`report_shared`](Self::report_shared) with this mark (and
    /// nothing the pod config adds to it: no ephemeral containers, no grace-period bound) becomes the store's
    /// value as it is, the same `Arc`, instead of an annotated copy: the source's pod and the desired pod
    /// are then one object.
    pub fn mark_seen(&self, pod: &mut DesiredPod) {
        let seen =
            self.shared.lock().first_seen.entry(pod.uid().to_owned()).or_insert_with(now_rfc3339).clone();
        pod.pod
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONFIG_SEEN_ANNOTATION.into(), seen);
    }

    /// Replaces this source's pods and problems with `pods` and `problems` (its full current
    /// set) and merges every source into the desired store. Counts as the source's report for
    /// [`PodConfig::seal`].
    pub fn report(&self, pods: Vec<DesiredPod>, problems: Vec<Problem>) {
        self.report_shared(pods.into_iter().map(Arc::new).collect(), problems);
    }

    /// [`report`](Self::report) for a source that keeps its pods behind `Arc`s: the pod config
    /// shares them instead of keeping a copy of each.
    pub fn report_shared(&self, pods: Vec<Arc<DesiredPod>>, problems: Vec<Problem>) {
        let mut state = self.shared.lock();
        if let Some(source) = state.sources.get_mut(self.index) {
            source.pods = pods;
            source.problems = problems;
            source.reported = true;
        }
        self.shared.merge(&mut state);
        state.maybe_mark_synced();
    }

    /// Replaces this source's problems only (its pods stay as last reported; it does not count
    /// as a report): for a source that cannot be read yet.
    pub(crate) fn set_problems(&self, problems: Vec<Problem>) {
        let mut state = self.shared.lock();
        if let Some(source) = state.sources.get_mut(self.index) {
            source.problems = problems;
        }
        self.shared.publish_problems(&state);
    }

    /// Which of `pods` would collide (same UID or `namespace/name`) with a pod another source
    /// has in the store: one message per collision.
    pub(crate) fn conflicts(&self, pods: &[DesiredPod]) -> Vec<String> {
        let state = self.shared.lock();
        let mut uids = HashMap::new();
        let mut names = HashMap::new();
        for (i, source) in state.sources.iter().enumerate() {
            if i == self.index {
                continue;
            }
            for pod in &source.pods {
                if self.shared.store.get(&pod.uid().to_owned()).is_some_and(|p| p.source == pod.source) {
                    uids.insert(pod.uid().to_owned(), location_of(&pod.source));
                    names.insert(full_name(pod), location_of(&pod.source));
                }
            }
        }
        pods.iter()
            .filter_map(|pod| {
                let other = uids.get(pod.uid()).or_else(|| names.get(&full_name(pod)))?;
                Some(format!("pod \"{}\" (uid {}) is already provided by {other}", full_name(pod), pod.uid()))
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

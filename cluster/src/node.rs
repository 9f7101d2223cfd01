//! This node's `Node` object and `Lease` in the API, kept as the kubelet keeps them.
//!
//! - **Registration** (`registerNode`): the Node is created with the standard labels
//!   (`kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch` and their `beta.` forms),
//!   the `--node-labels` and the `registerWithTaints`; when it exists already its labels are brought
//!   up to date. A Node deleted later is registered again on the next status update.
//! - **Status**: computed every `nodeStatusUpdateFrequency` from the node view (the same Node that
//!   `/api/v1/nodes` shows: capacity, allocatable, addresses, conditions, nodeInfo, daemon
//!   endpoints) plus the images the runtime holds (at most 50, largest first, as the kubelet's
//!   `nodeStatusMaxImages`), and patched (strategic merge on `nodes/status`) when it changed (heartbeat
//!   times aside) or `nodeStatusReportFrequency` has passed since the last patch.
//! - **Lease** `kube-node-lease/<node>`: held by this node for `nodeLeaseDurationSeconds` and renewed
//!   every quarter of it plus up to 4 % more, random (10 to 10.4 s by default; the kubelet's lease controller
//!   renews with the same jitter), owned by the Node so it goes with it.
//!
//! The Lease renewals and the status patches go through heartbeat clients without the rate limit
//! (`kubeAPIQPS`), as the kubelet's heartbeat client (`QPS = -1`), so they never queue behind the node's
//! other requests: the status patches over the node's connection, the Lease renewals over a connection of
//! their own, and they run on the heartbeat lane (`super::lane`), so a node whose runtime is busy still
//! renews on time. Each is given up after `nodeStatusUpdateFrequency` (at most the lease duration), the
//! kubelet's heartbeat timeout. Registration uses the rate-limited client.
//!
//! A failed call is retried with back-off; nothing here ever touches a pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lane::HeartbeatLane;
use super::{Backoff, is_status};
use crate::server::NodeView;

/// The most images the Node status lists (the kubelet's default `nodeStatusMaxImages`).
const MAX_IMAGES: usize = 50;
/// The namespace of node leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// How the Node is registered and kept.
#[derive(Debug, Clone)]
pub(crate) struct NodeSyncConfig {
    /// Create the Node when it does not exist (`registerNode`).
    pub(crate) register: bool,
    /// Labels besides the standard ones (`--node-labels`).
    pub(crate) labels: BTreeMap<String, String>,
    /// Taints of a newly registered Node (`registerWithTaints`).
    pub(crate) taints: Vec<Taint>,
    /// `nodeStatusUpdateFrequency`.
    pub(crate) update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub(crate) report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub(crate) lease_duration: Duration,
}

/// The Node's identity in the API once registered (for owner references).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeRef {
    /// `metadata.name`.
    pub(crate) name: String,
    /// `metadata.uid`.
    pub(crate) uid: String,
}

impl NodeRef {
    /// An owner reference to the Node (controller), as mirror pods and the Lease carry.
    pub(crate) fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }
}

/// The heartbeats' clients and where the Lease renewals run.
pub(crate) struct Heartbeats {
    /// The status patches: the node's connection, unthrottled.
    pub(crate) status: kube::Client,
    /// The Lease renewals: their own connection, on `lane`.
    pub(crate) lease: kube::Client,
    /// Where the Lease renewals run.
    pub(crate) lane: HeartbeatLane,
}

/// Keeps the Node and its Lease; see the [module docs](self).
pub(crate) struct NodeSync<V> {
    /// Registration (the rate-limited client).
    nodes: Api<Node>,
    /// The status patches (the heartbeat client).
    statuses: Api<Node>,
    leases: Api<Lease>,
    lane: HeartbeatLane,
    name: String,
    config: NodeSyncConfig,
    view: Arc<V>,
    cri: nodelet_cri::CriClient,
    registered: watch::Sender<Option<NodeRef>>,
}

impl<V> std::fmt::Debug for NodeSync<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSync").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<V: NodeView> NodeSync<V> {
    /// Keeps Node `name` from `view` (and the runtime's images from `cri`): registers it through
    /// `client`, patches its status and renews its Lease through the `heartbeats` clients (unthrottled, as
    /// the kubelet's heartbeat client), the renewals on its lane.
    pub(crate) fn new(
        client: kube::Client,
        heartbeats: Heartbeats,
        name: String,
        config: NodeSyncConfig,
        view: Arc<V>,
        cri: nodelet_cri::CriClient,
    ) -> Self {
        Self {
            nodes: Api::all(client),
            statuses: Api::all(heartbeats.status),
            leases: Api::namespaced(heartbeats.lease, LEASE_NAMESPACE),
            lane: heartbeats.lane,
            name,
            config,
            view,
            cri,
            registered: watch::channel(None).0,
        }
    }

    /// The Node's identity, once it is known to exist in the API.
    pub(crate) fn registered(&self) -> watch::Receiver<Option<NodeRef>> {
        self.registered.subscribe()
    }

    /// Registers, updates the status and renews the Lease until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let renewer = LeaseRenewer {
            leases: self.leases.clone(),
            name: self.name.clone(),
            duration: self.config.lease_duration,
            timeout: heartbeat_timeout(&self.config),
            registered: self.registered(),
        };
        // The renewals on the lane, aborted when this task ends; a panic of either is this task's.
        let renewals = self.lane.spawn(renewer.run(shutdown.clone()));
        let (renewed, ()) = tokio::join!(renewals, self.update_status(shutdown));
        if let Err(e) = renewed
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    /// The Node as this node would register it.
    fn node_object(&self) -> Node {
        let mut node = self.view.nodes().items.into_iter().next().unwrap_or_default();
        node.metadata.name = Some(self.name.clone());
        node.metadata.creation_timestamp = None;
        let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.extend(self.config.labels.clone());
        node.spec = Some(NodeSpec {
            taints: (!self.config.taints.is_empty()).then(|| self.config.taints.clone()),
            ..NodeSpec::default()
        });
        node
    }

    /// Makes sure the Node exists (creating it if allowed) with this node's labels.
    async fn ensure_registered(&self) -> Result<NodeRef, kube::Error> {
        let wanted = self.node_object();
        let existing = match self.nodes.get_opt(&self.name).await? {
            Some(node) => node,
            None if self.config.register => {
                let mut create = wanted.clone();
                create.status = None;
                match self.nodes.create(&PostParams::default(), &create).await {
                    Ok(node) => {
                        tracing::info!(node = %self.name, "registered the node");
                        node
                    }
                    Err(e) if is_status(&e, 409) => self.nodes.get(&self.name).await?,
                    Err(e) => return Err(e),
                }
            }
            None => {
                return Err(kube::Error::Api(Box::new(
                    kube::core::Status::failure(
                        &format!("node {:?} does not exist and registerNode is false", self.name),
                        "NotFound",
                    )
                    .with_code(404),
                )));
            }
        };
        // Labels this node sets that the existing Node lacks or has otherwise.
        let have = existing.metadata.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> =
            wanted.metadata.labels.iter().flatten().filter(|(k, v)| have.get(*k) != Some(*v)).collect();
        if !missing.is_empty() {
            let patch = serde_json::json!({ "metadata": { "labels": missing } });
            self.nodes.patch(&self.name, &PatchParams::default(), &Patch::Strategic(patch)).await?;
        }
        let node = NodeRef { name: self.name.clone(), uid: existing.metadata.uid.unwrap_or_default() };
        self.registered.send_replace(Some(node.clone()));
        Ok(node)
    }

    /// The status to report now: the node view's plus the runtime's images.
    async fn status(&self) -> NodeStatus {
        let mut status = self.node_object().status.unwrap_or_default();
        match self.cri.list_images(None).await {
            Ok(images) => {
                let mut images: Vec<ContainerImage> = images
                    .into_iter()
                    .filter(|i| !i.repo_tags.is_empty() || !i.repo_digests.is_empty())
                    .map(|i| ContainerImage {
                        names: Some(i.repo_digests.into_iter().chain(i.repo_tags).collect()),
                        size_bytes: i64::try_from(i.size).ok(),
                    })
                    .collect();
                images.sort_by_key(|i| std::cmp::Reverse(i.size_bytes));
                images.truncate(MAX_IMAGES);
                status.images = Some(images);
            }
            Err(e) => tracing::debug!(error = %e, "could not list images for the node status"),
        }
        status
    }

    async fn update_status(&self, shutdown: CancellationToken) {
        let mut registered: Option<NodeRef> = None;
        let mut last_sent: Option<(NodeStatus, Instant)> = None;
        let mut backoff = Backoff::default();
        loop {
            let delay = match self.sync_once(&mut registered, &mut last_sent).await {
                Ok(()) => {
                    backoff.reset();
                    self.config.update_frequency
                }
                Err(e) => {
                    let delay = backoff.next_delay().min(self.config.update_frequency);
                    tracing::warn!(node = %self.name, error = %e, retry_in = ?delay, "updating the node status failed");
                    delay
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn sync_once(
        &self,
        registered: &mut Option<NodeRef>,
        last_sent: &mut Option<(NodeStatus, Instant)>,
    ) -> Result<(), kube::Error> {
        if registered.is_none() {
            *registered = Some(self.ensure_registered().await?);
            *last_sent = None;
        }
        let status = self.status().await;
        let unchanged = last_sent.as_ref().is_some_and(|(sent, at)| {
            without_heartbeats(sent) == without_heartbeats(&status)
                && at.elapsed() < self.config.report_frequency
        });
        if unchanged {
            return Ok(());
        }
        let patch = Patch::Strategic(serde_json::json!({ "status": status }));
        let params = PatchParams::default();
        let patched = self.statuses.patch_status(&self.name, &params, &patch);
        match within(heartbeat_timeout(&self.config), patched).await {
            Ok(_) => {
                *last_sent = Some((status, Instant::now()));
                Ok(())
            }
            Err(e) if is_status(&e, 404) => {
                tracing::warn!(node = %self.name, "the node was deleted from the API; registering it again");
                *registered = None;
                self.registered.send_replace(None);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// A heartbeat request (Lease renewal, Node status patch) that got no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the API server within {0:?}")]
struct HeartbeatTimeout(Duration);

/// The limit of each heartbeat request: `nodeStatusUpdateFrequency`, at most `nodeLeaseDurationSeconds`
/// (the kubelet's heartbeat client timeout), so a request stuck on its way is given up and tried again
/// while the Lease still holds.
fn heartbeat_timeout(config: &NodeSyncConfig) -> Duration {
    config.update_frequency.min(config.lease_duration)
}

/// `request`, or a [`HeartbeatTimeout`] error after `timeout`.
async fn within<T>(
    timeout: Duration,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(HeartbeatTimeout(timeout)))),
    }
}

/// Renews this node's Lease; see the [module docs](self).
struct LeaseRenewer {
    leases: Api<Lease>,
    name: String,
    /// `nodeLeaseDurationSeconds`; renewed every quarter of it (plus jitter).
    duration: Duration,
    /// The limit of each renewal ([`heartbeat_timeout`]).
    timeout: Duration,
    /// The Node once registered (the Lease's owner).
    registered: watch::Receiver<Option<NodeRef>>,
}

impl LeaseRenewer {
    /// Renews until `shutdown`: every quarter of the duration plus up to 4 %, after a failure (or a renewal
    /// with no answer within the timeout) with back-off from 200 ms, at most the period.
    async fn run(mut self, shutdown: CancellationToken) {
        let period = self.duration / 4;
        let mut lease: Option<Lease> = None;
        let mut backoff = Backoff::default();
        loop {
            let node = self.registered.borrow_and_update().clone();
            let delay = match within(self.timeout, self.renew(&mut lease, node)).await {
                Ok(()) => {
                    backoff.reset();
                    jittered(period, fastrand::f64())
                }
                Err(e) => {
                    lease = None;
                    let delay = backoff.next_delay().min(period);
                    tracing::warn!(node = %self.name, error = %e, retry_in = ?delay, "renewing the node lease failed");
                    delay
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn renew(&self, lease: &mut Option<Lease>, node: Option<NodeRef>) -> Result<(), kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let owner = node.map(|n| vec![n.owner_reference()]);
        let current = match lease.take() {
            Some(l) => Some(l),
            None => self.leases.get_opt(&self.name).await?,
        };
        let updated = match current {
            None => {
                let new = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(LEASE_NAMESPACE.to_owned()),
                        owner_references: owner,
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.name.clone()),
                        lease_duration_seconds: Some(duration),
                        renew_time: Some(now),
                        ..LeaseSpec::default()
                    }),
                };
                self.leases.create(&PostParams::default(), &new).await?
            }
            Some(mut l) => {
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(self.name.clone());
                spec.lease_duration_seconds = Some(duration);
                spec.renew_time = Some(now);
                if l.metadata.owner_references.as_ref().is_none_or(Vec::is_empty) && owner.is_some() {
                    l.metadata.owner_references = owner;
                }
                // Not sent back: an update without managedFields keeps the API server's, and leaving them out
                // cut the bytes a renewal sends by about a third (1,060 to 720 on the wire, `docs/scale.md`).
                l.metadata.managed_fields = None;
                self.leases.replace(&self.name, &PostParams::default(), &l).await?
            }
        };
        *lease = Some(updated);
        Ok(())
    }
}

/// The status with the conditions' heartbeat times cleared (what "changed" compares).
fn without_heartbeats(status: &NodeStatus) -> NodeStatus {
    let mut status = status.clone();
    for c in status.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    status
}

/// The Lease renewal period: `period` plus up to 4 % of it, random (`r` in [0, 1)), as the kubelet's lease
/// controller renews (`wait.JitterUntil(…, renewInterval, 0.04, …)`), so that nodes started together do not
/// renew in step.
pub(crate) fn jittered(period: Duration, r: f64) -> Duration {
    period + period.mul_f64(0.04 * r.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An API server holding node `node`'s Lease: GET and PUT answer it; the first `hang` PUTs get no
    /// answer at all. Returns the (paused) times of the answered PUTs.
    fn lease_server(hang: usize) -> (kube::Client, Arc<Mutex<Vec<Instant>>>) {
        let answered = Arc::new(Mutex::new(Vec::new()));
        let puts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = answered.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (seen, puts) = (seen.clone(), puts.clone());
            async move {
                assert!(
                    req.uri().path().ends_with("/namespaces/kube-node-lease/leases/node"),
                    "{}",
                    req.uri()
                );
                if req.method() == http::Method::PUT {
                    if puts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < hang {
                        std::future::pending::<()>().await;
                    }
                    seen.lock().expect("lock").push(Instant::now());
                }
                let body = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
                    "metadata":{"name":"node","namespace":"kube-node-lease","resourceVersion":"1"},"spec":{}}"#;
                crate::test_support::json_response(200, body)
            }
        });
        (kube::Client::new(service, "default"), answered)
    }

    fn renewer(client: kube::Client) -> LeaseRenewer {
        LeaseRenewer {
            leases: Api::namespaced(client, LEASE_NAMESPACE),
            name: "node".to_owned(),
            duration: Duration::from_secs(40),
            timeout: Duration::from_secs(10),
            registered: watch::channel(None).1,
        }
    }

    /// Runs a renewer against [`lease_server`]`(hang)` for `secs` seconds; returns when it started and the
    /// times of the answered renewals.
    async fn renewals(hang: usize, secs: u64) -> (Instant, Vec<Instant>) {
        let (client, answered) = lease_server(hang);
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        tokio::spawn(renewer(client).run(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        shutdown.cancel();
        let times = answered.lock().expect("lock").clone();
        (start, times)
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_is_renewed_every_ten_to_ten_point_four_seconds() {
        let (start, times) = renewals(0, 61).await;
        assert!((6..=7).contains(&times.len()), "{} renewals in 61 s", times.len());
        assert_eq!(times[0], start, "the first renewal at once");
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= Duration::from_secs(10) && gap < Duration::from_millis(10_400), "{gap:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_without_an_answer_is_given_up_after_the_timeout_and_tried_again() {
        let (start, times) = renewals(1, 11).await;
        // Given up at 10 s, tried again after 200–240 ms of back-off: renewed long before the 40 s Lease lapses.
        assert_eq!(times.len(), 1, "{times:?}");
        let at = times[0] - start;
        assert!(at >= Duration::from_millis(10_200) && at <= Duration::from_millis(10_240), "{at:?}");
    }

    #[tokio::test]
    async fn a_renewal_sends_the_lease_back_without_its_managed_fields() {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = bodies.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                if req.method() == http::Method::PUT {
                    let body =
                        http_body_util::BodyExt::collect(req.into_body()).await.expect("body").to_bytes();
                    seen.lock()
                        .expect("lock")
                        .push(serde_json::from_slice::<serde_json::Value>(&body).expect("json"));
                }
                let body = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
                    "metadata":{"name":"node","namespace":"kube-node-lease","resourceVersion":"7",
                    "managedFields":[{"manager":"nodelet","operation":"Update","apiVersion":"coordination.k8s.io/v1",
                    "fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:renewTime":{}}}}]},"spec":{}}"#;
                crate::test_support::json_response(200, body)
            }
        });
        let renewer = renewer(kube::Client::new(service, "default"));
        let mut lease = None;
        renewer.renew(&mut lease, None).await.expect("first renewal");
        renewer.renew(&mut lease, None).await.expect("second renewal");
        let bodies = bodies.lock().expect("lock").clone();
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        for body in &bodies {
            assert!(body["metadata"].get("managedFields").is_none(), "{body}");
            assert_eq!(body["metadata"]["resourceVersion"], "7", "{body}");
            assert_eq!(body["spec"]["holderIdentity"], "node", "{body}");
        }
    }

    #[test]
    fn the_lease_is_renewed_on_its_lane_while_the_nodes_runtime_is_blocked() {
        let lane = HeartbeatLane::start().expect("lane");
        let node = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let renewed = node.block_on(async {
            // Made on the lane, as the Lease's client is: its request queue runs there.
            let (client, answered) = lane.enter(|| lease_server(0));
            // Renewed every second.
            let renewer = LeaseRenewer { duration: Duration::from_secs(4), ..renewer(client) };
            let shutdown = CancellationToken::new();
            let renewals = lane.spawn(renewer.run(shutdown.clone()));
            // The node's runtime (one thread) is busy for 3.5 s without a pause: its thread is blocked, which
            // is what this test is about (tokio's paused time would not block it).
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(3_500));
            shutdown.cancel();
            drop(renewals);
            answered.lock().expect("lock").len()
        });
        // At 0, 1, 2 and 3 s; 3 leaves room for a slow machine.
        assert!(renewed >= 3, "{renewed} renewals in 3.5 s");
    }

    #[test]
    fn the_heartbeat_timeout_is_the_status_update_frequency_at_most_the_lease_duration() {
        let config = |update: u64, lease: u64| NodeSyncConfig {
            register: true,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            update_frequency: Duration::from_secs(update),
            report_frequency: Duration::from_secs(300),
            lease_duration: Duration::from_secs(lease),
        };
        assert_eq!(heartbeat_timeout(&config(10, 40)), Duration::from_secs(10));
        assert_eq!(heartbeat_timeout(&config(60, 40)), Duration::from_secs(40));
    }

    #[test]
    fn lease_renewal_is_jittered_by_up_to_four_percent_as_the_kubelets() {
        let period = Duration::from_secs(10);
        assert_eq!(jittered(period, 0.0), period);
        assert_eq!(jittered(period, 0.5), Duration::from_millis(10_200));
        assert!(jittered(period, 0.999_999) < Duration::from_millis(10_400));
        // Out-of-range draws stay within the band.
        assert_eq!(jittered(period, 7.0), Duration::from_millis(10_400));
        assert_eq!(jittered(period, -1.0), period);
        // Random draws spread over the band rather than repeating one value.
        let draws: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| jittered(period, fastrand::f64())).collect();
        assert!(draws.len() > 1);
        assert!(draws.iter().all(|d| *d >= period && *d < Duration::from_millis(10_400)));
    }
}

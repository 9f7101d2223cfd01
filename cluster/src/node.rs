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
//!   renews with the same jitter), owned by the Node so it goes with it. Created when missing; renewed with
//!   a JSON merge patch of what changed (the renew time), conditional on the `resourceVersion` last seen, which
//!   has the effect of the kubelet's update of the whole Lease (a Lease changed meanwhile is read again).
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
            // Boxed: a sync's state (its requests) is held only while it runs, not through the sleep.
            let delay = match Box::pin(self.sync_once(&mut registered, &mut last_sent)).await {
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
            // Boxed: the request's state (kube's and the HTTP stack's futures, several KiB) is held only
            // while a renewal is under way, not through the sleep between renewals.
            let delay = match within(self.timeout, Box::pin(self.renew(&mut lease, node))).await {
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
            Some(l) => {
                let patch =
                    renewal_patch(&l, &self.name, duration, &now, owner).map_err(kube::Error::SerdeError)?;
                self.leases.patch(&self.name, &PatchParams::default(), &Patch::Merge(patch)).await?
            }
        };
        *lease = Some(updated);
        Ok(())
    }
}

/// The JSON merge patch that renews `current` (the Lease as the API server last answered it): the new
/// `renewTime`, the holder and duration where they differ from this node's, the Node as owner when the Lease
/// has none, and `current`'s `resourceVersion`, which makes the API server refuse the patch (409 Conflict)
/// when the Lease changed since, as it refuses a stale update; the renewer then reads the Lease again. The
/// same outcome as sending the whole Lease back (the kubelet's update) in a fraction of its bytes
/// (`docs/scale.md` has the figures).
fn renewal_patch(
    current: &Lease,
    holder: &str,
    duration: i32,
    now: &MicroTime,
    owner: Option<Vec<OwnerReference>>,
) -> Result<serde_json::Value, serde_json::Error> {
    let spec = current.spec.as_ref();
    let mut patch_spec = serde_json::Map::new();
    if spec.and_then(|s| s.holder_identity.as_deref()) != Some(holder) {
        patch_spec.insert("holderIdentity".into(), holder.into());
    }
    if spec.and_then(|s| s.lease_duration_seconds) != Some(duration) {
        patch_spec.insert("leaseDurationSeconds".into(), duration.into());
    }
    patch_spec.insert("renewTime".into(), serde_json::to_value(now)?);
    let mut metadata = serde_json::Map::new();
    if let Some(version) = &current.metadata.resource_version {
        metadata.insert("resourceVersion".into(), version.clone().into());
    }
    if current.metadata.owner_references.as_ref().is_none_or(Vec::is_empty)
        && let Some(owner) = owner
    {
        metadata.insert("ownerReferences".into(), serde_json::to_value(owner)?);
    }
    Ok(serde_json::json!({ "metadata": metadata, "spec": patch_spec }))
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

    /// The Lease an API server answers with (resourceVersion 7, held by `node` for 40 s).
    const LEASE: &str = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",
        "metadata":{"name":"node","namespace":"kube-node-lease","resourceVersion":"7",
            "managedFields":[{"manager":"nodelet","operation":"Update","apiVersion":"coordination.k8s.io/v1",
            "fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:renewTime":{}}}}]},
        "spec":{"holderIdentity":"node","leaseDurationSeconds":40,"renewTime":"2026-12-06T10:00:00.000000Z"}}"#;

    /// A request the fake API server saw: method, content type, body.
    type Seen = (http::Method, String, Vec<u8>);
    /// What a fake API server records, shared with the test.
    type Log<T> = Arc<Mutex<Vec<T>>>;

    /// An API server holding node `node`'s Lease ([`LEASE`]): every request gets it back; the first `hang`
    /// renewals (requests other than GET) get no answer at all. Returns the (paused) times of the answered
    /// renewals, and every request.
    fn lease_server(hang: usize) -> (kube::Client, Log<Instant>, Log<Seen>) {
        let answered = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let renewals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (times, seen) = (answered.clone(), requests.clone());
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (times, seen, renewals) = (times.clone(), seen.clone(), renewals.clone());
            async move {
                assert!(
                    req.uri().path().ends_with("/namespaces/kube-node-lease/leases/node"),
                    "{}",
                    req.uri()
                );
                let method = req.method().clone();
                let content_type = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body = http_body_util::BodyExt::collect(req.into_body()).await.expect("body").to_bytes();
                seen.lock().expect("lock").push((method.clone(), content_type, body.to_vec()));
                if method != http::Method::GET {
                    if renewals.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < hang {
                        std::future::pending::<()>().await;
                    }
                    times.lock().expect("lock").push(Instant::now());
                }
                crate::test_support::json_response(200, LEASE)
            }
        });
        (kube::Client::new(service, "default"), answered, requests)
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
        let (client, answered, _) = lease_server(hang);
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
            // under 10.4 s, plus tokio's timer resolution: a sleep ends on the millisecond at or after its
            // deadline, so 10.3999 s of jitter sleeps 10.400 s
            assert!(gap >= Duration::from_secs(10) && gap <= Duration::from_millis(10_400), "{gap:?}");
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
    async fn a_renewal_patches_the_renew_time_on_the_resource_version_last_seen() {
        let (client, _, requests) = lease_server(0);
        let renewer = renewer(client);
        let mut lease = None;
        renewer.renew(&mut lease, None).await.expect("first renewal");
        renewer.renew(&mut lease, None).await.expect("second renewal");
        let requests = requests.lock().expect("lock").clone();
        let methods: Vec<_> = requests.iter().map(|(m, _, _)| m.as_str()).collect();
        // read once, then only patches: the Lease each answer carries is the next one's base
        assert_eq!(methods, ["GET", "PATCH", "PATCH"]);
        for (_, content_type, body) in &requests[1..] {
            assert_eq!(content_type, "application/merge-patch+json");
            let body: serde_json::Value = serde_json::from_slice(body).expect("json");
            // holder and duration are already this node's: only the time, on resourceVersion 7
            assert_eq!(body["metadata"], serde_json::json!({"resourceVersion": "7"}), "{body}");
            let spec = body["spec"].as_object().expect("spec");
            assert_eq!(spec.keys().collect::<Vec<_>>(), ["renewTime"], "{body}");
            let renewed = spec["renewTime"].as_str().unwrap_or_default();
            assert!(renewed > "2026-12-06T10:00:00.000000Z" && renewed.len() == 27, "{renewed}");
        }
    }

    #[test]
    fn a_renewal_patch_restores_the_holder_and_duration_and_adds_the_missing_owner() {
        let mut current: Lease = serde_json::from_str(LEASE).expect("lease");
        let now = MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let owner = NodeRef { name: "node".into(), uid: "u-1".into() }.owner_reference();
        let patch = renewal_patch(&current, "node", 40, &now, Some(vec![owner.clone()])).expect("patch");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "u-1", "{patch}");
        // someone else's holder and another duration are put back; an owner already there is left alone
        let spec = current.spec.as_mut().expect("spec");
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(15);
        current.metadata.owner_references = Some(vec![owner.clone()]);
        let patch = renewal_patch(&current, "node", 40, &now, Some(vec![owner])).expect("patch");
        assert_eq!(
            patch,
            serde_json::json!({
                "metadata": {"resourceVersion": "7"},
                "spec": {"holderIdentity": "node", "leaseDurationSeconds": 40,
                         "renewTime": "1970-01-01T00:00:00.000000Z"},
            })
        );
        // without a resourceVersion (never from a real API server) the patch has no precondition to give
        current.metadata.resource_version = None;
        let patch = renewal_patch(&current, "node", 40, &now, None).expect("patch");
        assert!(patch["metadata"].as_object().is_some_and(serde_json::Map::is_empty), "{patch}");
    }

    #[test]
    fn the_lease_is_renewed_on_its_lane_while_the_nodes_runtime_is_blocked() {
        let lane = HeartbeatLane::start().expect("lane");
        let node = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let renewed = node.block_on(async {
            // Made on the lane, as the Lease's client is: its request queue runs there.
            let (client, answered, _) = lane.enter(|| lease_server(0));
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

//! Pod data from the API server: the ConfigMaps and Secrets this node's API pods refer to, and
//! their projected service-account tokens.
//!
//! - **ConfigMaps and Secrets** are watched one by one, as the kubelet's `Watch` change-detection
//!   strategy does: for each object an API pod refers to (configMap, secret and projected volumes,
//!   `env[].valueFrom.{configMapKeyRef,secretKeyRef}`, `envFrom`), a watch on that name alone (which is
//!   what the Node authorizer lets a node read: only objects its pods use), started when the first pod
//!   refers to it and stopped when the last one goes. Every change re-renders the volumes (the volume
//!   populator is poked), so running pods see new content within seconds; a missing object keeps the
//!   pod waiting with a `FailedMount` event, as the renderer reports it.
//! - **Service-account tokens** (`serviceAccountToken` projections, including the automatic
//!   `kube-api-access-*` volume) come from the TokenRequest API: audience and expiration as the
//!   projection asks, bound to the pod (name and UID). A token is asked for the first time the volume
//!   renders (the render waits, with no `FailedMount` event, then is redone as soon as the token is there;
//!   a failed request is a `FailedMount`; up to 16 requests are in flight at once, so a node starting many
//!   pods waits about one round trip; a token issued re-renders its pod's volumes alone), and again when 80 % of
//!   its lifetime or 24 hours have passed; the old one is served until the new one is there. Tokens of
//!   pods that are gone are dropped. A failed request is tried again after 0.5 s, doubling to at most
//!   32 s, as the kubelet's volume manager retries a failed mount: not sooner, however often the volumes
//!   render meanwhile (a failing token costs a bounded number of requests), and not later (the first
//!   request for a pod just bound is often refused by the Node authorizer, which has not seen the binding
//!   yet; the pod starts as soon as it has).
//!
//! - **PersistentVolumeClaims** of API pods, and the PersistentVolumes they are bound to, are read
//!   with `get` (all the Node authorizer allows a node for them): every 2 s while a claim is missing or
//!   not bound yet, every minute once bound. Binding is the control plane's job (the PV controller);
//!   nodelet's own binder serves static pods only. The volume of a bound claim mounts as today (local,
//!   hostPath, CSI).
//!
//! The lookups ([`ObjectLookup`], [`ClaimLookup`]) answer from memory and never block; secrets and
//! tokens are never logged.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use nodelet_host::files::{ObjectData, ObjectLookup, TokenError};
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::model::volumes::{BoundVolumeError, ClaimLookup};
use nodelet_resources::pod::validation::CONFIG_SOURCE_ANNOTATION;
use reconcile_engine::{Store, Subscription, Writer};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often token lifetimes are checked.
const TOKEN_CHECK_PERIOD: Duration = Duration::from_secs(30);
/// How often a claim that is missing or not bound is read again.
const CLAIM_PENDING_PERIOD: Duration = Duration::from_secs(2);
/// How often a bound claim (and its volume) is read again.
const CLAIM_BOUND_PERIOD: Duration = Duration::from_secs(60);
/// How many TokenRequests are in flight at once.
const TOKEN_REQUESTS_AT_ONCE: usize = 16;
/// The longest a token is used before a new one is asked for.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How long after a failed TokenRequest the first retry waits; each failure in a row doubles it.
const TOKEN_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// The longest wait between two TokenRequests for the same token.
const TOKEN_RETRY_MAX: Duration = Duration::from_secs(32);

/// An object a pod refers to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ObjectKey {
    ConfigMap(String, String),
    Secret(String, String),
}

/// What a token is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TokenKey {
    namespace: String,
    service_account: String,
    pod: String,
    pod_uid: String,
    audience: String,
    expiration_seconds: i64,
}

/// A token, and when to ask for the next one.
struct Token {
    /// Shared with the files of the volumes rendered from it.
    token: bytes::Bytes,
    refresh_at: SystemTime,
}

/// A watched object: its value once the watch listed it.
struct Watched {
    value: Option<Arc<Object>>,
    task: tokio::task::AbortHandle,
}

/// An object as watched, with its content as volumes read it (made once per version, shared by
/// every volume rendered from it).
struct Object {
    value: Value,
    data: ObjectData,
}

/// A watched object as the API server sent it.
enum Value {
    ConfigMap(ConfigMap),
    Secret(Secret),
}

impl Object {
    fn config_map(cm: ConfigMap) -> Object {
        Object { data: nodelet_host::files::config_map_data(&cm), value: Value::ConfigMap(cm) }
    }

    fn secret(secret: Secret) -> Object {
        Object { data: nodelet_host::files::secret_data(&secret), value: Value::Secret(secret) }
    }
}

/// A claim an API pod uses, as last read.
struct Claim {
    /// The bound volume, or why there is none.
    volume: Result<PersistentVolume, BoundVolumeError>,
    /// When to read it again.
    next_check: tokio::time::Instant,
}

struct State {
    /// The pods that hold a token: written (and its subscribers told) at each token issued for the pod.
    issued: Writer<PodUid, ()>,
    objects: HashMap<ObjectKey, Watched>,
    /// Claims by (namespace, name).
    claims: HashMap<(String, String), Claim>,
    tokens: HashMap<TokenKey, Token>,
    /// Tokens asked for by a render and not issued yet (with the last error, if any).
    wanted: HashMap<TokenKey, Option<Arc<kube::Error>>>,
    /// Tokens whose last request failed: when the next may be made.
    retries: HashMap<TokenKey, Retry>,
}

/// When a token whose request failed is asked for again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// Not before this.
    at: tokio::time::Instant,
    /// The wait that led to `at` (doubled at the next failure).
    delay: Duration,
}

impl Retry {
    /// The retry after one more failure at `now`, following `previous` (none: the first failure).
    fn after(previous: Option<&Retry>, now: tokio::time::Instant) -> Self {
        let delay = previous.map_or(TOKEN_RETRY_INITIAL, |r| (r.delay * 2).min(TOKEN_RETRY_MAX));
        Retry { at: now + delay, delay }
    }
}

/// The API's pod data for this node; see the [module docs](self). Cheap to clone.
#[derive(Clone)]
pub struct PodData {
    state: Arc<Mutex<State>>,
    /// The reader of `State::issued`.
    issued: Store<PodUid, ()>,
    wake: Arc<Notify>,
    changed: watch::Sender<()>,
}

impl std::fmt::Debug for PodData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodData").finish_non_exhaustive()
    }
}

impl Default for PodData {
    fn default() -> Self {
        Self::new()
    }
}

impl PodData {
    /// Nothing yet; its `run` fills it.
    pub fn new() -> Self {
        let (issued, writer) = reconcile_engine::store();
        let state = State {
            issued: writer,
            objects: HashMap::new(),
            claims: HashMap::new(),
            tokens: HashMap::new(),
            wanted: HashMap::new(),
            retries: HashMap::new(),
        };
        Self {
            state: Arc::new(Mutex::new(state)),
            issued,
            wake: Arc::new(Notify::new()),
            changed: watch::channel(()).0,
        }
    }

    /// Changes whenever an object or a claim changed (every pod's volumes must be rendered again).
    pub(crate) fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The pods a token was issued for since the last drain (only their volumes must be rendered again).
    pub fn tokens_issued(&self) -> Subscription<PodUid> {
        self.issued.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches the objects the API pods of `desired` refer to and issues their tokens, until `shutdown`.
    pub(crate) async fn run(
        self,
        client: kube::Client,
        desired: Store<PodUid, DesiredPod>,
        shutdown: CancellationToken,
    ) {
        let changes = desired.subscribe();
        let mut check = tokio::time::interval(TOKEN_CHECK_PERIOD);
        // The object watches, owned by this task: a watch's panic is this task's, and it ends once they have.
        let mut watches = JoinSet::new();
        'run: loop {
            self.sync_watches(&client, &desired, &mut watches);
            let next_token = self.issue_tokens(&client, &desired).await;
            // Boxed: the reads' state is held only while they run.
            let next_claim = Box::pin(self.read_claims(&client, &desired)).await;
            let next = next_token.map_or(next_claim, |t| t.min(next_claim));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break 'run,
                    () = changes.changed() => { changes.drain(); }
                    () = self.wake.notified() => {}
                    _ = check.tick() => {}
                    () = tokio::time::sleep_until(next) => {}
                    Some(ended) = watches.join_next(), if !watches.is_empty() => {
                        if let Err(e) = ended
                            && e.is_panic()
                        {
                            std::panic::resume_unwind(e.into_panic());
                        }
                        continue;
                    }
                }
                break;
            }
        }
        self.lock().objects.clear();
        watches.shutdown().await;
    }

    /// Starts and stops the object watches to match what the pods refer to.
    fn sync_watches(
        &self,
        client: &kube::Client,
        desired: &Store<PodUid, DesiredPod>,
        watches: &mut JoinSet<()>,
    ) {
        let mut wanted = HashSet::new();
        desired.for_each(|_, pod| {
            if matches!(pod.source, PodSource::Api) {
                references(pod, &mut wanted);
            }
        });
        let mut state = self.lock();
        state.objects.retain(|key, watched| {
            let keep = wanted.contains(key);
            if !keep {
                watched.task.abort();
            }
            keep
        });
        for key in wanted {
            if state.objects.contains_key(&key) {
                continue;
            }
            let task = watches.spawn(self.clone().watch_object(client.clone(), key.clone()));
            state.objects.insert(key, Watched { value: None, task });
        }
        // Tokens of pods that are gone.
        let mut live = HashSet::new();
        desired.for_each(|uid, _| {
            live.insert(uid.clone());
        });
        state.tokens.retain(|k, _| live.contains(&k.pod_uid));
        for gone in self.issued.keys().into_iter().filter(|uid| !live.contains(uid)) {
            state.issued.remove(&gone);
        }
        state.wanted.retain(|k, _| live.contains(&k.pod_uid));
        state.retries.retain(|k, _| live.contains(&k.pod_uid));
    }

    async fn watch_object(self, client: kube::Client, key: ObjectKey) {
        let (namespace, name) = match &key {
            ObjectKey::ConfigMap(ns, n) | ObjectKey::Secret(ns, n) => (ns.clone(), n.clone()),
        };
        let config = super::watch_config().fields(&format!("metadata.name={name}"));
        match &key {
            ObjectKey::ConfigMap(..) => {
                let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
                let stream = watcher::watcher(api, config).default_backoff();
                self.follow(key.clone(), stream, Object::config_map).await;
            }
            ObjectKey::Secret(..) => {
                let api: Api<Secret> = Api::namespaced(client, &namespace);
                let stream = watcher::watcher(api, config).default_backoff();
                self.follow(key.clone(), stream, Object::secret).await;
            }
        }
    }

    async fn follow<K>(
        &self,
        key: ObjectKey,
        stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
        wrap: fn(K) -> Object,
    ) {
        let mut stream = std::pin::pin!(stream);
        let mut listed: Option<K> = None;
        let mut failing = false;
        while let Some(event) = stream.next().await {
            let value = match event {
                Ok(Event::Init) => {
                    listed = None;
                    continue;
                }
                Ok(Event::InitApply(o)) => {
                    listed = Some(o);
                    continue;
                }
                Ok(Event::InitDone) => {
                    failing = false;
                    listed.take().map(|o| Arc::new(wrap(o)))
                }
                Ok(Event::Apply(o)) => Some(Arc::new(wrap(o))),
                Ok(Event::Delete(_)) => None,
                Err(e) => {
                    if !failing {
                        tracing::warn!(object = ?key, error = %e, "watching an object a pod refers to failed; retrying");
                        failing = true;
                    }
                    continue;
                }
            };
            if let Some(watched) = self.lock().objects.get_mut(&key) {
                watched.value = value;
            }
            self.changed.send_replace(());
        }
    }

    /// Reads the claims API pods use that are due, and their volumes; returns when the next is due.
    async fn read_claims(
        &self,
        client: &kube::Client,
        desired: &Store<PodUid, DesiredPod>,
    ) -> tokio::time::Instant {
        let mut used = HashSet::new();
        desired.for_each(|_, pod| {
            if matches!(pod.source, PodSource::Api) {
                for volume in pod.spec().volumes.iter().flatten() {
                    if let Some(c) = &volume.persistent_volume_claim {
                        used.insert((pod.namespace().to_owned(), c.claim_name.clone()));
                    }
                }
            }
        });
        let now = tokio::time::Instant::now();
        let due: Vec<(String, String)> = {
            let mut state = self.lock();
            state.claims.retain(|k, _| used.contains(k));
            used.into_iter().filter(|k| state.claims.get(k).is_none_or(|c| c.next_check <= now)).collect()
        };
        let mut changed = false;
        for (namespace, name) in due {
            let volume = read_claim(client, &namespace, &name).await;
            let period = if volume.is_ok() { CLAIM_BOUND_PERIOD } else { CLAIM_PENDING_PERIOD };
            let mut state = self.lock();
            let entry = state.claims.entry((namespace, name));
            match entry {
                std::collections::hash_map::Entry::Occupied(mut e) => {
                    let claim = e.get_mut();
                    // A failed read keeps a volume already known (the API server may be away).
                    let keep = claim.volume.is_ok() && matches!(&volume, Err(BoundVolumeError::Read { .. }));
                    if !keep && !same_claim(&claim.volume, &volume) {
                        claim.volume = volume;
                        changed = true;
                    }
                    claim.next_check = now + period;
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Claim { volume, next_check: now + period });
                    changed = true;
                }
            }
        }
        if changed {
            self.changed.send_replace(());
        }
        let state = self.lock();
        state.claims.values().map(|c| c.next_check).min().unwrap_or(now + CLAIM_BOUND_PERIOD)
    }

    /// Asks for the tokens renders wanted and renews those past their refresh time, except those whose
    /// last request failed and whose retry is not due; returns when the first of those is.
    async fn issue_tokens(
        &self,
        client: &kube::Client,
        desired: &Store<PodUid, DesiredPod>,
    ) -> Option<tokio::time::Instant> {
        let now = SystemTime::now();
        let instant = tokio::time::Instant::now();
        let due: Vec<TokenKey> = {
            let state = self.lock();
            let waiting = |key: &TokenKey| state.retries.get(key).is_some_and(|r| r.at > instant);
            state
                .wanted
                .keys()
                .chain(state.tokens.iter().filter(|(_, t)| t.refresh_at <= now).map(|(k, _)| k))
                .filter(|key| !waiting(key))
                .cloned()
                .collect()
        };
        let due: Vec<TokenKey> = due.into_iter().filter(|key| desired.get(&key.pod_uid).is_some()).collect();
        // Several at once: a node starting many pods waits for one round trip, not one per pod; each
        // token re-renders its volumes as soon as it is there.
        let mut requests = futures::stream::iter(due)
            .map(|key| async move {
                let result = request_token(client, &key).await;
                (key, result)
            })
            .buffer_unordered(TOKEN_REQUESTS_AT_ONCE);
        while let Some((key, result)) = requests.next().await {
            match result {
                Ok(token) => {
                    let mut state = self.lock();
                    state.wanted.remove(&key);
                    state.retries.remove(&key);
                    // Its pod's volumes render again (the pod's alone).
                    state.issued.insert(key.pod_uid.clone(), ());
                    state.tokens.insert(key, token);
                }
                Err(e) => {
                    tracing::warn!(
                        pod = %format!("{}/{}", key.namespace, key.pod),
                        service_account = %key.service_account,
                        error = %e,
                        "requesting a service account token failed"
                    );
                    let mut state = self.lock();
                    let retry = Retry::after(state.retries.get(&key), tokio::time::Instant::now());
                    state.retries.insert(key.clone(), retry);
                    if let Some(reason) = state.wanted.get_mut(&key) {
                        *reason = Some(Arc::new(e));
                    }
                }
            }
        }
        let mut state = self.lock();
        let State { retries, wanted, tokens, .. } = &mut *state;
        // A retry of a token no longer wanted (its projection changed) would never be made.
        retries.retain(|key, _| wanted.contains_key(key) || tokens.contains_key(key));
        retries.values().map(|r| r.at).min()
    }
}

/// Whether two reads of a claim say the same: the same volume, or the same reason for none.
fn same_claim(
    a: &Result<PersistentVolume, BoundVolumeError>,
    b: &Result<PersistentVolume, BoundVolumeError>,
) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.to_string() == b.to_string(),
        _ => false,
    }
}

/// The volume bound to claim `namespace/name`, or why there is none.
async fn read_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<PersistentVolume, BoundVolumeError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim = match claims.get_opt(name).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(BoundVolumeError::NotFound { claim: name.to_owned() }),
        Err(e) => {
            return Err(BoundVolumeError::Read {
                kind: "persistentvolumeclaim",
                name: name.to_owned(),
                error: Arc::new(e),
            });
        }
    };
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty());
    let (Some(volume), "Bound") = (volume, phase) else {
        return Err(BoundVolumeError::NotBoundPhase { claim: name.to_owned(), phase: phase.to_owned() });
    };
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    match volumes.get_opt(volume).await {
        Ok(Some(pv)) => Ok(pv),
        Ok(None) => Err(BoundVolumeError::VolumeGone { claim: name.to_owned(), volume: volume.to_owned() }),
        Err(e) => Err(BoundVolumeError::Read {
            kind: "persistentvolume",
            name: volume.to_owned(),
            error: Arc::new(e),
        }),
    }
}

/// TokenRequest for `key`.
async fn request_token(client: &kube::Client, key: &TokenKey) -> Result<Token, kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &key.namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!key.audience.is_empty()).then(|| vec![key.audience.clone()]),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(key.pod.clone()),
                uid: Some(key.pod_uid.clone()),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = api.create_token_request(&key.service_account, &PostParams::default(), &request).await?;
    let status = issued.status.unwrap_or_default();
    let Some(token) = status.token.filter(|t| !t.is_empty()) else {
        return Err(kube::Error::Api(Box::new(
            kube::core::Status::failure("the TokenRequest answer has no token", "InternalError")
                .with_code(500),
        )));
    };
    let now = SystemTime::now();
    // Renew at 80 % of the lifetime the API server gave (it may shorten it), at most after 24 h.
    let expires = status.expiration_timestamp.map_or(0, |t| u64::try_from(t.0.as_second()).unwrap_or(0));
    let lifetime =
        (SystemTime::UNIX_EPOCH + Duration::from_secs(expires)).duration_since(now).unwrap_or(Duration::ZERO);
    let refresh_at = now + lifetime.mul_f64(0.8).min(TOKEN_MAX_AGE);
    Ok(Token { token: token.into(), refresh_at })
}

/// The ConfigMaps and Secrets `pod` refers to.
fn references(pod: &DesiredPod, out: &mut HashSet<ObjectKey>) {
    let ns = pod.namespace().to_owned();
    let cm = |name: &str| ObjectKey::ConfigMap(ns.clone(), name.to_owned());
    let secret = |name: &str| ObjectKey::Secret(ns.clone(), name.to_owned());
    for volume in pod.spec().volumes.iter().flatten() {
        if let Some(c) = &volume.config_map {
            out.insert(cm(&c.name));
        }
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            out.insert(secret(name));
        }
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &source.config_map {
                out.insert(cm(&c.name));
            }
            if let Some(s) = &source.secret {
                out.insert(secret(&s.name));
            }
        }
    }
    for c in pod.init_containers().iter().chain(pod.containers()) {
        for from in c.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                out.insert(cm(&r.name));
            }
            if let Some(r) = &from.secret_ref {
                out.insert(secret(&r.name));
            }
        }
        for var in c.env.iter().flatten() {
            if let Some(r) = var.value_from.as_ref().and_then(|v| v.config_map_key_ref.as_ref()) {
                out.insert(cm(&r.name));
            }
            if let Some(r) = var.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) {
                out.insert(secret(&r.name));
            }
        }
    }
}

impl PodData {
    /// The object of `key`, once its watch listed it.
    fn watched(&self, key: ObjectKey) -> Option<Arc<Object>> {
        self.lock().objects.get(&key)?.value.clone()
    }
}

impl ObjectLookup for PodData {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        match &self.watched(ObjectKey::ConfigMap(namespace.to_owned(), name.to_owned()))?.value {
            Value::ConfigMap(c) => Some(c.clone()),
            Value::Secret(_) => None,
        }
    }

    fn config_map_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        Some(self.watched(ObjectKey::ConfigMap(namespace.to_owned(), name.to_owned()))?.data.clone())
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        match &self.watched(ObjectKey::Secret(namespace.to_owned(), name.to_owned()))?.value {
            Value::Secret(s) => Some(s.clone()),
            Value::ConfigMap(_) => None,
        }
    }

    fn secret_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        Some(self.watched(ObjectKey::Secret(namespace.to_owned(), name.to_owned()))?.data.clone())
    }

    fn service_account_token(
        &self,
        pod: &Pod,
        audience: &str,
        expiration_seconds: i64,
    ) -> Option<Result<bytes::Bytes, TokenError>> {
        // Only pods from the API server have a service account the API server issues tokens for.
        let source = pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION));
        if source.map(String::as_str) != Some("api") {
            return None;
        }
        let spec = pod.spec.as_ref();
        let key = TokenKey {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned()),
            service_account: spec
                .and_then(|s| s.service_account_name.clone().or_else(|| s.service_account.clone()))
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            pod: pod.metadata.name.clone().unwrap_or_default(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            audience: audience.to_owned(),
            expiration_seconds,
        };
        let mut state = self.lock();
        if let Some(token) = state.tokens.get(&key) {
            return Some(Ok(token.token.clone()));
        }
        let reason = match state.wanted.get(&key) {
            Some(Some(error)) => {
                TokenError::Failed { service_account: key.service_account.clone(), error: error.clone() }
            }
            _ => TokenError::Requesting { service_account: key.service_account.clone() },
        };
        state.wanted.entry(key).or_insert(None);
        drop(state);
        self.wake.notify_one();
        Some(Err(reason))
    }
}

impl PodData {
    /// The bound volume of claim `namespace/name` if an API pod uses it (`None`: not read yet).
    fn api_claim(&self, namespace: &str, claim: &str) -> Option<Result<PersistentVolume, BoundVolumeError>> {
        let state = self.lock();
        state.claims.get(&(namespace.to_owned(), claim.to_owned())).map(|c| c.volume.clone())
    }
}

/// The claims of API pods from the API server only, static pods' from nodelet's own binder only: a static
/// pod never mounts an API claim (even one an API pod on this node uses), an API pod never a manifest's.
pub struct ClusterClaims {
    /// The API's claims.
    pub api: PodData,
    /// nodelet's own binder (static pods' claims from the manifests).
    pub local: Arc<dyn ClaimLookup>,
}

impl std::fmt::Debug for ClusterClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClaims").field("api", &self.api).finish_non_exhaustive()
    }
}

impl ClaimLookup for ClusterClaims {
    fn bound_volume(&self, pod: &DesiredPod, claim: &str) -> Result<PersistentVolume, BoundVolumeError> {
        if pod.source != PodSource::Api {
            return self.local.bound_volume(pod, claim);
        }
        self.api
            .api_claim(pod.namespace(), claim)
            .unwrap_or_else(|| Err(BoundVolumeError::NotReadYet { claim: claim.to_owned() }))
    }

    fn wait_synced(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        self.local.wait_synced()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use nodelet_resources::pod::validation::prepare;

    use super::*;

    /// An API server that refuses the first `refusals` TokenRequests (403, as the Node authorizer does
    /// before it has seen the pod's binding) and issues a token afterwards; counts the requests.
    fn token_server(refusals: usize) -> (kube::Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                assert!(req.uri().path().ends_with("/serviceaccounts/default/token"), "{}", req.uri());
                let (code, body) = if n <= refusals {
                    (
                        403,
                        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                            "message":"no relationship found between node 'node' and this object",
                            "reason":"Forbidden","code":403}"#,
                    )
                } else {
                    (
                        201,
                        r#"{"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","spec":{},
                            "status":{"token":"issued","expirationTimestamp":"2099-01-01T00:00:00Z"}}"#,
                    )
                };
                crate::test_support::json_response(code, body)
            }
        });
        (kube::Client::new(service, "default"), calls)
    }

    /// The pod data task over `client`, with one API pod (UID `u1`) desired; returns the pod as renders see it
    /// and the writer of the desired pods.
    fn start(client: kube::Client) -> (PodData, Pod, Writer<PodUid, DesiredPod>, CancellationToken) {
        let (desired, mut writer) = reconcile_engine::store::<PodUid, DesiredPod>();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("pod");
        let pod = prepare(pod, PodSource::Api, "node").expect("valid");
        let seen = pod.pod.clone();
        writer.insert("u1".to_owned(), pod);
        let data = PodData::new();
        let shutdown = CancellationToken::new();
        tokio::spawn(data.clone().run(client, desired, shutdown.clone()));
        (data, seen, writer, shutdown)
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_request_is_retried_after_half_a_second_doubling_however_often_volumes_render() {
        let (client, calls) = token_server(3);
        let (data, pod, _desired, shutdown) = start(client);
        let start = tokio::time::Instant::now();
        let render = || data.service_account_token(&pod, "", 3600);
        assert!(matches!(render(), Some(Err(TokenError::Requesting { .. }))));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the first render asks at once");
        // Renders before the retry is due (each wakes the task) ask for nothing.
        for _ in 0..8 {
            assert!(matches!(render(), Some(Err(TokenError::Failed { .. }))));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "no request before the retry is due");
        // Retries 0.5 s, 1 s and 2 s after each refusal: the fourth request, 3.5 s in, is answered, with no
        // render asking meanwhile (before, a refused token waited for the next 30 s check).
        tokio::time::sleep_until(start + Duration::from_millis(3_400)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(matches!(render(), Some(Err(TokenError::Failed { .. }))));
        tokio::time::sleep_until(start + Duration::from_millis(3_600)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(render().map(|r| r.ok()), Some(Some(bytes::Bytes::from_static(b"issued"))));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_issued_names_its_pod_and_does_not_refresh_every_pod() {
        let (client, calls) = token_server(0);
        let (data, pod, _desired, shutdown) = start(client);
        let issued = data.tokens_issued();
        let everything = data.subscribe();
        assert!(matches!(
            data.service_account_token(&pod, "", 3600),
            Some(Err(TokenError::Requesting { .. }))
        ));
        tokio::time::timeout(Duration::from_secs(1), issued.changed()).await.expect("the pod is named");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(issued.drain(), vec!["u1".to_owned()]);
        assert!(!everything.has_changed().expect("open"), "no refresh of every pod for a token");
        assert_eq!(
            data.service_account_token(&pod, "", 3600).map(|r| r.ok()),
            Some(Some(bytes::Bytes::from_static(b"issued")))
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_of_a_pod_that_is_gone_is_dropped_and_its_pod_no_longer_listed_as_issued() {
        let (client, calls) = token_server(0);
        let (data, pod, mut desired, shutdown) = start(client);
        let issued = data.tokens_issued();
        let _ = data.service_account_token(&pod, "", 3600);
        tokio::time::timeout(Duration::from_secs(1), issued.changed()).await.expect("the pod is named");
        assert_eq!(data.issued.keys(), vec!["u1".to_owned()]);
        desired.remove(&"u1".to_owned());
        let mut waited = Duration::ZERO;
        while !data.issued.is_empty() && waited < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += Duration::from_millis(10);
        }
        assert!(data.issued.is_empty(), "the pod that is gone is still listed: {:?}", data.issued.keys());
        assert!(data.lock().tokens.is_empty(), "the pod's token is kept");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_refused_for_long_is_asked_for_at_most_every_32_seconds() {
        let (client, calls) = token_server(usize::MAX);
        let (data, pod, _desired, shutdown) = start(client);
        let _ = data.service_account_token(&pod, "", 3600);
        // 0.5 + 1 + 2 + 4 + 8 + 16 + 32 = 63.5 s: 8 requests; then one every 32 s.
        tokio::time::sleep(Duration::from_secs(64)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 8);
        tokio::time::sleep(Duration::from_secs(320)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 18);
        shutdown.cancel();
    }

    #[test]
    fn each_failure_in_a_row_doubles_the_wait_up_to_32_seconds() {
        let now = tokio::time::Instant::now();
        let mut retry = Retry::after(None, now);
        let mut waits = vec![retry.delay];
        for _ in 0..8 {
            retry = Retry::after(Some(&retry), now);
            waits.push(retry.delay);
        }
        let secs: Vec<f64> = waits.iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0]);
        assert_eq!(retry.at, now + Duration::from_secs(32));
    }

    #[tokio::test(start_paused = true)]
    async fn the_volumes_of_many_pods_share_one_copy_of_a_config_map_and_renders_share_the_pods_token() {
        // Tokens are issued; anything else (the ConfigMap's watch) is refused.
        let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
            if req.uri().path().ends_with("/token") {
                crate::test_support::json_response(
                    201,
                    r#"{"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","spec":{},
                        "status":{"token":"issued","expirationTimestamp":"2099-01-01T00:00:00Z"}}"#,
                )
            } else {
                crate::test_support::json_response(
                    403,
                    r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"Forbidden","code":403}"#,
                )
            }
        });
        let (data, pod, mut desired, shutdown) = start(kube::Client::new(service, "default"));
        // The kube-api-access volume the API server adds to every pod: a token and the cluster's CA.
        let projected = serde_json::json!({
            "name": "kube-api-access",
            "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ]},
        });
        let volume: k8s_openapi::api::core::v1::Volume = serde_json::from_value(projected).expect("volume");
        let mut referring = pod.clone();
        referring.spec.as_mut().expect("spec").volumes = Some(vec![volume.clone()]);
        desired.insert("u1".to_owned(), prepare(referring, PodSource::Api, "node").expect("valid"));
        // The watch of the ConfigMap starts (and fails); its value is set here.
        let key = ObjectKey::ConfigMap("default".into(), "kube-root-ca.crt".into());
        tokio::time::timeout(Duration::from_secs(1), async {
            while !data.lock().objects.contains_key(&key) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the ConfigMap is watched");
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
            "data": {"ca.crt": "-----BEGIN CERTIFICATE-----"},
        }))
        .expect("configmap");
        data.lock().objects.get_mut(&key).expect("watched").value = Some(Arc::new(Object::config_map(cm)));

        let render = |pod: &Pod| nodelet_host::files::volume_files(pod, &volume, &data);
        assert!(render(&pod).is_err(), "the token is asked for at the first render");
        let issued = data.tokens_issued();
        tokio::time::timeout(Duration::from_secs(1), issued.changed()).await.expect("issued");
        let first = render(&pod).expect("rendered");
        let again = render(&pod).expect("rendered");
        assert_eq!(&first["ca.crt"].data[..], b"-----BEGIN CERTIFICATE-----");
        assert_eq!(&first["token"].data[..], b"issued");
        assert_eq!(first, again);
        assert_eq!(first["ca.crt"].data.as_ptr(), again["ca.crt"].data.as_ptr(), "one copy of the CA");
        assert_eq!(first["token"].data.as_ptr(), again["token"].data.as_ptr(), "one copy of the token");
        let stored = data.config_map_data("default", "kube-root-ca.crt").expect("watched");
        assert_eq!(stored["ca.crt"].as_ptr(), first["ca.crt"].data.as_ptr(), "the watched object's bytes");

        // Another pod's volume of the same ConfigMap: the same bytes again.
        let ca_only: k8s_openapi::api::core::v1::Volume = serde_json::from_value(serde_json::json!({
            "name": "ca", "configMap": {"name": "kube-root-ca.crt"},
        }))
        .expect("volume");
        let mut other = pod.clone();
        other.metadata.name = Some("q".into());
        other.metadata.uid = Some("u2".into());
        let theirs = nodelet_host::files::volume_files(&other, &ca_only, &data).expect("rendered");
        assert_eq!(theirs["ca.crt"].data.as_ptr(), first["ca.crt"].data.as_ptr());
        shutdown.cancel();
    }
}

//! Cluster mode's checks on the main port, through the API server as the kubelet does them:
//!
//! - [`TokenReviewer`]: a bearer token that is not in the static token file is sent in a `TokenReview`
//!   (authentication.k8s.io/v1, no audiences); the answer's user (name, uid, groups, extra) is the request's
//!   user. Answers, authenticated or not, are cached by the token's SHA-256 for `cacheTTL`; a failed review
//!   (API server unreachable, an error status) is not cached and refuses the request with 401, as the kubelet
//!   does.
//! - [`AccessReviewer`]: each request is checked with a `SubjectAccessReview` (authorization.k8s.io/v1) for
//!   resource `nodes`, name = the node, the verb of the HTTP method and the subresource of the path
//!   ([`request_attributes`]), with the user, uid, groups and extra of authentication. Allowed answers are
//!   cached for `cacheAuthorizedTTL`, denied ones for `cacheUnauthorizedTTL`, by user, uid, groups, extra,
//!   verb and subresource; a failed review is not cached.
//!
//! Both caches hold at most [`CACHE_CAPACITY`] entries and drop the oldest entry when full. Tokens never go
//! into a log line or an error message.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::auth::UserInfo;

/// Entries each cache holds at most (the API server's token cache and the kubelet's authorizer cache are
/// bounded too).
pub(crate) const CACHE_CAPACITY: usize = 10_000;

/// Why a review could not be had (the request is then refused: 401 for a token, 500 for authorization).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// The API server could not be reached or answered with an error.
    #[error("{review} through the API server failed: {source}")]
    Api {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// What the client said (never holds the token: the token is only in the request body).
        #[source]
        source: kube::Error,
    },
    /// The API server answered without a status.
    #[error("the API server's {review} answer has no status")]
    NoStatus {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
    },
    /// The TokenReview said it could not decide (its `status.error`).
    #[error("the TokenReview could not decide: {0}")]
    Review(String),
}

/// A bounded map whose entries expire: at most `capacity` entries, the oldest inserted one dropped to make
/// room. Times are tokio's (paused in tests).
#[derive(Debug)]
pub(crate) struct TtlCache<K, V> {
    capacity: usize,
    inner: Mutex<CacheInner<K, V>>,
}

#[derive(Debug)]
struct CacheInner<K, V> {
    /// Value, expiry and insertion sequence number.
    entries: HashMap<K, (V, Instant, u64)>,
    /// Insertion sequence number → key, oldest first.
    order: BTreeMap<u64, K>,
    next: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(CacheInner { entries: HashMap::new(), order: BTreeMap::new(), next: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner<K, V>> {
        // A panic while holding the lock leaves consistent data (every update is done before unlocking).
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The value of `key` when present and not expired (an expired entry is removed).
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let mut inner = self.lock();
        let (value, expires, seq) = inner.entries.get(key)?.clone();
        if Instant::now() < expires {
            return Some(value);
        }
        inner.entries.remove(key);
        inner.order.remove(&seq);
        None
    }

    /// Keeps `value` for `ttl` (a zero `ttl` keeps nothing), replacing an older value of `key`.
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut inner = self.lock();
        let seq = inner.next;
        inner.next += 1;
        if let Some((_, _, old)) = inner.entries.remove(&key) {
            inner.order.remove(&old);
        }
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else { break };
            inner.entries.remove(&oldest);
        }
        inner.order.insert(seq, key.clone());
        inner.entries.insert(key, (value, Instant::now() + ttl, seq));
    }

    /// How many entries are held (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

/// TokenReview authentication of bearer tokens (see the [module docs](self)).
pub(crate) struct TokenReviewer {
    client: kube::Client,
    ttl: Duration,
    /// SHA-256 of the token → the user, or `None` when the review said "not authenticated".
    cache: TtlCache<[u8; 32], Option<UserInfo>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Reviews through `client`, caching answers for `ttl`.
    pub(crate) fn new(client: kube::Client, ttl: Duration) -> Self {
        Self { client, ttl, cache: TtlCache::new(CACHE_CAPACITY) }
    }

    /// The token's user; `Ok(None)` when the API server says the token does not authenticate.
    pub(crate) async fn review(&self, token: &str) -> Result<Option<UserInfo>, WebhookError> {
        let key = super::auth::token_digest(token);
        if let Some(answer) = self.cache.get(&key) {
            return Ok(answer);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| WebhookError::Api { review: "TokenReview", source })?;
        let status = answer.status.ok_or(WebhookError::NoStatus { review: "TokenReview" })?;
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Some(UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            _ => match status.error.filter(|e| !e.is_empty()) {
                // The kubelet's webhook authenticator: an error in the status with no user is an error.
                Some(error) => return Err(WebhookError::Review(error)),
                None => None,
            },
        };
        self.cache.insert(key, user.clone(), self.ttl);
        Ok(user)
    }
}

/// What a request asks to do, in the kubelet's terms: the verb of its method and the `nodes` subresource
/// of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RequestAttributes {
    /// `get`, `create`, `update`, `patch`, `delete` (another method: its lower-cased name).
    pub(crate) verb: &'static str,
    /// `stats`, `metrics`, `log`, `checkpoint` or `proxy`.
    pub(crate) subresource: &'static str,
}

/// Whether `path` is `prefix` or below it (`/stats`, `/stats/`, `/stats/summary`; not `/statsx`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The kubelet's mapping of a request to authorization attributes (`GetRequestAttributes`), with one
/// difference: the verb comes from the method (GET and HEAD → `get`, POST → `create`, PUT → `update`, PATCH →
/// `patch`, DELETE → `delete`), except on `/exec`, `/attach`, `/portForward` and `/run`, where it is always
/// `create`: a WebSocket upgrade is a GET, and the kubelet's `get` there lets read-only `nodes/proxy` access
/// run commands in every pod. The subresource comes from the path as the kubelet's: `/stats…` → `stats`,
/// `/metrics…` → `metrics`, `/logs…` → `log`, `/checkpoint…` → `checkpoint`, everything else (`/pods`,
/// `/run`, `/exec`, `/attach`, `/portForward`, `/containerLogs`, `/configz`, `/healthz`, `/spec`, …) →
/// `proxy`. (Kubelets before 1.18 also mapped `/spec…` to `spec`; today's kubelet, like nodelet, serves no
/// `/spec` and maps it to `proxy`.)
pub(crate) fn request_attributes(method: &http::Method, path: &str) -> RequestAttributes {
    let starts_a_process = ["/exec", "/attach", "/portForward", "/run"].iter().any(|p| is_subpath(path, p));
    let verb = if starts_a_process {
        "create"
    } else {
        match *method {
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            http::Method::OPTIONS => "options",
            http::Method::CONNECT => "connect",
            http::Method::TRACE => "trace",
            _ => "unknown",
        }
    };
    let subresource =
        [("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/checkpoint", "checkpoint")]
            .into_iter()
            .find(|(prefix, _)| is_subpath(path, prefix))
            .map_or("proxy", |(_, sub)| sub);
    RequestAttributes { verb, subresource }
}

/// The SubjectAccessReview answer: allowed, or denied with the API server's reason (may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The user may.
    Allowed,
    /// The user may not (or no authorizer had an opinion).
    Denied(String),
}

/// What an authorization answer is cached by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AccessKey {
    user: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
    attributes: RequestAttributes,
}

/// SubjectAccessReview authorization of each request (see the [module docs](self)).
pub(crate) struct AccessReviewer {
    client: kube::Client,
    node_name: String,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    cache: TtlCache<AccessKey, Decision>,
}

impl std::fmt::Debug for AccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReviewer")
            .field("node_name", &self.node_name)
            .field("allowed_ttl", &self.allowed_ttl)
            .field("denied_ttl", &self.denied_ttl)
            .finish_non_exhaustive()
    }
}

impl AccessReviewer {
    /// Reviews through `client` for node `node_name`; allowed answers are kept for `allowed_ttl`, denied
    /// ones for `denied_ttl`.
    pub(crate) fn new(
        client: kube::Client,
        node_name: String,
        allowed_ttl: Duration,
        denied_ttl: Duration,
    ) -> Self {
        Self { client, node_name, allowed_ttl, denied_ttl, cache: TtlCache::new(CACHE_CAPACITY) }
    }

    /// Whether `user` may do `attributes` on this node.
    pub(crate) async fn review(
        &self,
        user: &UserInfo,
        attributes: RequestAttributes,
    ) -> Result<Decision, WebhookError> {
        let key = AccessKey {
            user: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            attributes,
        };
        if let Some(decision) = self.cache.get(&key) {
            return Ok(decision);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attributes.verb.to_owned()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(attributes.subresource.to_owned()),
                    name: Some(self.node_name.clone()),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| WebhookError::Api { review: "SubjectAccessReview", source })?;
        let status = answer.status.ok_or(WebhookError::NoStatus { review: "SubjectAccessReview" })?;
        let (decision, ttl) = if status.allowed && status.denied != Some(true) {
            (Decision::Allowed, self.allowed_ttl)
        } else {
            (Decision::Denied(status.reason.unwrap_or_default()), self.denied_ttl)
        };
        self.cache.insert(key, decision.clone(), ttl);
        Ok(decision)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt as _;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        let get = http::Method::GET;
        for (path, sub) in [
            ("/stats", "stats"),
            ("/stats/", "stats"),
            ("/stats/summary", "stats"),
            ("/metrics", "metrics"),
            ("/metrics/resource", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/logs", "log"),
            ("/logs/syslog", "log"),
            ("/spec", "proxy"),
            ("/spec/", "proxy"),
            ("/configz", "proxy"),
            ("/checkpoint/ns/pod/c", "checkpoint"),
            ("/pods", "proxy"),
            ("/run/ns/pod/c", "proxy"),
            ("/exec/ns/pod/c", "proxy"),
            ("/attach/ns/pod/c", "proxy"),
            ("/portForward/ns/pod", "proxy"),
            ("/containerLogs/ns/pod/c", "proxy"),
            ("/healthz", "proxy"),
            ("/", "proxy"),
            ("/statsx", "proxy"),
            ("/metricsfoo", "proxy"),
            ("/logsx/a", "proxy"),
            ("/api/v1/nodes", "proxy"),
        ] {
            assert_eq!(request_attributes(&get, path).subresource, sub, "{path}");
        }
    }

    #[test]
    fn methods_map_to_the_kubelets_verbs() {
        for (method, verb) in [
            (http::Method::GET, "get"),
            (http::Method::HEAD, "get"),
            (http::Method::POST, "create"),
            (http::Method::PUT, "update"),
            (http::Method::PATCH, "patch"),
            (http::Method::DELETE, "delete"),
            (http::Method::OPTIONS, "options"),
        ] {
            assert_eq!(request_attributes(&method, "/pods").verb, verb, "{method}");
        }
        // A streaming GET (follow) is still a get.
        assert_eq!(
            request_attributes(&http::Method::GET, "/containerLogs/ns/p/c"),
            RequestAttributes { verb: "get", subresource: "proxy" }
        );
    }

    /// A WebSocket exec is a GET: were it `get`, read-only `nodes/proxy` access (what monitoring is given)
    /// would run commands in every pod. Every request to a path that starts a process or opens a stream into
    /// a pod is `create`, whatever its method (kubernetes/kubernetes#136550 proposes the same for the
    /// kubelet, which still maps a WebSocket GET to `get`).
    #[test]
    fn streaming_and_run_paths_are_create_on_proxy_whatever_the_method() {
        for path in [
            "/exec/ns/pod/c",
            "/exec/ns/pod/uid-1/c",
            "/attach/ns/pod/c",
            "/attach/ns/pod/uid-1/c",
            "/portForward/ns/pod",
            "/portForward/ns/pod/uid-1",
            "/run/ns/pod/c",
            "/run/ns/pod/uid-1/c",
            "/exec",
            "/portForward/",
        ] {
            for method in [http::Method::GET, http::Method::POST, http::Method::HEAD, http::Method::PUT] {
                assert_eq!(
                    request_attributes(&method, path),
                    RequestAttributes { verb: "create", subresource: "proxy" },
                    "{method} {path}"
                );
            }
        }
        // Paths that only look alike keep the method's verb.
        assert_eq!(request_attributes(&http::Method::GET, "/execute").verb, "get");
        assert_eq!(request_attributes(&http::Method::GET, "/portForwarding/x").verb, "get");
        assert_eq!(request_attributes(&http::Method::GET, "/pods").verb, "get");
    }

    #[tokio::test(start_paused = true)]
    async fn cache_entries_expire_after_their_ttl() {
        let cache: TtlCache<&str, u32> = TtlCache::new(10);
        cache.insert("a", 1, Duration::from_secs(2));
        cache.insert("b", 2, Duration::from_secs(10));
        cache.insert("zero", 3, Duration::ZERO);
        assert_eq!(cache.get(&"a"), Some(1));
        assert_eq!(cache.get(&"zero"), None, "a zero TTL caches nothing");
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(cache.get(&"a"), Some(1));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get(&"a"), None, "expired at 2 s");
        assert_eq!(cache.get(&"b"), Some(2));
        assert_eq!(cache.len(), 1, "the expired entry was dropped");
        // Inserting again renews.
        cache.insert("b", 20, Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(cache.get(&"b"), Some(20));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get(&"b"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_the_oldest_entry() {
        let cache: TtlCache<u32, u32> = TtlCache::new(3);
        for k in 0..3 {
            cache.insert(k, k, Duration::from_secs(60));
        }
        // Re-inserting 0 makes it the newest: 1 is now the oldest.
        cache.insert(0, 100, Duration::from_secs(60));
        cache.insert(3, 3, Duration::from_secs(60));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&1), None, "the oldest entry went");
        assert_eq!(cache.get(&0), Some(100));
        assert_eq!(cache.get(&2), Some(2));
        assert_eq!(cache.get(&3), Some(3));
        for k in 10..1000 {
            cache.insert(k, k, Duration::from_secs(60));
        }
        assert_eq!(cache.len(), 3, "bounded");
        assert_eq!(cache.get(&999), Some(999));
    }

    /// What [`fake_client`] saw: method, path and JSON body of each request.
    pub(crate) type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// A client whose "API server" records each request (method, path, JSON body) and answers with
    /// `answer(body)`: `Ok(json)` as 201, `Err(code)` as that error status.
    pub(crate) fn fake_client(
        answer: impl Fn(&Value) -> Result<Value, u16> + Send + Sync + 'static,
    ) -> (kube::Client, Seen, Arc<AtomicUsize>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let calls = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(answer);
        let (seen2, calls2) = (seen.clone(), calls.clone());
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (seen, calls, answer) = (seen2.clone(), calls2.clone(), answer.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let method = request.method().to_string();
                let path = request.uri().path().to_owned();
                let bytes = request.into_body().collect().await?.to_bytes();
                let body: Value = serde_json::from_slice(&bytes)?;
                let reply = answer(&body);
                seen.lock().map_err(|_| "poisoned")?.push((method, path, body));
                let (code, json) = match reply {
                    Ok(json) => (201, json),
                    Err(code) => (
                        code,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                               "reason": "InternalError", "message": "boom"}),
                    ),
                };
                let response = http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&json)?))?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
            }
        });
        (kube::Client::new(service, "default"), seen, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn token_reviews_are_sent_and_cached_errors_are_not() {
        let (client, seen, calls) = fake_client(|body| match body["spec"]["token"].as_str() {
            Some("good") => Ok(json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"],
                "status": {"authenticated": true, "user": {"username": "system:serviceaccount:ns:sa",
                    "uid": "u-1", "groups": ["system:serviceaccounts", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": ["p"]}}}})),
            Some("bad") => Ok(json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"],
                "status": {"authenticated": false, "user": {}}})),
            _ => Err(500),
        });
        let reviewer = TokenReviewer::new(client, Duration::from_secs(120));
        let user = reviewer.review("good").await.expect("reviewed").expect("authenticated");
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u-1");
        assert_eq!(user.groups, vec!["system:serviceaccounts".to_owned(), "system:authenticated".to_owned()]);
        assert_eq!(user.extra.get("authentication.kubernetes.io/pod-name"), Some(&vec!["p".to_owned()]));
        {
            let seen = seen.lock().expect("lock");
            let (method, path, body) = &seen[0];
            assert_eq!(
                (method.as_str(), path.as_str()),
                ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
            );
            assert_eq!(body["kind"], "TokenReview");
            assert_eq!(body["spec"], json!({"token": "good"}), "no audiences");
        }
        assert_eq!(reviewer.review("bad").await.expect("reviewed"), None);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // Both answers come from the cache until the TTL passes.
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(reviewer.review("good").await.expect("cached").is_some());
        assert_eq!(reviewer.review("bad").await.expect("cached"), None);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "cached");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(reviewer.review("good").await.expect("reviewed again").is_some());
        assert_eq!(calls.load(Ordering::SeqCst), 3, "reviewed again after the TTL");

        // An API error is an error, every time (never cached), and its message holds no token.
        let e = reviewer.review("secret-token-value").await.expect_err("the API failed");
        assert!(matches!(e, WebhookError::Api { .. }), "{e}");
        assert!(!e.to_string().contains("secret-token-value"), "{e}");
        assert!(reviewer.review("secret-token-value").await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5, "errors are not cached");
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.to_owned(),
            uid: "uid-1".to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: BTreeMap::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn access_reviews_carry_the_kubelets_attributes_and_are_cached_per_answer() {
        let allowed = Arc::new(Mutex::new(false));
        let flag = allowed.clone();
        let (client, seen, calls) = fake_client(move |body| {
            let yes = *flag.lock().map_err(|_| 500u16)?;
            Ok(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": body["spec"], "status": {"allowed": yes, "reason": if yes { "" } else { "no RBAC" }}}))
        });
        let reviewer =
            AccessReviewer::new(client, "node-1".into(), Duration::from_secs(300), Duration::from_secs(1));
        let alice = user("alice", &["devs"]);
        let metrics = request_attributes(&http::Method::GET, "/metrics");
        assert_eq!(
            reviewer.review(&alice, metrics).await.expect("reviewed"),
            Decision::Denied("no RBAC".into())
        );
        {
            let seen = seen.lock().expect("lock");
            let (method, path, body) = &seen[0];
            assert_eq!(
                (method.as_str(), path.as_str()),
                ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews")
            );
            assert_eq!(
                body["spec"],
                json!({"user": "alice", "uid": "uid-1", "groups": ["devs"], "resourceAttributes": {
                    "verb": "get", "version": "v1", "resource": "nodes", "subresource": "metrics",
                    "name": "node-1"}})
            );
        }
        // The denial is cached for the unauthorized TTL (1 s) only.
        *allowed.lock().expect("lock") = true;
        assert!(matches!(reviewer.review(&alice, metrics).await, Ok(Decision::Denied(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(reviewer.review(&alice, metrics).await.expect("reviewed"), Decision::Allowed);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Another subresource, verb or group set is another question.
        let pods = request_attributes(&http::Method::GET, "/pods");
        reviewer.review(&alice, pods).await.expect("reviewed");
        reviewer.review(&alice, request_attributes(&http::Method::POST, "/metrics")).await.expect("reviewed");
        reviewer.review(&user("alice", &["devs", "ops"]), metrics).await.expect("reviewed");
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // The allowance is cached for the authorized TTL (300 s).
        *allowed.lock().expect("lock") = false;
        tokio::time::advance(Duration::from_secs(299)).await;
        assert_eq!(reviewer.review(&alice, metrics).await.expect("cached"), Decision::Allowed);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(matches!(reviewer.review(&alice, metrics).await, Ok(Decision::Denied(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_access_reviews_are_errors_and_not_cached() {
        let (client, _seen, calls) = fake_client(|_| Err(503));
        let reviewer =
            AccessReviewer::new(client, "node-1".into(), Duration::from_secs(300), Duration::from_secs(30));
        let attrs = request_attributes(&http::Method::GET, "/pods");
        assert!(reviewer.review(&user("bob", &[]), attrs).await.is_err());
        assert!(reviewer.review(&user("bob", &[]), attrs).await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

//! Making sure a container's image is present, as its `imagePullPolicy` says (the kubelet's
//! `EnsureImageExists`), and checking image names before they reach the runtime. What happened to
//! each container's image (present, pulling, pulled in how long, how big) is kept in [`PullRecords`]
//! for the kubelet's `Pulling`/`Pulled` events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1;

use crate::client::CriClient;
use crate::error::CriError;

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull before every container start.
    Always,
    /// Pull only when the runtime does not have the image.
    IfNotPresent,
    /// Never pull; fail when the image is missing.
    Never,
}

impl PullPolicy {
    /// The policy as written, or, when unset, the API server's default for `image`: `Always` for an untagged
    /// or `:latest` image without a digest, `IfNotPresent` otherwise. `None` for an unknown value.
    pub fn resolve(policy: Option<&str>, image: &str) -> Option<PullPolicy> {
        match policy {
            Some("Always") => Some(PullPolicy::Always),
            Some("IfNotPresent") => Some(PullPolicy::IfNotPresent),
            Some("Never") => Some(PullPolicy::Never),
            Some(_) => None,
            None => {
                let (name, digest) = image.split_once('@').map_or((image, None), |(n, d)| (n, Some(d)));
                let tag = tag_of(name);
                if digest.is_none() && tag.is_none_or(|t| t == "latest") {
                    Some(PullPolicy::Always)
                } else {
                    Some(PullPolicy::IfNotPresent)
                }
            }
        }
    }
}

/// Why an image could not be made present. [`reason`](ImageError::reason) is the kubelet's waiting reason.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image reference is malformed (or empty, or the pull policy unknown).
    #[error("failed to apply default image tag {image:?}: {why}")]
    Invalid {
        /// The image as written in the pod spec.
        image: String,
        /// What is wrong with it.
        why: ImageNameError,
    },
    /// `imagePullPolicy: Never` and the runtime does not have the image.
    #[error("container image {image:?} is not present with pull policy of Never")]
    NeverPull {
        /// The image.
        image: String,
    },
    /// Asking the runtime about the image failed.
    #[error("failed to inspect image {image:?}: {source}")]
    Inspect {
        /// The image.
        image: String,
        /// The runtime's error.
        source: CriError,
    },
    /// Pulling failed.
    #[error("failed to pull image {image:?}: {source}")]
    Pull {
        /// The image.
        image: String,
        /// The runtime's error.
        source: CriError,
    },
}

impl ImageError {
    /// The kubelet's name for the failure: `InvalidImageName`, `ErrImageNeverPull`, `ImageInspectError` or
    /// `ErrImagePull`.
    pub fn reason(&self) -> &'static str {
        match self {
            ImageError::Invalid { .. } => "InvalidImageName",
            ImageError::NeverPull { .. } => "ErrImageNeverPull",
            ImageError::Inspect { .. } => "ImageInspectError",
            ImageError::Pull { .. } => "ErrImagePull",
        }
    }

    /// The runtime's error behind this one, if any.
    pub fn cri_error(&self) -> Option<&CriError> {
        match self {
            ImageError::Inspect { source, .. } | ImageError::Pull { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The tag of an image name without digest, if it has one (a `:` after the last `/`).
fn tag_of(name: &str) -> Option<&str> {
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, tag)| tag)
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// A path component: `[a-z0-9]+` runs joined by `.`, `_`, `__` or any number of `-`.
fn valid_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else { return false };
    if !is_lower_alnum(first) || !is_lower_alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if is_lower_alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !is_lower_alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// A registry host: `[A-Za-z0-9-]` labels joined by `.`, optional `:port`, or a bracketed IPv6 address.
fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, rest)) => {
                if ip.parse::<std::net::Ipv6Addr>().is_err() {
                    return false;
                }
                (None, rest.strip_prefix(':'))
            }
            None => return false,
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5)
    {
        return false;
    }
    host.is_none_or(|h| {
        !h.is_empty()
            && h.split('.').all(|label| {
                !label.is_empty()
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
    })
}

/// What is wrong with an image reference ([`validate_image_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageNameError {
    /// The reference is empty.
    #[error("empty image name")]
    Empty,
    /// Too long, a blank or control character, or a path component outside the grammar.
    #[error("invalid reference format")]
    Format,
    /// The part after `@` is not `algorithm:hex` (at least 32 hex digits).
    #[error("invalid digest format")]
    Digest,
    /// The tag is not `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
    #[error("invalid tag {0:?}")]
    Tag(String),
    /// The repository name exceeds 255 characters.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    /// The registry host is not a valid domain or address.
    #[error("invalid registry host {0:?}")]
    RegistryHost(String),
    /// The repository name has upper-case letters.
    #[error("repository name must be lowercase")]
    Uppercase,
}

/// Checks an image reference against the distribution reference grammar
/// (`[domain/]path[:tag][@algorithm:hex]`), as the kubelet does before pulling; `Err` says what is wrong.
pub fn validate_image_name(image: &str) -> Result<(), ImageNameError> {
    if image.is_empty() {
        return Err(ImageNameError::Empty);
    }
    if image.len() > 4096 || image.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err(ImageNameError::Format);
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else {
            return Err(ImageNameError::Digest);
        };
        let algorithm_ok = !algorithm.is_empty()
            && algorithm.bytes().all(|b| is_lower_alnum(b) || matches!(b, b'+' | b'.' | b'_' | b'-'));
        if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ImageNameError::Digest);
        }
    }
    let (name, tag) = match tag_of(name_tag) {
        Some(tag) => (&name_tag[..name_tag.len() - tag.len() - 1], Some(tag)),
        None => (name_tag, None),
    };
    if let Some(tag) = tag {
        let bytes = tag.as_bytes();
        let first_ok = bytes.first().is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if !first_ok
            || bytes.len() > 128
            || !bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(ImageNameError::Tag(tag.to_owned()));
        }
    }
    if name.len() > 255 {
        return Err(ImageNameError::NameTooLong);
    }
    let mut components: Vec<&str> = name.split('/').collect();
    let first = components.first().copied().unwrap_or_default();
    let has_domain = components.len() > 1
        && (first.contains(['.', ':', '['])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    if has_domain {
        if !valid_domain(first) {
            return Err(ImageNameError::RegistryHost(first.to_owned()));
        }
        components.remove(0);
    }
    if components.iter().all(|c| valid_path_component(c)) {
        Ok(())
    } else if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Err(ImageNameError::Uppercase)
    } else {
        Err(ImageNameError::Format)
    }
}

/// What happened the last time a container's image was made sure of: what the kubelet's `Pulling` and
/// `Pulled` events tell. Times are wall-clock nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullRecord {
    /// The runtime has the image; no pull was needed.
    Present {
        /// The image as the container names it.
        image: String,
        /// When this was found.
        at: i64,
    },
    /// A pull started and has not ended (or failed: the container's waiting reason says so).
    Pulling {
        /// The image.
        image: String,
        /// When the pull started.
        started_at: i64,
    },
    /// A pull succeeded.
    Pulled {
        /// The image.
        image: String,
        /// When the pull started.
        started_at: i64,
        /// When it ended.
        finished_at: i64,
        /// How long it took.
        took: Duration,
    },
}

impl PullRecord {
    /// The kubelet 1.28's message of a finished pull (`Pulled`): `Successfully pulled image "busybox" in
    /// 1.234s (1.234s including waiting)` (nodelet pulls one image at a time per container, so the waiting
    /// time is the pull's own; the image size was added to the message by later kubelets).
    pub fn pulled_message(image: &str, took: Duration) -> String {
        let took = go_duration(took);
        format!("Successfully pulled image {image:?} in {took} ({took} including waiting)")
    }
}

/// Go's `time.Duration.String` (`1.5s`, `345.2ms`, `2m3.1s`), as the kubelet's messages print durations.
pub fn go_duration(d: Duration) -> String {
    let n = d.as_nanos();
    if n == 0 {
        return "0s".into();
    }
    if n < 1_000 {
        return format!("{n}ns");
    }
    let frac = |v: u128, digits: usize| {
        let unit = 10u128.pow(u32::try_from(digits).unwrap_or(9));
        let (int, rem) = (v / unit, v % unit);
        if rem == 0 {
            int.to_string()
        } else {
            format!("{int}.{}", format!("{rem:0digits$}").trim_end_matches('0'))
        }
    };
    if n < 1_000_000 {
        return format!("{}µs", frac(n, 3));
    }
    if n < 1_000_000_000 {
        return format!("{}ms", frac(n, 6));
    }
    let secs = n / 1_000_000_000;
    let (h, m) = (secs / 3600, (secs % 3600) / 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{}s", frac(n % 60_000_000_000, 9)));
    out
}

/// The last [`PullRecord`] of each (pod UID, container name), shared between the runtime that pulls and
/// the node view that reports events. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PullRecords {
    records: Arc<Mutex<HashMap<(String, String), PullRecord>>>,
    /// Counts the changes (bumped after each one, outside the lock).
    version: Arc<std::sync::atomic::AtomicU64>,
}

impl PullRecords {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), PullRecord>> {
        self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn changed(&self) {
        self.version.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// The number of changes so far. Loaded before [`entries`](Self::entries), it tells later
    /// whether the records may have changed since: not while the version is the same.
    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records what happened to the image of `container` of pod `uid`.
    pub fn set(&self, uid: &str, container: &str, record: PullRecord) {
        self.lock().insert((uid.to_owned(), container.to_owned()), record);
        self.changed();
    }

    /// Every record, keyed by (pod UID, container name).
    pub fn entries(&self) -> Vec<((String, String), PullRecord)> {
        let mut all: Vec<_> = self.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Forgets the records of pods for which `keep(uid)` is false (a change only if one was there).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut records = self.lock();
        let before = records.len();
        records.retain(|(uid, _), _| keep(uid));
        let removed = records.len() != before;
        drop(records);
        if removed {
            self.changed();
        }
    }
}

/// Wall-clock nanoseconds.
fn now_nanos() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

/// Makes sure `image` is present as `policy` says (see [`ensure_image_with`]), recording into `records` under (`uid`, `container`) whether the image was present,
/// is being pulled, or was pulled (and how long that took).
pub(crate) async fn ensure_image_recorded(
    client: &CriClient,
    image: &str,
    policy: PullPolicy,
    sandbox_config: Option<&v1::PodSandboxConfig>,
    (records, uid, container): (&PullRecords, &str, &str),
) -> Result<v1::Image, ImageError> {
    use std::sync::atomic::{AtomicI64, Ordering};
    // 0 until a pull starts.
    let started_at = AtomicI64::new(0);
    let result = ensure_image_with(client, image, policy, sandbox_config, || {
        let at = now_nanos();
        started_at.store(at, Ordering::Relaxed);
        records.set(uid, container, PullRecord::Pulling { image: image.to_owned(), started_at: at });
    })
    .await;
    if result.is_ok() {
        let record = match started_at.load(Ordering::Relaxed) {
            0 => PullRecord::Present { image: image.to_owned(), at: now_nanos() },
            started_at => {
                let finished_at = now_nanos();
                PullRecord::Pulled {
                    image: image.to_owned(),
                    started_at,
                    finished_at,
                    took: Duration::from_nanos(
                        u64::try_from(finished_at.saturating_sub(started_at)).unwrap_or(0),
                    ),
                }
            }
        };
        records.set(uid, container, record);
    }
    result
}

/// Makes sure `image` is present as `policy` says, calling `on_pull` when a pull starts; returns the
/// runtime's record of it (its `id` is the reference to create containers with).
async fn ensure_image_with(
    client: &CriClient,
    image: &str,
    policy: PullPolicy,
    sandbox_config: Option<&v1::PodSandboxConfig>,
    on_pull: impl FnOnce(),
) -> Result<v1::Image, ImageError> {
    validate_image_name(image).map_err(|why| ImageError::Invalid { image: image.to_owned(), why })?;
    let inspect = |source| ImageError::Inspect { image: image.to_owned(), source };
    if policy != PullPolicy::Always {
        match client.image_status(image).await.map_err(inspect)? {
            Some(present) => return Ok(present),
            None if policy == PullPolicy::Never => {
                return Err(ImageError::NeverPull { image: image.to_owned() });
            }
            None => {}
        }
    }
    on_pull();
    let started = tokio::time::Instant::now();
    let image_ref = client
        .pull_image(image, None, sandbox_config.cloned())
        .await
        .map_err(|source| ImageError::Pull { image: image.to_owned(), source })?;
    tracing::info!(image, image_ref, elapsed_ms = started.elapsed().as_millis(), "pulled image");
    match client.image_status(&image_ref).await.map_err(inspect)? {
        Some(pulled) => Ok(pulled),
        None => Err(ImageError::Pull {
            image: image.to_owned(),
            source: CriError::InvalidResponse {
                call: "ImageStatus",
                reason: format!("pulled image {image_ref} is not present"),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_messages_are_the_kubelets() {
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_micros(345_200)), "345.2ms");
        assert_eq!(go_duration(Duration::from_millis(123_100)), "2m3.1s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_nanos(1_500)), "1.5µs");
        assert_eq!(
            PullRecord::pulled_message("busybox", Duration::from_millis(1234)),
            "Successfully pulled image \"busybox\" in 1.234s (1.234s including waiting)"
        );
        let records = PullRecords::default();
        let v0 = records.version();
        records.set("u1", "app", PullRecord::Present { image: "busybox".into(), at: 1 });
        records.set("u2", "app", PullRecord::Pulling { image: "busybox".into(), started_at: 2 });
        let v1 = records.version();
        assert_ne!(v1, v0, "a record is a change");
        records.retain(|uid| uid == "u2");
        assert_eq!(records.entries().len(), 1);
        let v2 = records.version();
        assert_ne!(v2, v1, "a record forgotten is a change");
        records.retain(|uid| uid == "u2");
        assert_eq!(records.version(), v2, "forgetting nothing is none");
    }

    #[test]
    fn default_pull_policy() {
        let p = |img: &str| PullPolicy::resolve(None, img);
        assert_eq!(p("busybox"), Some(PullPolicy::Always));
        assert_eq!(p("busybox:latest"), Some(PullPolicy::Always));
        assert_eq!(p("127.0.0.1:5000/busybox"), Some(PullPolicy::Always), "a port is not a tag");
        assert_eq!(p("127.0.0.1:5000/busybox:v2"), Some(PullPolicy::IfNotPresent));
        let digest = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(p(&digest), Some(PullPolicy::IfNotPresent));
        assert_eq!(PullPolicy::resolve(Some("Never"), "busybox"), Some(PullPolicy::Never));
        assert_eq!(PullPolicy::resolve(Some("Sometimes"), "busybox"), None);
    }

    #[test]
    fn image_names() {
        let digest = "a".repeat(64);
        for ok in [
            "busybox".to_owned(),
            "library/busybox:1.36".to_owned(),
            "localhost/nodelet/busybox:latest".to_owned(),
            "127.0.0.1:5000/busybox:v2".to_owned(),
            "registry.example/a__b/c-d/e.f:tag_1.0-x".to_owned(),
            format!("busybox@sha256:{digest}"),
            format!("busybox:1@sha256:{digest}"),
            "[::1]:5000/img".to_owned(),
            "Registry.Example/img".to_owned(),
        ] {
            assert_eq!(validate_image_name(&ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Busybox",
            "busy box",
            "busybox:",
            "busybox:-tag",
            "-busybox",
            "busybox//x",
            "busybox@sha256:xyz",
            "busybox@",
            "a/../b",
            "bad_host:99999999/img",
            "busybox\n",
        ] {
            assert!(validate_image_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reasons() {
        let e = ImageError::NeverPull { image: "x".into() };
        assert_eq!(e.reason(), "ErrImageNeverPull");
        assert!(e.to_string().contains("pull policy of Never"));
        assert_eq!(
            ImageError::Invalid { image: "X".into(), why: ImageNameError::Empty }.reason(),
            "InvalidImageName"
        );
    }
}

//! Making sure a container's image is present, as its `imagePullPolicy` says (the kubelet's
//! `EnsureImageExists`), and checking image names before they reach the runtime.

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
        why: String,
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

/// Checks an image reference against the distribution reference grammar
/// (`[domain/]path[:tag][@algorithm:hex]`), as the kubelet does before pulling; `Err` says what is wrong.
pub fn validate_image_name(image: &str) -> Result<(), String> {
    if image.is_empty() {
        return Err("empty image name".into());
    }
    if image.len() > 4096 || image.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
        return Err("invalid reference format".into());
    }
    let (name_tag, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let Some((algorithm, hex)) = digest.split_once(':') else {
            return Err("invalid digest format".into());
        };
        let algorithm_ok = !algorithm.is_empty()
            && algorithm.bytes().all(|b| is_lower_alnum(b) || matches!(b, b'+' | b'.' | b'_' | b'-'));
        if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("invalid digest format".into());
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
            return Err(format!("invalid tag {tag:?}"));
        }
    }
    if name.len() > 255 {
        return Err("repository name must not be more than 255 characters".into());
    }
    let mut components: Vec<&str> = name.split('/').collect();
    let first = components.first().copied().unwrap_or_default();
    let has_domain = components.len() > 1
        && (first.contains(['.', ':', '['])
            || first == "localhost"
            || first.bytes().any(|b| b.is_ascii_uppercase()));
    if has_domain {
        if !valid_domain(first) {
            return Err(format!("invalid registry host {first:?}"));
        }
        components.remove(0);
    }
    if components.iter().all(|c| valid_path_component(c)) {
        Ok(())
    } else if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Err("repository name must be lowercase".into())
    } else {
        Err("invalid reference format".into())
    }
}

/// Makes sure `image` is present as `policy` says; returns the runtime's record of it (its `id` is the
/// reference to create containers with).
pub(crate) async fn ensure_image(
    client: &CriClient,
    image: &str,
    policy: PullPolicy,
    sandbox_config: Option<&v1::PodSandboxConfig>,
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
        assert_eq!(ImageError::Invalid { image: "X".into(), why: "w".into() }.reason(), "InvalidImageName");
    }
}

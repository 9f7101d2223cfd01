//! The manifests of the pre-pull directory: YAML files (`*.yaml`, `*.yml`) of kind `ImagePrepull`.
//!
//! ```yaml
//! apiVersion: prepull.nodelet.io/v1alpha1
//! kind: ImagePrepull
//! metadata:
//!   name: base-images
//! spec:
//!   images:
//!     - 127.0.0.1:5000/busybox:v2
//!     - busybox            # docker.io/library/busybox:latest
//! ```
//!
//! Every field is read; an unknown one is an error (nothing is accepted that the extension does not act
//! on). Image references are normalized as the container runtime stores them (`busybox` →
//! `docker.io/library/busybox:latest`).

use std::collections::BTreeSet;

use serde::Deserialize;

/// The `apiVersion` of a pre-pull manifest.
pub const API_VERSION: &str = "prepull.nodelet.io/v1alpha1";
/// The `kind` of a pre-pull manifest.
pub const KIND: &str = "ImagePrepull";

/// Why a manifest cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not YAML of the expected shape (includes unknown fields).
    #[error("not an {KIND} manifest: {0}")]
    Parse(String),
    /// Another `apiVersion` or `kind`.
    #[error("apiVersion/kind must be {API_VERSION}/{KIND}, not {0}/{1}")]
    Kind(String, String),
    /// An image reference that cannot be pulled.
    #[error("invalid image reference {0:?}: {1}")]
    Image(String, &'static str),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Manifest {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    images: Vec<String>,
}

/// A valid manifest: its name and its images, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePrepull {
    /// `metadata.name`.
    pub name: String,
    /// `spec.images`, normalized, without duplicates.
    pub images: BTreeSet<String>,
}

/// Parses one manifest.
pub fn parse(text: &str) -> Result<ImagePrepull, ManifestError> {
    // The first line of the error (the YAML library adds an excerpt of the input on the next lines).
    let m: Manifest = serde_saphyr::from_str(text)
        .map_err(|e| ManifestError::Parse(e.to_string().lines().next().unwrap_or_default().to_owned()))?;
    if m.api_version != API_VERSION || m.kind != KIND {
        return Err(ManifestError::Kind(m.api_version, m.kind));
    }
    let images = m.spec.images.iter().map(|i| normalize(i)).collect::<Result<_, _>>()?;
    Ok(ImagePrepull { name: m.metadata.name, images })
}

/// Normalizes an image reference as containerd names it: a registry (`docker.io` when the first part is
/// not a host), `library/` for official Docker Hub images, and `:latest` when neither tag nor digest is
/// given.
pub fn normalize(image: &str) -> Result<String, ManifestError> {
    let bad = |why| Err(ManifestError::Image(image.to_owned(), why));
    if image.is_empty() {
        return bad("empty");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control() || c.is_ascii_uppercase()) {
        return bad("whitespace, control characters and upper case are not allowed");
    }
    if image.starts_with('/') || image.ends_with('/') || image.contains("//") {
        return bad("empty path component");
    }
    let (first, rest) = match image.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            (first.to_owned(), rest.to_owned())
        }
        Some(_) => ("docker.io".to_owned(), image.to_owned()),
        None => ("docker.io".to_owned(), format!("library/{image}")),
    };
    let rest = if first == "docker.io" && !rest.contains('/') { format!("library/{rest}") } else { rest };
    let last = rest.rsplit('/').next().unwrap_or_default();
    let tagged = last.contains(':') || last.contains('@');
    if last.starts_with(':') || last.starts_with('@') || last.ends_with(':') || last.ends_with('@') {
        return bad("empty name, tag or digest");
    }
    Ok(if tagged { format!("{first}/{rest}") } else { format!("{first}/{rest}:latest") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_should_be_normalized_as_containerd_stores_them() {
        let n = |s| normalize(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(n("bitnami/redis"), "docker.io/bitnami/redis:latest");
        assert_eq!(n("127.0.0.1:5000/busybox:v2"), "127.0.0.1:5000/busybox:v2");
        assert_eq!(n("localhost/pause"), "localhost/pause:latest");
        assert_eq!(n("quay.io/a/b@sha256:00"), "quay.io/a/b@sha256:00");
        for bad in ["", "Busybox", "a b", "/x", "x/", "a//b", "x:"] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_manifest_should_parse_and_unknown_fields_or_kinds_should_be_refused() {
        let ok = "apiVersion: prepull.nodelet.io/v1alpha1\nkind: ImagePrepull\nmetadata: {name: base}\n\
                  spec: {images: [busybox, busybox:latest, '127.0.0.1:5000/busybox:v2']}\n";
        let m = parse(ok).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.name, "base");
        assert_eq!(m.images.len(), 2);
        assert!(matches!(parse(&ok.replace("images:", "imagez:")), Err(ManifestError::Parse(_))));
        assert!(matches!(parse(&ok.replace("ImagePrepull", "Pod")), Err(ManifestError::Kind(..))));
        assert!(matches!(parse(&ok.replace("busybox,", "'bad image',")), Err(ManifestError::Image(..))));
        assert!(matches!(parse("{{{"), Err(ManifestError::Parse(_))));
    }
}

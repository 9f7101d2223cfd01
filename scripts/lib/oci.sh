# shellcheck shell=bash
# Digests of OCI images, for scripts that build images and push them to a local registry
# (scripts/runtime-up.sh, scripts/e2e-images.sh). Source it; needs jq and curl.

# oci_layout_digest LAYOUT TAG: the manifest digest of TAG in the OCI layout directory LAYOUT (empty if absent)
oci_layout_digest() {
	jq -r --arg t "$2" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t) | .digest' \
		"$1/index.json"
}

# oci_registry_digest HOST:PORT NAME:TAG: the manifest digest the plain-HTTP registry serves for NAME:TAG
# (empty if it has none or does not answer)
oci_registry_digest() {
	curl -fsS -I --max-time 5 -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
		"http://$1/v2/${2%%:*}/manifests/${2##*:}" 2>/dev/null |
		tr -d '\r' | awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}' || true
}

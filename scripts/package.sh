#!/usr/bin/env bash
# Builds nodelet's Debian package with cargo-deb ([package.metadata.deb] in Cargo.toml): the binary, the systemd
# unit (deploy/nodelet.service), the default configuration (/etc/nodelet/kubelet-config.yaml, /etc/default/nodelet;
# conffiles), the man pages and shell completions generated from the binary, and the maintainer scripts of
# deploy/debian/. Installs cargo-deb (`cargo install cargo-deb --locked`) when it is missing.
#
#   scripts/package.sh                          cargo build --profile dist (fat LTO), then the package
#   scripts/package.sh --binary target/debug/nodelet --deb-revision 2
#                                               package an existing binary (the package test packages the debug
#                                               build: no second, optimised build), with another revision
#   sudo apt install ./target/debian/nodelet_*.deb   (or deploy/install.sh, which finds it)
#
# Options:
#   --profile NAME      the cargo profile to build with (default dist; release is the faster, thin-LTO build)
#   --binary PATH       package this nodelet binary instead of building one
#   --deb-revision N    the Debian revision (default 1: version 0.1.0-1)
#   --out DIR           where the .deb goes (default: <target dir>/debian)
#   --fast              lighter compression (a larger file, built faster; the package test uses it)
# Prints the path of the package last.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

log() { printf '[package %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
	printf '[package %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

PROFILE=dist BINARY='' REVISION=1 OUT='' FAST=0
while [ $# -gt 0 ]; do
	case "$1" in
	--profile) PROFILE=${2:?--profile needs a name} && shift ;;
	--binary) BINARY=${2:?--binary needs a path} && shift ;;
	--deb-revision) REVISION=${2:?--deb-revision needs a value} && shift ;;
	--out) OUT=${2:?--out needs a directory} && shift ;;
	--fast) FAST=1 ;;
	-h | --help)
		awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
		exit 0
		;;
	*) die "unknown argument: $1 (see $0 --help)" ;;
	esac
	shift
done
[[ $PROFILE =~ ^[a-z][a-z0-9_-]*$ ]] || die "--profile: not a profile name: $PROFILE"
[[ $REVISION =~ ^[0-9A-Za-z.+~]+$ ]] || die "--deb-revision: not a Debian revision: $REVISION"
command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (https://rustup.rs) first"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian machine is needed)"

if ! cargo deb --version >/dev/null 2>&1; then
	log "installing cargo-deb (cargo install cargo-deb --locked)"
	cargo install cargo-deb --locked
fi

TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
OUT=${OUT:-$TARGET_DIR/debian}
mkdir -p "$OUT"

# cargo-deb reads the `target/release/` of the asset paths as <target dir>/<profile dir>. A given binary is packaged
# from a staging target dir of its own, as the release profile's output, so that the real build stays untouched.
if [ -n "$BINARY" ]; then
	if [ ! -f "$BINARY" ] || [ ! -x "$BINARY" ]; then die "--binary: not an executable file: $BINARY"; fi
	STAGE_TARGET=$(mktemp -d "$TARGET_DIR/package-stage.XXXXXX")
	trap 'rm -rf "$STAGE_TARGET"' EXIT
	mkdir -p "$STAGE_TARGET/release"
	cp "$BINARY" "$STAGE_TARGET/release/nodelet"
	DEB_TARGET=$STAGE_TARGET DEB_PROFILE=release
	log "packaging $BINARY"
else
	log "building nodelet (cargo build --profile $PROFILE)"
	start=$(date +%s)
	cargo build --locked --profile "$PROFILE" --bin nodelet
	log "built in $(($(date +%s) - start)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	DEB_TARGET=$TARGET_DIR DEB_PROFILE=$PROFILE
fi
case "$DEB_PROFILE" in
dev) PROFILE_DIR=$DEB_TARGET/debug ;;
*) PROFILE_DIR=$DEB_TARGET/$DEB_PROFILE ;;
esac
BIN=$PROFILE_DIR/nodelet
[ -x "$BIN" ] || die "no binary at $BIN"

# The man pages and completions come from the binary's own command definitions (clap_mangen, clap_complete).
GEN=$PROFILE_DIR/package
rm -rf "$GEN"
mkdir -p "$GEN/man" "$GEN/completions"
"$BIN" man --dir "$GEN/man"
gzip -9n "$GEN/man"/*.1
"$BIN" completion bash >"$GEN/completions/nodelet.bash"
"$BIN" completion zsh >"$GEN/completions/_nodelet"
"$BIN" completion fish >"$GEN/completions/nodelet.fish"
log "generated $(find "$GEN/man" -name '*.1.gz' | wc -l) man pages and the bash, zsh and fish completions"

VERSION=$(cargo metadata --format-version 1 --no-deps | jq -r '.packages[] | select(.name == "nodelet") | .version')
# --strip: the binary's line tables only serve backtraces; the package ships it stripped (as Debian does)
DEB_ARGS=(--no-build --strip --profile "$DEB_PROFILE" --deb-revision "$REVISION" --output "$OUT")
[ "$FAST" = 1 ] && DEB_ARGS+=(--fast)
CARGO_TARGET_DIR=$DEB_TARGET cargo deb "${DEB_ARGS[@]}" >&2
DEB=$OUT/nodelet_${VERSION}-${REVISION}_$(dpkg --print-architecture).deb
[ -f "$DEB" ] || die "cargo deb did not write $DEB"
log "built $DEB ($(du -h "$DEB" | cut -f1))"
echo "$DEB"

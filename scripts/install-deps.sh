#!/usr/bin/env bash
# Install the Debian 12 packages that nodelet's integration tests and quick start need.
#
# Idempotent: only packages that are not installed are installed, and `apt-get update`
# only runs when something is missing. Rust is expected to be preinstalled (not handled here).
#
#   scripts/install-deps.sh            install whatever is missing
#   scripts/install-deps.sh --check    only report missing packages (exit 1 if any)
#
# Services shipped by these packages (docker-registry, prometheus, lvm2 monitors, ...) are
# NOT started: runtime-up.sh runs its own containerd and registry. While installing, a
# temporary /usr/sbin/policy-rc.d (exit 101) is put in place if the host has none.
set -euo pipefail

PKGS=(
	containerd runc containernetworking-plugins
	busybox-static skopeo umoci docker-registry
	iptables iproute2
	protobuf-compiler gcc libc6-dev
	jq curl
	prometheus # for promtool
	systemd shellcheck # systemd-analyze verify and shellcheck of deploy/ (tests/daemon/deploy.rs)
	lintian            # the Debian package's check (scripts/package-test.sh)
	util-linux e2fsprogs lvm2
	make bzip2 xz-utils netcat-openbsd openssl # scripts/e2e-images.sh and scripts/conformance.sh
	criu # containerd 2.x's CRI CheckpointContainer (tests/daemon/checkpoint.rs; `criu check` decides what it expects)
)
# commands that must exist afterwards (name → proves which package works)
CMDS=(containerd containerd-shim-runc-v2 ctr runc skopeo umoci docker-registry
	iptables ip protoc gcc jq curl promtool systemd-analyze shellcheck lintian setsid nsenter findmnt mkfs.ext4 lvcreate
	make bzip2 xz nc.openbsd openssl criu)
CNI_BIN_DIR=/usr/lib/cni
CNI_PLUGINS=(bridge host-local loopback portmap)

log() { printf '[install-deps %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() {
	printf '[install-deps %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

CHECK_ONLY=0
case "${1:-}" in
"") ;;
--check) CHECK_ONLY=1 ;;
-h | --help)
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit 0
	;;
*) die "unknown argument: $1 (usage: $0 [--check])" ;;
esac

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ "${#missing[@]}" -eq 0 ]; then
	log "all ${#PKGS[@]} packages present"
elif [ "$CHECK_ONLY" = 1 ]; then
	die "missing packages: ${missing[*]}"
else
	[ "$(id -u)" = 0 ] || die "must run as root to install: ${missing[*]}"
	command -v apt-get >/dev/null || die "apt-get not found (Debian 12 expected)"
	export DEBIAN_FRONTEND=noninteractive
	aptlog=$(mktemp /tmp/nodelet-install-deps.XXXXXX.log)

	# keep package postinst scripts from starting daemons (no systemd here; a sysv
	# docker-registry on :5000 would collide with ours)
	policy=/usr/sbin/policy-rc.d
	own_policy=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\n# temporary, from nodelet scripts/install-deps.sh\nexit 101\n' >"$policy"
		chmod 0755 "$policy"
		own_policy=1
	fi
	cleanup() { if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi; }
	trap cleanup EXIT

	log "missing: ${missing[*]}"
	log "apt-get update (log: $aptlog)"
	if ! apt-get update -q >>"$aptlog" 2>&1; then
		tail -n 20 "$aptlog" >&2
		die "apt-get update failed (full log: $aptlog)"
	fi
	log "apt-get install ${missing[*]}"
	if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1; then
		tail -n 30 "$aptlog" >&2
		die "apt-get install failed (full log: $aptlog)"
	fi
	rm -f "$aptlog"
	log "installed ${#missing[@]} package(s)"
fi

# verify: commands on PATH (sbin included: root's PATH may lack it in some shells)
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
bad=()
for c in "${CMDS[@]}"; do command -v "$c" >/dev/null || bad+=("$c"); done
for b in "${CNI_PLUGINS[@]}"; do [ -x "$CNI_BIN_DIR/$b" ] || bad+=("$CNI_BIN_DIR/$b"); done
[ "${#bad[@]}" -eq 0 ] || die "not found after install: ${bad[*]}"
command -v cargo >/dev/null || log "note: cargo not on PATH (Rust is expected to be preinstalled)"
log "ok"

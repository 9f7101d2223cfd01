#!/usr/bin/env bash
# Bring up the real container runtime used by nodelet's integration tests and quick start.
# Idempotent: a second run only checks and reports. Run as root on Debian 12 (no systemd).
#
#   scripts/runtime-up.sh                  bring up (or verify) everything
#   scripts/runtime-up.sh --print-config   print the containerd config it uses, and exit
#   scripts/runtime-up.sh --images-only DIR  only build the OCI image archives into DIR (pause.tar,
#                                          busybox.tar, busybox-v2.tar, + extra images) and exit; starts
#                                          nothing (used by scripts/build-images.sh and the quick start)
#   . "$NODELET_TEST_BASE/env.sh"          afterwards: endpoints and image names for tests
#
# What runs afterwards (everything under $NODELET_TEST_BASE):
#   * containerd (CRI) as a plain background process: own root/state/socket/config, runc root,
#     pid file run/containerd.pid, log logs/containerd.log; restarted when its config changed
#   * CNI network "nodelet-test": bridge nlcni0 (gateway, no masquerade, hairpin), host-local
#     IPAM on 198.18.0.0/17, no default route in pods (nothing can leave the host), portmap
#   * deterministic OCI images built with umoci (identical digests on every build):
#       localhost/nodelet/pause:3.9       static C pause (deploy/images/pause.c), the sandbox image
#       localhost/nodelet/busybox:latest  busybox-static + one symlink per applet in /bin
#       localhost/nodelet/busybox:v2      + layer with /etc/nodelet-image-version (registry only)
#       localhost/nodelet/grpc-health:1  busybox + /usr/local/bin/grpc-health (gRPC health server of the
#                                         probe tests, built from deploy/images/grpc-health when cargo is there)
#     pause and busybox:latest are imported into containerd namespace k8s.io; v2 is not, so
#     pulling it is a real download
#   * docker-registry on 127.0.0.1:5000 (plain http) holding busybox:latest, busybox:v2, pause:3.9;
#     containerd's registry hosts.toml makes CRI PullImage of 127.0.0.1:5000/... work
#   * resolv.conf (nameserver 127.0.0.1) for pods' explicit DNS config, and env.sh
#
# Environment (all optional):
#   NODELET_TEST_BASE         base directory            (default /tmp/nodelet-test)
#   NODELET_TEST_REGISTRY     registry listen address   (default 127.0.0.1:5000, loopback only)
#   NODELET_TEST_POD_SUBNET   pod CIDR                  (default 198.18.0.0/17; must lie in 198.18.0.0/16)
#                             The default networks are disjoint: this one 198.18.0.0/17, the quick start's
#                             198.18.128.0/18 (scripts/quickstart.sh), the conformance node's 198.18.224.0/20
#                             (scripts/conformance.sh), so the test command and the quick start run side by side.
#   NODELET_TEST_BRIDGE       Linux bridge name         (default nlcni0)
#   NODELET_TEST_CNI_NETWORK  CNI network name          (default nodelet-test)
#   NODELET_TEST_CGROUP_PARENT top-level cgroup for pods (default /nodelet-test; exported for
#                             tests, runtime-down.sh kills and removes everything under it)
#   (a second instance next to the default one needs its own BASE, REGISTRY, BRIDGE,
#    CNI_NETWORK and CGROUP_PARENT)
#   NODELET_TEST_CONTAINERD   the containerd to run: a directory holding containerd, ctr and
#                             containerd-shim-runc-v2 (in DIR/bin or DIR), e.g. the containerd 2.x of
#                             ../shared/runtimes unpacked by its install.sh; default: containerd on PATH
#                             (Debian's 1.6). The config follows its version (`containerd config default`
#                             prints the newest config version it reads: 2, 3 or 4). A base directory
#                             belongs to one containerd major version: another one needs its own BASE.
#   NODELET_TEST_RUNC         the runc binary (or a directory holding runc) containerd's shim runs;
#                             default: runc on PATH
#   NODELET_TEST_EXTRA_IMAGES extra test images: space-separated NAME:TAG=/abs/static-binary;
#                             each becomes localhost/nodelet/NAME:TAG = busybox + the binary in
#                             /usr/local/bin (entrypoint), imported and pushed as NAME:TAG
set -euo pipefail

START_NS=$(date +%s%N)
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091 # scripts/lib/oci.sh
. "$SCRIPT_DIR/lib/oci.sh"
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

BASE=${NODELET_TEST_BASE:-/tmp/nodelet-test}
REG_ADDR=${NODELET_TEST_REGISTRY:-127.0.0.1:5000}
POD_SUBNET=${NODELET_TEST_POD_SUBNET:-198.18.0.0/17}
BRIDGE=${NODELET_TEST_BRIDGE:-nlcni0}
CNI_NET=${NODELET_TEST_CNI_NETWORK:-nodelet-test}
CGROUP_PARENT=${NODELET_TEST_CGROUP_PARENT:-/nodelet-test}
EXTRA_IMAGES_SPEC=${NODELET_TEST_EXTRA_IMAGES:-}
CNI_BIN_DIR=/usr/lib/cni
CTD_SPEC=${NODELET_TEST_CONTAINERD:-}
RUNC_SPEC=${NODELET_TEST_RUNC:-}

RUN=$BASE/run
SOCK=$RUN/containerd.sock
CTD_DIR=$BASE/containerd
CTD_CONFIG=$CTD_DIR/config.toml
CERTS_D=$CTD_DIR/certs.d
RUNC_ROOT=$BASE/runc
CNI_CONF_DIR=$BASE/cni/net.d
IPAM_DIR=$BASE/cni/ipam
IMG=$BASE/images
LAYOUT=$IMG/layout
REG_DIR=$BASE/registry
LOGS=$BASE/logs
POD_LOGS=$BASE/pods
RESOLV=$BASE/resolv.conf
CTD_LOG=$LOGS/containerd.log
REG_LOG=$LOGS/registry.log

PAUSE_IMAGE=localhost/nodelet/pause:3.9
BUSYBOX_IMAGE=localhost/nodelet/busybox:latest
BUSYBOX2_IMAGE=localhost/nodelet/busybox:v2
PAUSE_SRC=$REPO_ROOT/deploy/images/pause.c
# fixed timestamp for every file, layer and config => reproducible image digests
EPOCH=2024-01-01T00:00:00Z

log() { printf '[runtime-up %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() {
	printf '[runtime-up %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

# ---------------------------------------------------------------- arguments, validation
# The containerd binaries: CTD_BIN_DIR (empty: PATH), CONTAINERD, CTR; RUNC_BIN (empty: PATH)
CTD_BIN_DIR=
if [ -n "$CTD_SPEC" ]; then
	for d in "$CTD_SPEC/bin" "$CTD_SPEC"; do
		if [ -x "$d/containerd" ]; then
			CTD_BIN_DIR=$(realpath -- "$d")
			break
		fi
	done
	[ -n "$CTD_BIN_DIR" ] || die "NODELET_TEST_CONTAINERD=$CTD_SPEC holds no containerd (looked in DIR/bin and DIR)"
	for b in ctr containerd-shim-runc-v2; do
		[ -x "$CTD_BIN_DIR/$b" ] || die "NODELET_TEST_CONTAINERD: $CTD_BIN_DIR/$b missing"
	done
fi
RUNC_BIN=
if [ -n "$RUNC_SPEC" ]; then
	if [ -d "$RUNC_SPEC" ]; then RUNC_SPEC=$RUNC_SPEC/runc; fi
	[ -x "$RUNC_SPEC" ] || die "NODELET_TEST_RUNC=$RUNC_SPEC is not an executable runc"
	RUNC_BIN=$(realpath -- "$RUNC_SPEC")
fi
ctd_exe() { if [ -n "$CTD_BIN_DIR" ]; then echo "$CTD_BIN_DIR/$1"; else echo "$1"; fi; }
CONTAINERD=$(ctd_exe containerd)
CTR=$(ctd_exe ctr)
# "containerd github.com/containerd/containerd/v2 v2.3.4 <commit>" -> 2.3.4
containerd_version() { "$CONTAINERD" --version 2>/dev/null | awk '{sub(/^v/, "", $3); sub(/[~+-].*/, "", $3); print $3}'; }
# the newest config version this containerd reads (1.6/1.7: 2, 2.0/2.1: 3, 2.2+: 4)
config_version() {
	local v
	v=$("$CONTAINERD" config default 2>/dev/null | awk -F' *= *' '$1 == "version" {print $2; exit}')
	case "$v" in 2 | 3 | 4) echo "$v" ;; *) echo 2 ;; esac
}

print_config() {
	local runc_opt=()
	if [ -n "$RUNC_BIN" ]; then runc_opt=(--runc-binary "$RUNC_BIN"); fi
	"$SCRIPT_DIR/containerd-config.sh" "$CTD_DIR" "$SOCK" \
		--runc-root "$RUNC_ROOT" --cni-conf-dir "$CNI_CONF_DIR" --cni-bin-dir "$CNI_BIN_DIR" \
		--certs-dir "$CERTS_D" --sandbox-image "$PAUSE_IMAGE" \
		--config-version "$(config_version)" "${runc_opt[@]}"
}
IMAGES_ONLY=0
case "${1:-}" in
"") ;;
--print-config)
	print_config
	exit 0
	;;
--images-only)
	if [ $# -ne 2 ] || [ -z "$2" ]; then die "usage: $0 --images-only DIR"; fi
	IMAGES_ONLY=1
	IMG=$(realpath -m -- "$2")
	LAYOUT=$IMG/layout
	case "$IMG" in *[!A-Za-z0-9/._-]*) die "--images-only DIR may only contain [A-Za-z0-9/._-]: '$IMG'" ;; esac
	;;
-h | --help)
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit 0
	;;
*) die "unknown argument: $1 (usage: $0 [--print-config | --images-only DIR])" ;;
esac

case "$BASE" in
/*/*) ;;
*) die "NODELET_TEST_BASE must be an absolute path below a top-level directory, got '$BASE'" ;;
esac
case "$BASE" in *[!A-Za-z0-9/._-]*) die "NODELET_TEST_BASE may only contain [A-Za-z0-9/._-]: '$BASE'" ;; esac

# only 198.18.0.0/16 (RFC 2544 benchmark range) may be used for pod networks
if [[ ! $POD_SUBNET =~ ^198\.18\.([0-9]{1,3})\.([0-9]{1,3})/([0-9]{1,2})$ ]]; then
	die "NODELET_TEST_POD_SUBNET must be a CIDR inside 198.18.0.0/16, got '$POD_SUBNET'"
fi
c=${BASH_REMATCH[1]} d=${BASH_REMATCH[2]} plen=${BASH_REMATCH[3]}
GATEWAY_CIDR=198.18.$c.$((d + 1))/$plen # the bridge's address (the bridge plugin's gateway: the first host)
if [ "$c" -gt 255 ] || [ "$d" -gt 255 ] || [ "$plen" -lt 16 ] || [ "$plen" -gt 28 ] ||
	[ $((((c << 8) | d) & ((1 << (32 - plen)) - 1))) -ne 0 ]; then
	die "NODELET_TEST_POD_SUBNET '$POD_SUBNET' is not a network address with prefix /16../28 inside 198.18.0.0/16"
fi
if [[ ! $REG_ADDR =~ ^(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|localhost):([0-9]{1,5})$ ]]; then
	die "NODELET_TEST_REGISTRY must be a loopback HOST:PORT (127.x.x.x or localhost), got '$REG_ADDR'"
fi
REG_PORT=${BASH_REMATCH[2]}
[[ $BRIDGE =~ ^[A-Za-z0-9_.-]{1,15}$ ]] || die "NODELET_TEST_BRIDGE '$BRIDGE' is not a valid interface name"
[[ $CNI_NET =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "NODELET_TEST_CNI_NETWORK '$CNI_NET' is not a valid CNI network name"
if [[ ! $CGROUP_PARENT =~ ^/[A-Za-z0-9_.-]+$ ]] || [ "$CGROUP_PARENT" = /k8s.io ]; then
	die "NODELET_TEST_CGROUP_PARENT must be a dedicated top-level cgroup like /nodelet-test, got '$CGROUP_PARENT'"
fi

[ "$(id -u)" = 0 ] || die "must run as root"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
if [ "$IMAGES_ONLY" = 1 ]; then
	NEEDED=(skopeo umoci gcc jq flock sha256sum)
else
	NEEDED=(skopeo umoci docker-registry gcc jq curl
		setsid flock iptables ip sha256sum)
fi
for b in "${NEEDED[@]}"; do
	command -v "$b" >/dev/null || die "$b not found: run $SCRIPT_DIR/install-deps.sh first"
done
if [ "$IMAGES_ONLY" = 0 ]; then
	for b in containerd containerd-shim-runc-v2 ctr; do
		command -v "$(ctd_exe "$b")" >/dev/null || die "$b not found: run $SCRIPT_DIR/install-deps.sh first"
	done
	if [ -z "$RUNC_BIN" ]; then
		command -v runc >/dev/null || die "runc not found: run $SCRIPT_DIR/install-deps.sh first"
	fi
	CTD_VERSION=$(containerd_version)
	[ -n "$CTD_VERSION" ] || die "cannot read the version of $CONTAINERD"
fi
if [ "$IMAGES_ONLY" = 0 ]; then
	for b in bridge host-local loopback portmap; do
		[ -x "$CNI_BIN_DIR/$b" ] || die "CNI plugin $CNI_BIN_DIR/$b missing: run $SCRIPT_DIR/install-deps.sh first"
	done
fi
[ -x /bin/busybox ] || die "/bin/busybox missing (package busybox-static): run $SCRIPT_DIR/install-deps.sh first"
[ -f "$PAUSE_SRC" ] || die "pause source not found: $PAUSE_SRC"

if [ "$IMAGES_ONLY" = 1 ]; then
	mkdir -p "$IMG"
	# one build at a time per image directory
	exec 9>"$IMG/.lock"
	flock -w 300 9 || die "timed out waiting for $IMG/.lock"
else
	mkdir -p "$RUN" "$CTD_DIR/root" "$CTD_DIR/state" "$CTD_DIR/opt" "$CERTS_D" "$RUNC_ROOT" \
		"$CNI_CONF_DIR" "$IPAM_DIR" "$IMG" "$REG_DIR/data" "$LOGS" "$POD_LOGS"

	# one runtime-up/runtime-down at a time per base directory
	exec 9>"$RUN/lock"
	flock -w 300 9 || die "timed out waiting for $RUN/lock"
fi

ctr_() { "$CTR" --address "$SOCK" "$@"; }
ctrk() { "$CTR" --address "$SOCK" -n k8s.io "$@"; }

# write_file PATH < content: replace PATH only when the content differs; status 0 if changed
write_file() {
	local tmp
	tmp=$(mktemp "$1.XXXXXX")
	cat >"$tmp"
	if [ -f "$1" ] && cmp -s "$tmp" "$1"; then
		rm -f "$tmp"
		return 1
	fi
	chmod 0644 "$tmp"
	mv -f "$tmp" "$1"
}

# our_pid PIDFILE EXE CONFIG: print the pid from PIDFILE if that process runs EXE with CONFIG
# as an argument; otherwise look for such a process (lost pid file) and adopt it.
is_ours() { # pid exe config
	[ "$(basename "$(readlink "/proc/$1/exe" 2>/dev/null)")" = "$2" ] &&
		grep -qxzF -- "$3" "/proc/$1/cmdline" 2>/dev/null
}
our_pid() {
	local f=$1 exe=$2 cfg=$3 pid c
	pid=$(cat "$f" 2>/dev/null || true)
	if [ -n "$pid" ] && is_ours "$pid" "$exe" "$cfg"; then
		echo "$pid"
		return 0
	fi
	# shellcheck disable=SC2013 # file names from /proc have no spaces
	for c in $(grep -lxzF -- "$cfg" /proc/[0-9]*/cmdline 2>/dev/null); do
		pid=${c#/proc/}
		pid=${pid%/cmdline}
		if is_ours "$pid" "$exe" "$cfg"; then
			echo "$pid" >"$f"
			echo "$pid"
			return 0
		fi
	done
	rm -f "$f"
	return 1
}

# start_bg PIDFILE LOGFILE CMD...: own session, stdin from /dev/null, output appended to LOGFILE
start_bg() {
	local pidfile=$1 logfile=$2
	shift 2
	printf '\n=== %(%F %T)T runtime-up.sh: %s\n' -1 "$*" >>"$logfile"
	# 9>&-: the daemon must not inherit (and hold) our lock
	setsid "$@" </dev/null >>"$logfile" 2>&1 9>&- &
	echo $! >"$pidfile"
}

# alive PID: process exists and is not a zombie (pid 1 here may be slow to reap orphans)
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
wait_gone() { # pid timeout_s
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		alive "$1" || return 0
		sleep 0.1
	done
	return 1
}

reg_up() { curl -fsS -o /dev/null --max-time 2 "http://$REG_ADDR/v2/" 2>/dev/null; }
# fail early (before starting anything) if another registry owns our address
if [ "$IMAGES_ONLY" = 0 ] && ! our_pid "$RUN/registry.pid" docker-registry "$REG_DIR/config.yml" >/dev/null && reg_up; then
	die "something else already serves http://$REG_ADDR (not ours); set NODELET_TEST_REGISTRY"
fi

# ---------------------------------------------------------------- host state (first run only)
# Recorded so runtime-down.sh restores/removes only what this setup changed or created.
if [ "$IMAGES_ONLY" = 0 ] && [ ! -f "$RUN/host-state" ]; then
	{
		echo "IP_FORWARD_ORIG=$(cat /proc/sys/net/ipv4/ip_forward)"
		if iptables -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1; then
			echo "PORTMAP_CHAINS_PREEXISTING=1"
		else
			echo "PORTMAP_CHAINS_PREEXISTING=0"
		fi
		if [ -d /sys/fs/cgroup/memory/k8s.io ] || [ -d /sys/fs/cgroup/k8s.io ]; then
			echo "K8SIO_CGROUP_PREEXISTING=1"
		else
			echo "K8SIO_CGROUP_PREEXISTING=0"
		fi
	} >"$RUN/host-state"
fi
# what runtime-down.sh needs to know about this instance (rewritten every run)
if [ "$IMAGES_ONLY" = 0 ]; then
	write_file "$RUN/runtime.conf" <<EOF || true
BRIDGE=$BRIDGE
CNI_NET=$CNI_NET
REG_ADDR=$REG_ADDR
CGROUP_PARENT=$CGROUP_PARENT
CTD_BIN_DIR=$CTD_BIN_DIR
RUNC_BIN=$RUNC_BIN
EOF
fi

# ---------------------------------------------------------------- images
# Image table: LAYOUT_TAG|LOCAL_REF|REGISTRY_PATH|IMPORT(1/0)
IMAGES=(
	"pause|$PAUSE_IMAGE|pause:3.9|1"
	"busybox|$BUSYBOX_IMAGE|busybox:latest|1"
	"busybox-v2|$BUSYBOX2_IMAGE|busybox:v2|0"
)
EXTRA=() # LAYOUT_TAG|BINARY|DEST_PATH

# Hook for more test images: extra_image NAME:TAG /abs/static-binary [DEST_PATH]
# -> localhost/nodelet/NAME:TAG = busybox:latest + one layer holding the binary at DEST_PATH
#    (default /usr/local/bin/<basename>, also the entrypoint); imported into k8s.io and pushed
#    to the registry as NAME:TAG. Example (a future gRPC health server):
#      extra_image grpc-health:1 "$REPO_ROOT/target/x86_64-unknown-linux-musl/release/grpc-health"
extra_image() {
	local nt=$1 bin=$2 dest=${3:-/usr/local/bin/${2##*/}}
	[[ $nt =~ ^[a-z0-9][a-z0-9._-]*:[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] || die "extra image name '$nt' is not NAME:TAG"
	[ -f "$bin" ] || die "extra image $nt: binary $bin not found"
	IMAGES+=("x-${nt/:/-}|localhost/nodelet/$nt|$nt|1")
	EXTRA+=("x-${nt/:/-}|$bin|$dest")
}
for spec in $EXTRA_IMAGES_SPEC; do
	[[ $spec == *=/* ]] || die "NODELET_TEST_EXTRA_IMAGES entry '$spec' is not NAME:TAG=/abs/binary"
	extra_image "${spec%%=*}" "${spec#*=}"
done
# (add project-wide extra_image calls here)
# The gRPC health server of the gRPC probe tests (deploy/images/grpc-health), built from source with
# crates.io dependencies only, statically (+crt-static), into localhost/nodelet/grpc-health:1.
GRPC_HEALTH_IMAGE=
if command -v cargo >/dev/null; then
	grpc_src=$REPO_ROOT/deploy/images/grpc-health
	grpc_target=$(rustc -vV | sed -n 's/^host: //p')
	grpc_out=$IMG/grpc-health-build
	log "building the gRPC health test server ($grpc_src)"
	CARGO_TARGET_DIR=$grpc_out RUSTFLAGS="-C target-feature=+crt-static" \
		cargo build -q --release --locked --manifest-path "$grpc_src/Cargo.toml" --target "$grpc_target" ||
		die "building $grpc_src failed"
	extra_image grpc-health:1 "$grpc_out/$grpc_target/release/grpc-health"
	GRPC_HEALTH_IMAGE=localhost/nodelet/grpc-health:1
else
	log "cargo not found: no gRPC health test image (the gRPC probe tests need it)"
fi

images_stamp() {
	{
		echo "$EPOCH ${HIST[*]}"
		declare -f build_images umoci_cfg # the recipe itself
		sha256sum "$PAUSE_SRC" /bin/busybox | cut -d' ' -f1
		gcc --version | head -n1
		umoci --version
		local e
		for e in "${EXTRA[@]}"; do
			IFS='|' read -r tag bin dest <<<"$e"
			echo "$tag $dest $(sha256sum "$bin" | cut -d' ' -f1)"
		done
	} | sha256sum | cut -d' ' -f1
}

HIST=(--history.created "$EPOCH" --history.created_by "nodelet scripts/runtime-up.sh")
umoci_cfg() { # layout-tag, extra umoci config args...
	local tag=$1
	shift
	umoci config --no-history --image "$LAYOUT.new:$tag" --created "$EPOCH" \
		--os linux --architecture amd64 "$@"
}

build_images() {
	local work=$IMG/work new=$LAYOUT.new e tag bin dest
	rm -rf "$work" "$new"
	mkdir -p "$work"

	# pause
	gcc -static -Os -s -o "$work/pause" "$PAUSE_SRC"
	mkdir -p "$work/pause-root"
	install -m 0755 "$work/pause" "$work/pause-root/pause"

	# busybox
	local bb=$work/busybox-root a
	mkdir -p "$bb/bin" "$bb/etc" "$bb/tmp" "$bb/root" "$bb/var/www"
	chmod 1777 "$bb/tmp"
	chmod 0700 "$bb/root"
	install -m 0755 /bin/busybox "$bb/bin/busybox"
	for a in $(/bin/busybox --list); do
		[ "$a" = busybox ] || ln -s busybox "$bb/bin/$a"
	done
	printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$bb/etc/passwd"
	printf '%s\n' 'root:x:0:' 'nobody:x:65534:' >"$bb/etc/group"
	echo 'hello from nodelet busybox' >"$bb/var/www/index.html"

	# v2 marker layer
	mkdir -p "$work/v2-root/etc"
	echo v2 >"$work/v2-root/etc/nodelet-image-version"

	# extra images: one layer with the binary each
	for e in "${EXTRA[@]}"; do
		IFS='|' read -r tag bin dest <<<"$e"
		mkdir -p "$work/$tag-root$(dirname "$dest")"
		install -m 0755 "$bin" "$work/$tag-root$dest"
	done

	find "$work" -exec touch -h -d "$EPOCH" {} +

	umoci init --layout "$new"
	umoci new --image "$new:pause"
	umoci insert "${HIST[@]}" --image "$new:pause" "$work/pause-root" /
	umoci_cfg pause --config.entrypoint /pause --config.user 65535:65535 --config.workingdir /

	umoci new --image "$new:busybox"
	umoci insert "${HIST[@]}" --image "$new:busybox" "$bb" /
	umoci_cfg busybox --config.cmd sh --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--config.workingdir /

	umoci tag --image "$new:busybox" busybox-v2
	umoci insert "${HIST[@]}" --image "$new:busybox-v2" "$work/v2-root" /
	umoci_cfg busybox-v2 --config.label org.nodelet.image-version=v2

	for e in "${EXTRA[@]}"; do
		IFS='|' read -r tag bin dest <<<"$e"
		umoci tag --image "$new:busybox" "$tag"
		umoci insert "${HIST[@]}" --image "$new:$tag" "$work/$tag-root" /
		umoci_cfg "$tag" --config.entrypoint "$dest" --clear config.cmd
	done
	umoci gc --layout "$new"

	rm -rf "$LAYOUT" "$work"
	mv "$new" "$LAYOUT"
	# OCI archives (ctr images import / podman load); the ref-name annotation is the image name
	local i ltag ref
	for i in "${IMAGES[@]}"; do
		IFS='|' read -r ltag ref _ _ <<<"$i"
		rm -f "$IMG/$ltag.tar"
		skopeo copy -q "oci:$LAYOUT:$ltag" "oci-archive:$IMG/$ltag.tar:$ref"
	done
}

# manifest digest of a layout tag
layout_digest() { oci_layout_digest "$LAYOUT" "$1"; }

STAMP=$(images_stamp)
need_build=0
[ "$(cat "$IMG/.stamp" 2>/dev/null)" = "$STAMP" ] || need_build=1
for i in "${IMAGES[@]}"; do
	IFS='|' read -r ltag _ _ _ <<<"$i"
	[ -f "$IMG/$ltag.tar" ] && [ -n "$(layout_digest "$ltag" 2>/dev/null)" ] || need_build=1
done
if [ "$need_build" = 1 ]; then
	log "building OCI images in $LAYOUT"
	rm -f "$IMG/.stamp"
	build_images
	echo "$STAMP" >"$IMG/.stamp"
	for i in "${IMAGES[@]}"; do
		IFS='|' read -r ltag ref _ _ <<<"$i"
		log "  $ref $(layout_digest "$ltag")"
	done
else
	log "images up to date ($IMG)"
fi

if [ "$IMAGES_ONLY" = 1 ]; then
	for i in "${IMAGES[@]}"; do
		IFS='|' read -r ltag ref _ _ <<<"$i"
		log "  $IMG/$ltag.tar  $ref"
	done
	log "images ready in $((($(date +%s%N) - START_NS) / 1000000)) ms"
	exit 0
fi

# ---------------------------------------------------------------- CNI, registry hosts, resolv.conf
# The bridge plugin refuses a bridge that holds another address than the network's gateway: a bridge left by a
# runtime on another network (e.g. 198.18.0.0/16, the default before 198.18.0.0/17) would fail every pod. With no
# pod attached it is deleted (the plugin makes it again); with pods attached, they would lose their network.
if ip link show "$BRIDGE" >/dev/null 2>&1; then
	bridge_addrs=$(ip -4 -o addr show dev "$BRIDGE" 2>/dev/null | awk '{print $4}')
	if [ -n "$bridge_addrs" ] && [ "$bridge_addrs" != "$GATEWAY_CIDR" ]; then
		if [ -n "$(ip -o link show master "$BRIDGE" 2>/dev/null)" ]; then
			die "bridge $BRIDGE holds $(echo "$bridge_addrs" | paste -sd, -), not the gateway of $POD_SUBNET ($GATEWAY_CIDR), and" \
				"pods are attached to it: stop them with scripts/runtime-down.sh, or keep the old network with" \
				"NODELET_TEST_POD_SUBNET=$(echo "$bridge_addrs" | head -n1 | sed 's|\.[0-9]*/|.0/|')"
		fi
		log "deleting bridge $BRIDGE ($(echo "$bridge_addrs" | paste -sd, -)): the pod network is now $POD_SUBNET"
		ip link delete "$BRIDGE" || die "could not delete bridge $BRIDGE"
	fi
fi
if write_file "$CNI_CONF_DIR/10-$CNI_NET.conflist" <<EOF; then log "wrote CNI config $CNI_CONF_DIR/10-$CNI_NET.conflist"; fi
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$IPAM_DIR",
        "ranges": [[{ "subnet": "$POD_SUBNET" }]]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true }, "snat": false }
  ]
}
EOF
# any other conflist here would be picked instead of ours (max_conf_num = 1)
for f in "$CNI_CONF_DIR"/*; do
	[ -e "$f" ] || continue
	[ "$f" = "$CNI_CONF_DIR/10-$CNI_NET.conflist" ] || { log "removing foreign CNI config $f"; rm -f "$f"; }
done

for h in "$REG_ADDR" "localhost:$REG_PORT" "127.0.0.1:$REG_PORT"; do
	mkdir -p "$CERTS_D/$h"
	write_file "$CERTS_D/$h/hosts.toml" <<EOF || true
server = "http://$REG_ADDR"

[host."http://$REG_ADDR"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
EOF
done

# the host's resolver is in a range pods must not use: tests pass this file / DNSConfig explicitly
write_file "$RESOLV" <<EOF || true
nameserver 127.0.0.1
EOF

# ---------------------------------------------------------------- containerd
# containerd 2.x migrates a 1.x metadata store for good: one base directory, one major version
if [ -f "$RUN/containerd.version" ]; then
	had=$(cat "$RUN/containerd.version")
	if [ "${had%%.*}" != "${CTD_VERSION%%.*}" ]; then
		die "$BASE was set up with containerd $had; containerd $CTD_VERSION needs its own NODELET_TEST_BASE (or run scripts/runtime-down.sh and remove $BASE first)"
	fi
fi
echo "$CTD_VERSION" >"$RUN/containerd.version"
ctd_config=$(print_config) || die "containerd-config.sh failed"
if write_file "$CTD_CONFIG" <<<"$ctd_config"; then log "wrote containerd config $CTD_CONFIG"; fi

CFG_SUM=$(sha256sum "$CTD_CONFIG" | cut -d' ' -f1)
if CTD_PID=$(our_pid "$RUN/containerd.pid" containerd "$CTD_CONFIG"); then
	if [ "$(cat "$RUN/containerd.config.sha256" 2>/dev/null)" != "$CFG_SUM" ]; then
		# running pods and their shims survive a containerd restart
		log "containerd config changed: restarting containerd (pid $CTD_PID)"
		kill -TERM "$CTD_PID"
		wait_gone "$CTD_PID" 15 || die "containerd (pid $CTD_PID) did not stop within 15s"
		rm -f "$RUN/containerd.pid"
		CTD_PID=
	else
		log "containerd already running (pid $CTD_PID)"
	fi
else
	CTD_PID=
fi
if [ -z "$CTD_PID" ]; then
	rm -f "$SOCK" "$SOCK.ttrpc"
	log "starting containerd (log $CTD_LOG)"
	# the shim (next to containerd) is found on containerd's PATH, and runc on the shim's
	ctd_path=$PATH
	if [ -n "$RUNC_BIN" ]; then ctd_path=$(dirname "$RUNC_BIN"):$ctd_path; fi
	if [ -n "$CTD_BIN_DIR" ]; then ctd_path=$CTD_BIN_DIR:$ctd_path; fi
	start_bg "$RUN/containerd.pid" "$CTD_LOG" env PATH="$ctd_path" "$CONTAINERD" --config "$CTD_CONFIG"
	echo "$CFG_SUM" >"$RUN/containerd.config.sha256"
	CTD_PID=$(cat "$RUN/containerd.pid")
fi
ready=0
for ((i = 0; i < 300; i++)); do
	if [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; then
		ready=1
		break
	fi
	if ! alive "$CTD_PID"; then
		tail -n 20 "$CTD_LOG" >&2
		die "containerd exited during startup (log $CTD_LOG)"
	fi
	sleep 0.1
done
[ "$ready" = 1 ] || die "containerd socket $SOCK not ready after 30s (log $CTD_LOG)"
# the CRI service is plugin io.containerd.grpc.v1 cri in 1.x and 2.x
cri_status=$(ctr_ plugins ls 2>/dev/null | awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" {print $NF}')
[ "$cri_status" = ok ] || die "containerd CRI plugin status '${cri_status:-absent}' (see $CTD_LOG)"
log "containerd $CTD_VERSION ready: $SOCK (pid $CTD_PID)"

# ---------------------------------------------------------------- import into k8s.io
for i in "${IMAGES[@]}"; do
	IFS='|' read -r ltag ref _ imp <<<"$i"
	[ "$imp" = 1 ] || continue
	want=$(layout_digest "$ltag")
	have=$(ctrk images ls "name==$ref" 2>/dev/null | awk -v r="$ref" '$1 == r {print $3}' || true)
	if [ "$have" = "$want" ]; then
		log "image $ref present"
		continue
	fi
	old=$have
	log "importing $ref"
	ctrk images import "$IMG/$ltag.tar" >/dev/null
	have=$(ctrk images ls "name==$ref" | awk -v r="$ref" '$1 == r {print $3}' || true)
	[ "$have" = "$want" ] || die "import of $IMG/$ltag.tar gave '$ref' digest '${have:-none}', want $want"
	if [ -n "$old" ]; then
		# replaced an older build: drop CRI's sha256:<config> id refs of it unless still named
		refs=$(ctrk images ls | awk -v d="$old" 'NR > 1 && $3 == d {print $1}' || true)
		if ! grep -qv '^sha256:' <<<"$refs"; then
			# shellcheck disable=SC2086 # one ref per word
			ctrk images rm $refs >/dev/null 2>&1 || true
		fi
	fi
done

# ---------------------------------------------------------------- registry
write_file "$REG_DIR/config.yml" <<EOF || true
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REG_DIR/data
  delete:
    enabled: true
http:
  addr: $REG_ADDR
EOF
if REG_PID=$(our_pid "$RUN/registry.pid" docker-registry "$REG_DIR/config.yml"); then
	log "registry already running (pid $REG_PID)"
else
	if reg_up; then
		die "something else already serves http://$REG_ADDR (not ours); set NODELET_TEST_REGISTRY"
	fi
	log "starting registry on $REG_ADDR (log $REG_LOG)"
	start_bg "$RUN/registry.pid" "$REG_LOG" docker-registry serve "$REG_DIR/config.yml"
	REG_PID=$(cat "$RUN/registry.pid")
fi
ready=0
for ((i = 0; i < 100; i++)); do
	if reg_up; then
		ready=1
		break
	fi
	if ! alive "$REG_PID"; then
		tail -n 20 "$REG_LOG" >&2
		die "registry exited during startup (log $REG_LOG)"
	fi
	sleep 0.1
done
[ "$ready" = 1 ] || die "registry not answering on http://$REG_ADDR after 10s (log $REG_LOG)"

for i in "${IMAGES[@]}"; do
	IFS='|' read -r ltag _ rpath _ <<<"$i"
	want=$(layout_digest "$ltag")
	have=$(oci_registry_digest "$REG_ADDR" "$rpath")
	if [ "$have" = "$want" ]; then
		log "registry has $REG_ADDR/$rpath"
		continue
	fi
	log "pushing $REG_ADDR/$rpath"
	skopeo copy -q --dest-tls-verify=false "oci:$LAYOUT:$ltag" "docker://$REG_ADDR/$rpath"
done

# ---------------------------------------------------------------- env file for tests
write_file "$BASE/env.sh" <<EOF || true
# generated by nodelet scripts/runtime-up.sh; source it: . $BASE/env.sh
export NODELET_TEST_BASE="$BASE"
export NODELET_TEST_CRI_ENDPOINT="unix://$SOCK"
export NODELET_TEST_CONTAINERD_SOCK="$SOCK"
export NODELET_TEST_CONTAINERD_LOG="$CTD_LOG"
export NODELET_TEST_CONTAINERD_CONFIG="$CTD_CONFIG"
export NODELET_TEST_CONTAINERD_VERSION="$CTD_VERSION"
export NODELET_TEST_CTR="$(command -v "$CTR")"
export NODELET_TEST_RUNC_BIN="$RUNC_BIN"
export NODELET_TEST_PAUSE_IMAGE="$PAUSE_IMAGE"
export NODELET_TEST_BUSYBOX_IMAGE="$BUSYBOX_IMAGE"
export NODELET_TEST_REGISTRY="$REG_ADDR"
export NODELET_TEST_REGISTRY_BUSYBOX="$REG_ADDR/busybox:latest"
export NODELET_TEST_REGISTRY_BUSYBOX2="$REG_ADDR/busybox:v2"
export NODELET_TEST_POD_SUBNET="$POD_SUBNET"
export NODELET_TEST_CNI_CONF_DIR="$CNI_CONF_DIR"
export NODELET_TEST_LOG_DIR="$POD_LOGS"
export NODELET_TEST_CGROUP_PARENT="$CGROUP_PARENT"
export NODELET_TEST_RESOLV_CONF="$RESOLV"
export NODELET_TEST_IMAGE_DIR="$IMG"
export NODELET_TEST_GRPC_HEALTH_IMAGE="$GRPC_HEALTH_IMAGE"
EOF

log "ready in $((($(date +%s%N) - START_NS) / 1000000)) ms; use: . $BASE/env.sh"

#!/usr/bin/env bash
# nodelet quick start: from a fresh Debian 12 machine (as root) to pods running on nodelet's own containerd.
#
#   scripts/quickstart.sh           install, build, start nodelet in the background, show the pods
#   scripts/quickstart.sh --stop    remove the pods, stop nodelet and its containerd, remove the bridge
#   scripts/quickstart.sh --status  show whether it runs, and the pods
#
# Steps:
#   1. scripts/install-deps.sh: the Debian packages (containerd, runc, CNI plugins, busybox-static, umoci, ...);
#      then the container runtime: the newest one available, said as it is picked:
#        - containerd 2.x and runc from ../shared/runtimes (unpacked by its install.sh into
#          /var/cache/nodelet/runtimes) or already unpacked in /var/cache/nodelet/runtimes/containerd-*/bin
#          and /var/cache/nodelet/runtimes/runc-*,
#        - else Debian's containerd 1.6 and runc (on PATH);
#      NODELET_QS_CONTAINERD=DIR (a directory with bin/containerd or containerd) or =debian chooses.
#   2. cargo build --release (skipped when NODELET_BIN names a binary); prints how long the build took
#   3. scripts/build-images.sh: the local images as archives in $NODELET_QS_IMAGES (no registry needed)
#   4. nodelet in the background, with its embedded containerd (no --container-runtime-endpoint; with
#      --containerd-path DIR/bin/containerd and the runc's directory first on nodelet's PATH for containerd 2.x):
#        nodelet --root-dir /var/lib/nodelet --pod-manifest-path deploy/examples \
#                --address 127.0.0.1 --read-only-port 10255 --pod-cidr 198.18.128.0/18 \
#                --preload-images /var/cache/nodelet/images
#      log: /var/log/nodelet-quickstart.log, pid: /run/nodelet-quickstart.pid
#   5. waits for /healthz and for the web pod, prints `nodelet get pods -o wide`, fetches the web page through
#      the pod's hostPort 18080 on the bridge address (198.18.128.1), and prints what to try next
#
# --stop removes the pods the way nodelet removes any pod (grace period, CNI teardown with its hostPort rules,
# log directories): it stops nodelet, runs it once more on the same root dir with an empty manifest
# directory until its containerd holds no container, stops it, then deletes the bridge (nodelet0) and the
# portmap plugin's top-level iptables chains if this script's first start created them and they are empty.
# Installed packages, the binary, the images in $NODELET_QS_IMAGES and the root dir stay.
#
# Environment (all optional):
#   NODELET_BIN              use this nodelet binary instead of building one
#   NODELET_QS_ROOT_DIR      --root-dir                      (default /var/lib/nodelet)
#   NODELET_QS_IMAGES        image archive directory         (default /var/cache/nodelet/images)
#   NODELET_QS_POD_CIDR      pod network, inside 198.18.0.0/16 (default 198.18.128.0/18); it must not overlap
#                            another interface's network. The test command's runtime (nlcni0, 198.18.0.0/17)
#                            and conformance node (nlconf0, 198.18.224.0/20) are disjoint from the default.
#   NODELET_QS_PORT, NODELET_QS_READ_ONLY_PORT, NODELET_QS_HEALTHZ_PORT
#                            nodelet's ports on 127.0.0.1 (default 10250, 10255, 10248)
#   NODELET_QS_EVICTION_HARD --eviction-hard (default: the kubelet's memory threshold, 1Gi free for disks)
#   NODELET_QS_LOG           nodelet's log file              (default /var/log/nodelet-quickstart.log)
#   NODELET_QS_TIMEOUT       seconds to wait for the web pod (default 180)
#   NODELET_QS_KUBECONFIG    join the cluster of this kubeconfig (--kubeconfig, with --node-ip 127.0.0.1)
#   NODELET_QS_CONTAINERD    the runtime: a containerd directory (DIR/bin/containerd or DIR/containerd, with its
#                            ctr and shim), or "debian" for containerd on PATH (default: the newest available)
#   NODELET_QS_RUNC          runc's directory for a containerd of NODELET_QS_CONTAINERD (default: the newest
#                            runc-* next to it, else runc on PATH)
# A root dir belongs to the containerd major version that first used it: the quick start refuses to run
# another major on it (--stop uses the one recorded in the state file).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091 # scripts/lib/ipv4.sh
. "$REPO/scripts/lib/ipv4.sh"
ROOT_DIR=${NODELET_QS_ROOT_DIR:-/var/lib/nodelet}
IMAGES=${NODELET_QS_IMAGES:-/var/cache/nodelet/images}
POD_CIDR=${NODELET_QS_POD_CIDR:-198.18.128.0/18}
# The kubelet's defaults are nodefs.available<10% and imagefs.available<15%: on a large disk that is mostly
# used by other things, the demo would only show DiskPressure. Absolute disk thresholds keep it running.
EVICTION_HARD=${NODELET_QS_EVICTION_HARD:-memory.available<100Mi,nodefs.available<1Gi,nodefs.inodesFree<5%,imagefs.available<1Gi}
LOG=${NODELET_QS_LOG:-/var/log/nodelet-quickstart.log}
TIMEOUT=${NODELET_QS_TIMEOUT:-180}
KUBECONFIG_FILE=${NODELET_QS_KUBECONFIG:-}
CTD_CHOICE=${NODELET_QS_CONTAINERD:-}
RUNC_CHOICE=${NODELET_QS_RUNC:-}
RUNTIMES_CACHE=/var/cache/nodelet/runtimes
RUNTIMES_SRC=$REPO/../shared/runtimes
PIDFILE=/run/nodelet-quickstart.pid
STATEFILE=/run/nodelet-quickstart.state # what --stop needs: binary, root dir, pod CIDR, log, host state
BRIDGE=nodelet0                         # the embedded runtime's CNI bridge (config/src/lib.rs DEFAULT_CNI_BRIDGE)
CNI_NET=nodelet                         # its CNI network name (drivers/node/src/containerd.rs CNI_NETWORK_NAME)
MANIFESTS=$REPO/deploy/examples
PORT=${NODELET_QS_PORT:-10250}
READ_ONLY_PORT=${NODELET_QS_READ_ONLY_PORT:-10255}
HEALTHZ_PORT=${NODELET_QS_HEALTHZ_PORT:-10248}
HOST_PORT=18080

log() { printf '\033[1m[quickstart %(%H:%M:%S)T]\033[0m %s\n' -1 "$*"; }
die() {
	printf '[quickstart %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

# ---------------------------------------------------------------- checks
[ "$(id -u)" = 0 ] || die "run as root (nodelet manages containers, mounts and network namespaces)"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# What the running quick start was started with wins over the environment (so that a plain --stop undoes a
# start made with NODELET_QS_* settings). Only known keys with safe values are read.
PORTMAP_CHAINS_PREEXISTING=
STATE_BIN=
STATE_CONTAINERD=
STATE_RUNC_DIR=
if [ -f "$STATEFILE" ]; then
	while IFS='=' read -r k v; do
		case "$v" in *[!A-Za-z0-9/._-]*) continue ;; esac
		case "$k" in
		BIN) STATE_BIN=$v ;;
		ROOT_DIR) ROOT_DIR=$v ;;
		POD_CIDR) POD_CIDR=$v ;;
		LOG) LOG=$v ;;
		PORT) PORT=$v ;;
		READ_ONLY_PORT) READ_ONLY_PORT=$v ;;
		HEALTHZ_PORT) HEALTHZ_PORT=$v ;;
		PORTMAP_CHAINS_PREEXISTING) PORTMAP_CHAINS_PREEXISTING=$v ;;
		CONTAINERD) STATE_CONTAINERD=$v ;;
		RUNC_DIR) STATE_RUNC_DIR=$v ;;
		esac
	done <"$STATEFILE"
fi
if [[ ! $POD_CIDR =~ ^198\.18\.([0-9]{1,3})\.([0-9]{1,3})/([0-9]{1,2})$ ]]; then
	die "NODELET_QS_POD_CIDR must be a network inside 198.18.0.0/16, got '$POD_CIDR'"
fi
GATEWAY=198.18.${BASH_REMATCH[1]}.$((BASH_REMATCH[2] + 1)) # the bridge's address: the network's first host
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "NODELET_QS_TIMEOUT must be a number of seconds"
for p in "$PORT" "$READ_ONLY_PORT" "$HEALTHZ_PORT"; do
	if [[ ! $p =~ ^[1-9][0-9]{0,4}$ ]] || [ "$p" -gt 65535 ]; then die "NODELET_QS_*PORT must be a port number, got '$p'"; fi
done
READ_ONLY_URL=http://127.0.0.1:$READ_ONLY_PORT
HEALTHZ_URL=http://127.0.0.1:$HEALTHZ_PORT/healthz
case "$ROOT_DIR$IMAGES$LOG" in *[!A-Za-z0-9/._-]*) die "paths may only contain [A-Za-z0-9/._-]" ;; esac

# is_nodelet PID: whether PID is a live nodelet process (a rebuilt binary shows as "nodelet (deleted)")
is_nodelet() {
	local exe
	exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
	exe=${exe% (deleted)}
	# a binary called nodelet, or the one NODELET_BIN (or the state file) names, whatever its name
	if [ "$(basename "$exe")" != nodelet ] &&
		[ "$exe" != "$(readlink -f "${STATE_BIN:-$(nodelet_bin)}" 2>/dev/null)" ]; then
		return 1
	fi
	[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# running_pid: the pid of the nodelet started here (from the pid file, else any nodelet running with our
# --root-dir), if it still runs
running_pid() {
	local pid p
	pid=$(cat "$PIDFILE" 2>/dev/null) || pid=
	if [[ $pid =~ ^[0-9]+$ ]] && is_nodelet "$pid"; then
		echo "$pid"
		return 0
	fi
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		is_nodelet "$p" || continue
		if tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$ROOT_DIR" &&
			tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- --root-dir; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# stop_nodelet PID: SIGTERM, wait up to 60 s, then SIGKILL
stop_nodelet() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 600; i++)); do
		if [ ! -r "/proc/$pid/stat" ] || [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
			return 0
		fi
		sleep 0.1
	done
	log "nodelet (pid $pid) did not stop within 60s; sending SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
}

# containers_left: the number of containers (sandboxes included) in the embedded containerd, or fails
containers_left() {
	local out
	out=$("$(ctr_of "$CONTAINERD")" --address "$ROOT_DIR/containerd/containerd.sock" -n k8s.io containers ls -q 2>/dev/null) ||
		return 1
	grep -c . <<<"$out" || true
}

# remove_pods BIN: nodelet on the same root dir with no manifests tears down every pod it finds
remove_pods() {
	local bin=$1 empty pid i port n=unknown
	[ -d "$ROOT_DIR/containerd" ] || return 0
	for port in "$HEALTHZ_PORT" "$PORT"; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			die "something listens on 127.0.0.1:$port (another nodelet or kubelet?): stop it, then run --stop again"
		fi
	done
	if [ ! -x "$bin" ]; then
		log "WARNING: $bin is missing: pods (if any) were not removed; build nodelet and run --stop again"
		return 0
	fi
	empty=$(mktemp -d /tmp/nodelet-quickstart-empty.XXXXXX)
	log "removing the pods: nodelet runs once more on $ROOT_DIR with an empty manifest directory"
	printf '\n=== %(%F %T)T quickstart.sh --stop: removing the pods\n' -1 >>"$LOG"
	env PATH="$(runtime_path)" setsid "$bin" --root-dir "$ROOT_DIR" --pod-manifest-path "$empty" \
		--address 127.0.0.1 --port "$PORT" --healthz-port "$HEALTHZ_PORT" --read-only-port 0 --pod-cidr "$POD_CIDR" \
		--containerd-path "$CONTAINERD" </dev/null >>"$LOG" 2>&1 &
	pid=$!
	for ((i = 0; i < 1200; i++)); do # 120 s: grace periods, then SIGKILL
		if [ ! -r "/proc/$pid/stat" ] || [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
			rmdir "$empty"
			tail -n 5 "$LOG" >&2
			die "nodelet exited while removing the pods (log $LOG)"
		fi
		if curl -fsS --max-time 1 "$HEALTHZ_URL" >/dev/null 2>&1 && n=$(containers_left) && [ "$n" = 0 ]; then
			break
		fi
		sleep 0.1
	done
	stop_nodelet "$pid"
	rmdir "$empty"
	if [ "$n" = 0 ]; then
		log "all pods removed; nodelet and its containerd stopped"
	else
		log "WARNING: $n container(s) still there after 120s (log $LOG)"
	fi
}

# remove_network: the bridge and, if the first start created them, portmap's top-level chains
remove_network() {
	local rule chain base_chain c rules
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		if [ -n "$(ip -o link show master "$BRIDGE" 2>/dev/null)" ]; then
			log "WARNING: bridge $BRIDGE still has interfaces attached: left in place"
		else
			ip link delete "$BRIDGE" type bridge && log "removed bridge $BRIDGE"
		fi
	fi
	command -v iptables >/dev/null && iptables -w -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1 || return 0
	# hostPort rules of our network that a pod teardown left behind (nodelet's CNI DEL normally removes them)
	rules=$(iptables -w -t nat -S CNI-HOSTPORT-DNAT | grep -F "dnat name: \\\"$CNI_NET\\\"" || true)
	while read -r rule; do
		[ -n "$rule" ] || continue
		chain=$(sed -n 's/.* -j \(CNI-DN-[0-9a-f]*\).*/\1/p' <<<"$rule")
		# the rule text comes from iptables -S, shell-quoted; replay it with -D
		if eval "iptables -w -t nat -D ${rule#-A }"; then log "removed a leftover hostPort rule (${chain:-?})"; fi
		if [ -n "$chain" ]; then
			iptables -w -t nat -F "$chain" 2>/dev/null || true
			iptables -w -t nat -X "$chain" 2>/dev/null || true
		fi
	done <<<"$rules"
	# the top-level chains only if they did not exist before our first start and nobody uses them now
	if [ "$PORTMAP_CHAINS_PREEXISTING" = 0 ] && ! iptables -w -t nat -S CNI-HOSTPORT-DNAT | grep -q -- '^-A'; then
		for base_chain in PREROUTING OUTPUT POSTROUTING; do
			rules=$(iptables -w -t nat -S "$base_chain" | grep -E -- '-j CNI-HOSTPORT-(DNAT|MASQ)$' || true)
			while read -r rule; do
				[ -n "$rule" ] || continue
				eval "iptables -w -t nat -D ${rule#-A }" || true
			done <<<"$rules"
		done
		for c in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SETMARK CNI-HOSTPORT-MASQ; do
			if iptables -w -t nat -F "$c" 2>/dev/null && iptables -w -t nat -X "$c" 2>/dev/null; then
				log "removed iptables nat chain $c"
			fi
		done
	fi
}

stop() {
	local pid bin
	bin=${STATE_BIN:-$(nodelet_bin)}
	# the containerd the quick start ran with (a root dir is not for another major version)
	CONTAINERD=${STATE_CONTAINERD:-$(command -v containerd || echo containerd)}
	RUNC_DIR=$STATE_RUNC_DIR
	if pid=$(running_pid); then
		log "stopping nodelet (pid $pid)"
		stop_nodelet "$pid"
	else
		log "nodelet (quick start) is not running"
	fi
	rm -f "$PIDFILE"
	remove_pods "$bin"
	remove_network
	rm -f "$STATEFILE"
	log "stopped and cleaned up (kept: $ROOT_DIR, $IMAGES, $LOG)"
}

# ctr_of CONTAINERD: the ctr beside that containerd, else ctr on PATH
ctr_of() {
	if [ -x "$(dirname "$1")/ctr" ]; then echo "$(dirname "$1")/ctr"; else echo ctr; fi
}

# runtime_path: nodelet's PATH: the runc directory first (containerd's shim runs the runc on its PATH;
# nodelet puts containerd's own directory before it)
runtime_path() {
	if [ -n "$RUNC_DIR" ]; then echo "$RUNC_DIR:$PATH"; else echo "$PATH"; fi
}

# newest_in DIR PREFIX: the newest DIR/PREFIX-<version> directory's name
newest_in() {
	[ -d "$1" ] || return 0
	(cd "$1" && find . -maxdepth 1 -type d -name "$2-*" -printf '%f\n' | sort -V | tail -1)
}

# pick_runtime: sets CONTAINERD (the binary), RUNC_DIR (empty: runc on PATH) and RUNTIME_NAME, the newest
# runtime available unless NODELET_QS_CONTAINERD chooses
pick_runtime() {
	local name runc d
	CONTAINERD='' RUNC_DIR='' RUNTIME_NAME=''
	case "$CTD_CHOICE" in
	debian) ;;
	"")
		# unpack the newest of ../shared/runtimes (idempotent), else the newest already unpacked
		name=$(newest_in "$RUNTIMES_SRC" containerd)
		runc=$(newest_in "$RUNTIMES_SRC" runc)
		if [ -n "$name" ] && [ -x "$RUNTIMES_SRC/install.sh" ]; then
			d=$("$RUNTIMES_SRC/install.sh" "$name" | tail -1) || die "cannot unpack $name from $RUNTIMES_SRC"
			CONTAINERD=$d/bin/containerd
			if [ -n "$runc" ]; then
				RUNC_DIR=$("$RUNTIMES_SRC/install.sh" "$runc" | tail -1) || die "cannot unpack $runc from $RUNTIMES_SRC"
			fi
		else
			name=$(newest_in "$RUNTIMES_CACHE" containerd)
			[ -n "$name" ] && [ -x "$RUNTIMES_CACHE/$name/bin/containerd" ] && CONTAINERD=$RUNTIMES_CACHE/$name/bin/containerd
		fi
		;;
	*)
		for d in "$CTD_CHOICE/bin" "$CTD_CHOICE"; do
			if [ -x "$d/containerd" ]; then
				CONTAINERD=$(realpath -- "$d/containerd")
				break
			fi
		done
		[ -n "$CONTAINERD" ] || die "NODELET_QS_CONTAINERD=$CTD_CHOICE holds no containerd (looked in DIR/bin and DIR)"
		;;
	esac
	if [ -n "$CONTAINERD" ] && [ -z "$RUNC_DIR" ]; then
		if [ -n "$RUNC_CHOICE" ]; then
			RUNC_DIR=$RUNC_CHOICE
		else
			runc=$(newest_in "$RUNTIMES_CACHE" runc)
			[ -n "$runc" ] && RUNC_DIR=$RUNTIMES_CACHE/$runc
		fi
	fi
	if [ -n "$RUNC_DIR" ] && [ ! -x "$RUNC_DIR/runc" ]; then
		die "no runc in $RUNC_DIR (NODELET_QS_RUNC)"
	fi
	if [ -z "$CONTAINERD" ]; then
		CONTAINERD=$(command -v containerd) || die "no containerd: install Debian's (scripts/install-deps.sh) or set NODELET_QS_CONTAINERD"
	fi
	case "$CONTAINERD$RUNC_DIR" in *[!A-Za-z0-9/._-]*) die "runtime paths may only contain [A-Za-z0-9/._-]: $CONTAINERD $RUNC_DIR" ;; esac
	RUNTIME_NAME="$("$CONTAINERD" --version 2>/dev/null | awk '{print $1, $3}') with $("$(if [ -n "$RUNC_DIR" ]; then echo "$RUNC_DIR/runc"; else echo runc; fi)" --version 2>/dev/null | head -1)"
}

# containerd_major CONTAINERD: its major version (1 for Debian's 1.6)
containerd_major() {
	"$1" --version 2>/dev/null | awk '{v = $3; sub(/^v/, "", v); split(v, p, "."); print p[1]}'
}

nodelet_bin() {
	if [ -n "${NODELET_BIN:-}" ]; then
		echo "$NODELET_BIN"
	else
		echo "${CARGO_TARGET_DIR:-$REPO/target}/release/nodelet"
	fi
}

case "${1:-}" in
"") ;;
--stop)
	stop
	exit 0
	;;
--status)
	if pid=$(running_pid); then log "nodelet runs (pid $pid), log $LOG"; else log "nodelet (quick start) is not running"; fi
	exec "$(nodelet_bin)" get pods -o wide --server "$READ_ONLY_URL"
	;;
-h | --help)
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit 0
	;;
*) die "unknown argument: $1 (usage: $0 [--stop | --status])" ;;
esac

# Another bridge on an overlapping network would take the route to the pods: refuse before any work.
claims=$(ipv4_claims_of "$POD_CIDR" "$BRIDGE")
if [ -n "$claims" ]; then
	die "the pod network $POD_CIDR overlaps a network this machine already has ($(echo "$claims" | paste -sd, -)):" \
		"the pods on $BRIDGE would not be reachable from the host. Remove that network, or choose another network" \
		"inside 198.18.0.0/16 with NODELET_QS_POD_CIDR (the test runtime uses 198.18.0.0/17, the conformance node" \
		"198.18.224.0/20)."
fi

# ---------------------------------------------------------------- 1. packages
log "1/5 installing missing Debian packages"
"$REPO/scripts/install-deps.sh"
pick_runtime
log "container runtime: $RUNTIME_NAME ($CONTAINERD${RUNC_DIR:+, runc from $RUNC_DIR})"
# a root dir is containerd's state of one major version: 2.x migrates 1.6's, 1.6 cannot read 2.x's
MAJOR_FILE=$ROOT_DIR/containerd/quickstart-containerd-major
major=$(containerd_major "$CONTAINERD")
if [ -f "$MAJOR_FILE" ] && [ "$major" -lt "$(cat "$MAJOR_FILE")" ]; then
	die "$ROOT_DIR was used with containerd $(cat "$MAJOR_FILE").x, which $CONTAINERD ($major.x) cannot read:" \
		"choose that runtime with NODELET_QS_CONTAINERD, or another NODELET_QS_ROOT_DIR"
fi

# ---------------------------------------------------------------- 2. build
BIN=$(nodelet_bin)
if [ -n "${NODELET_BIN:-}" ]; then
	[ -x "$BIN" ] || die "NODELET_BIN=$BIN is not an executable"
	log "2/5 using $BIN"
else
	command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (https://rustup.rs) first"
	log "2/5 building nodelet (cargo build --release; the first build takes several minutes)"
	build_start=$(date +%s)
	(cd "$REPO" && cargo build --release --bin nodelet)
	[ -x "$BIN" ] || die "build finished but $BIN is missing"
	build_secs=$(($(date +%s) - build_start))
	log "built $BIN in $((build_secs / 60)) min $((build_secs % 60)) s (load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs)"
fi

# ---------------------------------------------------------------- 3. images
log "3/5 building the local images into $IMAGES"
"$REPO/scripts/build-images.sh" "$IMAGES"

# ---------------------------------------------------------------- 4. start nodelet
if pid=$(running_pid); then
	log "a quick-start nodelet already runs (pid $pid): restarting it (its pods keep running)"
	stop_nodelet "$pid"
	rm -f "$PIDFILE"
fi
for port in "$HEALTHZ_PORT" "$PORT" "$READ_ONLY_PORT"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		die "something already listens on 127.0.0.1:$port (another kubelet or nodelet?)"
	fi
done
ARGS=(
	--root-dir "$ROOT_DIR"
	--pod-manifest-path "$MANIFESTS"
	--address 127.0.0.1
	--port "$PORT"
	--read-only-port "$READ_ONLY_PORT"
	--healthz-port "$HEALTHZ_PORT"
	--pod-cidr "$POD_CIDR"
	--preload-images "$IMAGES"
	--eviction-hard "$EVICTION_HARD"
	--containerd-path "$CONTAINERD"
)
if [ -n "$KUBECONFIG_FILE" ]; then
	[ -r "$KUBECONFIG_FILE" ] || die "NODELET_QS_KUBECONFIG: cannot read $KUBECONFIG_FILE"
	# The API server reaches the node (logs, exec) at its InternalIP: loopback here.
	ARGS+=(--kubeconfig "$KUBECONFIG_FILE" --node-ip 127.0.0.1)
fi
log "4/5 starting nodelet in the background (log $LOG):"
log "    $BIN ${ARGS[*]}"
mkdir -p "$(dirname "$LOG")"
printf '\n=== %(%F %T)T quickstart.sh: %s\n' -1 "$BIN ${ARGS[*]}" >>"$LOG"
if [ -z "$PORTMAP_CHAINS_PREEXISTING" ]; then
	if iptables -w -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1; then
		PORTMAP_CHAINS_PREEXISTING=1
	else
		PORTMAP_CHAINS_PREEXISTING=0
	fi
fi
case "$BIN" in *[!A-Za-z0-9/._-]*) die "the nodelet binary's path may only contain [A-Za-z0-9/._-]: $BIN" ;; esac
printf '%s\n' "BIN=$BIN" "ROOT_DIR=$ROOT_DIR" "POD_CIDR=$POD_CIDR" "LOG=$LOG" "PORT=$PORT" \
	"READ_ONLY_PORT=$READ_ONLY_PORT" "HEALTHZ_PORT=$HEALTHZ_PORT" \
	"PORTMAP_CHAINS_PREEXISTING=$PORTMAP_CHAINS_PREEXISTING" "CONTAINERD=$CONTAINERD" "RUNC_DIR=$RUNC_DIR" >"$STATEFILE"
mkdir -p "$ROOT_DIR/containerd"
if [ ! -f "$MAJOR_FILE" ] || [ "$(cat "$MAJOR_FILE")" -lt "$major" ]; then echo "$major" >"$MAJOR_FILE"; fi
env PATH="$(runtime_path)" setsid "$BIN" "${ARGS[@]}" </dev/null >>"$LOG" 2>&1 &
PID=$!
echo "$PID" >"$PIDFILE"

alive() { [ -r "/proc/$PID/stat" ] && [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" != Z ]; }
failed() {
	echo "--- last lines of $LOG:" >&2
	tail -n 25 "$LOG" >&2
	if alive; then echo "nodelet (pid $PID) keeps running for inspection; stop it with: $0 --stop" >&2; fi
	die "$*"
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every second while nodelet runs
wait_for() {
	local secs=$1 what=$2 i
	shift 2
	for ((i = 0; i < secs; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		alive || failed "nodelet exited while waiting for $what"
		sleep 1
	done
	failed "timed out after ${secs}s waiting for $what"
}

wait_for 60 "nodelet's /healthz ($HEALTHZ_URL)" curl -fsS --max-time 2 "$HEALTHZ_URL"
log "nodelet is healthy (pid $PID)"

# ---------------------------------------------------------------- 5. show
log "5/5 waiting for the web pod to serve on its hostPort ($GATEWAY:$HOST_PORT)"
wait_for "$TIMEOUT" "the web pod (http://$GATEWAY:$HOST_PORT/)" curl -fsS --max-time 2 "http://$GATEWAY:$HOST_PORT/"

echo
log "nodelet get pods -o wide"
"$BIN" get pods -o wide --server "$READ_ONLY_URL" || true
echo
log "curl http://$GATEWAY:$HOST_PORT/"
curl -fsS --max-time 5 "http://$GATEWAY:$HOST_PORT/"
NODE=$(tr '[:upper:]' '[:lower:]' </proc/sys/kernel/hostname)
echo
echo "nodelet runs in the background (pid $PID), with its own containerd under $ROOT_DIR/containerd"
echo "($RUNTIME_NAME)."
echo "Try:"
N=$BIN
[ "$BIN" = "$REPO/target/release/nodelet" ] && N=target/release/nodelet # as the README shows it
GET="$N get pods"
[ "$READ_ONLY_PORT" = 10255 ] || GET="$GET --server $READ_ONLY_URL"
TRY=(
	"$GET" "the pods, like kubectl get pods (port $READ_ONLY_PORT)"
	"$N logs web-$NODE" "the web server's log (CRI log files)"
	"$N logs crashloop-$NODE --previous" "the crash-looping container's last run"
	"$N logs shared-emptydir-$NODE -c reader" "what the init container wrote into the shared emptyDir"
	"curl -s $READ_ONLY_URL/pods" "the v1 PodList nodelet serves"
	"curl http://$GATEWAY:$HOST_PORT/" "the web pod, through its hostPort"
)
width=0
for ((i = 0; i < ${#TRY[@]}; i += 2)); do if ((${#TRY[i]} > width)); then width=${#TRY[i]}; fi; done
for ((i = 0; i < ${#TRY[@]}; i += 2)); do printf '  %-*s  # %s\n' "$width" "${TRY[i]}" "${TRY[i + 1]}"; done
echo "Add, edit or delete manifests in $MANIFESTS: nodelet picks the change up within seconds."
echo "nodelet's log: $LOG"
echo "Stop nodelet and remove its pods, containerd and bridge: $0 --stop"

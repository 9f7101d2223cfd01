#!/usr/bin/env bash
# nodelet quick start: from a fresh Debian 12 machine (as root) to pods running on nodelet's own containerd.
#
#   scripts/quickstart.sh           install, build, start nodelet in the background, show the pods
#   scripts/quickstart.sh --stop    stop the nodelet started here (its containerd stops with it)
#   scripts/quickstart.sh --status  show whether it runs, and the pods
#
# Steps:
#   1. scripts/install-deps.sh: the Debian packages (containerd, runc, CNI plugins, busybox-static, umoci, ...)
#   2. cargo build --release (skipped when NODELET_BIN names a binary)
#   3. scripts/build-images.sh: the local images as archives in $NODELET_QS_IMAGES (no registry needed)
#   4. nodelet in the background, with its embedded containerd (no --container-runtime-endpoint):
#        nodelet --root-dir /var/lib/nodelet --pod-manifest-path deploy/examples \
#                --address 127.0.0.1 --read-only-port 10255 --pod-cidr 198.18.0.0/16 \
#                --preload-images /var/cache/nodelet/images
#      log: /var/log/nodelet-quickstart.log, pid: /run/nodelet-quickstart.pid
#   5. waits for /healthz and for the web pod, prints `nodelet get pods -o wide`, fetches the web page through
#      the pod's hostPort 18080 on the bridge address (198.18.0.1), and prints what to try next
#
# Environment (all optional):
#   NODELET_BIN              use this nodelet binary instead of building one
#   NODELET_QS_ROOT_DIR      --root-dir                      (default /var/lib/nodelet)
#   NODELET_QS_IMAGES        image archive directory         (default /var/cache/nodelet/images)
#   NODELET_QS_POD_CIDR      pod network, inside 198.18.0.0/16 (default 198.18.0.0/16)
#   NODELET_QS_LOG           nodelet's log file              (default /var/log/nodelet-quickstart.log)
#   NODELET_QS_TIMEOUT       seconds to wait for the web pod (default 180)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT_DIR=${NODELET_QS_ROOT_DIR:-/var/lib/nodelet}
IMAGES=${NODELET_QS_IMAGES:-/var/cache/nodelet/images}
POD_CIDR=${NODELET_QS_POD_CIDR:-198.18.0.0/16}
LOG=${NODELET_QS_LOG:-/var/log/nodelet-quickstart.log}
TIMEOUT=${NODELET_QS_TIMEOUT:-180}
PIDFILE=/run/nodelet-quickstart.pid
MANIFESTS=$REPO/deploy/examples
READ_ONLY_URL=http://127.0.0.1:10255
HEALTHZ_URL=http://127.0.0.1:10248/healthz
HOST_PORT=18080

log() { printf '\033[1m[quickstart %(%H:%M:%S)T]\033[0m %s\n' -1 "$*"; }
die() {
	printf '[quickstart %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

# ---------------------------------------------------------------- checks
[ "$(id -u)" = 0 ] || die "run as root (nodelet manages containers, mounts and network namespaces)"
if [[ ! $POD_CIDR =~ ^198\.18\.([0-9]{1,3})\.([0-9]{1,3})/([0-9]{1,2})$ ]]; then
	die "NODELET_QS_POD_CIDR must be a network inside 198.18.0.0/16, got '$POD_CIDR'"
fi
GATEWAY=198.18.${BASH_REMATCH[1]}.$((BASH_REMATCH[2] + 1)) # the bridge's address: the network's first host
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "NODELET_QS_TIMEOUT must be a number of seconds"
case "$ROOT_DIR$IMAGES$LOG" in *[!A-Za-z0-9/._-]*) die "paths may only contain [A-Za-z0-9/._-]" ;; esac

# running_pid: the pid of the nodelet started here, if it still runs
running_pid() {
	local pid
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)" 2>/dev/null)" = nodelet ] || return 1
	[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
	echo "$pid"
}

stop() {
	local pid i
	if ! pid=$(running_pid); then
		log "nodelet (quick start) is not running"
		rm -f "$PIDFILE"
		return 0
	fi
	log "stopping nodelet (pid $pid); it stops its containerd (pods' containers keep running until nodelet removes them)"
	kill -TERM "$pid"
	for ((i = 0; i < 600; i++)); do
		if ! running_pid >/dev/null; then
			rm -f "$PIDFILE"
			log "stopped"
			return 0
		fi
		sleep 0.1
	done
	log "nodelet did not stop within 60s; sending SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$PIDFILE"
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

# ---------------------------------------------------------------- 1. packages
log "1/5 installing missing Debian packages"
"$REPO/scripts/install-deps.sh"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# ---------------------------------------------------------------- 2. build
BIN=$(nodelet_bin)
if [ -n "${NODELET_BIN:-}" ]; then
	[ -x "$BIN" ] || die "NODELET_BIN=$BIN is not an executable"
	log "2/5 using $BIN"
else
	command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (https://rustup.rs) first"
	log "2/5 building nodelet (cargo build --release; the first build takes several minutes)"
	(cd "$REPO" && cargo build --release --bin nodelet)
	[ -x "$BIN" ] || die "build finished but $BIN is missing"
fi

# ---------------------------------------------------------------- 3. images
log "3/5 building the local images into $IMAGES"
"$REPO/scripts/build-images.sh" "$IMAGES"

# ---------------------------------------------------------------- 4. start nodelet
if pid=$(running_pid); then
	log "a quick-start nodelet already runs (pid $pid): restarting it"
	stop
fi
for port in 10248 10250 10255; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		die "something already listens on 127.0.0.1:$port (another kubelet or nodelet?)"
	fi
done
ARGS=(
	--root-dir "$ROOT_DIR"
	--pod-manifest-path "$MANIFESTS"
	--address 127.0.0.1
	--read-only-port 10255
	--pod-cidr "$POD_CIDR"
	--preload-images "$IMAGES"
)
log "4/5 starting nodelet in the background (log $LOG):"
log "    $BIN ${ARGS[*]}"
mkdir -p "$(dirname "$LOG")"
printf '\n=== %(%F %T)T quickstart.sh: %s\n' -1 "$BIN ${ARGS[*]}" >>"$LOG"
setsid "$BIN" "${ARGS[@]}" </dev/null >>"$LOG" 2>&1 &
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
cat <<EOF

nodelet runs in the background (pid $PID), with its own containerd under $ROOT_DIR/containerd.
Try:
  $BIN get pods                          # the pods, like kubectl get pods (read-only port 10255)
  $BIN logs web-$NODE                    # the web server's log (CRI files under /var/log/pods)
  $BIN logs crashloop-$NODE --previous   # the crash-looping container's last run
  curl $READ_ONLY_URL/pods               # the v1 PodList nodelet serves
  edit or add manifests in $MANIFESTS: nodelet picks changes up within seconds
Log: $LOG
Stop: $0 --stop
EOF

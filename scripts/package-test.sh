#!/usr/bin/env bash
# The Debian package, end to end, on this machine (as root, with the test runtime of scripts/runtime-up.sh up):
#   1. builds the package twice with scripts/package.sh from one binary (revision 1, then 2: "a rebuilt package
#      with a changed version"), and checks the first with lintian (errors and warnings fail; the overrides in
#      deploy/debian/lintian-overrides are justified there);
#   2. installs it with apt-get (an /etc/default/nodelet written first, as an operator would, is kept), checks the
#      files and conffiles, and runs `systemd-analyze verify` on the installed unit;
#   3. starts nodelet from the installed files: `systemctl start nodelet` when systemd is PID 1, else the unit's
#      ExecStart by hand, with /etc/default/nodelet as the unit reads it; the example pods of deploy/examples in
#      /etc/nodelet/manifests, on the test runtime's containerd (NODELET_TEST_CRI_ENDPOINT) as node
#      "nodelet-pkgtest" (its pods only: nodelet leaves other nodes' pods alone), on free loopback ports;
#   4. edits /etc/nodelet/kubelet-config.yaml and upgrades to revision 2 while the web pod runs: the config keeps
#      the edit, nodelet restarts the way the package restarts it (systemd: the postinst's restart with
#      KillMode=process; by hand: SIGTERM to nodelet only, then the new binary), and every pod keeps its
#      container (same container IDs, no restart);
#   5. removes the pods (empty manifest directory), removes the package (conffiles stay), purges it (they go; the
#      pods' data stays), and, when /var/lib/nodelet did not exist before, purges with NODELET_PURGE_DATA=yes.
# Everything it installed or started is removed at the end, pass or fail.
#
#   scripts/package-test.sh                       packages target/debug/nodelet (cargo build first)
#   scripts/package-test.sh --binary PATH         packages PATH
#
# The package is built from the debug binary by default: the fat-LTO dist build takes about 20 minutes on 2 cores,
# and what this checks (files, maintainer scripts, upgrade, removal) does not depend on the optimisation.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

log() { printf '[package-test %(%H:%M:%S)T] %s\n' -1 "$*"; }
FAILED=0
die() {
	printf '[package-test %(%H:%M:%S)T] FAILED: %s\n' -1 "$*" >&2
	FAILED=1
	exit 1
}

BINARY=''
case "${1:-}" in
"") ;;
--binary) BINARY=${2:?--binary needs a path} ;;
-h | --help)
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit 0
	;;
*) die "unknown argument: $1 (usage: $0 [--binary PATH])" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (it installs a package)"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
if [ -z "${NODELET_TEST_CRI_ENDPOINT:-}" ]; then
	# shellcheck disable=SC1091
	. "${NODELET_TEST_BASE:-/tmp/nodelet-test}/env.sh" 2>/dev/null || die "no test runtime: run scripts/runtime-up.sh first"
fi
for tool in apt-get dpkg dpkg-deb lintian systemd-analyze ctr jq curl; do
	command -v "$tool" >/dev/null || die "$tool not found (scripts/install-deps.sh; lintian: apt-get install lintian)"
done
if dpkg-query -W -f='${Status}' nodelet 2>/dev/null | grep -q installed; then
	die "the nodelet package is installed on this machine: this test installs and purges it, so it does not run here"
fi
for f in /etc/nodelet /etc/default/nodelet; do
	[ ! -e "$f" ] || die "$f exists (another nodelet installation?): this test would take it over"
done
if iptables -w -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -q -- '--dport 18080 '; then
	die "hostPort 18080 (the web example's) is in use by another pod"
fi

NODE=nodelet-pkgtest
BASE=${NODELET_TEST_BASE:-/tmp/nodelet-test}/package
SOCK=${NODELET_TEST_CRI_ENDPOINT#unix://}
UNIT=/usr/lib/systemd/system/nodelet.service
SYSTEMD=0
[ -d /run/systemd/system ] && [ "$(ps -p 1 -o comm=)" = systemd ] && SYSTEMD=1
DATA_DIR_PREEXISTED=0
[ -e /var/lib/nodelet ] && DATA_DIR_PREEXISTED=1
rm -rf "$BASE"
mkdir -p "$BASE"
PID=''

# free_port START: the first port from START up that nothing listens on (loopback)
free_port() {
	local p=$1
	while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || [[ " ${USED_PORTS:-} " == *" $p "* ]]; do p=$((p + 1)); done
	USED_PORTS="${USED_PORTS:-} $p"
	echo "$p"
}
PORT=$(free_port 30250)
RO_PORT=$(free_port 30255)
HEALTHZ_PORT=$(free_port 30248)
SERVER=http://127.0.0.1:$RO_PORT

# node_containers: the runtime's containers (sandboxes included) of our node
node_containers() { ctr --address "$SOCK" -n k8s.io containers ls -q "labels.\"io.nodelet.node\"==$NODE" 2>/dev/null | grep -c . || true; }
alive() { [ -n "$PID" ] && [ -r "/proc/$PID/stat" ] && [ "$(awk '{print $3}' "/proc/$PID/stat")" != Z ]; }
healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$HEALTHZ_PORT/healthz" >/dev/null 2>&1; }
pods_json() { /usr/bin/nodelet get pods -o json --server "$SERVER" 2>/dev/null; }

start_nodelet() {
	if [ "$SYSTEMD" = 1 ]; then
		systemctl daemon-reload
		systemctl start nodelet
	else
		# the unit's ExecStart, with its EnvironmentFile and PATH, as systemd would run it (ExecStartPre's modprobe
		# of overlay and br_netfilter is left out: the test runtime has them)
		local exec_line extra argv
		exec_line=$(sed -n 's/^ExecStart=//p' "$UNIT")
		# shellcheck disable=SC1091
		extra=$(. /etc/default/nodelet && echo "$NODELET_EXTRA_ARGS")
		read -ra argv <<<"${exec_line//\$NODELET_EXTRA_ARGS/$extra}"
		log "by hand (systemd is not PID 1 here): ${argv[*]}"
		PATH=$(sed -n 's/^Environment=PATH=//p' "$UNIT") setsid "${argv[@]}" </dev/null >>"$BASE/nodelet.log" 2>&1 &
		PID=$!
	fi
	local i
	for ((i = 0; i < 60; i++)); do
		healthy && return 0
		if [ "$SYSTEMD" = 0 ] && ! alive; then
			tail -n 20 "$BASE/nodelet.log" >&2
			die "nodelet exited (log $BASE/nodelet.log)"
		fi
		sleep 1
	done
	die "nodelet did not answer /healthz within 60 s"
}

# stop_nodelet: as the unit stops it (KillMode=process: SIGTERM to nodelet only)
stop_nodelet() {
	if [ "$SYSTEMD" = 1 ]; then
		systemctl stop nodelet || true
		return 0
	fi
	alive || return 0
	kill -TERM "$PID"
	local i
	for ((i = 0; i < 900; i++)); do
		alive || return 0
		sleep 0.1
	done
	log "nodelet did not stop within 90 s (the unit's TimeoutStopSec): SIGKILL"
	kill -KILL "$PID" || true
}

# remove_pods: an empty manifest directory, until the runtime holds nothing of our node
remove_pods() {
	rm -f /etc/nodelet/manifests/*.yaml
	local i
	for ((i = 0; i < 120; i++)); do
		[ "$(node_containers)" = 0 ] && return 0
		sleep 1
	done
	return 1
}

cleanup() {
	local rc=$?
	set +e
	if [ "$rc" != 0 ] || [ "$FAILED" = 1 ]; then
		log "cleaning up after a failure (nodelet's log: $BASE/nodelet.log)"
		tail -n 30 "$BASE/nodelet.log" 2>/dev/null
	fi
	if healthy && [ -d /etc/nodelet/manifests ]; then
		remove_pods || log "WARNING: containers of node $NODE are left in the test runtime"
	fi
	stop_nodelet
	if dpkg-query -W -f='${Status}' nodelet 2>/dev/null | grep -q installed; then
		DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nodelet >/dev/null 2>&1 || dpkg --purge nodelet
	fi
	rm -rf /etc/nodelet /etc/default/nodelet
	[ "$DATA_DIR_PREEXISTED" = 1 ] || rm -rf --one-file-system /var/lib/nodelet
	if ! grep -qF " $BASE/" /proc/self/mountinfo; then rm -rf --one-file-system "$BASE/root"; fi
	# the packages (about 16 MB each); the logs stay for a look
	rm -rf "$BASE/v1" "$BASE/v2"
	exit "$rc"
}
trap cleanup EXIT

# ---------------------------------------------------------------- 1. build, lintian
if [ -z "$BINARY" ]; then
	cargo build --workspace --all-features --bin nodelet
	BINARY=${CARGO_TARGET_DIR:-$REPO/target}/debug/nodelet
fi
log "1. building the packages from $BINARY"
DEB1=$(scripts/package.sh --fast --binary "$BINARY" --out "$BASE/v1")
DEB2=$(scripts/package.sh --fast --binary "$BINARY" --deb-revision 2 --out "$BASE/v2")
V1=$(dpkg-deb -f "$DEB1" Version) V2=$(dpkg-deb -f "$DEB2" Version)
[ "$V1" != "$V2" ] || die "the rebuilt package has the same version $V1"
log "lintian $DEB1"
lint_rc=0
lintian --fail-on error,warning --info "$DEB1" >"$BASE/lintian.txt" 2>&1 || lint_rc=$?
# (as root lintian says so on stderr: it only reads the package)
grep -v 'running with root privileges' "$BASE/lintian.txt" || true
[ "$lint_rc" = 0 ] || die "lintian reports errors or warnings (above)"
log "lintian: clean (overrides: deploy/debian/lintian-overrides)"

# ---------------------------------------------------------------- 2. install
log "2. installing $V1 (apt-get install; an operator's /etc/default/nodelet is already there)"
mkdir -p "$BASE/root" "$BASE/logs"
EXTRA="--container-runtime-endpoint $NODELET_TEST_CRI_ENDPOINT --hostname-override $NODE --address 127.0.0.1"
EXTRA="$EXTRA --port $PORT --read-only-port $RO_PORT --healthz-port $HEALTHZ_PORT --root-dir $BASE/root"
EXTRA="$EXTRA --pod-logs-dir $BASE/logs --cgroup-root $NODELET_TEST_CGROUP_PARENT --resolv-conf $NODELET_TEST_RESOLV_CONF"
# The test runtime is shared (other tests' images, a disk that may be nearly full): no image garbage collection
# (it would remove images other tests use) and no disk-pressure eviction (it would refuse the pods), as the
# integration tests run nodelet there.
EXTRA="$EXTRA --image-gc-high-threshold 100 --eviction-hard memory.available<100Mi"
printf '# written by scripts/package-test.sh before the install\nNODELET_EXTRA_ARGS="%s"\n' "$EXTRA" >/etc/default/nodelet
cp /etc/default/nodelet "$BASE/default.operator"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold "$DEB1" </dev/null
[ "$(dpkg-query -W -f='${Version}' nodelet)" = "$V1" ] || die "dpkg does not list nodelet $V1"
for f in /usr/bin/nodelet "$UNIT" /etc/nodelet/kubelet-config.yaml /usr/share/man/man1/nodelet.1.gz \
	/usr/share/bash-completion/completions/nodelet /usr/share/zsh/vendor-completions/_nodelet \
	/usr/share/fish/vendor_completions.d/nodelet.fish /usr/share/doc/nodelet/copyright; do
	[ -f "$f" ] || die "the package did not install $f"
done
[ -d /etc/nodelet/manifests ] || die "the postinst did not make /etc/nodelet/manifests"
conffiles=$(dpkg-query -W -f='${Conffiles}' nodelet)
for f in /etc/nodelet/kubelet-config.yaml /etc/default/nodelet; do
	grep -q " $f " <<<"$conffiles" || die "$f is not a conffile: $conffiles"
done
cmp -s /etc/default/nodelet "$BASE/default.operator" || die "the install overwrote the operator's /etc/default/nodelet"
/usr/bin/nodelet completion bash | cmp -s - /usr/share/bash-completion/completions/nodelet ||
	die "the bash completion differs from the binary's"
log "systemd-analyze verify $UNIT"
out=$(systemd-analyze verify "$UNIT" 2>&1) || die "systemd-analyze verify: $out"
[ -z "$out" ] || die "systemd-analyze verify warns: $out"
grep -qx 'KillMode=process' "$UNIT" || die "the installed unit lacks KillMode=process"

# ---------------------------------------------------------------- 3. start, pods
log "3. starting nodelet from the installed files, with the example pods"
cp deploy/examples/*.yaml /etc/nodelet/manifests/
start_nodelet
log "nodelet is healthy; waiting for the web pod"
web_ip=''
for ((i = 0; i < 120; i++)); do
	web_ip=$(pods_json | jq -r --arg n "web-$NODE" '.items[] | select(.metadata.name == $n and .status.phase == "Running") | .status.podIP // empty')
	if [ -n "$web_ip" ] && curl -fsS --max-time 2 "http://$web_ip:8080/" 2>/dev/null | grep -q "hello from nodelet"; then break; fi
	web_ip=''
	sleep 1
done
[ -n "$web_ip" ] || die "the web pod did not serve within 120 s"
case "$web_ip" in 198.18.*) ;; *) die "the web pod's IP $web_ip is outside 198.18.0.0/16" ;; esac
web_id() { pods_json | jq -r --arg n "web-$NODE" '.items[] | select(.metadata.name == $n) | .status.containerStatuses[0] | "\(.containerID) \(.restartCount)"'; }
before=$(web_id)
/usr/bin/nodelet get pods -o wide --server "$SERVER"
log "web pod serves at $web_ip:8080; its container: $before"

# ---------------------------------------------------------------- 4. upgrade while the pod runs
printf '# edited by the operator (scripts/package-test.sh)\n' >>/etc/nodelet/kubelet-config.yaml
cp /etc/nodelet/kubelet-config.yaml "$BASE/config.operator"
log "4. upgrading to $V2 while the pods run"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$DEB2" </dev/null
[ "$(dpkg-query -W -f='${Version}' nodelet)" = "$V2" ] || die "dpkg does not list nodelet $V2 after the upgrade"
cmp -s /etc/nodelet/kubelet-config.yaml "$BASE/config.operator" || die "the upgrade overwrote the edited config"
cmp -s /etc/default/nodelet "$BASE/default.operator" || die "the upgrade overwrote /etc/default/nodelet"
if [ "$SYSTEMD" = 0 ]; then
	log "restarting nodelet as the package's postinst does on systemd (KillMode=process: nodelet only)"
	stop_nodelet
	start_nodelet
else
	systemctl is-active --quiet nodelet || die "nodelet is not active after the upgrade"
fi
for ((i = 0; i < 60; i++)); do
	after=$(web_id)
	[ -n "$after" ] && [ "$after" != "null null" ] && break
	sleep 1
done
log "after the upgrade the web pod's container: $after"
[ "$after" = "$before" ] || die "the web pod's container changed across the upgrade: $before -> $after"
curl -fsS --max-time 5 "http://$web_ip:8080/" | grep -q "hello from nodelet" || die "the web pod stopped serving"

# ---------------------------------------------------------------- 5. remove, purge
log "5. removing the pods (empty manifest directory), then the package"
remove_pods || die "the pods were not removed within 120 s"
stop_nodelet
if [ "$DATA_DIR_PREEXISTED" = 0 ]; then
	mkdir -p /var/lib/nodelet/pods
	echo data >/var/lib/nodelet/pods/marker
fi
DEBIAN_FRONTEND=noninteractive apt-get remove -y -q nodelet </dev/null
for f in /usr/bin/nodelet "$UNIT" /usr/share/man/man1/nodelet.1.gz; do
	[ ! -e "$f" ] || die "remove left $f"
done
for f in /etc/nodelet/kubelet-config.yaml /etc/default/nodelet; do
	[ -f "$f" ] || die "remove deleted the conffile $f (only purge may)"
done
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nodelet </dev/null
for f in /etc/nodelet /etc/default/nodelet; do
	[ ! -e "$f" ] || die "purge left $f"
done
[ -d "$BASE/root" ] || die "purge removed the pods' data ($BASE/root)"
if [ "$DATA_DIR_PREEXISTED" = 0 ]; then
	[ -f /var/lib/nodelet/pods/marker ] || die "purge without NODELET_PURGE_DATA removed /var/lib/nodelet"
	log "purge kept /var/lib/nodelet; once more with NODELET_PURGE_DATA=yes"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold "$DEB2" </dev/null
	NODELET_PURGE_DATA=yes DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nodelet </dev/null
	[ ! -e /var/lib/nodelet ] || die "purge with NODELET_PURGE_DATA=yes left /var/lib/nodelet"
else
	log "/var/lib/nodelet existed before this test: the NODELET_PURGE_DATA=yes purge is not tried here"
fi
left=$(dpkg -L nodelet 2>/dev/null || true)
[ -z "$left" ] || die "dpkg still lists files of nodelet: $left"
log "passed: built, lintian-clean, installed, verified, ran the example pods, upgraded $V1 -> $V2 with the pods' containers kept, removed and purged"

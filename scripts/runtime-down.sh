#!/usr/bin/env bash
# Stop exactly what scripts/runtime-up.sh started and clean up what its pods left behind.
# Idempotent; safe to run when nothing is up.
#
#   scripts/runtime-down.sh           stop + clean; keep $NODELET_TEST_BASE (images, registry
#                                     data, logs) so the next runtime-up.sh is fast
#   scripts/runtime-down.sh --purge   additionally delete $NODELET_TEST_BASE
#
# Only touches things that are provably ours: processes via our pid files / config paths,
# shims whose argv has "-address <our socket>", mounts under the base dir, bridge nlcni0 and
# veths on it, cgroups under /nodelet-test (and /k8s.io/<our container id>), CNI cache files of
# network "nodelet-test" and of our sandbox ids, portmap rules tagged with our network name,
# and the top-level portmap chains / ip_forward only if runtime-up.sh found them absent / off.
#
# First the envtest control plane scripts/test.sh starts for the cluster tests ($NODELET_TEST_BASE/envtest),
# with envtest's stop.sh ($NODELET_TEST_ENVTEST_SCRIPTS, else ../shared/envtest; --purge passed on).
#
# Order: with containerd up (started briefly if it is down but containers were left behind),
# kill + delete every task and container via ctr (crictl, if installed, first removes pods
# properly); stop containerd and the registry; force-delete leftover runc containers, kill stray
# shims; unmount everything under the base dir; remove network, cgroup and CNI leftovers.
#
# Environment: NODELET_TEST_BASE (default /tmp/nodelet-test). Bridge, CNI network and cgroup
# parent are read from $NODELET_TEST_BASE/run/runtime.conf (written by runtime-up.sh); without
# it, NODELET_TEST_BRIDGE / NODELET_TEST_CNI_NETWORK / NODELET_TEST_CGROUP_PARENT or defaults.
set -euo pipefail

START_NS=$(date +%s%N)
BASE=${NODELET_TEST_BASE:-/tmp/nodelet-test}
PURGE=0
case "${1:-}" in
"") ;;
--purge) PURGE=1 ;;
-h | --help)
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit 0
	;;
*)
	echo "usage: $0 [--purge]" >&2
	exit 2
	;;
esac

log() { printf '[runtime-down %(%H:%M:%S)T] %s\n' -1 "$*"; }
warn() { printf '[runtime-down %(%H:%M:%S)T] WARNING: %s\n' -1 "$*" >&2; }
die() {
	printf '[runtime-down %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

case "$BASE" in
/*/*) ;;
*) die "NODELET_TEST_BASE must be an absolute path below a top-level directory, got '$BASE'" ;;
esac
case "$BASE" in *[!A-Za-z0-9/._-]*) die "NODELET_TEST_BASE may only contain [A-Za-z0-9/._-]: '$BASE'" ;; esac
[ "$(id -u)" = 0 ] || die "must run as root"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

RUN=$BASE/run
SOCK=$RUN/containerd.sock
CTD_DIR=$BASE/containerd
CTD_CONFIG=$CTD_DIR/config.toml
CTD_ROOT=$CTD_DIR/root
CTD_STATE=$CTD_DIR/state
RUNC_ROOT=$BASE/runc
REG_CONFIG=$BASE/registry/config.yml
CTD_LOG=$BASE/logs/containerd.log
SHIM_SOCKET_DIR=/run/containerd/s # containerd 1.6 puts shim sockets here, whatever its state dir
CNI_CACHE=/var/lib/cni/results

# what runtime-up.sh used (run/runtime.conf), else the same environment/defaults as runtime-up.sh
BRIDGE=${NODELET_TEST_BRIDGE:-nlcni0}
CNI_NET=${NODELET_TEST_CNI_NETWORK:-nodelet-test}
CGROUP_PARENT=${NODELET_TEST_CGROUP_PARENT:-/nodelet-test}
CTD_BIN_DIR='' RUNC_BIN='' # the containerd and runc of NODELET_TEST_CONTAINERD / NODELET_TEST_RUNC
if [ -f "$RUN/runtime.conf" ]; then
	while IFS='=' read -r k v; do
		case "$k" in
		BRIDGE) BRIDGE=$v ;;
		CNI_NET) CNI_NET=$v ;;
		CGROUP_PARENT) CGROUP_PARENT=$v ;;
		CTD_BIN_DIR) CTD_BIN_DIR=$v ;;
		RUNC_BIN) RUNC_BIN=$v ;;
		esac
	done <"$RUN/runtime.conf"
fi
case "$CTD_BIN_DIR$RUNC_BIN" in *[!A-Za-z0-9/._-]*) die "invalid binary path in $RUN/runtime.conf" ;; esac
CONTAINERD=containerd CTR=ctr RUNC=runc
if [ -n "$CTD_BIN_DIR" ]; then CONTAINERD=$CTD_BIN_DIR/containerd CTR=$CTD_BIN_DIR/ctr; fi
if [ -n "$RUNC_BIN" ]; then RUNC=$RUNC_BIN; fi
# these decide what gets killed and deleted: refuse anything unexpected
[[ $BRIDGE =~ ^[A-Za-z0-9_.-]{1,15}$ ]] || die "invalid bridge name '$BRIDGE'"
[[ $CNI_NET =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "invalid CNI network name '$CNI_NET'"
if [[ ! $CGROUP_PARENT =~ ^/[A-Za-z0-9_.-]+$ ]] || [ "$CGROUP_PARENT" = /k8s.io ]; then
	die "invalid cgroup parent '$CGROUP_PARENT' (must be a dedicated top-level cgroup)"
fi

IP_FORWARD_ORIG='' PORTMAP_CHAINS_PREEXISTING=1 K8SIO_CGROUP_PREEXISTING=1
if [ -f "$RUN/host-state" ]; then
	while IFS='=' read -r k v; do
		case "$k" in
		IP_FORWARD_ORIG) IP_FORWARD_ORIG=$v ;;
		PORTMAP_CHAINS_PREEXISTING) PORTMAP_CHAINS_PREEXISTING=$v ;;
		K8SIO_CGROUP_PREEXISTING) K8SIO_CGROUP_PREEXISTING=$v ;;
		esac
	done <"$RUN/host-state"
fi

if [ -d "$RUN" ]; then
	exec 9>"$RUN/lock"
	flock -w 300 9 || die "timed out waiting for $RUN/lock (runtime-up.sh running?)"
fi

ctr_() { "$CTR" --address "$SOCK" "$@"; }

# ---------------------------------------------------------------- process helpers
is_ours() { # pid exe config
	[ "$(basename "$(readlink "/proc/$1/exe" 2>/dev/null)")" = "$2" ] &&
		grep -qxzF -- "$3" "/proc/$1/cmdline" 2>/dev/null
}
our_pid() { # pidfile exe config: pid of our daemon (pid file, else search by config path)
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
			echo "$pid"
			return 0
		fi
	done
	return 1
}
# alive PID: process exists and is not a zombie (pid 1 here may be slow to reap orphans)
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
stop_pid() { # pid name timeout_s: SIGTERM, wait, SIGKILL
	local pid=$1 name=$2 t=$3 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < t * 10; i++)); do
		if ! alive "$pid"; then
			log "$name (pid $pid) stopped"
			return 0
		fi
		sleep 0.1
	done
	warn "$name (pid $pid) did not stop within ${t}s, sending SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	sleep 0.2
}
our_shims() { # containerd-shim-runc-v2 processes whose argv has "-address $SOCK"
	local c pid
	# shellcheck disable=SC2013 # file names from /proc have no spaces
	for c in $(grep -lxzF -- "$SOCK" /proc/[0-9]*/cmdline 2>/dev/null); do
		pid=${c#/proc/}
		pid=${pid%/cmdline}
		[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = containerd-shim-runc-v2 ] || continue
		tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null |
			awk -v s="$SOCK" 'prev == "-address" && $0 == s {f = 1} {prev = $0} END {exit !f}' &&
			echo "$pid"
	done
	return 0
}
mounts_under_base() { awk -v b="$BASE/" 'index($5, b) == 1 {print $5}' /proc/self/mountinfo | sort -r; }
task_dirs() { # ns/id of every task bundle containerd has under our state dir
	local d
	for d in "$CTD_STATE"/io.containerd.runtime.v2.task/*/*/; do
		[ -d "$d" ] || continue
		d=${d%/}
		echo "$(basename "$(dirname "$d")")/$(basename "$d")"
	done
}
cri_ids() { # ids of CRI sandboxes/containers that still have directories
	local d
	for d in "$CTD_ROOT"/io.containerd.grpc.v1.cri/{sandboxes,containers}/*/ \
		"$CTD_STATE"/io.containerd.grpc.v1.cri/{sandboxes,containers}/*/; do
		if [ -d "$d" ]; then basename "$d"; fi
	done | sort -u
}

# ---------------------------------------------------------------- 0. the envtest control plane
# scripts/test.sh starts one for the cluster tests under $BASE/envtest with envtest's start.sh: stop it with
# envtest's stop.sh (by its pid files; --purge as given here), else by those pid files ourselves. Pid files
# whose process is gone or runs another program (a reboot, a restored machine) are dropped first.
ENVTEST_DIR=$BASE/envtest
"$(dirname "${BASH_SOURCE[0]}")/envtest-clear-stale.sh" "$ENVTEST_DIR"
if compgen -G "$ENVTEST_DIR/run/*.pid" >/dev/null; then
	ENVTEST_SCRIPTS=${NODELET_TEST_ENVTEST_SCRIPTS:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/../shared/envtest}
	if [ -x "$ENVTEST_SCRIPTS/stop.sh" ]; then
		log "stopping the envtest control plane in $ENVTEST_DIR ($ENVTEST_SCRIPTS/stop.sh)"
		if [ "$PURGE" = 1 ]; then set -- --purge; else set --; fi
		ENVTEST_BASE=$ENVTEST_DIR "$ENVTEST_SCRIPTS/stop.sh" "$@" 9>&- || warn "envtest stop.sh failed"
	else
		warn "no envtest stop.sh at $ENVTEST_SCRIPTS: stopping the control plane by its pid files"
		for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do
			f=$ENVTEST_DIR/run/$n.pid
			[ -f "$f" ] || continue
			stop_pid "$(cat "$f")" "$n" 10
			rm -f "$f"
		done
	fi
fi

# ---------------------------------------------------------------- 1. runtime-level cleanup
CTD_PID=$(our_pid "$RUN/containerd.pid" containerd "$CTD_CONFIG" || true)
TASKS_AT_START=$(task_dirs) # a containerd started below cleans these up itself
if [ -z "$CTD_PID" ] && [ -f "$CTD_CONFIG" ] && [ -n "$TASKS_AT_START$(cri_ids)" ]; then
	# containers were left behind by a containerd that is gone: start it briefly so that it
	# cleans up its dead shims and the containers can be deleted through it
	log "containerd not running but containers left behind: starting it to clean up"
	mkdir -p "$(dirname "$CTD_LOG")"
	rm -f "$SOCK" "$SOCK.ttrpc"
	ctd_path=$PATH
	if [ -n "$RUNC_BIN" ]; then ctd_path=$(dirname "$RUNC_BIN"):$ctd_path; fi
	if [ -n "$CTD_BIN_DIR" ]; then ctd_path=$CTD_BIN_DIR:$ctd_path; fi
	PATH=$ctd_path setsid "$CONTAINERD" --config "$CTD_CONFIG" </dev/null >>"$CTD_LOG" 2>&1 9>&- &
	CTD_PID=$!
	echo "$CTD_PID" >"$RUN/containerd.pid"
	for ((i = 0; i < 300; i++)); do
		{ [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; } && break
		alive "$CTD_PID" || break
		sleep 0.1
	done
fi

# NS/ID of every container/sandbox we know of (CRI dirs, task bundles, containerd metadata)
all_nsids() {
	local ns id
	for id in $(cri_ids); do echo "k8s.io/$id"; done
	task_dirs
	if [ -n "$CTD_PID" ] && [ -S "$SOCK" ]; then
		for ns in $(ctr_ namespaces ls -q 2>/dev/null || true); do
			for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null || true); do echo "$ns/$id"; done
		done
	fi
}
NSIDS=$(printf '%s\n' "$TASKS_AT_START" "$(all_nsids)" | grep -v '^$' | sort -u || true)
IDS=$(cut -d/ -f2 <<<"$NSIDS" | sort -u)
if [ -n "$CTD_PID" ] && [ -S "$SOCK" ] && ctr_ version >/dev/null 2>&1; then
	if command -v crictl >/dev/null; then
		log "crictl: stopping and removing all pod sandboxes"
		timeout 120 crictl --runtime-endpoint "unix://$SOCK" --timeout 60s rmp -af >/dev/null 2>&1 ||
			warn "crictl rmp reported errors (continuing with ctr)"
	fi
	for ns in $(ctr_ namespaces ls -q 2>/dev/null || true); do
		tasks=$(ctr_ -n "$ns" tasks ls -q 2>/dev/null || true)
		containers=$(ctr_ -n "$ns" containers ls -q 2>/dev/null || true)
		[ -n "$tasks$containers" ] || continue
		log "namespace $ns: deleting $(wc -w <<<"$tasks") task(s), $(wc -w <<<"$containers") container(s)"
		for t in $tasks; do
			ctr_ -n "$ns" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
		done
		for t in $tasks; do
			for ((i = 0; i < 50; i++)); do
				ctr_ -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 && break
				ctr_ -n "$ns" tasks ls -q 2>/dev/null | grep -qxF -- "$t" || break
				sleep 0.1
			done
		done
		for c in $containers; do
			ctr_ -n "$ns" containers delete "$c" >/dev/null 2>&1 || warn "could not delete container $ns/$c"
		done
	done
fi

# ---------------------------------------------------------------- 2. stop containerd + registry
if [ -n "$CTD_PID" ]; then stop_pid "$CTD_PID" containerd 15; else log "containerd not running"; fi
if REG_PID=$(our_pid "$RUN/registry.pid" docker-registry "$REG_CONFIG"); then
	stop_pid "$REG_PID" registry 10
else
	log "registry not running"
fi
rm -f "$RUN/containerd.pid" "$RUN/registry.pid" "$RUN/containerd.config.sha256" "$SOCK" "$SOCK.ttrpc"

# ---------------------------------------------------------------- 3. leftover containers and shims
# runc state of containers whose bundle is under our base: CRI ones use our runc root, `ctr run`
# ones the default root /run/containerd/runc/<ns> (shared with other containerds: check the bundle)
for st in "$RUNC_ROOT"/*/*/state.json /run/containerd/runc/*/*/state.json; do
	[ -f "$st" ] || continue
	grep -qF "\"$BASE/" "$st" || continue
	id=$(basename "$(dirname "$st")")
	root=$(dirname "$(dirname "$st")")
	log "runc delete --force $id (root $root)"
	"$RUNC" --root "$root" delete --force "$id" >/dev/null 2>&1 || warn "runc delete $id failed"
done
for s in $(our_shims); do
	for c in $(ps -o pid= --ppid "$s" 2>/dev/null || true); do
		log "killing process $c (child of our shim $s)"
		kill -KILL "$c" 2>/dev/null || true
	done
	log "killing stray shim $s"
	kill -KILL "$s" 2>/dev/null || true
done
# shim sockets: /run/containerd/s/sha256(<containerd socket>/<ns>/<id>)
for t in $NSIDS; do
	f=$SHIM_SOCKET_DIR/$(printf '%s' "$SOCK/$t" | sha256sum | cut -d' ' -f1)
	[ -e "$f" ] && rm -f "$f"
done

# ---------------------------------------------------------------- 4. mounts under the base dir
for m in $(mounts_under_base); do
	log "umount $m"
	umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || warn "could not unmount $m"
done
rm -f "$CTD_STATE"/io.containerd.grpc.v1.cri/netns/* 2>/dev/null || true
if [ -z "$(mounts_under_base)" ]; then
	# bundles and CRI dirs of containers that no longer exist (nothing is mounted any more)
	rm -rf "$CTD_STATE"/io.containerd.runtime.v2.task/*/* \
		"$CTD_ROOT"/io.containerd.grpc.v1.cri/{sandboxes,containers}/* \
		"$CTD_STATE"/io.containerd.grpc.v1.cri/{sandboxes,containers}/* \
		"${RUNC_ROOT:?}"/* 2>/dev/null || true
fi

# ---------------------------------------------------------------- 5. network
if ip link show "$BRIDGE" >/dev/null 2>&1; then
	for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
		log "deleting veth $v (on $BRIDGE)"
		ip link del "$v" 2>/dev/null || true
	done
	log "deleting bridge $BRIDGE"
	ip link del "$BRIDGE" 2>/dev/null || warn "could not delete bridge $BRIDGE"
fi
# libcni result cache: <network>-<container id>-<ifname>; go-cni's loopback network is "cni-loopback"
for f in "$CNI_CACHE/$CNI_NET"-*; do
	[ -e "$f" ] && rm -f "$f"
done
for id in $IDS; do
	rm -f "$CNI_CACHE/cni-loopback-$id-lo"
done
rm -rf "$BASE/cni/ipam"

# portmap: per-pod CNI-DN-* chains hang off CNI-HOSTPORT-DNAT with comment 'dnat name: "<net>"'
if command -v iptables >/dev/null && iptables -w -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1; then
	rules=$(iptables -w -t nat -S CNI-HOSTPORT-DNAT | grep -F "dnat name: \\\"$CNI_NET\\\"" || true)
	while read -r rule; do
		[ -n "$rule" ] || continue
		chain=$(sed -n 's/.* -j \(CNI-DN-[0-9a-f]*\).*/\1/p' <<<"$rule")
		# the rule text comes from iptables -S, shell-quoted; replay it with -D
		if eval "iptables -w -t nat -D ${rule#-A }"; then log "removed portmap rule -> ${chain:-?}"; fi
		if [ -n "$chain" ]; then
			iptables -w -t nat -F "$chain" 2>/dev/null || true
			iptables -w -t nat -X "$chain" 2>/dev/null || true
		fi
	done <<<"$rules"
	# the top-level chains only if runtime-up.sh found them absent and nobody uses them now
	if [ "$PORTMAP_CHAINS_PREEXISTING" = 0 ] &&
		! iptables -w -t nat -S CNI-HOSTPORT-DNAT | grep -q -- '^-A'; then
		for base_chain in PREROUTING OUTPUT POSTROUTING; do
			rules=$(iptables -w -t nat -S "$base_chain" | grep -E -- '-j CNI-HOSTPORT-(DNAT|MASQ)$' || true)
			while read -r rule; do
				[ -n "$rule" ] || continue
				if eval "iptables -w -t nat -D ${rule#-A }"; then log "iptables -t nat -D ${rule#-A }"; fi
			done <<<"$rules"
		done
		for c in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SETMARK CNI-HOSTPORT-MASQ; do
			if iptables -w -t nat -F "$c" 2>/dev/null && iptables -w -t nat -X "$c" 2>/dev/null; then
				log "removed iptables nat chain $c"
			fi
		done
	fi
fi
if [ -n "$IP_FORWARD_ORIG" ] && [ "$(cat /proc/sys/net/ipv4/ip_forward)" != "$IP_FORWARD_ORIG" ]; then
	echo "$IP_FORWARD_ORIG" >/proc/sys/net/ipv4/ip_forward
	log "net.ipv4.ip_forward restored to $IP_FORWARD_ORIG"
fi

# ---------------------------------------------------------------- 6. cgroups
cg_kill_rmdir() { # dir: kill whatever is left inside, then remove the tree bottom-up
	local d=$1 p
	[ -d "$d" ] || return 0
	for p in $(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u); do
		log "killing pid $p left in cgroup $d"
		kill -KILL "$p" 2>/dev/null || true
	done
	find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
	if [ -d "$d" ]; then
		sleep 0.2
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
	fi
	[ ! -d "$d" ] || warn "could not remove cgroup $d"
}
CG_ROOTS=(/sys/fs/cgroup/*/)
[ -f /sys/fs/cgroup/cgroup.controllers ] && CG_ROOTS=(/sys/fs/cgroup/) # pure cgroup v2
for ctl in "${CG_ROOTS[@]}"; do
	cg_kill_rmdir "${ctl%/}$CGROUP_PARENT"
	# containers without a cgroup parent (e.g. `ctr run`) land in /k8s.io/<id>
	for id in $IDS; do
		[ -d "${ctl%/}/k8s.io/$id" ] && cg_kill_rmdir "${ctl%/}/k8s.io/$id"
	done
	if [ "$K8SIO_CGROUP_PREEXISTING" = 0 ] && [ -d "${ctl%/}/k8s.io" ]; then
		rmdir "${ctl%/}/k8s.io" 2>/dev/null || true # only if empty
	fi
done

# ---------------------------------------------------------------- 7. summary, purge
rm -f "$RUN/host-state"
problems=()
left=$(mounts_under_base)
[ -z "$left" ] || problems+=("mounts under $BASE: $(tr '\n' ' ' <<<"$left")")
shims=$(our_shims)
[ -z "$shims" ] || problems+=("shims still running: $(tr '\n' ' ' <<<"$shims")")
! ip link show "$BRIDGE" >/dev/null 2>&1 || problems+=("bridge $BRIDGE still present")
if our_pid "$RUN/containerd.pid" containerd "$CTD_CONFIG" >/dev/null; then problems+=("containerd still running"); fi
if our_pid "$RUN/registry.pid" docker-registry "$REG_CONFIG" >/dev/null; then problems+=("registry still running"); fi
if [ "${#problems[@]}" -gt 0 ]; then
	for p in "${problems[@]}"; do warn "$p"; done
	die "cleanup incomplete$([ "$PURGE" = 0 ] || echo " (not purging $BASE)")"
fi
if [ "$PURGE" = 1 ] && [ -d "$BASE" ]; then
	log "purging $BASE"
	rm -rf --one-file-system "$BASE"
fi
log "done in $((($(date +%s%N) - START_NS) / 1000000)) ms"

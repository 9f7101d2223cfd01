#!/usr/bin/env bash
# Kubernetes' own end-to-end [NodeConformance] suite (upstream e2e.test v1.28.7) against nodelet, or against the
# upstream kubelet v1.28.7 on the same machine, control plane, runtime and images. From a fresh Debian 12
# machine, as root: installs what is missing, starts everything, runs the suite, stops what it started.
#
#   scripts/conformance.sh                      nodelet, every [NodeConformance] spec a machine without internet can
#                                               run (skips below); records the result and rewrites docs/conformance.md
#   scripts/conformance.sh --agent kubelet      the same against the reference kubelet (recorded beside nodelet's)
#   scripts/conformance.sh --suite extended     what the default run leaves out: the [Slow], [Serial] and [Disruptive]
#                                               [NodeConformance] specs and the [sig-node] and [sig-storage]
#                                               [Conformance] specs outside [NodeConformance] (parallel ones first,
#                                               then the [Serial]/[Disruptive] ones in one process); recorded as
#                                               docs/conformance/<agent>-extended.json, its own table in the doc
#   scripts/conformance.sh --focus REGEX        a subset (Ginkgo focus regex on the spec's full text); not recorded
#   scripts/conformance.sh --subset             the representative subset of tests/conformance-subset.txt
#                                               (the test command runs it); not recorded
#   scripts/conformance.sh --doc                only rewrite docs/conformance.md from the recorded results
#   scripts/conformance.sh --stop               stop and remove what the runs left (runtime, control plane, bridge)
#
# Options: --agent nodelet|kubelet, --focus REGEX, --skip REGEX (replaces the default skip), --procs N (Ginkgo
# processes, default 4), --nodelet-bin PATH (default: cargo build --release), --out DIR (reports; default
# $NODELET_CONFORMANCE_BASE/reports/<agent>-<time>), --record / --no-record (force or suppress recording),
# --keep (leave the node and the control plane running after the suite, to look at them; --stop ends them).
# Prints "N passed, N failed, N skipped" last and exits non-zero when a spec failed.
#
# What runs (under NODELET_CONFORMANCE_BASE, default /tmp/nodelet-conformance; nothing outside this machine):
#   * containerd + CNI + a registry through scripts/runtime-up.sh as a separate instance: base $BASE/runtime,
#     registry 127.0.0.1:5100, bridge nlconf0 with the node's address 198.18.224.1/20 (pods in 198.18.224.0/20),
#     cgroup /nodelet-conformance. Every other registry name the suite could ask for (registry.k8s.io, docker.io,
#     gcr.io, ...) resolves, in this containerd only, to 127.0.0.1:5199, where nothing listens: a pull of an image
#     that was not built here fails at once and no traffic leaves the machine.
#   * the test images of scripts/e2e-images.sh, pushed to the registry; KUBE_TEST_REPO_LIST maps the suite's
#     registries there (the invalid, private and authenticated ones to 127.0.0.1:5199).
#   * a fresh control plane for each run: ../shared/envtest (etcd, kube-apiserver, controller manager, scheduler)
#     on ports 36443/32379, purged before the run.
#   * the node "e2e-node": nodelet or the kubelet with a node client certificate, Webhook authentication and
#     authorization, the envtest CA as client CA, serving 198.18.224.1:10250 (the API server's logs/exec/port-
#     forward go there) and /healthz on 198.18.224.1:10248 (not 127.0.0.1, where a quick start's nodelet may
#     listen), pods' DNS from an explicit resolv.conf (nameserver 127.0.0.1), cluster domain cluster.local.
#   * ginkgo + e2e.test from ../shared/conformance (install.sh), --provider=skeleton.
#
# Skipped by default: [Serial], [Disruptive], [Flaky], [Slow] (the default suite is the parallel set; --suite extended
# runs the rest but [Flaky]), and the one spec that needs the internet: "should be able to pull from private registry
# with secret" (its image and credentials are upstream's private registry). Skipped on a machine that cannot run
# them, detected before the run and named in its output and record: PrivilegedPod, whose container runs
# `ip link add dummy1 type dummy`, where the kernel has no dummy link type (the kubelet fails it the same way).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
BASE=${NODELET_CONFORMANCE_BASE:-/tmp/nodelet-conformance}
DOC=$REPO_ROOT/docs/conformance.md
RESULTS=$REPO_ROOT/docs/conformance
SUBSET_FILE=$REPO_ROOT/tests/conformance-subset.txt

NODE=e2e-node
NODE_IP=198.18.224.1
POD_SUBNET=198.18.224.0/20
BRIDGE=nlconf0
REG=127.0.0.1:5100
DEAD_REG=127.0.0.1:5199
API_PORT=36443
ETCD_PORT=32379
CGROUP_PARENT=/nodelet-conformance
NO_INTERNET_SKIP='should be able to pull from private registry with secret'
DEFAULT_SKIP="\\[Serial\\]|\\[Disruptive\\]|\\[Flaky\\]|\\[Slow\\]|$NO_INTERNET_SKIP"
# --suite extended: the node-facing specs beyond the default suite (those of this focus that the default run skips)
EXTENDED_FOCUS='\[NodeConformance\]|\[sig-node\].*\[Conformance\]|\[sig-storage\].*\[Conformance\]'
EXTENDED_SKIP="\\[Flaky\\]|$NO_INTERNET_SKIP"

log() { printf '[conformance %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() {
	printf '[conformance %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}
usage() {
	awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
	exit "${1:-0}"
}

AGENT=nodelet FOCUS='\[NodeConformance\]' SKIP=$DEFAULT_SKIP PROCS=4 NODELET_BIN=${NODELET_BIN:-} OUT=
RECORD=auto MODE=run CUSTOM_FOCUS=0 CUSTOM_SKIP=0 KEEP=0 SUITE=node BUILD=
while [ $# -gt 0 ]; do
	case "$1" in
	--agent) AGENT=${2:?--agent needs a value} && shift ;;
	--focus) FOCUS=${2:?--focus needs a value} CUSTOM_FOCUS=1 && shift ;;
	--skip) SKIP=${2?--skip needs a value} CUSTOM_SKIP=1 && shift ;;
	--procs) PROCS=${2:?--procs needs a value} && shift ;;
	--nodelet-bin) NODELET_BIN=${2:?--nodelet-bin needs a value} && shift ;;
	--out) OUT=${2:?--out needs a value} && shift ;;
	--subset) MODE=subset ;;
	--suite) SUITE=${2:?--suite needs a value} && shift ;;
	--record) RECORD=1 ;;
	--no-record) RECORD=0 ;;
	--doc) MODE=doc ;;
	--stop) MODE=stop ;;
	--keep) KEEP=1 ;;
	-h | --help) usage 0 ;;
	*)
		echo "unknown argument: $1" >&2
		usage 2
		;;
	esac
	shift
done
case "$AGENT" in nodelet | kubelet) ;; *) die "--agent must be nodelet or kubelet, got '$AGENT'" ;; esac
case "$SUITE" in node | extended) ;; *) die "--suite must be node or extended, got '$SUITE'" ;; esac
if [ "$SUITE" = extended ]; then
	[ "$CUSTOM_FOCUS" = 1 ] || [ "$CUSTOM_SKIP" = 1 ] || [ "$MODE" = subset ] &&
		die "--suite extended chooses its own specs: no --focus, --skip or --subset with it"
	FOCUS=$EXTENDED_FOCUS SKIP=$EXTENDED_SKIP
fi
[[ $PROCS =~ ^[1-9][0-9]?$ ]] || die "--procs must be 1..99, got '$PROCS'"
case "$BASE" in /*/*) ;; *) die "NODELET_CONFORMANCE_BASE must be an absolute path below a top-level directory" ;; esac

RUNTIME_ENV=(NODELET_TEST_BASE="$BASE/runtime" NODELET_TEST_REGISTRY="$REG" NODELET_TEST_POD_SUBNET="$POD_SUBNET"
	NODELET_TEST_BRIDGE="$BRIDGE" NODELET_TEST_CNI_NETWORK=nodelet-conformance
	NODELET_TEST_CGROUP_PARENT="$CGROUP_PARENT")
ENVTEST_ENV=(ENVTEST_BASE="$BASE/envtest" ENVTEST_APISERVER_PORT="$API_PORT" ENVTEST_ETCD_PORT="$ETCD_PORT")
envtest_scripts() {
	local d=${NODELET_TEST_ENVTEST_SCRIPTS:-$REPO_ROOT/../shared/envtest}
	[ -x "$d/start.sh" ] || die "no envtest scripts in $d (set NODELET_TEST_ENVTEST_SCRIPTS)"
	(cd "$d" && pwd)
}

# ---------------------------------------------------------------- the document
# one section of the document: the recorded runs $1 (nodelet) and $2 (kubelet), under heading $3 (markdown, or empty
# for the default suite, whose section opens the document)
doc_section() {
	local n=$1 k=$2 heading=$3 reasons=$RESULTS/reasons.tsv
	jq -n -r --slurpfile n "$n" --slurpfile k "$k" --rawfile reasons "${reasons}" --arg heading "$heading" '
		def esc: gsub("\\|"; "\\|");
		def fmt_t: (. / 60 | floor | tostring) + " m " + (. % 60 | floor | tostring) + " s";
		def count(s; st): [s.specs[] | select(.state == st)] | length;
		def sub: if $heading == "" then "##" else "###" end;
		($reasons | split("\n") | map(select(length > 0 and (startswith("#") | not)) | split("\t"))) as $rs
		| def reason(name): ([$rs[] | select(.[0] as $re | name | test($re))] | first) // null;
		$n[0] as $N | $k[0] as $K
		| ([$N.specs[].name] + [$K.specs[].name] | unique) as $names
		| ($N.specs | map({(.name): .state}) | add // {}) as $ns
		| ($K.specs | map({(.name): .state}) | add // {}) as $ks
		| ($N.specs | map({(.name): .seconds}) | add // {}) as $nt
		| ($K.specs | map({(.name): .seconds}) | add // {}) as $kt
		| def cell(st; t; n): if st[n] == null then "not run" else "\(st[n]) (\(t[n]) s)" end;
		def machine_skip(r): if (r.machine_skip // "") == "" then "none" else "`\(r.machine_skip | esc)`" end;
		.
		| [ $names[] | select(($ks[.] // "") == "passed" and ($ns[.] // "") != "passed") ] as $gap
		| [
		(if $heading == "" then empty else ($heading, "") end),
		"| | nodelet | kubelet v1.28.7 |",
		"|---|---|---|",
		"| run started (UTC) | \($N.date) | \($K.date) |",
		"| commit of this tree | `\($N.commit)` | `\($K.commit)` (the scripts'"'"'; the kubelet is upstream'"'"'s) |",
		"| nodelet build | \($N.build // "not recorded") | (upstream release binary) |",
		"| runtime | \($N.runtime) | \($K.runtime) |",
		"| Ginkgo processes | \($N.procs) | \($K.procs) |",
		"| focus | `\($N.focus | esc)` | `\($K.focus | esc)` |",
		"| skip | `\($N.skip | esc)` | `\($K.skip | esc)` |",
		"| skipped because of this machine | \(machine_skip($N)) | \(machine_skip($K)) |",
		"| wall time of the suite | \($N.wall_seconds | fmt_t) | \($K.wall_seconds | fmt_t) |",
		"| load average (1 min) | \($N.load // "not recorded") | \($K.load // "not recorded") |",
		"| passed | \(count($N; "passed")) | \(count($K; "passed")) |",
		"| failed | \(count($N; "failed")) | \(count($K; "failed")) |",
		"| skipped (by the spec itself) | \(count($N; "skipped")) | \(count($K; "skipped")) |",
		"",
		(if ($gap | length) == 0 then
			"**nodelet passes every spec the kubelet passes here.**"
		else
			"**\($gap | length) spec(s) the kubelet passes and nodelet does not:** see the reasons below."
		end),
		"",
		"\(sub) Specs nodelet does not pass",
		"",
		"| spec | nodelet | kubelet | reason | plan |",
		"|---|---|---|---|---|",
		( $names[] | select(($ns[.] // "not run") != "passed" and ($ns[.] // "not run") != "skipped") as $s
		  | reason($s) as $r
		  | "| \($s | esc) | \($ns[$s] // "not run") | \($ks[$s] // "not run") | \(($r[1] // "**no reason recorded**") | esc) | \(($r[2] // "") | esc) |" ),
		"",
		"\(sub) Every spec run",
		"",
		"| spec | nodelet | kubelet |",
		"|---|---|---|",
		( $names[] | "| \(. | esc) | \(cell($ns; $nt; .)) | \(cell($ks; $kt; .)) |" ),
		""
		] | .[]'
}

# docs/conformance/<agent>.json and <agent>-extended.json: one recorded run each (written by the record step);
# docs/conformance/reasons.tsv: why nodelet does not pass a spec and the plan (regex on the spec name, TAB, reason,
# TAB, plan; written by hand).
write_doc() {
	local n=$RESULTS/nodelet.json k=$RESULTS/kubelet.json tmp
	[ -f "$n" ] || die "no recorded nodelet run ($n): run $0 first"
	[ -f "$k" ] || die "no recorded kubelet run ($k): run $0 --agent kubelet first"
	tmp=$(mktemp)
	{
		cat <<-'EOF'
			# Kubernetes conformance: nodelet beside the kubelet

			Written by `scripts/conformance.sh` from the recorded runs in `docs/conformance/` (`nodelet.json`, `kubelet.json`,
			`nodelet-extended.json`, `kubelet-extended.json`) and the reasons in `docs/conformance/reasons.tsv`; do not edit by
			hand. Both agents ran the upstream `e2e.test` v1.28.7 on the same machine, control plane (envtest v1.28.7),
			containerd, images and settings (see the header of `scripts/conformance.sh`).

			The default suite is every `[NodeConformance]` spec that runs in parallel: the skip leaves out `[Serial]`,
			`[Disruptive]`, `[Flaky]` and `[Slow]` (`--suite extended` runs them but `[Flaky]`), and the one spec that
			needs the internet (a pull from upstream's private registry with upstream's credentials). A spec this machine
			cannot run is detected before the run and named in the table. The wall time is the suite's, from the first
			spec to the last; a spec's seconds are its own run time in its Ginkgo process.

		EOF
		doc_section "$n" "$k" ""
		if [ -f "$RESULTS/nodelet-extended.json" ] && [ -f "$RESULTS/kubelet-extended.json" ]; then
			doc_section "$RESULTS/nodelet-extended.json" "$RESULTS/kubelet-extended.json" \
				"## Beyond [NodeConformance]: the extended suite (\`--suite extended\`)"$'\n\n'"The node-facing specs the default suite leaves out: the \`[Slow]\`, \`[Serial]\` and \`[Disruptive]\` \`[NodeConformance]\` specs, and the \`[sig-node]\` and \`[sig-storage]\` \`[Conformance]\` specs outside \`[NodeConformance]\`. The parallel ones run first, then the \`[Serial]\` and \`[Disruptive]\` ones in one process."
		fi
	} >"$tmp"
	mv "$tmp" "$DOC"
	log "wrote $DOC"
}

if [ "$MODE" = doc ]; then
	command -v jq >/dev/null || die "jq not found: run scripts/install-deps.sh first"
	write_doc
	exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root"
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# ---------------------------------------------------------------- stop
kubelet_sysctls_restore() {
	local f=$BASE/run/kubelet-sysctls
	[ -f "$f" ] || return 0
	while read -r key val; do
		sysctl -qw "$key=$val" >/dev/null 2>&1 || true
	done <"$f"
	rm -f "$f"
}
agent_stop() {
	local pid
	pid=$(cat "$BASE/run/agent.pid" 2>/dev/null || true)
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$BASE/run/agent.pid"
	kubelet_sysctls_restore
	# the kubelet leaves a bind mount of its root directory (and pods' volume mounts) behind
	local m
	for m in $(findmnt -rn -o TARGET | awk -v b="$BASE/agent" 'index($0, b) == 1' | sort -r); do
		umount -l "$m" 2>/dev/null || true
	done
	return 0
}
stop_all() {
	agent_stop
	env "${ENVTEST_ENV[@]}" "$(envtest_scripts)/stop.sh" --purge >/dev/null 2>&1 || true
	env "${RUNTIME_ENV[@]}" "$SCRIPT_DIR/runtime-down.sh" || true
	rm -rf "$BASE/agent" "$BASE/run"
}
if [ "$MODE" = stop ]; then
	stop_all
	log "stopped"
	exit 0
fi

if [ "$MODE" = subset ]; then
	[ -f "$SUBSET_FILE" ] || die "$SUBSET_FILE not found"
	FOCUS=$(grep -v '^#' "$SUBSET_FILE" | grep -v '^[[:space:]]*$' | sed 's/[][().*+?{}|^$\\]/\\&/g' | paste -sd'|')
	[ -n "$FOCUS" ] || die "$SUBSET_FILE lists no spec"
	CUSTOM_FOCUS=1
	[ "$RECORD" = 1 ] && die "--subset runs are not recorded"
fi
if [ "$RECORD" = auto ]; then
	if [ "$CUSTOM_FOCUS" = 0 ] && [ "$CUSTOM_SKIP" = 0 ]; then RECORD=1; else RECORD=0; fi
fi

# ---------------------------------------------------------------- 1. packages and programs
log "1/7 packages and programs"
"$SCRIPT_DIR/install-deps.sh"
CONF_SRC=${NODELET_CONFORMANCE_SOURCE:-$REPO_ROOT/../shared/conformance}
[ -x "$CONF_SRC/install.sh" ] || die "no $CONF_SRC/install.sh (the upstream e2e.test, ginkgo and kubelet; set NODELET_CONFORMANCE_SOURCE)"
CONFORMANCE_BIN=$("$CONF_SRC/install.sh" | tail -1)
export CONFORMANCE_BIN
ENVTEST_SCRIPTS=$(envtest_scripts)
ASSETS=${KUBEBUILDER_ASSETS:-$("$ENVTEST_SCRIPTS/install.sh" | tail -1)}
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	[ -x "$ASSETS/$b" ] || die "no $b in $ASSETS (the suite needs a controller manager, a scheduler and kubectl)"
done
KUBECTL=$ASSETS/kubectl

if [ "$AGENT" = nodelet ]; then
	if [ -z "$NODELET_BIN" ]; then
		log "building nodelet (cargo build --release)"
		(cd "$REPO_ROOT" && cargo build -q --release --bin nodelet)
		NODELET_BIN=$REPO_ROOT/target/release/nodelet
	fi
	NODELET_BIN=$(realpath "$NODELET_BIN")
	case "$NODELET_BIN" in
	*/target/release/nodelet) BUILD="release (cargo build --release)" ;;
	*/target/debug/nodelet) BUILD="debug (cargo build)" ;;
	*) BUILD="given: $NODELET_BIN" ;;
	esac
	[ -x "$NODELET_BIN" ] || die "nodelet binary $NODELET_BIN not found"
	AGENT_BIN=$NODELET_BIN
else
	AGENT_BIN=$CONFORMANCE_BIN/kubelet
fi

# ---------------------------------------------------------------- 2. runtime
log "2/7 runtime (containerd, CNI, registry $REG)"
mkdir -p "$BASE/run"
agent_stop # a run interrupted before
# the node's address lives on the pod bridge: reachable from the host, the API server and every pod
node_bridge() {
	ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
	local addrs
	addrs=$(ip -o -4 addr show dev "$BRIDGE")
	grep -qF "inet $NODE_IP/20" <<<"$addrs" || ip addr add "$NODE_IP/20" dev "$BRIDGE"
	ip link set "$BRIDGE" up
}
node_bridge
env "${RUNTIME_ENV[@]}" "$SCRIPT_DIR/runtime-up.sh" | sed 's/^/  /'
# shellcheck disable=SC1091
. "$BASE/runtime/env.sh"
SOCK=$NODELET_TEST_CONTAINERD_SOCK
ctrk() { ctr --address "$SOCK" -n k8s.io "$@"; }
left=$(ctrk containers ls -q | wc -l)
if [ "$left" -gt 0 ]; then
	log "the runtime still holds $left container(s) of an earlier run: restarting it clean"
	env "${RUNTIME_ENV[@]}" "$SCRIPT_DIR/runtime-down.sh" | sed 's/^/  /'
	node_bridge
	env "${RUNTIME_ENV[@]}" "$SCRIPT_DIR/runtime-up.sh" | sed 's/^/  /'
fi
for h in registry.k8s.io k8s.gcr.io gcr.io docker.io registry-1.docker.io quay.io mcr.microsoft.com \
	invalid.registry.k8s.io "$DEAD_REG"; do
	mkdir -p "$BASE/runtime/containerd/certs.d/$h"
	cat >"$BASE/runtime/containerd/certs.d/$h/hosts.toml" <<EOF
# scripts/conformance.sh: nothing leaves this machine; nothing listens here, so a pull fails at once
server = "http://$DEAD_REG"

[host."http://$DEAD_REG"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
EOF
done

# ---------------------------------------------------------------- 3. images
log "3/7 test images (scripts/e2e-images.sh)"
IMAGES_DIR=/var/cache/nodelet/e2e-images
"$SCRIPT_DIR/e2e-images.sh" "$IMAGES_DIR" "$REG" | sed 's/^/  /'
# an image the runtime holds from an earlier build under the same name would be used instead (IfNotPresent)
while read -r ref digest; do
	have=$(ctrk images ls "name==$ref" 2>/dev/null | awk -v r="$ref" '$1 == r {print $3}')
	if [ -n "$have" ] && [ "$have" != "$digest" ]; then
		log "  dropping the runtime's older $ref ($have)"
		ctrk images rm "$ref" >/dev/null
	fi
done <"$IMAGES_DIR/images.txt"
REPO_LIST=$BASE/run/repo-list.yaml
cat >"$REPO_LIST" <<EOF
e2eRegistry: $REG/e2e-test-images
promoterE2eRegistry: $REG/e2e-test-images
buildImageRegistry: $REG/build-image
gcEtcdRegistry: $REG
gcRegistry: $REG
sigStorageRegistry: $REG/sig-storage
gcrReleaseRegistry: $REG/gke-release
sampleRegistry: $REG/google-samples
microsoftRegistry: $REG/microsoft
dockerLibraryRegistry: $REG/library
cloudProviderGcpRegistry: $REG/cloud-provider-gcp
invalidRegistry: $DEAD_REG/invalid
privateRegistry: $DEAD_REG/k8s-authenticated-test
gcAuthenticatedRegistry: $DEAD_REG/authenticated-image-pulling
EOF
export KUBE_TEST_REPO_LIST=$REPO_LIST
PAUSE=$REG/pause:3.9

# ---------------------------------------------------------------- 4. control plane
log "4/7 control plane (fresh envtest on :$API_PORT with controller manager and scheduler)"
env "${ENVTEST_ENV[@]}" "$ENVTEST_SCRIPTS/stop.sh" --purge >/dev/null 2>&1 || true
env "${ENVTEST_ENV[@]}" ENVTEST_CONTROLLERS=1 KUBEBUILDER_ASSETS="$ASSETS" "$ENVTEST_SCRIPTS/start.sh" 2>&1 | sed 's/^/  /'
# shellcheck disable=SC1091
. "$BASE/envtest/env.sh"
k() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# ---------------------------------------------------------------- 5. the node
log "5/7 the node: $AGENT ($AGENT_BIN) as $NODE on $NODE_IP"
AGENT_DIR=$BASE/agent
rm -rf "$AGENT_DIR"
mkdir -p "$AGENT_DIR/root" "$AGENT_DIR/logs"
ENVTEST_BASE=$BASE/envtest "$ENVTEST_SCRIPTS/mint-node-kubeconfig.sh" "$NODE" "$AGENT_DIR/node.kubeconfig"
RESOLV=$NODELET_TEST_RESOLV_CONF
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-$BASE/reports/$AGENT-$STAMP}
mkdir -p "$OUT"
AGENT_LOG=$OUT/$AGENT.log
COMMON=(--kubeconfig "$AGENT_DIR/node.kubeconfig" --hostname-override "$NODE" --node-ip "$NODE_IP"
	--address "$NODE_IP" --container-runtime-endpoint "unix://$SOCK" --client-ca-file "$APISERVER_CA"
	--authentication-token-webhook --authorization-mode Webhook --resolv-conf "$RESOLV"
	--cluster-domain cluster.local --read-only-port 0 --healthz-bind-address "$NODE_IP")
if [ "$AGENT" = nodelet ]; then
	ARGS=("${COMMON[@]}" --root-dir "$AGENT_DIR/root" --pod-logs-dir "$AGENT_DIR/logs" --cgroup-root "$CGROUP_PARENT"
		--v 2)
else
	for key in vm.overcommit_memory kernel.panic kernel.panic_on_oops; do
		echo "$key $(sysctl -n "$key")"
	done >"$BASE/run/kubelet-sysctls"
	ARGS=("${COMMON[@]}" --root-dir "$AGENT_DIR/root" --cert-dir "$AGENT_DIR/root/pki"
		--pod-infra-container-image "$PAUSE" --make-iptables-util-chains=false --cgroup-driver cgroupfs
		--fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable= --v 2)
fi
printf '%q ' "$AGENT_BIN" "${ARGS[@]}" >"$OUT/$AGENT.cmdline"
setsid "$AGENT_BIN" "${ARGS[@]}" </dev/null >"$AGENT_LOG" 2>&1 &
echo $! >"$BASE/run/agent.pid"
trap 'agent_stop' EXIT
ready=0
for _ in $(seq 1 120); do
	kill -0 "$(cat "$BASE/run/agent.pid")" 2>/dev/null || { tail -n 30 "$AGENT_LOG" >&2; die "$AGENT exited (log $AGENT_LOG)"; }
	if [ "$(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
		ready=1
		break
	fi
	sleep 1
done
[ "$ready" = 1 ] || { tail -n 30 "$AGENT_LOG" >&2; die "node $NODE not Ready after 120 s (log $AGENT_LOG)"; }
log "node $NODE is Ready"
# a node under pressure is tainted NoSchedule, and the suite would wait 30 minutes for it to be schedulable:
# say so now (the usual cause on a build machine is a disk fuller than the eviction thresholds, e.g.
# imagefs.available<15%, which both agents apply)
# (an agent's eviction manager reports within seconds of its start: watch for 15 s)
pressure=
for _ in $(seq 1 15); do
	pressure=$(k get node "$NODE" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}' |
		tr ' ' '\n' | grep -E '^(DiskPressure|MemoryPressure|PIDPressure)$' | paste -sd, || true)
	[ -n "$pressure" ] && break
	sleep 1
done
if [ -n "$pressure" ]; then
	df -h / "$BASE" >&2 || true
	die "node $NODE reports $pressure: free disk (or memory) below the agent's eviction thresholds before running the suite (log $AGENT_LOG)"
fi

# ---------------------------------------------------------------- 6. the suite
COMMIT=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$REPO_ROOT" status --porcelain -- src resources drivers reconcile-engine proto 2>/dev/null)" ]; then
	COMMIT="$COMMIT+changes"
fi
# a spec this machine cannot run, detected here (the reason goes to the log and the record)
MACHINE_SKIP=
probe_ns=nlconf-probe-$$
if ip netns add "$probe_ns" 2>/dev/null; then
	if ! ip -n "$probe_ns" link add probe0 type dummy 2>/dev/null; then
		MACHINE_SKIP='PrivilegedPod \[NodeConformance\] should enable privileged commands'
		log "skipping PrivilegedPod: this kernel cannot create a dummy link, which the spec's container does (ip link add dummy1 type dummy)"
	fi
	ip netns del "$probe_ns" 2>/dev/null || true
fi
if [ -n "$MACHINE_SKIP" ]; then SKIP=${SKIP:+$SKIP|}$MACHINE_SKIP; fi

# run_ginkgo FOCUS SKIP PROCS DIR: one Ginkgo run of e2e.test, reports in DIR
run_ginkgo() {
	mkdir -p "$4"
	"$CONFORMANCE_BIN/ginkgo" --procs="$3" --timeout=120m --focus="$1" --skip="$2" --no-color \
		--output-dir="$4" --junit-report=junit.xml --json-report=report.json \
		"$CONFORMANCE_BIN/e2e.test" -- \
		--kubeconfig="$ADMIN_KUBECONFIG" --provider=skeleton --num-nodes=1 --node-os-distro=debian \
		--disable-log-dump --system-pods-startup-timeout=1m --minStartupPods=0 --kubectl-path="$KUBECTL" \
		--report-dir="$4" >"$4/e2e.log" 2>&1
}
# names_focus FILE: a focus regex matching exactly the spec names listed in FILE (one per line)
names_focus() { sed 's/[][().*+?{}|^$\\]/\\&/g' "$1" | paste -sd'|'; }

START=$(date +%s)
START_UTC=$(date -u '+%F %H:%M')
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
REPORTS=()
if [ "$SUITE" = extended ]; then
	# the specs of the focus that the default suite does not run, from a dry run of e2e.test
	"$CONFORMANCE_BIN/e2e.test" --ginkgo.dry-run --ginkgo.no-color --ginkgo.focus="$FOCUS" --ginkgo.skip="$SKIP" \
		--ginkgo.json-report="$OUT/dry-run.json" >"$OUT/dry-run.log" 2>&1 ||
		{ tail -n 20 "$OUT/dry-run.log" >&2; die "the dry run of e2e.test failed"; }
	jq -r --arg default_skip "$DEFAULT_SKIP" '.[].SpecReports[]? | select(.LeafNodeType == "It" and .State == "passed")
		| ((.ContainerHierarchyTexts // []) + [.LeafNodeText] | join(" "))
		| select((test("\\[NodeConformance\\]") and (test($default_skip) | not)) | not)' "$OUT/dry-run.json" |
		sort >"$OUT/extended-specs.txt"
	grep -E '\[Serial\]|\[Disruptive\]' "$OUT/extended-specs.txt" >"$OUT/serial-specs.txt" || true
	grep -vE '\[Serial\]|\[Disruptive\]' "$OUT/extended-specs.txt" >"$OUT/parallel-specs.txt" || true
	[ -s "$OUT/extended-specs.txt" ] || die "the dry run found no spec for the extended suite ($OUT/dry-run.json)"
	log "6/7 e2e.test, extended suite: $(wc -l <"$OUT/parallel-specs.txt") parallel specs ($PROCS processes), then $(wc -l <"$OUT/serial-specs.txt") [Serial]/[Disruptive] specs (1 process); reports in $OUT"
	set +e
	if [ -s "$OUT/parallel-specs.txt" ]; then
		run_ginkgo "$(names_focus "$OUT/parallel-specs.txt")" "$SKIP" "$PROCS" "$OUT/parallel"
		rc=$?
		log "parallel part ended (exit $rc)"
		REPORTS+=("$OUT/parallel/report.json")
	fi
	if [ -s "$OUT/serial-specs.txt" ]; then
		run_ginkgo "$(names_focus "$OUT/serial-specs.txt")" "$SKIP" 1 "$OUT/serial"
		rc=$?
		log "serial part ended (exit $rc)"
		REPORTS+=("$OUT/serial/report.json")
	fi
else
	log "6/7 e2e.test: focus '$FOCUS', skip '$SKIP', $PROCS processes; reports in $OUT"
	set +e
	run_ginkgo "$FOCUS" "$SKIP" "$PROCS" "$OUT"
	rc=$?
	REPORTS+=("$OUT/report.json")
fi
set -e
WALL=$(($(date +%s) - START))
LOAD_END=$(cut -d' ' -f1 /proc/loadavg)
log "suite ended after $((WALL / 60)) m $((WALL % 60)) s; logs: e2e.log in $OUT"
for r in "${REPORTS[@]}"; do
	[ -f "$r" ] || { tail -n 40 "$(dirname "$r")/e2e.log" >&2; die "no $r: the suite did not run"; }
done

# ---------------------------------------------------------------- 7. results
log "7/7 results"
# the specs of this run: It nodes that matched the filters (a filtered-out spec is 'skipped' without a failure
# and was never attempted)
SPECS=$OUT/specs.json
jq '[.[].SpecReports[]? | select(.LeafNodeType == "It")
	| {name: ((.ContainerHierarchyTexts // []) + [.LeafNodeText] | join(" ")),
	   state: (if .State == "skipped" and (.Failure == null) then "filtered" else .State end),
	   seconds: ((.RunTime // 0) / 1e9 | floor),
	   message: ((.Failure.Message // "") | .[0:400])}
	| select(.state != "filtered")] | sort_by(.name)' <(jq -s 'add' "${REPORTS[@]}") >"$SPECS"
if [ "$MODE" = subset ]; then
	# every listed spec must have run: a renamed or dropped spec counts as a failure, not as a smaller subset
	grep -v '^#' "$SUBSET_FILE" | grep -v '^[[:space:]]*$' | jq -R . | jq -s . >"$OUT/subset.json"
	jq --slurpfile want "$OUT/subset.json" '. as $ran | ($ran | map(.name)) as $names
		| $ran + [$want[0][] | select(. as $w | $names | index($w) | not)
			| {name: ., state: "not run", seconds: 0, message: "listed in tests/conformance-subset.txt, not run"}]' \
		"$SPECS" >"$SPECS.tmp"
	mv "$SPECS.tmp" "$SPECS"
fi
passed=$(jq '[.[] | select(.state == "passed")] | length' "$SPECS")
skipped=$(jq '[.[] | select(.state == "skipped")] | length' "$SPECS")
failed=$(jq '[.[] | select(.state != "passed" and .state != "skipped")] | length' "$SPECS")
jq -r '.[] | select(.state != "passed" and .state != "skipped") | "  \(.state): \(.name)\n      \(.message | split("\n")[0])"' "$SPECS"

# remove what the suite left, then stop the node
k delete namespaces -l e2e-framework --wait=false >/dev/null 2>&1 || true
for _ in $(seq 1 90); do
	[ "$KEEP" = 1 ] && break
	[ "$(k get pods -A --field-selector "spec.nodeName=$NODE" -o name 2>/dev/null | wc -l)" = 0 ] && break
	sleep 2
done
if [ "$KEEP" = 1 ]; then
	log "the node keeps running (--keep): . $BASE/envtest/env.sh; $KUBECTL --kubeconfig \$ADMIN_KUBECONFIG get pods -A; stop with $0 --stop"
else
	agent_stop
fi
trap - EXIT

if [ "$RECORD" = 1 ]; then
	mkdir -p "$RESULTS"
	runtime=$(containerd --version | awk '{print "containerd " $3}')
	record=$RESULTS/$AGENT.json
	[ "$SUITE" = extended ] && record=$RESULTS/$AGENT-extended.json
	jq --arg agent "$AGENT" --arg date "$START_UTC" --arg commit "$COMMIT" --arg runtime "$runtime" \
		--argjson procs "$PROCS" --arg focus "$FOCUS" --arg skip "$SKIP" --argjson wall "$WALL" \
		--arg load "$LOAD_START at the start, $LOAD_END at the end" --arg machine_skip "$MACHINE_SKIP" \
		--arg build "$BUILD" \
		'{agent: $agent, date: $date, commit: $commit, runtime: $runtime, procs: $procs, focus: $focus, skip: $skip,
		  machine_skip: $machine_skip, build: (if $agent == "nodelet" then $build else null end),
		  wall_seconds: $wall, load: $load, specs: [.[] | {name, state, seconds}]}' "$SPECS" >"$record"
	log "recorded $record"
	if [ -f "$RESULTS/nodelet.json" ] && [ -f "$RESULTS/kubelet.json" ]; then write_doc; fi
fi

if [ "$((passed + failed + skipped))" = 0 ]; then
	log "ERROR: no spec matched the focus and skip (a [Slow] spec needs --skip or --suite extended: the default skip leaves out [Slow], [Serial] and [Disruptive])"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ] && [ "$((passed + skipped))" -gt 0 ]

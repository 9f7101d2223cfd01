#!/usr/bin/env bash
# Two builds of `nodelet hollow` side by side, at the same time, against one control plane: which of them
# costs the nodes more CPU per pod. Runs of scripts/hollow-bench.sh an hour apart on a shared machine differ
# by more than two builds do (the same build's start-up wave at N=500 took 260 and 417 CPU-seconds on
# 2026-12-06), so two builds are compared here in the same minutes, each process with half the nodes.
#
# A fresh envtest control plane (controller manager and scheduler on); N node identities; process A
# ($AB_BIN_A) runs nodes 0 .. N/2-1, process B ($AB_BIN_B) N/2 .. N-1, both started at once; once all are
# Ready, one Deployment of 30 pods per node; each process's CPU (utime+stime) from its creation until every
# pod is Ready, divided by the pods the scheduler put on its nodes, then each process's CPU over one
# steady minute (30 s after), and its memory (PSS, /proc/PID/smaps_rollup) at the minute's end. Prints ms
# per pod, steady cores and MiB of PSS per node for A and B, and B/A.
#
# Environment:
#   AB_BIN_A, AB_BIN_B      the two nodelet binaries (required)
#   AB_NODES                N (default 500)
#   AB_BASE                 work directory (default /tmp/nodelet-hollow-ab; kept, with both processes' logs)
#   ENVTEST_SCRIPTS         default ../shared/envtest beside this checkout
#   ENVTEST_APISERVER_PORT, ENVTEST_ETCD_PORT   default 46443, 42379
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BIN_A="${AB_BIN_A:?AB_BIN_A: the first nodelet binary}"
BIN_B="${AB_BIN_B:?AB_BIN_B: the second nodelet binary}"
N="${AB_NODES:-500}"
HALF=$((N / 2))
PODS=$((HALF * 2 * 30))
BASE="${AB_BASE:-/tmp/nodelet-hollow-ab}"
ENVTEST_SCRIPTS="${ENVTEST_SCRIPTS:-$(cd "$ROOT/.." && pwd)/shared/envtest}"
export ENVTEST_BASE="$BASE/envtest"
export ENVTEST_APISERVER_PORT="${ENVTEST_APISERVER_PORT:-46443}" ENVTEST_ETCD_PORT="${ENVTEST_ETCD_PORT:-42379}"

log() { printf '[hollow-ab %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ -x "$BIN_A" ] || die "no binary at $BIN_A"
[ -x "$BIN_B" ] || die "no binary at $BIN_B"
[ "$HALF" -ge 1 ] || die "AB_NODES must be at least 2"
# shellcheck disable=SC1091 # cpu_ticks, steal_ticks
. "$HERE/lib/procstat.sh"

rm -rf "$BASE"; mkdir -p "$BASE/kubeconfigs"
A=""; B=""
cleanup() {
  for p in $A $B; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $A $B; do wait "$p" 2>/dev/null || true; done
  "$ENVTEST_SCRIPTS/stop.sh" --purge >/dev/null 2>&1 || true
}
trap cleanup EXIT

log "N=$N: starting the control plane"
ENVTEST_CONTROLLERS=1 ENVTEST_KCM_ARGS="--kube-api-qps=100 --kube-api-burst=200" \
  "$ENVTEST_SCRIPTS/start.sh" >"$BASE/envtest.log" 2>&1 || die "envtest start failed: $(tail -5 "$BASE/envtest.log")"
# shellcheck disable=SC1091
. "$ENVTEST_BASE/env.sh"
kubectl="$KUBEBUILDER_ASSETS/kubectl --kubeconfig $ADMIN_KUBECONFIG"
for i in $(seq 0 $((N - 1))); do
  "$ENVTEST_SCRIPTS/mint-node-kubeconfig.sh" "ab-$i" "$BASE/kubeconfigs/ab-$i.kubeconfig"
done
log "N=$N: starting A ($BIN_A) and B ($BIN_B)"
"$BIN_A" hollow --nodes "$HALF" --first-index 0 --name-prefix ab- --kubeconfig-dir "$BASE/kubeconfigs" \
  --root-dir "$BASE/nodes-a" >"$BASE/a.log" 2>&1 &
A=$!
"$BIN_B" hollow --nodes "$HALF" --first-index "$HALF" --name-prefix ab- --kubeconfig-dir "$BASE/kubeconfigs" \
  --root-dir "$BASE/nodes-b" >"$BASE/b.log" 2>&1 &
B=$!
t0=$SECONDS
until [ "$($kubectl get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)" -ge $((HALF * 2)) ]; do
  [ $((SECONDS - t0)) -lt 600 ] || die "not all nodes Ready after 600 s"
  kill -0 "$A" 2>/dev/null || die "A exited: $(tail -3 "$BASE/a.log")"
  kill -0 "$B" 2>/dev/null || die "B exited: $(tail -3 "$BASE/b.log")"
  sleep 2
done
log "N=$N: all nodes Ready; the wave of $PODS pods"
sleep 20
a1=$(cpu_ticks "$A"); b1=$(cpu_ticks "$B"); s1=$(steal_ticks); t1=$(date +%s.%N)
$kubectl create namespace bench >/dev/null
$kubectl -n bench create deployment bench --image=busybox:1.36 --replicas="$PODS" -- sleep 36000 >/dev/null
t0=$SECONDS
while true; do
  ready=$($kubectl -n bench get deployment bench -o jsonpath='{.status.readyReplicas}' 2>/dev/null || true)
  [ "${ready:-0}" -ge "$PODS" ] && break
  [ $((SECONDS - t0)) -lt 2700 ] || die "only ${ready:-0} of $PODS pods Ready after 2700 s"
  sleep 3
done
a2=$(cpu_ticks "$A"); b2=$(cpu_ticks "$B"); s2=$(steal_ticks); t2=$(date +%s.%N)
log "N=$N: all $PODS pods Ready; a steady minute"
sleep 30
a3=$(cpu_ticks "$A"); b3=$(cpu_ticks "$B"); t3=$(date +%s.%N)
sleep 60
a4=$(cpu_ticks "$A"); b4=$(cpu_ticks "$B"); t4=$(date +%s.%N)
pss_a=$(pss_kib "$A"); pss_b=$(pss_kib "$B")
$kubectl -n bench get pods -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' >"$BASE/placement.txt"
pods_a=$(awk -F- -v h="$HALF" '$2 < h' "$BASE/placement.txt" | wc -l)
pods_b=$(awk -F- -v h="$HALF" '$2 >= h' "$BASE/placement.txt" | wc -l)
python3 - "$(getconf CLK_TCK)" "$a1" "$a2" "$b1" "$b2" "$s1" "$s2" "$t1" "$t2" "$a3" "$a4" "$b3" "$b4" "$t3" "$t4" \
  "$pods_a" "$pods_b" "$pss_a" "$pss_b" "$HALF" <<'EOF' | tee "$BASE/result.txt"
import sys
hz, a1, a2, b1, b2, s1, s2, t1, t2, a3, a4, b3, b4, t3, t4, pa, pb, ma, mb, half = map(float, sys.argv[1:])
wave, steady = t2 - t1, t4 - t3
print(f"wave: {wave:.0f} s; the machine's steal time in it: {(s2 - s1) / hz / wave:.3f} cores")
for name, w1, w2, c1, c2, pods in (("A", a1, a2, a3, a4, pa), ("B", b1, b2, b3, b4, pb)):
    print(f"{name}: wave {(w2 - w1) / hz:.1f} CPU-s for {pods:.0f} pods = {(w2 - w1) / hz * 1000 / pods:.2f} ms per pod;"
          f" steady {(c2 - c1) / hz / steady:.3f} cores")
for name, kib in (("A", ma), ("B", mb)):
    print(f"{name}: memory {kib / 1024:.1f} MiB PSS, {kib / 1024 / half:.3f} MiB per node")
print(f"B/A: per pod in the wave {((b2 - b1) / pb) / ((a2 - a1) / pa):.3f}; steady {(b4 - b3) / (a4 - a3):.3f};"
      f" memory {mb / ma:.3f}")
EOF
log "N=$N: done ($BASE/result.txt)"

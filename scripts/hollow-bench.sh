#!/usr/bin/env bash
# Hollow nodes against one API server: nodelet's (`nodelet hollow`, N nodes in one process) and upstream
# kubemark's hollow kubelets (one process per node), side by side, at the same N, on a fresh envtest control
# plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) per run. See docs/scale.md.
#
# Per run: start the control plane (an audit log of every request of group system:nodes), mint N node
# identities, start the N nodes, wait until all are Ready, create a Deployment of N*PODS_PER_NODE pods and
# wait until all are Running (a watch records when each pod appears and when it is first Running), settle,
# measure one steady window, delete the Deployment and wait until every pod is gone, stop everything.
#
# What is recorded (one JSON line per run in $BASE/results.jsonl, a table at the end):
#   - requests per minute in the steady window, by verb and resource: of the nodes (the audit log, users
#     system:node:*), per node and in total; and the whole API server's (apiserver_request_total)
#   - watches held by the nodes (audit: watches opened and not closed by the end of the window), per node
#   - bytes sent by the API server in the window (apiserver_response_sizes_sum; all clients, so the
#     controllers' share is in it), per minute
#   - kube-apiserver's, etcd's and the nodes' CPU (cores, averaged over the window; nodelet: the one process,
#     kubemark: the sum of its processes) and the first two's RSS at its end (/proc)
#   - the nodes' memory per node: RSS (nodelet: the one process; kubemark: the sum of its processes, each
#     counting the binary it shares with the others) and PSS (shared pages split between their users)
#   - pod start latency p50/p99: from a watch's first sight of the pod (its creation) to its first sight
#     Running (the SLO's creation to running, as the API shows it)
#   - how long the Deployment took to be all Running, and all gone after its deletion, and the API server's
#     and the nodes' CPU over each of the two phases
#   - Lease lapses over the whole run (audit): a node's successful Lease renewals more than 40 s apart (the
#     node lifecycle controller's grace period; the node is then marked NotReady), how many nodes, the longest
#   - the latency pods (after the steady window, as sig-scalability's density test): LATENCY_PODS more pods
#     created one at a time at LATENCY_RATE per second, each measured from creation to Running as above,
#     p50/p99 (the SLO's pod start-up latency: pods created at a sustainable rate), then deleted
#   - the load average of the machine (1, 5, 15 min) at the end of the steady window
#   - the nodes' established connections to the API server at the end of the steady window, and the bytes
#     those connections received and sent over the window (the kernel's per-socket counts, read with `ss`;
#     apiserver_response_sizes counts a watch's bytes only when the watch ends)
#   - the machine's steal time (/proc/stat: CPU the hypervisor gave to others) over each phase, in cores
#
# The table is printed at the end, and $BASE/scale.svg plots the per-node figures against N. Two builds are
# compared with scripts/hollow-ab.sh (both at once), not with runs hours apart on a shared machine.
#
# Environment:
#   HOLLOW_BENCH_NODES          node counts (default "10 100")
#   HOLLOW_BENCH_KINDS          "nodelet kubemark" (default), or one of them
#   HOLLOW_BENCH_PODS_PER_NODE  default 30
#   HOLLOW_BENCH_STEADY         seconds of the steady window (default 120)
#   HOLLOW_BENCH_SETTLE         seconds between all Running and the window (default 30)
#   HOLLOW_BENCH_LATENCY_PODS   latency pods (default: 2 x N, at least 100; 0: no latency phase)
#   HOLLOW_BENCH_LATENCY_RATE   latency pods created per second (default 5)
#   HOLLOW_BENCH_KEEP           non-empty: keep each run's directory (audit log, watch records, the nodes' log)
#   HOLLOW_BENCH_WAIT           seconds to wait for all pods Running, and for all gone (default 1200)
#   HOLLOW_BENCH_MIN_FREE_MIB   kubemark: no further process starts below this MemAvailable (default 6144);
#                               the run then goes on with the nodes started and says so
#   HOLLOW_BENCH_BASE           work directory (default /tmp/nodelet-hollow-bench; removed at the end)
#   NODELET_BIN                 the nodelet binary (default target/release/nodelet, else target/debug/nodelet)
#   KUBEMARK_BIN                default: what ../shared/conformance/install.sh unpacked
#   ENVTEST_SCRIPTS             default ../shared/envtest beside this checkout
#   ENVTEST_APISERVER_PORT, ENVTEST_ETCD_PORT   default 46443, 42379
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
NODES="${HOLLOW_BENCH_NODES:-10 100}"
KINDS="${HOLLOW_BENCH_KINDS:-nodelet kubemark}"
PODS_PER_NODE="${HOLLOW_BENCH_PODS_PER_NODE:-30}"
STEADY="${HOLLOW_BENCH_STEADY:-120}"
SETTLE="${HOLLOW_BENCH_SETTLE:-30}"
MIN_FREE_MIB="${HOLLOW_BENCH_MIN_FREE_MIB:-6144}"
WAIT="${HOLLOW_BENCH_WAIT:-1200}"
LATENCY_PODS="${HOLLOW_BENCH_LATENCY_PODS:-}"
LATENCY_RATE="${HOLLOW_BENCH_LATENCY_RATE:-5}"
BASE="${HOLLOW_BENCH_BASE:-/tmp/nodelet-hollow-bench}"
ENVTEST_SCRIPTS="${ENVTEST_SCRIPTS:-$(cd "$ROOT/.." && pwd)/shared/envtest}"
API_PORT="${ENVTEST_APISERVER_PORT:-46443}"
ETCD_PORT="${ENVTEST_ETCD_PORT:-42379}"
if [ -z "${NODELET_BIN:-}" ]; then
  target="${CARGO_TARGET_DIR:-$ROOT/target}"
  NODELET_BIN="$target/release/nodelet"
  [ -x "$NODELET_BIN" ] || NODELET_BIN="$target/debug/nodelet"
fi
KUBEMARK_BIN="${KUBEMARK_BIN:-/var/cache/nodelet/conformance/v1.28.7/kubemark}"
RESULTS="$BASE/results.jsonl"

log() { printf '[hollow-bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ -x "$NODELET_BIN" ] || die "no nodelet binary at $NODELET_BIN (cargo build --release --bin nodelet)"
[ -x "$ENVTEST_SCRIPTS/start.sh" ] || die "no envtest scripts in $ENVTEST_SCRIPTS"
case " $KINDS " in *" kubemark "*) [ -x "$KUBEMARK_BIN" ] || die "no kubemark at $KUBEMARK_BIN (../shared/conformance/install.sh)";; esac
command -v python3 >/dev/null || die "python3 is needed for the arithmetic"
mkdir -p "$BASE"
: > "$RESULTS"

PIDS=()          # node processes of the current run
WATCHER=""
LATENCY_WATCHER=""
ENVTEST_BASE=""
TMP_BEFORE="$BASE/tmp-before"
kubemark_tmp() { find /tmp -maxdepth 1 \( -name 'hollow-kubelet.*' -o -name 'kubelet_remote_*.sock' \) | sort; }
cleanup_run() {
  if [ -n "$WATCHER" ]; then kill "$WATCHER" 2>/dev/null || true; fi
  if [ -n "$LATENCY_WATCHER" ]; then kill "$LATENCY_WATCHER" 2>/dev/null || true; fi
  WATCHER=""; LATENCY_WATCHER=""
  if [ "${#PIDS[@]}" -gt 0 ]; then
    kill -TERM "${PIDS[@]}" 2>/dev/null || true
    for _ in $(seq 1 60); do
      alive=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [ "$alive" = 0 ] && break; sleep 0.5
    done
    kill -KILL "${PIDS[@]}" 2>/dev/null || true
  fi
  PIDS=()
  if [ -n "$ENVTEST_BASE" ]; then
    ENVTEST_BASE="$ENVTEST_BASE" ENVTEST_APISERVER_PORT="$API_PORT" ENVTEST_ETCD_PORT="$ETCD_PORT" \
      "$ENVTEST_SCRIPTS/stop.sh" --purge >/dev/null 2>&1 || true
  fi
  ENVTEST_BASE=""
  # What kubemark's hollow kubelets leave in /tmp (their root directories and CRI sockets), of this run only.
  if [ -f "$TMP_BEFORE" ]; then
    comm -13 "$TMP_BEFORE" <(kubemark_tmp) |
      while read -r f; do rm -rf -- "$f"; done
  fi
}
trap 'cleanup_run; [ -n "${HOLLOW_BENCH_KEEP:-}" ] || rm -rf "$BASE/run"' EXIT

# /proc figures: CPU in ticks (cpu_ticks PID, steal_ticks), RSS and PSS in KiB.
# shellcheck disable=SC1091 # cpu_ticks, steal_ticks
. "$HERE/lib/procstat.sh"
sum_ticks() { local t=0; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
sum_rss() { local t=0; for p in "$@"; do t=$((t + $(rss_kib "$p"))); done; echo "$t"; }
# Proportional set size in KiB: memory shared between processes (kubemark's binary, mapped by every one of
# its processes) counted once over all of them, not once per process as RSS counts it.
sum_pss() { local t=0; for p in "$@"; do t=$((t + $(pss_kib "$p"))); done; echo "$t"; }
# How many pods namespace $1 has, from a LIST of one item (`remainingItemCount`): the wait loops poll this
# instead of listing every pod (15,000 at N=500) every few seconds, which loaded the API server they measure.
pod_count() {
  $kubectl get --raw "/api/v1/namespaces/$1/pods?limit=1" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(len(d.get("items") or []) + (d.get("metadata", {}).get("remainingItemCount") or 0))' 2>/dev/null || echo -1
}
mem_available_mib() { awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo; }

# The admin token from a file, never on a command line.
metrics() { curl -s --max-time 20 --cacert "$APISERVER_CA" -H @"$AUTH_HEADER" "$APISERVER_URL/metrics"; }

run_one() {
  local kind=$1 n=$2
  local run="$BASE/run/$kind-$n"
  rm -rf "$run"; mkdir -p "$run/kubeconfigs"
  kubemark_tmp > "$TMP_BEFORE"
  # ---- control plane, with an audit log of the nodes' requests
  cat > "$run/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:nodes"]
- level: None
EOF
  ENVTEST_BASE="$run/envtest"
  log "$kind N=$n: starting the control plane"
  ENVTEST_BASE="$ENVTEST_BASE" ENVTEST_APISERVER_PORT="$API_PORT" ENVTEST_ETCD_PORT="$ETCD_PORT" \
    ENVTEST_CONTROLLERS=1 ENVTEST_KCM_ARGS="--kube-api-qps=100 --kube-api-burst=200" \
    ENVTEST_APISERVER_ARGS="--audit-policy-file=$run/audit-policy.yaml --audit-log-path=$run/audit.log --audit-log-maxsize=1000000 --audit-log-format=json" \
    "$ENVTEST_SCRIPTS/start.sh" >"$run/envtest.log" 2>&1 || die "envtest start failed: $(tail -5 "$run/envtest.log")"
  # shellcheck disable=SC1091
  . "$ENVTEST_BASE/env.sh"
  local kubectl="$KUBEBUILDER_ASSETS/kubectl --kubeconfig $ADMIN_KUBECONFIG"
  AUTH_HEADER="$run/auth-header"
  (umask 077; printf 'Authorization: Bearer %s\n' "$ADMIN_TOKEN" > "$AUTH_HEADER")
  local api_pid etcd_pid
  api_pid=$(cat "$ENVTEST_BASE/run/kube-apiserver.pid"); etcd_pid=$(cat "$ENVTEST_BASE/run/etcd.pid")
  # ---- node identities
  local prefix="$kind-"
  for i in $(seq 0 $((n - 1))); do
    ENVTEST_BASE="$ENVTEST_BASE" "$ENVTEST_SCRIPTS/mint-node-kubeconfig.sh" "$prefix$i" "$run/kubeconfigs/$prefix$i.kubeconfig"
  done
  metrics > "$run/metrics-base.txt"
  # ---- nodes
  local started=$n note=""
  log "$kind N=$n: starting the nodes"
  if [ "$kind" = nodelet ]; then
    "$NODELET_BIN" hollow --nodes "$n" --name-prefix "$prefix" --kubeconfig-dir "$run/kubeconfigs" \
      --root-dir "$run/nodes" >"$run/nodes.log" 2>&1 &
    PIDS+=($!)
  else
    mkdir -p "$run/logs"
    for i in $(seq 0 $((n - 1))); do
      if [ "$(mem_available_mib)" -lt "$MIN_FREE_MIB" ]; then
        started=$i; note="kubemark stopped at $i processes: MemAvailable below ${MIN_FREE_MIB} MiB"
        log "$note"; break
      fi
      "$KUBEMARK_BIN" --morph=kubelet --name "$prefix$i" --kubeconfig "$run/kubeconfigs/$prefix$i.kubeconfig" \
        --kubelet-port $((31000 + i)) --kubelet-read-only-port=0 --use-host-image-service=false \
        >"$run/logs/$i.log" 2>&1 &
      PIDS+=($!)
      # kubemark's start is CPU-heavy: a few at a time
      [ $((i % 10)) = 9 ] && sleep 2
    done
  fi
  local t_nodes=$SECONDS ready=0
  while [ $((SECONDS - t_nodes)) -lt 600 ]; do
    ready=$($kubectl get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | grep -c "^$prefix" || true)
    [ "$ready" -ge "$started" ] && break
    sleep 2
  done
  [ "$ready" -ge "$started" ] || die "$kind N=$n: only $ready of $started nodes Ready after 600 s"
  local nodes_ready_s=$((SECONDS - t_nodes))
  log "$kind N=$n: $ready nodes Ready in ${nodes_ready_s}s"
  # ---- pods
  local pods=$((started * PODS_PER_NODE))
  $kubectl create namespace bench >/dev/null
  python3 "$HERE/hollow-bench.py" watch --url "$APISERVER_URL" --ca "$APISERVER_CA" \
    --namespace bench --out "$run/watch.txt" &
  WATCHER=$!
  sleep 2
  local t_create=$SECONDS cw1 ca1 cn1 cs1
  cw1=$(date +%s.%N); ca1=$(cpu_ticks "$api_pid"); cn1=$(sum_ticks "${PIDS[@]}"); cs1=$(steal_ticks)
  $kubectl -n bench create deployment bench --image=busybox:1.36 --replicas="$pods" -- sleep 36000 >/dev/null
  local running=0
  local polls=0
  while [ $((SECONDS - t_create)) -lt "$WAIT" ]; do
    # The Deployment's ready count is one small GET; the pods are listed once it says all are ready, and
    # every 30 s (a pod can be Running and not Ready: the node controller marks a lapsed node's pods so).
    ready=$($kubectl -n bench get deployment bench -o jsonpath='{.status.readyReplicas}' 2>/dev/null || true)
    polls=$((polls + 1))
    if [ "${ready:-0}" -ge "$pods" ] || [ $((polls % 10)) = 0 ]; then
      running=$($kubectl -n bench get pods --no-headers --field-selector=status.phase=Running 2>/dev/null | wc -l)
      [ "$running" -ge "$pods" ] && break
    fi
    sleep 3
  done
  [ "$running" -ge "$pods" ] || die "$kind N=$n: only $running of $pods pods Running after $WAIT s"
  local all_running_s=$((SECONDS - t_create))
  local wave_cpu; wave_cpu="$cw1 $(date +%s.%N) $ca1 $(cpu_ticks "$api_pid") $cn1 $(sum_ticks "${PIDS[@]}") $cs1 $(steal_ticks)"
  log "$kind N=$n: $pods pods Running in ${all_running_s}s; settling ${SETTLE}s"
  sleep "$SETTLE"
  # ---- steady window
  local m1="$run/metrics-1.txt" m2="$run/metrics-2.txt"
  local a1 e1 a2 e2 n1 n2 w1 w2 s1 s2 lw1="" lw2="" la1="" la2="" ln1="" ln2="" ls1="" ls2=""
  w1=$(date +%s.%N); a1=$(cpu_ticks "$api_pid"); e1=$(cpu_ticks "$etcd_pid"); n1=$(sum_ticks "${PIDS[@]}"); s1=$(steal_ticks); metrics > "$m1"
  python3 "$HERE/hollow-bench.py" socket-bytes --port "$API_PORT" "${PIDS[@]}" > "$run/sockets-1.json"
  sleep "$STEADY"
  w2=$(date +%s.%N); a2=$(cpu_ticks "$api_pid"); e2=$(cpu_ticks "$etcd_pid"); n2=$(sum_ticks "${PIDS[@]}"); s2=$(steal_ticks); metrics > "$m2"
  python3 "$HERE/hollow-bench.py" socket-bytes --port "$API_PORT" "${PIDS[@]}" > "$run/sockets-2.json"
  local api_rss etcd_rss nodes_rss nodes_pss
  api_rss=$(rss_kib "$api_pid"); etcd_rss=$(rss_kib "$etcd_pid"); nodes_rss=$(sum_rss "${PIDS[@]}")
  nodes_pss=$(sum_pss "${PIDS[@]}")
  # the nodes' established connections to the API server at the end of the steady window
  local conns; conns=$(python3 "$HERE/hollow-bench.py" connections --port "$API_PORT" "${PIDS[@]}")
  local load; load=$(cut -d' ' -f1-3 /proc/loadavg)
  # ---- latency pods: created one at a time at a fixed rate beside the saturation pods, then deleted
  local latency=${LATENCY_PODS:-$((2 * started > 100 ? 2 * started : 100))}
  if [ "$latency" -gt 0 ]; then
    log "$kind N=$n: $latency latency pods at ${LATENCY_RATE}/s"
    lw1=$(date +%s.%N); la1=$(cpu_ticks "$api_pid"); ln1=$(sum_ticks "${PIDS[@]}"); ls1=$(steal_ticks)
    $kubectl create namespace latency >/dev/null
    python3 "$HERE/hollow-bench.py" watch --url "$APISERVER_URL" --ca "$APISERVER_CA" \
      --namespace latency --out "$run/latency-watch.txt" &
    LATENCY_WATCHER=$!
    sleep 2
    python3 "$HERE/hollow-bench.py" create --url "$APISERVER_URL" --ca "$APISERVER_CA" --namespace latency \
      --count "$latency" --rate "$LATENCY_RATE" > "$run/latency-create.json"
    local t_lat=$SECONDS lrunning=0
    while [ $((SECONDS - t_lat)) -lt 600 ]; do
      lrunning=$($kubectl -n latency get pods --no-headers --field-selector=status.phase=Running 2>/dev/null | wc -l)
      [ "$lrunning" -ge "$latency" ] && break
      sleep 2
    done
    lw2=$(date +%s.%N); la2=$(cpu_ticks "$api_pid"); ln2=$(sum_ticks "${PIDS[@]}"); ls2=$(steal_ticks)
    log "$kind N=$n: $lrunning of $latency latency pods Running ($(cat "$run/latency-create.json"))"
    kill "$LATENCY_WATCHER" 2>/dev/null || true; LATENCY_WATCHER=""
    $kubectl -n latency delete pods --all --wait=false >/dev/null
    local t_ldel=$SECONDS
    while [ $((SECONDS - t_ldel)) -lt 600 ]; do
      [ "$(pod_count latency)" = 0 ] && break
      sleep 3
    done
  fi
  # ---- delete
  local t_delete=$SECONDS dw1 da1 dn1 ds1
  dw1=$(date +%s.%N); da1=$(cpu_ticks "$api_pid"); dn1=$(sum_ticks "${PIDS[@]}"); ds1=$(steal_ticks)
  $kubectl -n bench delete deployment bench --wait=false >/dev/null
  local left=$pods
  while [ $((SECONDS - t_delete)) -lt "$WAIT" ]; do
    left=$(pod_count bench)
    [ "$left" = 0 ] && break
    sleep 3
  done
  [ "$left" = 0 ] || log "$kind N=$n: $left pods still there after $WAIT s"
  local all_gone_s=$((SECONDS - t_delete))
  local delete_cpu; delete_cpu="$dw1 $(date +%s.%N) $da1 $(cpu_ticks "$api_pid") $dn1 $(sum_ticks "${PIDS[@]}") $ds1 $(steal_ticks)"
  log "$kind N=$n: pods gone in ${all_gone_s}s"
  kill "$WATCHER" 2>/dev/null || true; WATCHER=""
  # ---- arithmetic
  python3 "$HERE/hollow-bench.py" run \
    --kind "$kind" --nodes "$started" --asked "$n" --pods "$pods" --note "$note" \
    --window "$w1" "$w2" --audit "$run/audit.log" --metrics "$run/metrics-base.txt" "$m1" "$m2" \
    --watch "$run/watch.txt" --ticks "$(getconf CLK_TCK)" \
    --cpu "$a1" "$a2" "$e1" "$e2" --nodes-cpu "$n1" "$n2" --rss "$api_rss" "$etcd_rss" "$nodes_rss" --pss "$nodes_pss" \
    --connections "$conns" --steal "$s1" "$s2" --socket-bytes "$run/sockets-1.json" "$run/sockets-2.json" \
    --times "$nodes_ready_s" "$all_running_s" "$all_gone_s" --gone "$left" \
    --latency-watch "$( [ "$latency" -gt 0 ] && echo "$run/latency-watch.txt")" --latency-rate "$LATENCY_RATE" \
    ${lw1:+--latency-cpu "$lw1" "$lw2" "$la1" "$la2" "$ln1" "$ln2" "$ls1" "$ls2"} \
    --wave-cpu $wave_cpu --delete-cpu $delete_cpu \
    --load "$load" >> "$RESULTS"
  tail -1 "$RESULTS" >&2
  cleanup_run
  if [ -n "${HOLLOW_BENCH_KEEP:-}" ]; then log "kept $run (audit log, watches, the nodes' log)"; else rm -rf "$run"; fi
}

for n in $NODES; do
  for kind in $KINDS; do
    run_one "$kind" "$n"
  done
done
python3 "$HERE/hollow-bench.py" table "$RESULTS"
python3 "$HERE/hollow-bench.py" plot "$RESULTS" "$BASE/scale.svg"
log "results: $RESULTS"

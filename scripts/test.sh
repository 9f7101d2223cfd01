#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root:
#   installs what is missing (Debian packages), starts the real runtime (containerd + CNI +
#   local images + local registry, under /tmp/nodelet-test), then runs the format check, clippy,
#   the docs build, reconcile-engine's check from outside the workspace and every test, the
#   real-runtime tests included (they fail, not skip, when the runtime is missing, because
#   NODELET_REQUIRE_RUNTIME=1), and the dependency check (cargo deny: licenses, sources,
#   duplicate versions; deny.toml).
#
#   scripts/test.sh            everything
#   scripts/test.sh -E 'EXPR'  extra arguments go to cargo nextest (e.g. a filter)
#
# Two runtimes: the whole suite runs on Debian's containerd 1.6 (the first test runtime), then the
# representative subset of tests/runtime2-subset.txt on the second: the newest containerd 2.x and runc of
# ../shared/runtimes (or $NODELET_TEST_RUNTIMES_SOURCE), unpacked by its install.sh, started by
# runtime-up.sh as a second instance with settings of its own (base /tmp/nodelet-test-ctd2, registry
# 127.0.0.1:5002, bridge nlcni2, pod subnet 198.18.192.0/20, cgroup parent /nodelet-test2) next to the
# first. Without ../shared/runtimes (or with NODELET_TEST_RUNTIME2=0) the subset does not run, and the
# final notes say so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "installing missing packages"
scripts/install-deps.sh

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

# cargo-deny (licenses, sources and duplicate versions of the dependency graph, deny.toml): built from crates.io
# when this version is missing (about 4 CPU-minutes), in the background at low priority while the runtime starts
# and the tests run; its check runs after the tests.
DENY_VERSION=0.20.2
DENY_PID= DENY_LOG=
if [[ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $DENY_VERSION" ]]; then
  DENY_LOG=$(mktemp /tmp/nodelet-cargo-deny.XXXXXX.log)
  nice -n 19 cargo install --locked --quiet "cargo-deny@$DENY_VERSION" >"$DENY_LOG" 2>&1 &
  DENY_PID=$!
fi

step "starting the real runtime (containerd, CNI, images, registry)"
scripts/runtime-up.sh
# shellcheck disable=SC1091
. "${NODELET_TEST_BASE:-/tmp/nodelet-test}/env.sh"
export NODELET_REQUIRE_RUNTIME=1

# The cluster-mode tests need a real Kubernetes control plane (envtest: etcd + kube-apiserver, plus
# kube-controller-manager and kube-scheduler where present): assets from $KUBEBUILDER_ASSETS, else from
# ../shared/envtest/install.sh; the control plane itself is started with envtest's start.sh (from
# $NODELET_TEST_ENVTEST_SCRIPTS, else ../shared/envtest). One control plane serves the whole suite;
# scripts/runtime-down.sh stops it. Without assets the cluster tests cannot run: said before the tests and
# again at the very end.
step "starting the Kubernetes control plane for the cluster tests (envtest)"
NOTES=()
print_notes() {
  local n
  for n in "${NOTES[@]}"; do printf '\nNOTE: %s\n' "$n"; done
}
# What the run leaves running, so that the next run starts at once: said at the end, pass or fail.
print_kept() {
  print_notes
  printf '\nKEPT: the test runtime under %s (containerd, the registry on %s, bridge %s on %s) and the\n' \
    "${NODELET_TEST_BASE:-/tmp/nodelet-test}" "${NODELET_TEST_REGISTRY:-127.0.0.1:5000}" \
    "${NODELET_TEST_BRIDGE:-nlcni0}" "${NODELET_TEST_POD_SUBNET:-198.18.0.0/17}"
  printf 'control plane on 127.0.0.1:26443 (if it started); they leave the quick start'"'"'s network (198.18.128.0/18) free.\n'
  printf 'Stop them with scripts/runtime-down.sh (add --purge to delete %s too).\n' "${NODELET_TEST_BASE:-/tmp/nodelet-test}"
  if [[ "${RT2_UP:-0}" == 1 ]]; then
    printf '\nKEPT: the second test runtime (%s) under %s (containerd, the registry on %s, bridge %s on %s).\n' \
      "$RT2_NAME" "$RT2_BASE" "$RT2_REGISTRY" "$RT2_BRIDGE" "$RT2_SUBNET"
    printf 'Stop it with NODELET_TEST_BASE=%s scripts/runtime-down.sh.\n' "$RT2_BASE"
  fi
}
trap print_kept EXIT
ENVTEST_SCRIPTS=${NODELET_TEST_ENVTEST_SCRIPTS:-}
if [[ -z "$ENVTEST_SCRIPTS" && -d ../shared/envtest ]]; then
  ENVTEST_SCRIPTS=$(cd ../shared/envtest && pwd)
fi
ASSETS=${KUBEBUILDER_ASSETS:-}
if [[ -z "$ASSETS" && -n "$ENVTEST_SCRIPTS" && -x "$ENVTEST_SCRIPTS/install.sh" ]]; then
  ASSETS=$("$ENVTEST_SCRIPTS/install.sh" | tail -1)
fi
if [[ -z "$ASSETS" ]]; then
  NOTES+=("cluster tests did NOT run: no envtest assets (set KUBEBUILDER_ASSETS, e.g. with 'setup-envtest use 1.28 -p path', or provide ../shared/envtest)")
elif [[ -z "$ENVTEST_SCRIPTS" || ! -x "$ENVTEST_SCRIPTS/start.sh" ]]; then
  NOTES+=("cluster tests did NOT run: KUBEBUILDER_ASSETS=$ASSETS is set, but there is no envtest start.sh to start a control plane with (provide ../shared/envtest or set NODELET_TEST_ENVTEST_SCRIPTS)")
else
  ENVTEST_BASE="${NODELET_TEST_BASE:-/tmp/nodelet-test}/envtest"
  scripts/envtest-clear-stale.sh "$ENVTEST_BASE"
  # In-place pod resize (issue 17) is alpha in v1.28: the API server lets resources change only with this gate.
  ENVTEST_APISERVER_ARGS="--feature-gates=InPlacePodVerticalScaling=true ${ENVTEST_APISERVER_ARGS:-}" \
  ENVTEST_BASE=$ENVTEST_BASE ENVTEST_APISERVER_PORT=26443 ENVTEST_ETCD_PORT=22379 ENVTEST_CONTROLLERS=1 \
    KUBEBUILDER_ASSETS=$ASSETS "$ENVTEST_SCRIPTS/start.sh"
  export NODELET_TEST_ENVTEST_ENV=$ENVTEST_BASE/env.sh
  export NODELET_TEST_ENVTEST_SCRIPTS=$ENVTEST_SCRIPTS
  export NODELET_REQUIRE_CLUSTER=1
  for bin in kube-controller-manager kube-scheduler; do
    if [[ ! -x "$ASSETS/$bin" ]]; then
      NOTES+=("the Deployment cluster test did NOT run: no $bin in $ASSETS (it needs kube-controller-manager and kube-scheduler)")
      break
    fi
  done
fi

# The standard CSI driver flow (issue 16) is tested with upstream programs built from public source in
# ../shared/csi (hostpathplugin, csi-node-driver-registrar): unpacked here, or the test says it did not run.
CSI_SRC=${NODELET_TEST_CSI_SOURCE:-../shared/csi/bin}
if [[ -f "$CSI_SRC/hostpathplugin.xz" && -f "$CSI_SRC/csi-node-driver-registrar.xz" ]]; then
  CSI_BIN="${NODELET_TEST_BASE:-/tmp/nodelet-test}/csi-bin"
  mkdir -p "$CSI_BIN"
  for bin in hostpathplugin csi-node-driver-registrar csi-sanity; do
    if [[ -f "$CSI_SRC/$bin.xz" && ! -x "$CSI_BIN/$bin" ]]; then
      xz -dc "$CSI_SRC/$bin.xz" >"$CSI_BIN/$bin.tmp" && chmod 755 "$CSI_BIN/$bin.tmp" && mv "$CSI_BIN/$bin.tmp" "$CSI_BIN/$bin"
    fi
  done
  export NODELET_TEST_UPSTREAM_CSI=$CSI_BIN
  export NODELET_REQUIRE_UPSTREAM_CSI=1
else
  NOTES+=("the upstream CSI driver test did NOT run: no hostpathplugin.xz and csi-node-driver-registrar.xz in $CSI_SRC (set NODELET_TEST_CSI_SOURCE)")
fi
print_notes

# A one-off build (CI, a fresh clone) gains nothing from incremental caches, which would
# double the disk that target/ needs.
if [[ "${CI:-}" == "true" ]]; then
  export CARGO_INCREMENTAL=0
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, warnings denied)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features

# reconcile-engine from a cargo project outside the workspace (a copy of the crate, the guide's dependencies and
# complete example): a `cargo check` with a target dir kept between runs, so only what changed is checked again.
step "reconcile-engine outside the workspace (scripts/check-engine-standalone.sh)"
scripts/check-engine-standalone.sh

# The representative subset of Kubernetes' own [NodeConformance] suite (tests/conformance-subset.txt) against
# this tree's nodelet, with the upstream e2e.test of ../shared/conformance (or $NODELET_CONFORMANCE_SOURCE):
# a spec that regresses fails the run. Without the upstream programs it cannot run: said here and at the end.
CONF_SRC=${NODELET_CONFORMANCE_SOURCE:-../shared/conformance}
if [[ -x "$CONF_SRC/install.sh" ]]; then
  step "upstream conformance subset (scripts/conformance.sh --subset)"
  cargo build --workspace --all-features --bin nodelet
  # a failing spec fails the run at the end, after the other tests have run too
  if ! NODELET_CONFORMANCE_SOURCE=$CONF_SRC scripts/conformance.sh --subset --nodelet-bin target/debug/nodelet; then
    CONFORMANCE_FAILED=1
  fi
  scripts/conformance.sh --stop
else
  NOTES+=("the upstream conformance subset did NOT run: no $CONF_SRC/install.sh (set NODELET_CONFORMANCE_SOURCE)")
fi

step "tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@"
  cargo test --workspace --all-features --doc
else
  cargo test --workspace --all-features --no-fail-fast "$@"
fi

# The second runtime (see the top): the subset of tests/runtime2-subset.txt, one nextest filterset a line.
RT2_BASE=/tmp/nodelet-test-ctd2 RT2_REGISTRY=127.0.0.1:5002 RT2_BRIDGE=nlcni2 RT2_SUBNET=198.18.192.0/20
RUNTIMES_SRC=${NODELET_TEST_RUNTIMES_SOURCE:-../shared/runtimes}
newest() { (cd "$RUNTIMES_SRC" && find . -maxdepth 1 -type d -name "$1-*" -printf '%f\n' | sort -V | tail -1); }
if [[ "${NODELET_TEST_RUNTIME2:-1}" == 0 ]]; then
  NOTES+=("the second runtime's subset did NOT run: NODELET_TEST_RUNTIME2=0")
elif [[ ! -x "$RUNTIMES_SRC/install.sh" || -z "$(newest containerd)" || -z "$(newest runc)" ]]; then
  NOTES+=("the second runtime's subset (containerd 2.x, tests/runtime2-subset.txt) did NOT run: no install.sh with a containerd-* and a runc-* in $RUNTIMES_SRC (set NODELET_TEST_RUNTIMES_SOURCE)")
else
  RT2_NAME="$(newest containerd) + $(newest runc)"
  step "the subset of tests/runtime2-subset.txt on the second runtime ($RT2_NAME, under $RT2_BASE)"
  rt2_start=$(date +%s)
  RT2_CONTAINERD=$("$RUNTIMES_SRC/install.sh" "$(newest containerd)" | tail -1)
  RT2_RUNC=$("$RUNTIMES_SRC/install.sh" "$(newest runc)" | tail -1)
  if NODELET_TEST_BASE=$RT2_BASE NODELET_TEST_REGISTRY=$RT2_REGISTRY NODELET_TEST_BRIDGE=$RT2_BRIDGE \
    NODELET_TEST_CNI_NETWORK=nodelet-test2 NODELET_TEST_CGROUP_PARENT=/nodelet-test2 \
    NODELET_TEST_POD_SUBNET=$RT2_SUBNET NODELET_TEST_CONTAINERD=$RT2_CONTAINERD NODELET_TEST_RUNC=$RT2_RUNC \
    scripts/runtime-up.sh; then
    RT2_UP=1
    RT2_FILTER=$(grep -v '^[[:space:]]*#' tests/runtime2-subset.txt | grep -v '^[[:space:]]*$' |
      awk '{ printf "%s(%s)", (NR > 1 ? " | " : ""), $0 }')
    # the second runtime's env.sh replaces the first's settings in a subshell; the control plane is shared
    # shellcheck disable=SC1091
    if ! (. "$RT2_BASE/env.sh" && cargo nextest run --workspace --all-features --no-fail-fast -E "$RT2_FILTER"); then
      RUNTIME2_FAILED=1
    fi
  else
    RUNTIME2_FAILED=1
  fi
  echo "the second runtime's subset took $(($(date +%s) - rt2_start)) s"
fi

step "cargo deny check licenses bans sources (deny.toml)"
if [[ -n "$DENY_PID" ]] && ! wait "$DENY_PID"; then
  cat "$DENY_LOG" >&2
  DENY_FAILED=1
  NOTES+=("cargo-deny $DENY_VERSION could not be installed (its log is above): the dependency check did NOT run")
elif ! cargo deny --log-level warn check licenses bans sources; then
  DENY_FAILED=1
fi
if [[ -n "$DENY_LOG" ]]; then rm -f "$DENY_LOG"; fi

step "examples"
cargo run -q -p reconcile-engine --example minimal
cargo run -q -p reconcile-engine --example files

# The README's other command on the same machine, with the suite's runtime still up: scripts/quickstart.sh runs its
# own checks (nodelet healthy, the web pod answers on its hostPort through the nodelet0 bridge) and --stop removes
# its pods, containerd and bridge. The default networks are disjoint (this runtime's nlcni0 198.18.0.0/17, the quick
# start's 198.18.128.0/18, the conformance node's 198.18.224.0/20). It runs the debug binary the tests built (no
# second, release build) with its root dir and log under $NODELET_TEST_BASE/quickstart (the root dir is removed
# afterwards) and the test runtime's images. NODELET_QS_* settings in the environment (ports, network) are passed on.
QS_STATE=/run/nodelet-quickstart.state
if [[ -f "$QS_STATE" ]]; then
  NOTES+=("the quick-start check did NOT run: a quick start runs on this machine ($QS_STATE); it was left alone")
else
  step "the quick start next to the test runtime (scripts/quickstart.sh, then --stop)"
  QS_BASE="${NODELET_TEST_BASE:-/tmp/nodelet-test}/quickstart"
  QS_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/nodelet"
  cargo build --workspace --all-features --bin nodelet
  mkdir -p "$QS_BASE"
  qs_start=$(date +%s)
  # the images are the test runtime's archives (the same recipe: build-images.sh finds them up to date)
  qs_env=(NODELET_BIN="$QS_BIN" NODELET_QS_ROOT_DIR="$QS_BASE/root" NODELET_QS_LOG="$QS_BASE/nodelet.log"
    NODELET_QS_IMAGES="${NODELET_TEST_BASE:-/tmp/nodelet-test}/images")
  if ! env "${qs_env[@]}" scripts/quickstart.sh; then
    QUICKSTART_FAILED=1
  fi
  if ! env "${qs_env[@]}" scripts/quickstart.sh --stop; then
    QUICKSTART_FAILED=1
  fi
  if [[ -d "$QS_BASE/root" ]]; then
    if grep -qF " $QS_BASE/root" /proc/self/mountinfo; then
      NOTES+=("$QS_BASE/root still has mounts after quickstart.sh --stop: left in place")
      QUICKSTART_FAILED=1
    else
      rm -rf --one-file-system "$QS_BASE/root"
    fi
  fi
  echo "the quick-start check took $(($(date +%s) - qs_start)) s"
fi

# The Debian package end to end (scripts/package-test.sh): built with cargo-deb from the same debug binary (the
# fat-LTO dist build would take about 20 minutes), lintian, installed, the unit verified, nodelet started from the
# installed files against this runtime with the example pods, upgraded while they run, removed and purged.
if dpkg-query -W -f='${Status}' nodelet 2>/dev/null | grep -q installed || [[ -e /etc/nodelet || -e /etc/default/nodelet ]]; then
  NOTES+=("the package test did NOT run: nodelet is installed on this machine (/etc/nodelet); it was left alone")
else
  step "the Debian package (scripts/package-test.sh)"
  pkg_start=$(date +%s)
  cargo build --workspace --all-features --bin nodelet
  if ! scripts/package-test.sh --binary "${CARGO_TARGET_DIR:-$PWD/target}/debug/nodelet"; then
    PACKAGE_FAILED=1
  fi
  echo "the package test took $(($(date +%s) - pkg_start)) s"
fi

FAILED=()
[[ "${CONFORMANCE_FAILED:-0}" == 1 ]] && FAILED+=("the upstream conformance subset")
[[ "${RUNTIME2_FAILED:-0}" == 1 ]] && FAILED+=("the subset on the second runtime (${RT2_NAME:-})")
[[ "${QUICKSTART_FAILED:-0}" == 1 ]] && FAILED+=("the quick start next to the test runtime")
[[ "${PACKAGE_FAILED:-0}" == 1 ]] && FAILED+=("the Debian package test")
[[ "${DENY_FAILED:-0}" == 1 ]] && FAILED+=("the dependency check (cargo deny, deny.toml)")
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo
  printf 'FAILED: %s (see its output above)\n' "${FAILED[@]}" >&2
  exit 1
fi
echo
echo "all checks passed"

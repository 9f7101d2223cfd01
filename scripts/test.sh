#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root:
#   installs what is missing (Debian packages), starts the real runtime (containerd + CNI +
#   local images + local registry, under /tmp/nodelet-test), then runs the format check, clippy,
#   the docs build and every test, the real-runtime tests included (they fail, not skip, when
#   the runtime is missing, because NODELET_REQUIRE_RUNTIME=1).
#
#   scripts/test.sh            everything
#   scripts/test.sh -E 'EXPR'  extra arguments go to cargo nextest (e.g. a filter)
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

step "starting the real runtime (containerd, CNI, images, registry)"
scripts/runtime-up.sh
# shellcheck disable=SC1091
. "${NODELET_TEST_BASE:-/tmp/nodelet-test}/env.sh"
export NODELET_REQUIRE_RUNTIME=1
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

step "tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@"
  cargo test --workspace --all-features --doc
else
  cargo test --workspace --all-features --no-fail-fast "$@"
fi

step "examples"
cargo run -q -p reconcile-engine --example minimal
cargo run -q -p reconcile-engine --example files

echo
echo "all checks passed"

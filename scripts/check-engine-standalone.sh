#!/usr/bin/env bash
# reconcile-engine used as a stranger uses it: from a cargo project outside nodelet's workspace, with the
# dependencies and the complete example of its guide (reconcile-engine/docs/guide.md).
#
#   scripts/check-engine-standalone.sh          cargo check of the example (offline)
#   scripts/check-engine-standalone.sh --run    also builds and runs it
#
# It lays out, in $NODELET_ENGINE_STANDALONE_DIR (default: $TMPDIR/nodelet-engine-standalone, which must have no
# Cargo.toml in any directory above it):
#   reconcile-engine/   a copy of the crate's own files (Cargo.toml, README.md, src/, docs/). A copy, since cargo
#                       resolves `workspace = true` fields of a path dependency from the workspace above it: a
#                       crate that inherited anything from nodelet's workspace builds in the checkout but not
#                       once copied (vendored, or used from a tarball).
#   app/                Cargo.toml = a [package] header + the guide's dependency block (it depends on
#                       `../reconcile-engine` by path, as the guide says); src/main.rs = the guide's complete
#                       example; Cargo.lock = nodelet's, so that the check is offline and uses the versions the
#                       workspace tests.
# and runs `cargo check --offline` in app/ with the target dir $NODELET_ENGINE_STANDALONE_TARGET (default:
# ${CARGO_TARGET_DIR:-target}/engine-standalone), kept between runs: the first run checks the engine's
# dependencies (about 40 s of CPU), later runs only what changed. Before that it checks that the crate's own
# [lints] are the workspace's [workspace.lints].
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

RUN=0
case "${1:-}" in
  --run) RUN=1 ;;
  "") ;;
  *)
    echo "usage: $0 [--run]" >&2
    exit 2
    ;;
esac

GUIDE=reconcile-engine/docs/guide.md
DIR=${NODELET_ENGINE_STANDALONE_DIR:-${TMPDIR:-/tmp}/nodelet-engine-standalone}
TARGET=${NODELET_ENGINE_STANDALONE_TARGET:-${CARGO_TARGET_DIR:-$REPO/target}/engine-standalone}
mkdir -p "$DIR" "$TARGET"
DIR=$(cd "$DIR" && pwd -P)
TARGET=$(cd "$TARGET" && pwd -P) # cargo runs in $DIR/app: a relative target dir would move

# A Cargo.toml above the copy could lend it a workspace: the check would then prove nothing.
up=$(dirname "$DIR")
while :; do
  if [[ -f "$up/Cargo.toml" ]]; then
    echo "$DIR is below $up/Cargo.toml: set NODELET_ENGINE_STANDALONE_DIR to a directory outside any cargo project" >&2
    exit 1
  fi
  [[ "$up" == / ]] && break
  up=$(dirname "$up")
done

# The lines of TOML table [$2] in $1, up to the next table or blank line.
table() {
  awk -v header="[$2]" '
    $0 == header { inside = 1; next }
    inside && (/^\[/ || /^[[:space:]]*$/) { exit }
    inside { print }
  ' "$1"
}

# The crate keeps the workspace's lints, written out in its own Cargo.toml.
for group in rust clippy; do
  if [[ "$(table Cargo.toml "workspace.lints.$group")" != "$(table reconcile-engine/Cargo.toml "lints.$group")" ]]; then
    echo "reconcile-engine/Cargo.toml: [lints.$group] differs from [workspace.lints.$group] of Cargo.toml" >&2
    exit 1
  fi
done

# The fenced block of the given language that follows the marker line `<!-- $2 -->` in $1.
block() {
  awk -v marker="<!-- $2 -->" -v lang="$3" '
    $0 == marker { armed = 1; next }
    armed && !inside && $0 == "```" lang { inside = 1; next }
    inside && $0 == "```" { found = 1; exit }
    inside { print }
    END { if (!found) exit 1 }
  ' "$1"
}

# The crate's own files, mtimes kept so that cargo rebuilds it only when they changed.
rm -rf "$DIR/reconcile-engine.new"
mkdir -p "$DIR/reconcile-engine.new"
cp -a reconcile-engine/Cargo.toml reconcile-engine/README.md reconcile-engine/src reconcile-engine/docs \
  "$DIR/reconcile-engine.new/"
rm -rf "$DIR/reconcile-engine"
mv "$DIR/reconcile-engine.new" "$DIR/reconcile-engine"

mkdir -p "$DIR/app/src"
deps=$(block "$GUIDE" "complete example: Cargo.toml" toml) || {
  echo "$GUIDE: no toml block after <!-- complete example: Cargo.toml -->" >&2
  exit 1
}
main=$(block "$GUIDE" "complete example: main.rs" rust) || {
  echo "$GUIDE: no rust block after <!-- complete example: main.rs -->" >&2
  exit 1
}
# Written only when changed, so that an unchanged example is not checked again.
write_if_changed() {
  if [[ ! -f "$1" ]] || [[ "$(cat "$1")" != "$2" ]]; then
    printf '%s\n' "$2" >"$1"
  fi
}
write_if_changed "$DIR/app/Cargo.toml" "$(printf '[package]\nname = "engine-guide-example"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n# its own workspace, whatever lies above it\n[workspace]\n\n%s' "$deps")"
write_if_changed "$DIR/app/src/main.rs" "$main"
cp Cargo.lock "$DIR/app/Cargo.lock"

cd "$DIR/app"
echo "checking the guide's complete example in $DIR/app against a copy of reconcile-engine (target dir $TARGET)"
cargo check --offline --quiet --target-dir "$TARGET"
if [[ $RUN == 1 ]]; then
  cargo run --offline --quiet --target-dir "$TARGET"
fi
echo "reconcile-engine builds outside the workspace with the guide's dependencies and example"

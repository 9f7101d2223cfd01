#!/usr/bin/env bash
# Installs nodelet as a systemd service. See docs/operations.md.
#
# With a Debian package (--deb FILE, or without --binary the newest target/debian/nodelet_*.deb that
# scripts/package.sh built, on a machine with apt-get and the default paths): `apt-get install FILE`, which
# brings containerd, runc and the CNI plugins, installs the unit and the config as conffiles, and starts nodelet.
#
# Otherwise the files: the binary, the unit (deploy/nodelet.service, ExecStart rewritten to the binary's path),
# a config (deploy/config/kubelet-config.yaml), an environment file for extra flags
# (deploy/config/nodelet.default) and the static pod directory; then
# `systemctl daemon-reload && systemctl enable --now nodelet`.
#
#   sudo deploy/install.sh                          # the package if there is one, else target/release/nodelet
#   sudo deploy/install.sh --deb nodelet_0.1.0-1_amd64.deb
#   sudo deploy/install.sh --binary target/release/nodelet
#   deploy/install.sh --destdir /tmp/stage          # stage the files under /tmp/stage, start nothing
#
# Running it again is safe: files that did not change are left alone; a config or environment file that
# exists is never overwritten (a differing new default goes next to it as <file>.default); nodelet is
# restarted only when its binary or unit changed and it was running.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: install.sh [options]

  --deb FILE        install this Debian package with apt-get (no other option applies)
  --binary PATH     install the files with this nodelet binary (default, when there is no package to
                    install: target/release/nodelet, else target/debug/nodelet, of this repository)
  --prefix DIR      the binary goes to DIR/bin/nodelet (default: /usr/local)
  --sysconfdir DIR  the config goes to DIR/nodelet/kubelet-config.yaml, the environment file to
                    DIR/default/nodelet (default: /etc)
  --unitdir DIR     where the unit goes (default: /etc/systemd/system)
  --destdir DIR     write every file under DIR (a staging root, as DESTDIR in `make install`); the paths
                    inside the unit and the config stay the final ones. Implies --no-start.
  --no-start        install the files only: no systemctl
  -h, --help        this text

Environment: DESTDIR and PREFIX are read as --destdir and --prefix.
EOF
}

die() {
    echo "install.sh: $*" >&2
    exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

binary=""
deb=""
custom_paths=0
prefix="${PREFIX:-/usr/local}"
sysconfdir="/etc"
unitdir="/etc/systemd/system"
destdir="${DESTDIR:-}"
start=1

while [ $# -gt 0 ]; do
    case "$1" in
        --deb) deb="${2:?--deb needs a file}"; shift 2 ;;
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --prefix) prefix="${2:?--prefix needs a directory}"; custom_paths=1; shift 2 ;;
        --sysconfdir) sysconfdir="${2:?--sysconfdir needs a directory}"; custom_paths=1; shift 2 ;;
        --unitdir) unitdir="${2:?--unitdir needs a directory}"; custom_paths=1; shift 2 ;;
        --destdir) destdir="${2:?--destdir needs a directory}"; shift 2 ;;
        --no-start) start=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *)
            usage >&2
            die "unknown argument: $1"
            ;;
    esac
done

if [ -n "$destdir" ]; then
    start=0
fi

# ---- the Debian package, when there is one to install and this machine can
can_apt() {
    command -v apt-get >/dev/null && command -v dpkg >/dev/null && [ "$(id -u)" = 0 ]
}
if [ -z "$deb" ] && [ -z "$binary" ] && [ -z "$destdir" ] && [ "$custom_paths" = 0 ] && [ -z "${PREFIX:-}" ] &&
    [ "$start" = 1 ] && can_apt; then
    # the newest package scripts/package.sh built for this machine's architecture
    arch="$(dpkg --print-architecture)"
    # shellcheck disable=SC2012 # package file names have no special characters
    deb="$(ls -t "${CARGO_TARGET_DIR:-$repo/target}"/debian/nodelet_*_"$arch".deb 2>/dev/null | head -n 1 || true)"
fi
if [ -n "$deb" ]; then
    if [ -n "$binary" ] || [ -n "$destdir" ] || [ "$custom_paths" = 1 ]; then
        die "--deb installs the package's own paths: it cannot be combined with --binary, --destdir or paths"
    fi
    [ -f "$deb" ] || die "no such package: $deb"
    can_apt || die "installing $deb needs apt-get, dpkg and root; without them use --binary"
    case "$deb" in
        /*) ;;
        *) deb="$PWD/$deb" ;;
    esac
    echo "installing the package $deb (apt-get install; its dependencies come with it)"
    # --force-confold: an edited /etc/nodelet/kubelet-config.yaml or /etc/default/nodelet is kept as it is
    DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold "$deb"
    if [ -d /run/systemd/system ]; then
        systemctl --no-pager --lines=0 status nodelet || true
    else
        echo "systemd is not running on this machine: the package's files are installed, nodelet is not started"
    fi
    exit 0
fi
for dir in "$prefix" "$sysconfdir" "$unitdir"; do
    case "$dir" in
        /*) ;;
        *) die "not an absolute path: $dir" ;;
    esac
    case "$dir" in
        *[\|\&\\]*) die "a path with |, & or \\ is not supported: $dir" ;;
    esac
done
if [ -z "$binary" ]; then
    for candidate in "$repo/target/release/nodelet" "$repo/target/debug/nodelet"; do
        if [ -x "$candidate" ]; then
            binary="$candidate"
            break
        fi
    done
fi
[ -n "$binary" ] || die "no nodelet binary: build it (cargo build --release) or pass --binary PATH"
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
    die "not an executable file: $binary"
fi
for src in "$here/nodelet.service" "$here/config/kubelet-config.yaml" "$here/config/nodelet.default"; do
    [ -f "$src" ] || die "missing $src"
done
if [ "$start" = 1 ]; then
    [ -d /run/systemd/system ] || die "systemd is not running on this machine: use --no-start or --destdir"
    command -v systemctl >/dev/null || die "systemctl not found"
fi

bin_path="$prefix/bin/nodelet"
config_dir="$sysconfdir/nodelet"
config_path="$config_dir/kubelet-config.yaml"
env_path="$sysconfdir/default/nodelet"
unit_path="$unitdir/nodelet.service"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

changed=0

# put SRC DEST MODE: installs SRC as $destdir/DEST (atomically: a temporary file in the same directory,
# renamed over DEST) unless DEST already has the same content. Sets changed=1 when it wrote.
put() {
    local src="$1" dest="$destdir$2" mode="$3"
    if [ -f "$dest" ] && cmp -s "$src" "$dest"; then
        echo "unchanged: $dest"
        return 0
    fi
    mkdir -p "$(dirname "$dest")"
    local tmp
    tmp="$(mktemp "$(dirname "$dest")/.nodelet-install.XXXXXX")"
    install -m "$mode" "$src" "$tmp"
    mv -f "$tmp" "$dest"
    echo "installed: $dest"
    changed=1
}

# keep SRC DEST MODE: installs SRC as $destdir/DEST only when DEST does not exist; an existing DEST (an
# operator's file) is never touched: when it differs from SRC, SRC goes next to it as DEST.default.
keep() {
    local src="$1" dest="$destdir$2" mode="$3"
    if [ ! -e "$dest" ]; then
        mkdir -p "$(dirname "$dest")"
        install -m "$mode" "$src" "$dest"
        echo "installed: $dest"
    elif cmp -s "$src" "$dest"; then
        echo "unchanged: $dest"
    else
        install -m "$mode" "$src" "$dest.default"
        echo "kept: $dest (edited; the new default is $dest.default)"
    fi
}

# The unit and the config name the final paths.
sed -e "/^ExecStart=/s|/usr/bin/nodelet|$bin_path|" \
    -e "s|/etc/nodelet/kubelet-config.yaml|$config_path|g" \
    -e "s|/etc/default/nodelet|$env_path|g" \
    "$here/nodelet.service" >"$stage/nodelet.service"
sed -e "s|/etc/nodelet/|$config_dir/|g" "$here/config/kubelet-config.yaml" >"$stage/kubelet-config.yaml"
sed -e "s|/etc/nodelet/kubelet-config.yaml|$config_path|g" "$here/config/nodelet.default" >"$stage/nodelet.env"

put "$binary" "$bin_path" 0755
put "$stage/nodelet.service" "$unit_path" 0644
keep "$stage/kubelet-config.yaml" "$config_path" 0644
keep "$stage/nodelet.env" "$env_path" 0644
mkdir -p "$destdir$config_dir/manifests"

if [ "$start" = 0 ]; then
    echo "not started (--no-start); on the host run: systemctl daemon-reload && systemctl enable --now nodelet"
    exit 0
fi
was_active=0
if systemctl is-active --quiet nodelet; then
    was_active=1
fi
systemctl daemon-reload
systemctl enable --now nodelet
if [ "$changed" = 1 ] && [ "$was_active" = 1 ]; then
    # pods keep running across the restart (KillMode=process)
    systemctl restart nodelet
fi
systemctl --no-pager --lines=0 status nodelet || true

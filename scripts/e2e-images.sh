#!/usr/bin/env bash
# Build the container images that Kubernetes' e2e [NodeConformance] specs run, without network access to any
# image registry, deterministically (the same digests on every build from the same inputs), and push them to a
# local registry under the names the suite asks for once KUBE_TEST_REPO_LIST points its registries there.
# Run as root on Debian 12 (scripts/install-deps.sh first). Used by scripts/conformance.sh.
#
#   scripts/e2e-images.sh DIR [REGISTRY]
#     DIR        build directory (OCI layout DIR/layout, cached build of busybox, stamp; DIR/images.txt lists
#                "REF DIGEST" of what was pushed)
#     REGISTRY   loopback HOST:PORT of a plain-HTTP registry to push to (omit: build only)
#
# Inputs (nothing is downloaded but Debian's packages and the source package of busybox):
#   * busybox, built statically from the upstream source tarball (busybox_*.orig.tar.bz2) of Debian's busybox
#     source package, with upstream's defconfig: Debian's patched busybox-static drops environment variables whose
#     names are not shell identifiers (the envFrom specs use names like `data-1`); upstream's shell keeps them.
#     The source is fetched with `apt-get source --download-only` through a private APT state directory whose
#     source list is the host's own `deb` entries turned into `deb-src` (the host's APT configuration is not
#     changed).
#   * agnhost and nonewprivs: the static programs of the Kubernetes v1.28.7 tree (CONFORMANCE_BIN, default
#     the output of ../shared/conformance/install.sh).
#   * curl and OpenBSD netcat from Debian's packages (copied with the shared libraries they load), for the
#     e2e framework's network checks from agnhost pods.
#   * pause: deploy/images/pause.c, compiled statically.
#
# Images (registry path under REGISTRY; what each upstream image provides that the specs use):
#   e2e-test-images/busybox:1.29-4     busybox, one applet link per command in /bin; CMD sh
#   e2e-test-images/agnhost:2.45       ENTRYPOINT /agnhost, CMD pause; /agnhost-2 link (entrypoint tests),
#                                      /uploads, /localhost.crt and .key (deploy/images/e2e); busybox shell and
#                                      utilities, curl, nc (OpenBSD; busybox's nc applet left out so it cannot
#                                      shadow it)
#   e2e-test-images/nginx:1.14-4, :1.15-4        CMD nginx -g 'daemon off;': a web server on port 80 (here
#                                      busybox httpd serving /usr/share/nginx/html), one marker file per tag
#   e2e-test-images/httpd:2.4.38-4, :2.4.39-4    CMD httpd-foreground: the same, serving /usr/local/apache2/htdocs
#   e2e-test-images/nonewprivs:1.3     /usr/local/bin/nnp (and the name nonewprivs) setuid root; CMD nnp
#   e2e-test-images/nonroot:1.4        busybox with USER 1234
#   pause:3.9                          the sandbox image (USER 65535)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091 # scripts/lib/oci.sh
. "$SCRIPT_DIR/lib/oci.sh"
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
EPOCH=2024-01-01T00:00:00Z
log() { printf '[e2e-images %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() {
	printf '[e2e-images %(%H:%M:%S)T] ERROR: %s\n' -1 "$*" >&2
	exit 1
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then die "usage: $0 DIR [REGISTRY]"; fi
DIR=$(realpath -m -- "$1")
REG=${2:-}
case "$DIR" in *[!A-Za-z0-9/._-]*) die "DIR may only contain [A-Za-z0-9/._-]: '$DIR'" ;; esac
if [ -n "$REG" ] && [[ ! $REG =~ ^(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|localhost):[0-9]{1,5}$ ]]; then
	die "REGISTRY must be a loopback HOST:PORT, got '$REG'"
fi
[ "$(id -u)" = 0 ] || die "must run as root"
for b in umoci skopeo gcc make bzip2 jq sha256sum curl flock; do
	command -v "$b" >/dev/null || die "$b not found: run scripts/install-deps.sh first"
done
[ -x /usr/bin/nc.openbsd ] || die "/usr/bin/nc.openbsd not found (package netcat-openbsd): run scripts/install-deps.sh"
CONFORMANCE_BIN=${CONFORMANCE_BIN:-}
if [ -z "$CONFORMANCE_BIN" ]; then
	[ -x "$REPO_ROOT/../shared/conformance/install.sh" ] ||
		die "set CONFORMANCE_BIN to a directory with agnhost and nonewprivs (or provide ../shared/conformance)"
	CONFORMANCE_BIN=$("$REPO_ROOT/../shared/conformance/install.sh" | tail -1)
fi
for b in agnhost nonewprivs; do
	[ -x "$CONFORMANCE_BIN/$b" ] || die "$CONFORMANCE_BIN/$b not found"
done

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock -w 600 9 || die "timed out waiting for $DIR/.lock"

# ---------------------------------------------------------------- busybox from upstream source
BB_DIR=$DIR/busybox-src
fetch_busybox_source() {
	local apt=$BB_DIR/apt f
	rm -rf "$apt"
	mkdir -p "$apt/lists/partial" "$apt/sources.list.d" "$apt/archives/partial"
	: >"$apt/sources.list"
	# the host's binary sources, as source entries (deb822 and one-line formats)
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		sed -E 's/^Types:.*\bdeb\b.*$/Types: deb-src/' "$f" >"$apt/sources.list.d/$(basename "$f")"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		sed -nE 's/^deb[[:space:]]/deb-src /p' "$f" >>"$apt/sources.list"
	done
	local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/sources.list.d"
		-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives" -o "APT::Sandbox::User=root")
	apt-get "${opts[@]}" update -q >"$apt/update.log" 2>&1 || {
		tail -n 20 "$apt/update.log" >&2
		die "apt-get update of the source lists failed (log $apt/update.log)"
	}
	(cd "$BB_DIR" && apt-get "${opts[@]}" source --download-only busybox >"$apt/source.log" 2>&1) || {
		tail -n 20 "$apt/source.log" >&2
		die "apt-get source busybox failed (log $apt/source.log)"
	}
	rm -rf "$apt"
}
mkdir -p "$BB_DIR"
BB_TAR=$(find "$BB_DIR" -maxdepth 1 -name 'busybox_*.orig.tar.bz2' | sort | tail -n 1)
if [ -z "$BB_TAR" ]; then
	log "fetching busybox's source package"
	fetch_busybox_source
	BB_TAR=$(find "$BB_DIR" -maxdepth 1 -name 'busybox_*.orig.tar.bz2' | sort | tail -n 1)
	[ -n "$BB_TAR" ] || die "no busybox_*.orig.tar.bz2 after apt-get source"
fi
BB_SUM=$(sha256sum "$BB_TAR" | cut -d' ' -f1)
BB_BIN=$BB_DIR/busybox-$BB_SUM
if [ ! -x "$BB_BIN" ]; then
	log "building busybox statically from $(basename "$BB_TAR") (upstream defconfig; a few minutes)"
	rm -rf "$BB_DIR/build"
	mkdir -p "$BB_DIR/build"
	tar -xjf "$BB_TAR" -C "$BB_DIR/build" --strip-components=1
	(
		cd "$BB_DIR/build"
		make -s defconfig >/dev/null
		sed -i 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/' .config
		grep -qx 'CONFIG_STATIC=y' .config
		make -s -j"$(nproc)" KCONFIG_NOTIMESTAMP=1 SOURCE_DATE_EPOCH=1704067200 >build.log 2>&1 ||
			{ tail -n 30 build.log >&2; exit 1; }
	) || die "busybox build failed (tree $BB_DIR/build)"
	install -m 0755 "$BB_DIR/build/busybox" "$BB_BIN.tmp"
	mv "$BB_BIN.tmp" "$BB_BIN"
	rm -rf "$BB_DIR/build"
fi
"$BB_BIN" sh -c 'true' || die "the busybox build does not run"

# ---------------------------------------------------------------- the recipe
HIST=(--history.created "$EPOCH" --history.created_by "nodelet scripts/e2e-images.sh")
LAYOUT=$DIR/layout
PAUSE_SRC=$REPO_ROOT/deploy/images/pause.c
ENV_PATH=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Image table: LAYOUT_TAG|REGISTRY_PATH
IMAGES=(
	"busybox|e2e-test-images/busybox:1.29-4"
	"agnhost|e2e-test-images/agnhost:2.45"
	"nginx-1.14|e2e-test-images/nginx:1.14-4"
	"nginx-1.15|e2e-test-images/nginx:1.15-4"
	"httpd-2.4.38|e2e-test-images/httpd:2.4.38-4"
	"httpd-2.4.39|e2e-test-images/httpd:2.4.39-4"
	"nonewprivs|e2e-test-images/nonewprivs:1.3"
	"nonroot|e2e-test-images/nonroot:1.4"
	"pause|pause:3.9"
)

# copy_with_libs ROOT BINARY...: each binary at its own path under ROOT, with every shared library ldd names
copy_with_libs() {
	local root=$1 b l
	shift
	for b in "$@"; do
		install -D -m 0755 "$b" "$root$b"
		for l in $(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
			[ -e "$root$l" ] || install -D -m 0755 "$(realpath "$l")" "$root$l"
		done
	done
}

busybox_root() { # DIR [APPLET-TO-LEAVE-OUT...]
	local r=$1 a skip
	shift
	mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/root" "$r/home" "$r/var/www" "$r/usr/local/bin"
	chmod 1777 "$r/tmp"
	chmod 0700 "$r/root"
	install -m 0755 "$BB_BIN" "$r/bin/busybox"
	for a in $("$BB_BIN" --list); do
		[ "$a" = busybox ] && continue
		for skip in "$@"; do [ "$a" = "$skip" ] && continue 2; done
		ln -s busybox "$r/bin/$a"
	done
	printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'daemon:x:1:1:daemon:/usr/sbin:/bin/false' \
		'bin:x:2:2:bin:/bin:/bin/false' 'sys:x:3:3:sys:/dev:/bin/false' 'sync:x:4:100:sync:/bin:/bin/sync' \
		'mail:x:8:8:mail:/var/spool/mail:/bin/false' 'www-data:x:33:33:www-data:/var/www:/bin/false' \
		'operator:x:37:37:Operator:/var:/bin/false' 'nobody:x:65534:65534:nobody:/home:/bin/false' >"$r/etc/passwd"
	printf '%s\n' 'root:x:0:' 'daemon:x:1:' 'bin:x:2:' 'sys:x:3:' 'adm:x:4:' 'tty:x:5:' 'disk:x:6:' 'wheel:x:10:root' \
		'mail:x:8:' 'www-data:x:33:' 'operator:x:37:' 'users:x:100:' 'nogroup:x:65534:' >"$r/etc/group"
}

images_stamp() {
	{
		echo "$EPOCH ${HIST[*]} ${IMAGES[*]}"
		declare -f build_images busybox_root copy_with_libs web_root
		sha256sum "$PAUSE_SRC" "$BB_BIN" "$CONFORMANCE_BIN/agnhost" "$CONFORMANCE_BIN/nonewprivs" \
			"$REPO_ROOT"/deploy/images/e2e/localhost.* \
			/usr/bin/curl /usr/bin/nc.openbsd | cut -d' ' -f1
		dpkg-query -W -f='${Package} ${Version}\n' curl libcurl4 netcat-openbsd 2>/dev/null
		gcc --version | head -n1
		umoci --version
	} | sha256sum | cut -d' ' -f1
}

web_root() { # DIR DOCROOT NAME:TAG COMMAND: COMMAND (a path) runs busybox httpd on port 80 serving DOCROOT
	mkdir -p "$1$2" "$1/etc" "$1$(dirname "$4")"
	printf '<html><body><h1>It works!</h1><p>%s (nodelet e2e image)</p></body></html>\n' "$3" >"$1$2/index.html"
	echo "$3" >"$1/etc/e2e-image-version"
	printf '#!/bin/sh\nexec httpd -f -p 80 -h %s\n' "$2" >"$1$4"
	chmod 0755 "$1$4"
}

build_images() {
	local work=$DIR/work new=$LAYOUT.new t
	rm -rf "$work" "$new"
	mkdir -p "$work"

	busybox_root "$work/busybox"

	# agnhost: busybox without its nc applet (the framework's checks need OpenBSD nc), curl, nc, agnhost
	busybox_root "$work/agnhost" nc
	copy_with_libs "$work/agnhost" /usr/bin/curl /usr/bin/nc.openbsd
	ln -s nc.openbsd "$work/agnhost/usr/bin/nc"
	install -m 0755 "$CONFORMANCE_BIN/agnhost" "$work/agnhost/agnhost"
	ln -s agnhost "$work/agnhost/agnhost-2"
	mkdir -p "$work/agnhost/uploads"
	# porter's and netexec's HTTPS files, at the paths the upstream image has them (a fixed test certificate)
	install -m 0644 "$REPO_ROOT/deploy/images/e2e/localhost.crt" "$work/agnhost/localhost.crt"
	install -m 0644 "$REPO_ROOT/deploy/images/e2e/localhost.key" "$work/agnhost/localhost.key"

	# upstream's commands (`nginx -g 'daemon off;'`, `httpd-foreground`) serve the same page here
	for t in 1.14 1.15; do web_root "$work/nginx-$t" /usr/share/nginx/html "nginx:$t-4" /usr/sbin/nginx; done
	for t in 2.4.38 2.4.39; do
		web_root "$work/httpd-$t" /usr/local/apache2/htdocs "httpd:$t-4" /usr/local/bin/httpd-foreground
	done

	mkdir -p "$work/nonewprivs/usr/local/bin"
	install -m 4755 "$CONFORMANCE_BIN/nonewprivs" "$work/nonewprivs/usr/local/bin/nnp"
	ln -s nnp "$work/nonewprivs/usr/local/bin/nonewprivs"

	gcc -static -Os -s -o "$work/pause.bin" "$PAUSE_SRC"
	mkdir -p "$work/pause"
	install -m 0755 "$work/pause.bin" "$work/pause/pause"
	rm -f "$work/pause.bin"

	find "$work" -exec touch -h -d "$EPOCH" {} +

	cfg() { # tag, umoci config args...
		local tag=$1
		shift
		umoci config --no-history --image "$new:$tag" --created "$EPOCH" --os linux --architecture amd64 "$@"
	}
	on_busybox() { # tag layer-dir: busybox + one layer
		umoci tag --image "$new:busybox" "$1"
		umoci insert "${HIST[@]}" --image "$new:$1" "$2" /
	}
	umoci init --layout "$new"
	umoci new --image "$new:busybox"
	umoci insert "${HIST[@]}" --image "$new:busybox" "$work/busybox" /
	cfg busybox --config.cmd sh --config.env "$ENV_PATH" --config.workingdir / --config.label image_version=1.29

	umoci new --image "$new:agnhost"
	umoci insert "${HIST[@]}" --image "$new:agnhost" "$work/agnhost" /
	cfg agnhost --config.entrypoint /agnhost --config.cmd pause --config.env "$ENV_PATH" --config.workingdir / \
		--config.exposedports 80/tcp --config.exposedports 8080/tcp --config.exposedports 8081/tcp \
		--config.exposedports 9376/tcp

	for t in 1.14 1.15; do
		on_busybox "nginx-$t" "$work/nginx-$t"
		cfg "nginx-$t" --config.cmd nginx --config.cmd=-g --config.cmd 'daemon off;' --config.exposedports 80/tcp \
			--config.stopsignal SIGQUIT
	done
	for t in 2.4.38 2.4.39; do
		on_busybox "httpd-$t" "$work/httpd-$t"
		cfg "httpd-$t" --config.cmd httpd-foreground --config.exposedports 80/tcp --config.stopsignal SIGWINCH \
			--config.workingdir /usr/local/apache2
	done
	on_busybox nonewprivs "$work/nonewprivs"
	cfg nonewprivs --config.cmd nnp
	umoci tag --image "$new:busybox" nonroot
	cfg nonroot --config.user 1234

	umoci new --image "$new:pause"
	umoci insert "${HIST[@]}" --image "$new:pause" "$work/pause" /
	cfg pause --config.entrypoint /pause --config.user 65535:65535 --config.workingdir /

	umoci gc --layout "$new"
	rm -rf "$LAYOUT" "$work"
	mv "$new" "$LAYOUT"
}

layout_digest() { oci_layout_digest "$LAYOUT" "$1"; }

STAMP=$(images_stamp)
if [ "$(cat "$DIR/.stamp" 2>/dev/null)" != "$STAMP" ] || [ ! -f "$LAYOUT/index.json" ]; then
	log "building the e2e images in $LAYOUT"
	rm -f "$DIR/.stamp"
	build_images
	echo "$STAMP" >"$DIR/.stamp"
else
	log "e2e images up to date ($LAYOUT)"
fi

# what is in the registry now, one "REF DIGEST" line each (a runtime that cached an older build under the same
# name compares against this)
: >"$DIR/images.txt.new"
for i in "${IMAGES[@]}"; do
	IFS='|' read -r ltag rpath <<<"$i"
	want=$(layout_digest "$ltag")
	[ -n "$want" ] || die "image $ltag missing from $LAYOUT"
	[ -z "$REG" ] || echo "$REG/$rpath $want" >>"$DIR/images.txt.new"
	if [ -z "$REG" ]; then
		log "  $rpath $want"
		continue
	fi
	have=$(oci_registry_digest "$REG" "$rpath")
	if [ "$have" = "$want" ]; then
		log "  $REG/$rpath $want (present)"
		continue
	fi
	skopeo copy -q --dest-tls-verify=false "oci:$LAYOUT:$ltag" "docker://$REG/$rpath"
	log "  $REG/$rpath $want (pushed)"
done
mv "$DIR/images.txt.new" "$DIR/images.txt"

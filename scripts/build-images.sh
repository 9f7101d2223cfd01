#!/usr/bin/env bash
# Build nodelet's local OCI images as image archives, with no registry and no network (deterministic:
# the same digests on every build). Run as root on Debian 12 after scripts/install-deps.sh.
#
#   scripts/build-images.sh [DIR]      default DIR: /var/cache/nodelet/images
#
# Produces (plus DIR/layout, the OCI layout they come from):
#   DIR/pause.tar        localhost/nodelet/pause:3.9        static C pause (deploy/images/pause.c), the sandbox image
#   DIR/busybox.tar      localhost/nodelet/busybox:latest   busybox-static with one symlink per applet
#   DIR/busybox-v2.tar   localhost/nodelet/busybox:v2       the same plus /etc/nodelet-image-version
#
# Load them into nodelet's embedded containerd at start with `nodelet --preload-images DIR`, or into any
# containerd with `ctr --address SOCKET -n k8s.io images import DIR/busybox.tar`.
# This is `scripts/runtime-up.sh --images-only DIR`: the same recipe the test runtime uses.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/runtime-up.sh" --images-only "${1:-/var/cache/nodelet/images}"

#!/usr/bin/env bash
# Usage: scripts/envtest-clear-stale.sh ENVTEST_BASE
#
# Removes the pid files of envtest's start.sh (ENVTEST_BASE/run/<program>.pid) whose process is gone or
# runs another program. After a reboot or a restored machine the files outlive their processes and the
# numbers get reused: start.sh would take such a process for an unhealthy etcd and refuse to start, and
# stop.sh would kill it. Processes are never touched here; a file is removed only when its process does not
# run the program it names.
set -euo pipefail
base=${1:?usage: envtest-clear-stale.sh ENVTEST_BASE}
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
	f=$base/run/$name.pid
	[ -f "$f" ] || continue
	pid=$(cat "$f" 2>/dev/null || true)
	exe=
	if [[ "$pid" =~ ^[0-9]+$ ]]; then
		exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
	fi
	exe=${exe% (deleted)}
	if [ "$(basename "${exe:-/}")" != "$name" ]; then
		echo "[envtest-clear-stale] $f: pid ${pid:-?} does not run $name (${exe:-no such process}): removing the stale file" >&2
		rm -f "$f"
	fi
done

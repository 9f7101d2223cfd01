# shellcheck shell=bash
# CPU and memory figures from /proc for the benchmark scripts (scripts/hollow-bench.sh, scripts/hollow-ab.sh). Source it;
# defines functions only. The CPU figures are in ticks (getconf CLK_TCK per second).

# cpu_ticks PID: the process's CPU time (utime + stime), 0 if it is gone.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# steal_ticks: the machine's steal time (CPU the hypervisor gave to other tenants), summed over its CPUs.
steal_ticks() { awk '/^cpu / {print $9}' /proc/stat; }
# The proportional set size (KiB) of process $1 (0 when it is gone).
pss_kib() { awk '/^Pss:/ {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }

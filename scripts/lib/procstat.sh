# shellcheck shell=bash
# CPU figures from /proc for the benchmark scripts (scripts/hollow-bench.sh, scripts/hollow-ab.sh). Source it;
# defines functions only. Both are in ticks (getconf CLK_TCK per second).

# cpu_ticks PID: the process's CPU time (utime + stime), 0 if it is gone.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# steal_ticks: the machine's steal time (CPU the hypervisor gave to other tenants), summed over its CPUs.
steal_ticks() { awk '/^cpu / {print $9}' /proc/stat; }

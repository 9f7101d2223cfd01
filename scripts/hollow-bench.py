#!/usr/bin/env python3
"""The arithmetic of scripts/hollow-bench.sh.

`run ...`: one run's figures from the audit log, the API server's /metrics snapshots, the pod watches
(the saturation phase's Deployment, the latency pods) and the /proc samples, as one JSON line. `watch ...`:
a namespace's pod events with their times. `create ...`: the latency pods, one at a time at a fixed rate.
`table FILE`: the runs of FILE as a table, with nodelet/kubemark ratios at each N.
"""
import argparse
import collections
import datetime
import glob
import json
import os
import re
import subprocess
import sys

LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_metrics(path):
    """{(name, frozenset(labels)): value} of a Prometheus text page."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line or line[0] == "#":
                continue
            head, _, value = line.rstrip("\n").rpartition(" ")
            if "{" in head:
                name, _, labels = head.partition("{")
                labels = tuple(sorted(LABEL.findall(labels)))
            else:
                name, labels = head, ()
            try:
                out[(name, labels)] = float(value)
            except ValueError:
                pass
    return out


def metric_sum(m, name, **match):
    total = 0.0
    for (n, labels), v in m.items():
        if n != name:
            continue
        d = dict(labels)
        if all(d.get(k) == val for k, val in match.items()):
            total += v
    return total


def by_labels(m, name, keys):
    out = collections.Counter()
    for (n, labels), v in m.items():
        if n == name:
            d = dict(labels)
            out[tuple(d.get(k, "") for k in keys)] += v
    return out


def ts(s):
    # RFC 3339 with microseconds, "Z"
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def lines(paths):
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            yield from f


# The node lifecycle controller's --node-monitor-grace-period (default 40 s): a node whose Lease is not
# renewed for longer is marked NotReady (Unknown) and its pods not Ready.
NODE_MONITOR_GRACE_S = 40.0


def audit(path, w1, w2):
    """The nodes' requests received in [w1, w2) by (verb, resource[/subresource]), the watches they opened
    in it, the watches open at w2, and over the whole run the gaps between a node's successful Lease
    renewals longer than NODE_MONITOR_GRACE_S (count, longest, the nodes that had one)."""
    requests = collections.Counter()
    opened = {}
    closed = set()
    users = set()
    renewed = {}
    lapses = {"count": 0, "longest_s": 0.0, "nodes": set()}
    # The API server's audit log rotates at --audit-log-maxsize MB (0 is lumberjack's default, 100 MB: an
    # N=500 run's log was cut there and its window's events went to a backup), keeping the backups
    # beside it as audit-<time>.log: read them all.
    base, ext = os.path.splitext(path)
    paths = sorted(glob.glob(f"{glob.escape(base)}-*{ext}")) + [path]
    for line in lines(paths):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        user = e.get("user", {}).get("username", "")
        if not user.startswith("system:node:"):
            continue
        users.add(user)
        verb = e.get("verb", "")
        ref = e.get("objectRef") or {}
        resource = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        received = ts(e["requestReceivedTimestamp"])
        stage = e.get("stage")
        if verb == "watch":
            if stage == "ResponseStarted":
                opened[e["auditID"]] = (received, resource)
            elif stage == "ResponseComplete" and ts(e["stageTimestamp"]) <= w2:
                closed.add(e["auditID"])
            if stage == "ResponseStarted" and w1 <= received < w2:
                requests[(verb, resource)] += 1
        elif stage == "ResponseComplete" and w1 <= received < w2:
            requests[(verb, resource)] += 1
        # A renewal: nodelet patches its Lease, the kubelet updates it (both 200 when renewed).
        if verb in ("update", "patch") and (resource, stage) == ("leases", "ResponseComplete") and (
            e.get("responseStatus") or {}
        ).get("code") == 200:
            done = ts(e["stageTimestamp"])
            gap = done - renewed.get(user, done)
            if gap > NODE_MONITOR_GRACE_S:
                lapses["count"] += 1
                lapses["nodes"].add(user)
                lapses["longest_s"] = max(lapses["longest_s"], gap)
            renewed[user] = max(done, renewed.get(user, done))
    held = collections.Counter(r for a, (t, r) in opened.items() if t <= w2 and a not in closed)
    return requests, held, len(users), lapses


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    k = max(0, min(len(values) - 1, int(round(p / 100.0 * len(values) + 0.5)) - 1))
    return values[k]


def watch_latency(path):
    first, running = {}, {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            t, _type, name = float(parts[0]), parts[1], parts[2]
            phase = parts[3] if len(parts) > 3 else ""
            first.setdefault(name, t)
            if phase == "Running":
                running.setdefault(name, t)
    lat = [running[n] - first[n] for n in running if n in first]
    return lat, len(first)


def run(a):
    w1, w2 = float(a.window[0]), float(a.window[1])
    minutes = (w2 - w1) / 60.0
    base, m1, m2 = (parse_metrics(p) for p in a.metrics)
    requests, held, users, lapses = audit(a.audit, w1, w2)
    node_rpm = {f"{v} {r}": round(c / minutes, 2) for (v, r), c in sorted(requests.items())}
    node_total = sum(c for (v, _), c in requests.items() if v != "watch") / minutes
    server = by_labels(m2, "apiserver_request_total", ("verb", "resource", "subresource"))
    server1 = by_labels(m1, "apiserver_request_total", ("verb", "resource", "subresource"))
    server_rpm = {}
    for k, v in server.items():
        d = v - server1.get(k, 0.0)
        if d > 0:
            server_rpm[" ".join(x for x in k if x)] = round(d / minutes, 2)
    server_total = sum(v for k, v in server_rpm.items() if not k.startswith("WATCH"))
    bytes_min = (metric_sum(m2, "apiserver_response_sizes_sum") - metric_sum(m1, "apiserver_response_sizes_sum")) / minutes
    watches_server = metric_sum(m2, "apiserver_longrunning_requests", verb="WATCH") - metric_sum(
        base, "apiserver_longrunning_requests", verb="WATCH")
    lat, seen = watch_latency(a.watch)
    if a.latency_watch:
        llat, lseen = watch_latency(a.latency_watch)
    else:
        llat, lseen = [], 0
    ticks = float(a.ticks)
    secs = w2 - w1
    n = max(a.nodes, 1)
    out = {
        "kind": a.kind,
        "nodes": a.nodes,
        "asked": a.asked,
        "note": a.note,
        "pods": a.pods,
        "window_s": round(secs, 1),
        "node_requests_per_min": round(node_total, 2),
        "node_requests_per_min_per_node": round(node_total / n, 3),
        "node_requests_by_verb_resource_per_min": node_rpm,
        "audit_node_users": users,
        "lease_lapses": lapses["count"],
        "lease_lapsed_nodes": len(lapses["nodes"]),
        "lease_longest_gap_s": round(lapses["longest_s"], 1),
        "node_watches": sum(held.values()),
        "node_watches_per_node": round(sum(held.values()) / n, 2),
        "node_watches_by_resource": dict(sorted(held.items())),
        "server_requests_per_min": round(server_total, 2),
        "server_requests_by_verb_resource_per_min": dict(sorted(server_rpm.items())),
        "server_watches_added": round(watches_server, 1),
        "server_bytes_per_min": round(bytes_min),
        "server_bytes_per_min_per_node": round(bytes_min / n),
        "apiserver_cpu_cores": round((float(a.cpu[1]) - float(a.cpu[0])) / ticks / secs, 3),
        "etcd_cpu_cores": round((float(a.cpu[3]) - float(a.cpu[2])) / ticks / secs, 3),
        "steal_cores": (
            round((float(a.steal[1]) - float(a.steal[0])) / ticks / secs, 3) if a.steal else None
        ),
        "nodes_cpu_cores": (
            round((float(a.nodes_cpu[1]) - float(a.nodes_cpu[0])) / ticks / secs, 3) if a.nodes_cpu else None
        ),
        "apiserver_rss_mib": round(int(a.rss[0]) / 1024.0, 1),
        "etcd_rss_mib": round(int(a.rss[1]) / 1024.0, 1),
        "nodes_rss_mib": round(int(a.rss[2]) / 1024.0, 1),
        "rss_per_node_mib": round(int(a.rss[2]) / 1024.0 / n, 2),
        "pss_per_node_mib": round(int(a.pss) / 1024.0 / n, 2) if a.pss else None,
        **node_socket_bytes(a.socket_bytes, minutes, n),
        "api_connections": a.connections,
        "api_connections_per_node": round(a.connections / n, 2) if a.connections is not None else None,
        "pods_seen": seen,
        "pods_running_seen": len(lat),
        "start_latency_p50_s": round(percentile(lat, 50), 3) if lat else None,
        "start_latency_p99_s": round(percentile(lat, 99), 3) if lat else None,
        "latency_pods": lseen,
        "latency_pods_running": len(llat),
        "latency_pods_rate_per_s": a.latency_rate,
        "latency_start_p50_s": round(percentile(llat, 50), 3) if llat else None,
        "latency_start_p99_s": round(percentile(llat, 99), 3) if llat else None,
        **latency_cpu(a, ticks),
        **phase_cpu("wave", a.wave_cpu, ticks),
        **phase_cpu("delete", a.delete_cpu, ticks),
        "load_average": a.load,
        "nodes_ready_s": int(a.times[0]),
        "all_running_s": int(a.times[1]),
        "all_gone_s": int(a.times[2]),
        "pods_left_after_delete": int(a.gone),
    }
    print(json.dumps(out, sort_keys=True))


def held_sockets(pids):
    """The inodes of the sockets the processes `pids` hold open."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def socket_bytes(port, pids):
    """The bytes each established TCP connection of the processes `pids` to `port` (the API server's) has
    received and sent (acknowledged by the peer) since it opened, by socket inode: the kernel's
    `tcpi_bytes_received` and `tcpi_bytes_acked`, read with `ss -tie`. These are the bytes on the wire (TLS
    included) between the nodes and the API server, whichever request or watch carried them, counted when
    they pass and not when a watch ends as `apiserver_response_sizes` counts them."""
    inodes = held_sockets(pids)
    out = subprocess.run(["ss", "-tinHe", "state", "established"], capture_output=True, text=True, check=True).stdout
    counts = {}
    ino = None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            # Recv-Q Send-Q local peer ... ino:N ...
            fields = line.split()
            peer = fields[3] if len(fields) > 3 else ""
            inode = next((f[4:] for f in fields if f.startswith("ino:")), None)
            ino = inode if peer.rsplit(":", 1)[-1] == str(port) and inode in inodes else None
        elif ino is not None:
            info = dict(f.split(":", 1) for f in line.split() if f.startswith(("bytes_received:", "bytes_acked:")))
            counts[ino] = [int(info.get("bytes_received", 0)), int(info.get("bytes_acked", 0))]
            ino = None
    return counts


def window_bytes(before, after):
    """The bytes received and sent over the window between two `socket_bytes` snapshots (a connection opened
    in the window counts whole), and how many connections of the first snapshot closed in it (their bytes
    since the first snapshot are not counted)."""
    received = sent = 0
    for ino, (r, s) in after.items():
        r0, s0 = before.get(ino, (0, 0))
        received += r - r0
        sent += s - s0
    return received, sent, sum(1 for ino in before if ino not in after)


def connections(port, pids):
    """The established TCP connections the processes `pids` hold to `port` (the API server's), each socket
    counted once (processes may share one)."""
    inodes = held_sockets(pids)
    count = 0
    seen = set()
    for pid in pids[:1]:  # one network namespace: every process sees the same table
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows = f.readlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                # remote address "HEX:PORT", state 01 = ESTABLISHED, inode in column 10
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port == port and fields[9] in inodes and fields[9] not in seen:
                    seen.add(fields[9])
                    count += 1
    return count


def node_socket_bytes(paths, minutes, n):
    """The bytes the nodes received from and sent to the API server in the window (`--socket-bytes` FILE1
    FILE2, written by the `socket-bytes` command at its start and end), per minute and per node and minute."""
    if not paths:
        return {}
    snapshots = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            snapshots.append(json.load(f))
    before, after = snapshots
    received, sent, closed = window_bytes(before, after)
    return {
        "node_bytes_received_per_min_per_node": round(received / minutes / n),
        "node_bytes_sent_per_min_per_node": round(sent / minutes / n),
        "node_connections_closed_in_window": closed,
    }


def latency_cpu(a, ticks):
    """The API server's and the nodes' CPU (cores) from the first latency pod's creation to the last one seen
    Running (`--latency-cpu` wall1 wall2 api1 api2 nodes1 nodes2), if the run had a latency phase."""
    if not a.latency_cpu:
        return {}
    w1, w2, a1, a2, n1, n2 = (float(x) for x in a.latency_cpu[:6])
    secs = max(w2 - w1, 1e-9)
    return {
        "latency_window_s": round(secs, 1),
        "latency_apiserver_cpu_cores": round((a2 - a1) / ticks / secs, 3),
        "latency_nodes_cpu_cores": round((n2 - n1) / ticks / secs, 3),
        **steal("latency_", a.latency_cpu, secs, ticks),
    }


def steal(prefix, figures, secs, ticks):
    """The CPU the hypervisor took from this machine over a phase (cores), from /proc/stat's steal ticks at
    its start and end (the last two of `figures`, when there are 8): the same work takes longer when this is
    high, so figures of runs hours apart are compared with it."""
    if len(figures) < 8:
        return {}
    return {f"{prefix}steal_cores": round((float(figures[7]) - float(figures[6])) / ticks / secs, 3)}


def phase_cpu(name, figures, ticks):
    """The API server's and the nodes' CPU (cores) over a phase (wall1 wall2 api1 api2 nodes1 nodes2): the
    saturation wave (the Deployment created to all pods Running) or the deletion (deleted to all gone)."""
    if not figures:
        return {}
    w1, w2, a1, a2, n1, n2 = (float(x) for x in figures[:6])
    secs = max(w2 - w1, 1e-9)
    return {
        f"{name}_apiserver_cpu_cores": round((a2 - a1) / ticks / secs, 3),
        f"{name}_nodes_cpu_cores": round((n2 - n1) / ticks / secs, 3),
        **steal(f"{name}_", figures, secs, ticks),
    }


FIGURES = [
    ("node requests/min per node", "node_requests_per_min_per_node"),
    ("node watches per node", "node_watches_per_node"),
    ("API bytes/min per node (all clients)", "server_bytes_per_min_per_node"),
    ("bytes/min per node received from the API server (its connections)", "node_bytes_received_per_min_per_node"),
    ("bytes/min per node sent to the API server (its connections)", "node_bytes_sent_per_min_per_node"),
    ("API server requests/min (all)", "server_requests_per_min"),
    ("kube-apiserver CPU (cores)", "apiserver_cpu_cores"),
    ("the nodes' CPU (cores)", "nodes_cpu_cores"),
    ("CPU the hypervisor took (steal, cores)", "steal_cores"),
    ("kube-apiserver RSS (MiB)", "apiserver_rss_mib"),
    ("etcd CPU (cores)", "etcd_cpu_cores"),
    ("etcd RSS (MiB)", "etcd_rss_mib"),
    ("RSS per hollow node (MiB)", "rss_per_node_mib"),
    ("PSS per hollow node (MiB)", "pss_per_node_mib"),
    ("the nodes' connections to the API server per node", "api_connections_per_node"),
    ("pod start p50 (s)", "start_latency_p50_s"),
    ("pod start p99 (s)", "start_latency_p99_s"),
    ("latency pods' start p50 (s)", "latency_start_p50_s"),
    ("latency pods' start p99 (s)", "latency_start_p99_s"),
    ("all pods Running (s)", "all_running_s"),
    ("all pods gone (s)", "all_gone_s"),
    ("the nodes' CPU in the wave (cores)", "wave_nodes_cpu_cores"),
    ("the nodes' CPU while deleting (cores)", "delete_nodes_cpu_cores"),
    ("Lease renewals > 40 s apart", "lease_lapses"),
]


def table(path):
    runs = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    by = {(r["kind"], r["asked"]): r for r in runs}
    for n in sorted({r["asked"] for r in runs}):
        nl, km = by.get(("nodelet", n)), by.get(("kubemark", n))
        print(f"\n## N = {n}" + (f" (kubemark: {km['nodes']} nodes; {km['note']})" if km and km["note"] else ""))
        print("| figure | nodelet | kubemark | nodelet/kubemark |")
        print("|---|---:|---:|---:|")
        for label, key in FIGURES:
            a = nl.get(key) if nl else None
            b = km.get(key) if km else None
            ratio = f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "–"
            print(f"| {label} | {a if a is not None else '–'} | {b if b is not None else '–'} | {ratio} |")
        for r in (nl, km):
            if r:
                print(f"\n{r['kind']} N={r['nodes']}: the nodes' requests per minute in steady state, by verb and resource:")
                for k, v in r["node_requests_by_verb_resource_per_min"].items():
                    print(f"  {k}: {v} ({v / max(r['nodes'], 1):.3f} per node)")
                print(f"  watches held: {r['node_watches_by_resource']}")


PLOTS = [
    ("node requests per node and minute (steady)", "node_requests_per_min_per_node", None),
    ("watches held per node", "node_watches_per_node", None),
    ("API bytes per node and minute (all clients)", "server_bytes_per_min_per_node", None),
    ("bytes per node and minute from the API server", "node_bytes_received_per_min_per_node", None),
    ("kube-apiserver CPU, steady (cores)", "apiserver_cpu_cores", None),
    ("etcd CPU, steady (cores)", "etcd_cpu_cores", None),
    ("kube-apiserver RSS (MiB)", "apiserver_rss_mib", None),
    ("memory per hollow node (PSS, MiB)", "pss_per_node_mib", None),
    ("latency pods' start p99 (s; SLO 5 s)", "latency_start_p99_s", 5.0),
]
COLOURS = {"nodelet": "#1f77b4", "kubemark": "#d62728"}


def short(v):
    """A tick label of at most about 5 characters: 0.123, 12.3, 1.2k, 3.4M."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def plot(path, out):
    """Writes an SVG with one panel per figure of PLOTS against N (log scale), a line per kind, from the last
    run of each kind and N in `path` (the table's choice). A run without the figure leaves its point out."""
    import html
    import math
    runs = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    by = {(r["kind"], r["asked"]): r for r in runs}
    ns = sorted({n for _, n in by})
    if not ns:
        raise SystemExit("no runs to plot")
    cols, pw, ph, m = 4, 300, 220, 45
    rows = (len(PLOTS) + cols - 1) // cols
    width, height = cols * pw, rows * ph + 30
    lo, hi = math.log10(min(ns)), math.log10(max(ns))
    span = hi - lo or 1.0
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="#fff"/>']
    x_legend = 10
    for kind, colour in COLOURS.items():
        svg.append(f'<rect x="{x_legend}" y="10" width="14" height="4" fill="{colour}"/>'
                   f'<text x="{x_legend + 18}" y="16">{kind}</text>')
        x_legend += 90
    svg.append(f'<text x="{x_legend}" y="16" fill="#555">x: N hollow nodes (log scale); the last run of each kind '
               f'and N in {html.escape(os.path.basename(path))}</text>')
    for i, (title, key, limit) in enumerate(PLOTS):
        ox, oy = (i % cols) * pw, 30 + (i // cols) * ph
        left, right, top, bottom = ox + m, ox + pw - 15, oy + 25, oy + ph - 30
        values = [r[key] for r in by.values() if isinstance(r.get(key), (int, float))]
        if limit is not None:
            values.append(limit)
        vmax = max(values) if values else 1.0
        vmax = vmax * 1.1 if vmax > 0 else 1.0
        def sx(n):
            return left + (math.log10(n) - lo) / span * (right - left)
        def sy(v):
            return bottom - v / vmax * (bottom - top)
        svg.append(f'<text x="{ox + pw / 2}" y="{oy + 14}" text-anchor="middle" font-weight="bold">'
                   f'{html.escape(title)}</text>')
        svg.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#000"/>'
                   f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#000"/>')
        for frac in (0, 0.5, 1):
            v = vmax / 1.1 * frac
            svg.append(f'<text x="{left - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{short(v)}</text>'
                       f'<line x1="{left}" y1="{sy(v):.1f}" x2="{right}" y2="{sy(v):.1f}" stroke="#000" '
                       f'stroke-opacity="0.1"/>')
        for n in ns:
            svg.append(f'<text x="{sx(n):.1f}" y="{bottom + 14}" text-anchor="middle">{n}</text>')
        if limit is not None:
            svg.append(f'<line x1="{left}" y1="{sy(limit):.1f}" x2="{right}" y2="{sy(limit):.1f}" '
                       f'stroke="#2ca02c" stroke-dasharray="4 3"/>')
        for kind, colour in COLOURS.items():
            points = [(n, by[(kind, n)][key]) for n in ns
                      if (kind, n) in by and isinstance(by[(kind, n)].get(key), (int, float))]
            if len(points) > 1:
                d = " ".join(f"{sx(n):.1f},{sy(v):.1f}" for n, v in points)
                svg.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"/>')
            for n, v in points:
                svg.append(f'<circle cx="{sx(n):.1f}" cy="{sy(v):.1f}" r="3" fill="{colour}">'
                           f'<title>{kind} N={n}: {v}</title></circle>')
    svg.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")


def watch(a):
    """Writes "time type name phase" for every event of the pods of namespace a.namespace until killed
    (with the bearer token of $ADMIN_TOKEN)."""
    import ssl
    import time
    import urllib.request
    ctx = ssl.create_default_context(cafile=a.ca)
    rv = ""
    with open(a.out, "a", encoding="utf-8") as out:
        while True:
            url = f"{a.url}/api/v1/namespaces/{a.namespace}/pods?watch=1&timeoutSeconds=1800"
            if rv:
                url += f"&resourceVersion={rv}"
            req = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ["ADMIN_TOKEN"]})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=1900) as r:
                    for line in r:
                        t = time.time()
                        e = json.loads(line)
                        if e.get("type") == "ERROR":
                            rv = ""
                            break
                        o = e["object"]
                        rv = o["metadata"].get("resourceVersion", rv)
                        phase = (o.get("status") or {}).get("phase", "")
                        out.write("%.3f %s %s %s\n" % (t, e["type"], o["metadata"]["name"], phase))
                        out.flush()
            except Exception:  # a broken watch is opened again from where it was
                time.sleep(0.5)


def create(a):
    """Creates a.count pods latency-0 ... in namespace a.namespace, one at a time at a.rate per second (the
    density test's "latency pods", created at a sustainable rate after the saturation phase), with the
    bearer token of $ADMIN_TOKEN. Prints how many were created and how late the last one was."""
    import ssl
    import time
    import urllib.request
    ctx = ssl.create_default_context(cafile=a.ca)
    url = f"{a.url}/api/v1/namespaces/{a.namespace}/pods"
    headers = {"Authorization": "Bearer " + os.environ["ADMIN_TOKEN"], "Content-Type": "application/json"}
    start = time.monotonic()
    created, late = 0, 0.0
    for i in range(a.count):
        due = start + i / a.rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"latency-{i}", "labels": {"app": "latency"}},
            "spec": {"containers": [{"name": "busybox", "image": "busybox:1.36", "command": ["sleep", "36000"]}]},
        }
        req = urllib.request.Request(url, data=json.dumps(pod).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                r.read()
            created += 1
        except Exception as e:  # counted: the figures say how many of the asked pods there were
            print(f"latency-{i}: {e}", file=sys.stderr)
    print(json.dumps({"created": created, "max_late_s": round(late, 3)}))


WRITES = ("create", "update", "patch", "delete", "deletecollection")


def extrapolate(path, nodes=5000):
    """The steady-state figures of the largest N of each kind, scaled to `nodes` nodes."""
    runs = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    print(f"\n## Scaled to {nodes} nodes (steady state, from the largest N of each kind)")
    print("| figure | nodelet | kubemark |")
    print("|---|---:|---:|")
    rows = collections.OrderedDict()
    for kind in ("nodelet", "kubemark"):
        mine = [r for r in runs if r["kind"] == kind]
        if not mine:
            continue
        r = max(mine, key=lambda r: r["nodes"])
        n = max(r["nodes"], 1)
        per_node = r["node_requests_by_verb_resource_per_min"]
        writes = sum(v for k, v in per_node.items() if k.split()[0] in WRITES) / n
        reads = sum(v for k, v in per_node.items() if k.split()[0] in ("get", "list")) / n
        rows.setdefault("from N", {})[kind] = r["nodes"]
        rows.setdefault("node requests/s at the API server", {})[kind] = round(r["node_requests_per_min_per_node"] * nodes / 60, 1)
        rows.setdefault("  of which writes (etcd writes/s)", {})[kind] = round(writes * nodes / 60, 1)
        rows.setdefault("  of which reads (get, list)/s", {})[kind] = round(reads * nodes / 60, 1)
        rows.setdefault("watches held by nodes", {})[kind] = round(r["node_watches_per_node"] * nodes)
        rows.setdefault("API bytes/s (all clients, per node x N)", {})[kind] = round(r["server_bytes_per_min_per_node"] * nodes / 60)
        rows.setdefault("kube-apiserver CPU cores (linear)", {})[kind] = round(r["apiserver_cpu_cores"] / n * nodes, 2)
        rows.setdefault("etcd CPU cores (linear)", {})[kind] = round(r["etcd_cpu_cores"] / n * nodes, 2)
        mem = r.get("pss_per_node_mib") or r["rss_per_node_mib"]
        rows.setdefault("hollow node memory (GiB, PSS)", {})[kind] = round(mem * nodes / 1024, 1)
    for label, v in rows.items():
        print(f"| {label} | {v.get('nodelet', '–')} | {v.get('kubemark', '–')} |")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--kind", required=True)
    r.add_argument("--nodes", type=int, required=True)
    r.add_argument("--asked", type=int, required=True)
    r.add_argument("--pods", type=int, required=True)
    r.add_argument("--note", default="")
    r.add_argument("--window", nargs=2, required=True)
    r.add_argument("--audit", required=True)
    r.add_argument("--metrics", nargs=3, required=True)
    r.add_argument("--watch", required=True)
    r.add_argument("--ticks", required=True)
    r.add_argument("--cpu", nargs=4, required=True)
    r.add_argument("--nodes-cpu", nargs=2, default=None)
    r.add_argument("--rss", nargs=3, required=True)
    r.add_argument("--pss", type=int, default=0)
    r.add_argument("--times", nargs=3, required=True)
    r.add_argument("--gone", required=True)
    r.add_argument("--latency-watch", default="")
    r.add_argument("--latency-rate", type=float, default=None)
    r.add_argument("--load", default="")
    r.add_argument("--latency-cpu", nargs="+", default=None)
    r.add_argument("--wave-cpu", nargs="+", default=None)
    r.add_argument("--delete-cpu", nargs="+", default=None)
    r.add_argument("--connections", type=int, default=None)
    r.add_argument("--steal", nargs=2, default=None)
    r.add_argument("--socket-bytes", nargs=2, default=None)
    k = sub.add_parser("connections")
    k.add_argument("--port", type=int, required=True)
    k.add_argument("pids", nargs="*", type=int)
    b = sub.add_parser("socket-bytes")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("pids", nargs="*", type=int)
    c = sub.add_parser("create")
    for flag in ("--url", "--ca", "--namespace"):
        c.add_argument(flag, required=True)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--rate", type=float, required=True)
    w = sub.add_parser("watch")
    for flag in ("--url", "--ca", "--namespace", "--out"):
        w.add_argument(flag, required=True)
    t = sub.add_parser("table")
    t.add_argument("file")
    g = sub.add_parser("plot")
    g.add_argument("file")
    g.add_argument("out")
    a = p.parse_args()
    if a.cmd == "run":
        run(a)
    elif a.cmd == "watch":
        watch(a)
    elif a.cmd == "create":
        create(a)
    elif a.cmd == "connections":
        print(connections(a.port, a.pids))
    elif a.cmd == "socket-bytes":
        print(json.dumps(socket_bytes(a.port, a.pids), sort_keys=True))
    elif a.cmd == "plot":
        plot(a.file, a.out)
    else:
        table(a.file)
        extrapolate(a.file)


if __name__ == "__main__":
    sys.exit(main())

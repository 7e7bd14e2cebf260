#!/usr/bin/env python3
"""Helper of perf/shard-scaling.sh: owner-steering names, the per-placement client, the table.

Subcommands:
  auth FILE            writes an auth config with eight keys, sk-hivenet-shard-0 .. -7, whose
                       owners' tenant ids are 0 .. 7 modulo 8 (so key i's tenant is owned by
                       shard i with 1, 2, 4 or 8 shards when i < shards), each with
                       perf/auth-bench.yaml's limits
  owners               prints the owner names, tenant ids and owner shards (the scan)
  run ...              against a running router: finds the connection's front shard, then for
                       each placement warms up and counts (callgrind or native), appending one JSON
                       object per placement to --out
  table FILE...        the markdown table of the JSON lines

The owners of a request (src/router/shard/owner/mod.rs, `Visit::owner`):
  - the tenant's quota holder: `TenantId(id).owner(n) = id % n`, where the id is the first
    non-zero 32-bit big-endian window of SHA-256("hivenet-router/tenant-id/v1\\0" || owner)
    (src/logic/auth/keys.rs `tenant_digest`, keys/assign.rs `assign_ids`);
  - the model's routing and occupancy state: `ModelId::owner(n) = name_id % n`, the name id
    being dense in the order the control core first saw the name (control/registry.rs
    `model_id`). The sim serves model-0 .. model-7, registered in that order, so model-i is
    owned by shard i % n. The native run checks both from which shard threads did work.
"""
import argparse
import glob
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

TENANT_DOMAIN = b"hivenet-router/tenant-id/v1\0"
KEYS = 8
MODELS = [f"model-{i}" for i in range(KEYS)]

# name, key owner offset, model owner offset from the front shard, fewest shards it needs
PLACEMENTS = [
    ("all-local", 0, 0, 1),
    ("key-remote", 1, 0, 2),
    ("model-remote", 0, 1, 2),
    ("both-remote-same", 1, 1, 2),
    ("both-remote-different", 1, 2, 3),
]


def tenant_id(owner):
    digest = hashlib.sha256(TENANT_DOMAIN + owner.encode()).digest()
    for w in range(8):
        value = int.from_bytes(digest[4 * w : 4 * w + 4], "big")
        if value:
            return value
    raise ValueError("all windows zero")


def owners():
    """Owner name whose tenant id is i modulo 8, for i in 0..7 (first found scanning n)."""
    found = {}
    n = 0
    while len(found) < KEYS:
        name = f"shard-owner-{n}"
        found.setdefault(tenant_id(name) % KEYS, name)
        n += 1
    ids = [tenant_id(found[i]) for i in range(KEYS)]
    assert len(set(ids)) == KEYS, "tenant ids collide: assign_ids would move one"
    return [found[i] for i in range(KEYS)]


def raw_key(i):
    return f"sk-hivenet-shard-{i}"


def cmd_auth(args):
    lines = [
        "# Written by perf/shard_scaling.py: key sk-hivenet-shard-i belongs to an owner whose tenant",
        "# is owned by shard i modulo the shard count (1, 2, 4, 8); limits of perf/auth-bench.yaml.",
        "api:",
        "  mode: api-key",
        "  keys:",
    ]
    for i, owner in enumerate(owners()):
        digest = hashlib.sha256(raw_key(i).encode()).hexdigest()
        lines += [
            f'    - key_hash: "{digest}"',
            f'      key_preview: "sk-...rd-{i}"',
            "      metadata:",
            f'        name: "shard-{i}"',
            f'        owner: "{owner}"',
            "      quota:",
            "        requests_per_minute: 100000000",
            "        tokens_per_day: 1000000000000",
        ]
    with open(args.file, "w") as out:
        out.write("\n".join(lines) + "\n")


def cmd_owners(_args):
    print("key                 owner            tenant id   owner shard with 1 2 4 8 shards")
    for i, owner in enumerate(owners()):
        t = tenant_id(owner)
        print(f"{raw_key(i):<19} {owner:<16} {t:>10}   {[t % n for n in (1, 2, 4, 8)]}")


# ---------------------------------------------------------------- run


def metric_by_shard(port, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = {}
    for match in re.finditer(r'^%s\{shard="(\d+)"\} (\S+)$' % re.escape(name), text, re.M):
        values[int(match.group(1))] = float(match.group(2))
    return values


class Client:
    def __init__(self, port, kind):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.kind = kind

    def send(self, key, model, count):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if self.kind == "stream":
            body["stream"] = True
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        for _ in range(count):
            self.conn.request("POST", "/v1/chat/completions", payload, headers)
            response = self.conn.getresponse()
            data = response.read()
            if response.status != 200:
                sys.exit(f"status {response.status}: {data[:300]!r}")


def threads(pid):
    """tid -> (name, voluntary, nonvoluntary) for every thread of pid."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            vol = invol = 0
            with open(f"{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol = int(line.split()[1])
        except OSError:
            continue
        out[int(os.path.basename(task))] = (name, vol, invol)
    return out


def switches(before, after):
    """name -> (voluntary, involuntary) over the threads alive at both ends."""
    by_name = {}
    for tid, (name, vol, invol) in after.items():
        if tid not in before:
            continue
        v = vol - before[tid][1]
        i = invol - before[tid][2]
        pv, pi = by_name.get(name, (0, 0))
        by_name[name] = (pv + v, pi + i)
    return by_name


SYSCALL_KINDS = ["read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg",
                 "epoll_wait", "epoll_pwait", "epoll_ctl", "futex", "io_uring_enter",
                 "clock_gettime", "accept4", "sched_yield"]


def perf_start(pid, path):
    events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{k}" for k in SYSCALL_KINDS]
    proc = subprocess.Popen(
        ["perf", "stat", "--per-thread", "-x", ",", "-e", ",".join(events),
         "-p", str(pid), "-o", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf attaches to every thread
    return proc


def perf_stop(proc, path):
    """(thread name -> all system calls, syscall kind -> count over the threads)."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    by_name, by_kind = {}, {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 4 or "sys_enter" not in parts[3]:
                continue
            # "<comm>-<tid>,<count>,,<event>,..."
            name = parts[0].rsplit("-", 1)[0]
            try:
                count = int(parts[1])
            except ValueError:
                continue  # "<not counted>": the thread never ran
            if parts[3] == "raw_syscalls:sys_enter":
                by_name[name] = by_name.get(name, 0) + count
            else:
                kind = parts[3].removeprefix("syscalls:sys_enter_")
                by_kind[kind] = by_kind.get(kind, 0) + count
    return by_name, by_kind


def native_window(args, client, key, model, scratch):
    """Syscalls and context switches of the router over `requests` requests, minus idle."""
    before = threads(args.pid)
    proc = perf_start(args.pid, scratch)
    started = time.monotonic()
    client.send(key, model, args.requests)
    elapsed = time.monotonic() - started
    syscalls, kinds = perf_stop(proc, scratch)
    window = time.monotonic() - started + 0.5
    after = threads(args.pid)
    return syscalls, kinds, switches(before, after), elapsed, window


def connect_landing_on(args, target, key, model):
    """A fresh keep-alive connection that the kernel gave to shard `target`, its first request
    (with `key` and `model`) answered: fresh connections come from new source ports, so the
    SO_REUSEPORT hash puts each on any shard; those that land elsewhere are closed. Returns the
    client, whether the connection moved to its key's owner (hivenet_shard_connections_handed_off_total,
    src/router/shard/handoff.rs), and how many connections it took."""
    for attempt in range(1, 201):
        client = Client(args.port, args.kind)
        accepted0 = metric_by_shard(args.metrics_port, "hivenet_shard_connections_accepted_total")
        handed0 = metric_by_shard(args.metrics_port, "hivenet_shard_connections_handed_off_total")
        client.send(key, model, 1)
        accepted1 = metric_by_shard(args.metrics_port, "hivenet_shard_connections_accepted_total")
        handed1 = metric_by_shard(args.metrics_port, "hivenet_shard_connections_handed_off_total")
        landed = [s for s in accepted1 if accepted1[s] - accepted0.get(s, 0) >= 1]
        if len(landed) != 1:
            sys.exit(f"cannot tell the front shard: accepted before {accepted0} after {accepted1}")
        if landed[0] == target:
            moved = sum(handed1.values()) - sum(handed0.values()) >= 1
            return client, moved, attempt
        client.conn.close()
    sys.exit(f"no connection landed on shard {target} in 200 tries")


def cmd_run(args):
    n = args.shards
    # Every placement is measured on a connection of its own whose first request carries the
    # placement's key, as an SDK client's would, accepted by shard 0 (the "front"): the key's and
    # the model's owners are placed relative to it. With connection handoff on (the router's default) a
    # connection accepted away from its key's owner moves there after that first request, so
    # the requests counted run on the key's owner; the row says so ("moved").
    front = 0
    print(f"[shard-scaling] {args.mode} shards={n} kind={args.kind}: connections accepted by shard {front}",
          file=sys.stderr)

    idle = None
    if args.mode == "native":
        # Idle rate: what the router does with no request (timers, heartbeats), subtracted below.
        scratch = f"{args.scratch}.idle"
        before = threads(args.pid)
        proc = perf_start(args.pid, scratch)
        time.sleep(2.0)
        syscalls, _ = perf_stop(proc, scratch)
        after = threads(args.pid)
        sw = switches(before, after)
        idle_window = 2.5
        idle = {
            "syscalls_per_s": sum(syscalls.values()) / idle_window,
            "switches_per_s": sum(v + i for v, i in sw.values()) / idle_window,
        }

    with open(args.out, "a") as out:
        only = os.environ.get("PLACEMENTS", "").split()
        for name, dk, dm, needs in PLACEMENTS:
            if n < needs or (only and name not in only):
                continue
            key_shard, model_shard = (front + dk) % n, (front + dm) % n
            key, model = raw_key(key_shard), MODELS[model_shard]
            client, moved, tries = connect_landing_on(args, front, key, model)
            serving = key_shard if moved else front
            client.send(key, model, args.warmup)
            row = {
                "mode": args.mode, "shards": n, "kind": args.kind, "placement": name,
                "front": front, "key_owner": key_shard, "model_owner": model_shard,
                "moved": moved, "serving": serving, "connections_tried": tries,
                "key": key, "model": model, "requests": args.requests,
                "loadavg": os.getloadavg()[0],
            }
            if args.mode == "callgrind":
                subprocess.run(["callgrind_control", "-z", str(args.pid)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                existing = set(glob.glob(args.cgout + "*"))
                client.send(key, model, args.requests)
                subprocess.run(["callgrind_control", "-d", str(args.pid)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                total = None
                for path in sorted(set(glob.glob(args.cgout + "*")) - existing):
                    with open(path) as f:
                        text = f.read()
                    if re.search(r"^desc: Trigger: .*[Dd]ump", text, re.M):
                        total = int(re.search(r"^summary: (\d+)", text, re.M).group(1))
                if total is None:
                    sys.exit("no callgrind dump found")
                row["instructions"] = total / args.requests
            else:
                syscalls, kinds, sw, elapsed, window = native_window(
                    args, client, key, model, f"{args.scratch}.{name}")
                total_sys = sum(syscalls.values()) - idle["syscalls_per_s"] * window
                vol = sum(v for v, _ in sw.values())
                invol = sum(i for _, i in sw.values())
                total_sw = vol + invol - idle["switches_per_s"] * window
                row.update({
                    "syscalls": total_sys / args.requests,
                    "switches": total_sw / args.requests,
                    "voluntary": vol / args.requests,
                    "involuntary": invol / args.requests,
                    "seconds": elapsed,
                    "idle": idle,
                    "syscalls_by_kind": {k: round(v / args.requests, 3) for k, v in sorted(kinds.items()) if v},
                    "syscalls_by_thread": {k: round(v / args.requests, 2) for k, v in sorted(syscalls.items())},
                    "switches_by_thread": {k: round((v + i) / args.requests, 2) for k, (v, i) in sorted(sw.items())},
                })
                # Which shard threads worked: each should be the front or an owner.
                active = sorted(
                    int(k.split("-")[1]) for k, v in syscalls.items()
                    if re.fullmatch(r"shard-\d+", k) and v / args.requests >= 0.5)
                expected = sorted({serving, key_shard, model_shard})
                row["active_shards"] = active
                row["placement_seen"] = active == expected
            out.write(json.dumps(row) + "\n")
            out.flush()
            client.conn.close()
            print(f"[shard-scaling]   {name}: {json.dumps({k: row[k] for k in row if k in ('instructions', 'syscalls', 'switches', 'active_shards')})}",
                  file=sys.stderr)


# ---------------------------------------------------------------- table


def cmd_table(args):
    rows = []
    for path in args.files:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    order = {p[0]: i for i, p in enumerate(PLACEMENTS)}
    cells = {}
    for row in rows:
        cell = cells.setdefault((row["kind"], row["shards"], row["placement"]), {
            "fronts": set(), "seen": []})
        cell["fronts"].add(row["front"])
        cell["moved"] = cell.get("moved", False) or row.get("moved", False)
        for name in ("instructions", "syscalls", "switches", "voluntary", "involuntary"):
            if name in row:
                cell.setdefault(name, []).append(row[name])
        if "placement_seen" in row:
            cell["seen"].append(row["placement_seen"])

    def mean(values):
        return sum(values) / len(values) if values else None

    def spread(values, spec):
        if not values:
            return "–"
        text = format(mean(values), spec).replace(",", " ")
        if len(values) > 1:
            text += f" ({format(min(values), spec)}–{format(max(values), spec)})".replace(",", " ")
        return text

    for kind in sorted({k for k, _, _ in cells}, key=lambda k: k != "json"):
        base = mean(cells.get((kind, 1, "all-local"), {}).get("instructions", []))
        print(f"\n{kind} requests, the router's process, per request (mean of the runs; min–max when several):\n")
        print("| shards | placement | fronts seen | instructions | × 1-shard all-local | system calls "
              "| context switches | voluntary + involuntary (idle not subtracted) | placement seen in the threads |")
        print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for (k, shards, placement), cell in sorted(cells.items(), key=lambda c: (c[0][1], order[c[0][2]])):
            if k != kind:
                continue
            instr = mean(cell.get("instructions", []))
            ratio = f"{instr / base:.2f}" if instr and base else "–"
            vol, invol = mean(cell.get("voluntary", [])), mean(cell.get("involuntary", []))
            split = "–" if vol is None else f"{vol:.2f} + {invol:.2f}"
            seen = cell["seen"]
            seen_text = "–" if not seen else f"{sum(seen)}/{len(seen)} runs"
            fronts = ",".join(map(str, sorted(cell["fronts"])))
            print(f"| {shards} | {placement} | {fronts} | {spread(cell.get('instructions', []), ',.0f')} | {ratio} "
                  f"| {spread(cell.get('syscalls', []), '.2f')} | {spread(cell.get('switches', []), '.2f')} "
                  f"| {split} | {seen_text} |")
        moved = sorted({(s, p) for (k, s, p), cell in cells.items() if k == kind and cell["moved"]})
        if moved:
            print("\nMoved to the key's owner after the first request (connection handoff): "
                  + ", ".join(f"{p} with {s} shards" for s, p in moved) + ".")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("auth")
    p.add_argument("file")
    p.set_defaults(func=cmd_auth)
    p = sub.add_parser("owners")
    p.set_defaults(func=cmd_owners)
    p = sub.add_parser("run")
    p.add_argument("--mode", choices=["callgrind", "native"], required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--kind", choices=["json", "stream"], default="json")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--out", required=True)
    p.add_argument("--cgout", default="")
    p.add_argument("--scratch", default="/tmp/shard-scaling-perf")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("table")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_table)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Prefix-cache-aware routing under a chat workload: one open-loop run against a router (or
several, or SMG), with the replicas' prefix-cache counters and the router's CPU around it.

`run`: sends --rate requests/s for --duration seconds, streamed, to /v1/chat/completions of one of
--urls at random (a load balancer without stickiness). The sequence is fixed by --seed, the same for
every target:
- conversations (--conversations at once, --turns each): a system prompt of about --system-bytes of
  seeded random words, distinct per conversation; turn k sends the system prompt, the k-1 earlier
  user and assistant messages (the assistant's are seeded text, not the answers: the loop is open,
  a turn may be due before the answer to the one before has come), and a new user message of about
  --user-bytes. Append-only, so the leading bytes repeat. At each arrival one conversation, picked
  at random, sends its next turn; one that has sent its turns starts again as a new conversation
  with a fresh system prompt;
- one-shot prompts: a fraction --one-shot of the arrivals, each about --one-shot-bytes of random
  words, sharing no prefix with anything.
Before and after the run it reads the replicas' `vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total` (--sim-metrics, summed: hit rate = hits / queries of the run), the
routers' `hivenet_prefix_index_hits_total` / `..._misses_total` (--router-metrics) and utime+stime
of --pids from /proc (CPU per request = the difference / requests sent). TTFT counts from when the
request was due to the first SSE chunk carrying content. At most --max-in-flight requests are open;
arrivals beyond are skipped and counted. Bounded: the run lasts --duration plus at most --timeout
for the answers in flight. Writes one row (JSON) to --row-out.

`table`: reads rows (JSON files), prints a table and writes rows.json and rows.csv to --out.
"""
import argparse
import asyncio
import csv
import json
import math
import os
import random
import re
import sys
import time
import urllib.request
from collections import Counter

CLK_TCK = os.sysconf("SC_CLK_TCK")
WORDS_ALPHABET = "abcdefghijklmnopqrstuvwxyz"

CSV_FIELDS = [
    "variant", "workload", "requests", "ok", "errors", "errors_by_status", "skipped", "rps",
    "ttft_p50_ms", "ttft_p99_ms", "hit_rate", "cache_queries", "cache_hits", "cpu_us_per_req",
    "idle_cpu_pct", "index_hits", "index_misses", "rate", "duration_s", "one_shot", "seed", "loadavg_1m",
]


def percentile(values, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 1)


# ---------------------------------------------------------------------------------------------
# The workload: a seeded list of request bodies, one per arrival
# ---------------------------------------------------------------------------------------------
def random_text(rng, size):
    """About `size` bytes of random lowercase words."""
    words = []
    n = 0
    while n < size:
        w = "".join(rng.choice(WORDS_ALPHABET) for _ in range(rng.randint(2, 10)))
        words.append(w)
        n += len(w) + 1
    return " ".join(words)


def build_workload(args):
    """Bodies (JSON bytes) and kinds ("conv" or "one-shot") of rate x duration arrivals."""
    rng = random.Random(args.seed)
    count = int(args.rate * args.duration)
    convs = []
    serial = 0

    def new_conv():
        nonlocal serial
        serial += 1
        system = f"Conversation {serial}. " + random_text(rng, args.system_bytes)
        return {"messages": [{"role": "system", "content": system}], "turn": 0}

    convs = [new_conv() for _ in range(args.conversations)]
    bodies, kinds = [], []
    for _ in range(count):
        if rng.random() < args.one_shot:
            messages = [{"role": "user", "content": random_text(rng, args.one_shot_bytes)}]
            kinds.append("one-shot")
        else:
            i = rng.randrange(len(convs))
            conv = convs[i]
            if conv["turn"] > 0:
                # the answer to the turn before (seeded text, see the module's doc)
                conv["messages"].append(
                    {"role": "assistant", "content": random_text(rng, args.assistant_bytes)})
            conv["messages"].append({"role": "user", "content": random_text(rng, args.user_bytes)})
            conv["turn"] += 1
            messages = list(conv["messages"])
            if conv["turn"] >= args.turns:
                convs[i] = new_conv()
            kinds.append("conv")
        body = {"model": args.model, "messages": messages, "stream": True,
                "max_tokens": args.max_tokens}
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    return bodies, kinds


# ---------------------------------------------------------------------------------------------
# Counters: replicas' prefix caches, the routers' prefix index, CPU from /proc
# ---------------------------------------------------------------------------------------------
def scrape(url, names):
    """Sum of every series of each family in `names` at a Prometheus endpoint (None: unreachable)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001
        print(f"[prefix] cannot scrape {url}: {exc}", file=sys.stderr)
        return None
    sums = {n: 0.0 for n in names}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in sums:
            try:
                sums[m.group(1)] += float(m.group(3))
            except ValueError:
                pass
    return sums


def scrape_all(urls, names):
    total = {n: 0.0 for n in names}
    for u in urls:
        s = scrape(u, names)
        if s is None:
            return None
        for n in names:
            total[n] += s[n]
    return total


def proc_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # rest[0] is the state (field 3): utime is field 14, stime field 15
    return int(rest[11]) + int(rest[12])


def cpu_ticks(pids):
    total = 0
    for p in pids:
        t = proc_ticks(p)
        if t is None:
            return None
        total += t
    return total


SIM_FAMILIES = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"]
ROUTER_FAMILIES = ["hivenet_prefix_index_hits_total", "hivenet_prefix_index_misses_total"]


# ---------------------------------------------------------------------------------------------
# The load
# ---------------------------------------------------------------------------------------------
def error_code(text):
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    if not isinstance(err, dict):
        return None
    return err.get("code") or err.get("type") or "unknown"


async def one_request(client, url, headers, body, due, stats):
    try:
        async with client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                stats["codes"][f"{resp.status_code} {error_code(text) or '-'}"] += 1
                return
            first = False
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                if '"error"' in data and error_code(data):
                    stats["codes"][f"200 event {error_code(data)}"] += 1
                    return
                if first or '"content"' not in data or '"content":""' in data:
                    continue  # role or finish chunk, or a later token
                first = True
                stats["ttft"].append(time.monotonic() - due)
            if done:
                stats["ok"] += 1
            else:
                stats["codes"]["200 truncated"] += 1
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind, never raised
        stats["codes"][f"transport {type(exc).__name__}"] += 1


async def run_load(args, bodies):
    import httpx

    stats = {"ok": 0, "ttft": [], "codes": Counter(), "sent": 0, "skipped": 0}
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    urls = [u.rstrip("/") + "/v1/chat/completions" for u in args.urls.split(",") if u]
    pick = random.Random(args.seed + 1)
    limits = httpx.Limits(max_connections=args.max_in_flight,
                          max_keepalive_connections=args.max_in_flight)
    timeout = httpx.Timeout(args.timeout)
    tasks = set()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        for i, body in enumerate(bodies):
            url = urls[pick.randrange(len(urls))] if len(urls) > 1 else urls[0]
            due = start + i / args.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= args.max_in_flight:
                stats["skipped"] += 1
                continue
            stats["sent"] += 1
            task = asyncio.create_task(one_request(client, url, headers, body, due, stats))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        sent_s = time.monotonic() - start
        if tasks:
            await asyncio.wait(set(tasks), timeout=args.timeout + 5)
        for task in list(tasks):
            task.cancel()
            stats["codes"]["cancelled"] += 1
        stats["run_s"] = time.monotonic() - start
        stats["sent_s"] = sent_s
    return stats


def cmd_run(args):
    bodies, kinds = build_workload(args)
    kc = Counter(kinds)
    print(f"[prefix] {args.variant} {args.workload}: {len(bodies)} requests at {args.rate:g}/s for "
          f"{args.duration}s ({kc['conv']} conversation turns, {kc['one-shot']} one-shot; "
          f"{sum(map(len, bodies)) / max(1, len(bodies)) / 1024:.1f} KiB a body on average) "
          f"to {args.urls}", file=sys.stderr)
    sim_urls = [u for u in args.sim_metrics.split(",") if u]
    router_urls = [u for u in args.router_metrics.split(",") if u]
    pids = [int(p) for p in args.pids.split(",") if p]
    sim0 = scrape_all(sim_urls, SIM_FAMILIES)
    rt0 = scrape_all(router_urls, ROUTER_FAMILIES) if router_urls else None
    idle0 = cpu_ticks(pids)
    time.sleep(args.idle_s)
    cpu0 = cpu_ticks(pids)
    stats = asyncio.run(run_load(args, bodies))
    cpu1 = cpu_ticks(pids)
    time.sleep(0.2)
    sim1 = scrape_all(sim_urls, SIM_FAMILIES)
    rt1 = scrape_all(router_urls, ROUTER_FAMILIES) if router_urls else None

    row = {"variant": args.variant, "workload": args.workload, "rate": args.rate,
           "duration_s": args.duration, "one_shot": args.one_shot, "seed": args.seed,
           "requests": stats["sent"], "ok": stats["ok"], "skipped": stats["skipped"]}
    errors = {k: v for k, v in stats["codes"].items()}
    row["errors"] = sum(errors.values())
    row["errors_by_status"] = dict(sorted(errors.items()))
    row["rps"] = round(stats["ok"] / args.duration, 2)
    row["ttft_p50_ms"] = ms(percentile(stats["ttft"], 50))
    row["ttft_p99_ms"] = ms(percentile(stats["ttft"], 99))
    if sim0 is not None and sim1 is not None:
        q = sim1[SIM_FAMILIES[0]] - sim0[SIM_FAMILIES[0]]
        h = sim1[SIM_FAMILIES[1]] - sim0[SIM_FAMILIES[1]]
        row["cache_queries"], row["cache_hits"] = int(q), int(h)
        row["hit_rate"] = round(h / q, 3) if q > 0 else None
    else:
        row["cache_queries"] = row["cache_hits"] = row["hit_rate"] = None
    if cpu0 is not None and cpu1 is not None and stats["sent"] > 0:
        row["cpu_us_per_req"] = round((cpu1 - cpu0) / CLK_TCK * 1e6 / stats["sent"], 1)
    else:
        row["cpu_us_per_req"] = None
    # the router's own background work, before the load: CPU % of one core
    if idle0 is not None and cpu0 is not None and args.idle_s > 0:
        row["idle_cpu_pct"] = round((cpu0 - idle0) / CLK_TCK / args.idle_s * 100, 1)
    else:
        row["idle_cpu_pct"] = None
    if rt0 is not None and rt1 is not None:
        row["index_hits"] = int(rt1[ROUTER_FAMILIES[0]] - rt0[ROUTER_FAMILIES[0]])
        row["index_misses"] = int(rt1[ROUTER_FAMILIES[1]] - rt0[ROUTER_FAMILIES[1]])
    else:
        row["index_hits"] = row["index_misses"] = None
    with open("/proc/loadavg") as f:
        row["loadavg_1m"] = float(f.read().split()[0])
    row["run_s"] = round(stats["run_s"], 2)
    with open(args.row_out, "w") as f:
        json.dump(row, f, indent=1)
    print(f"[prefix] {args.variant} {args.workload}: ok {row['ok']}/{row['requests']}, errors "
          f"{row['errors_by_status'] or 0}, TTFT p50 {row['ttft_p50_ms']} ms, hit rate "
          f"{row['hit_rate']}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
TABLE = [("variant", 9), ("workload", 9), ("requests", 8), ("ok", 6), ("errors", 6), ("rps", 6),
         ("ttft_p50_ms", 11), ("ttft_p99_ms", 11), ("hit_rate", 8), ("cpu_us_per_req", 14),
         ("idle_cpu_pct", 12), ("index_hits", 10), ("index_misses", 12)]


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def cmd_table(args):
    rows = []
    for path in args.rows:
        with open(path) as f:
            rows.append(json.load(f))
    print("  ".join(name.rjust(width) for name, width in TABLE))
    for r in rows:
        print("  ".join(fmt(r.get(name)).rjust(width) for name, width in TABLE))
    for r in rows:
        if r.get("errors") or r.get("skipped"):
            print(f"{r['variant']} {r['workload']}: errors {r['errors_by_status']}, skipped "
                  f"{r['skipped']}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rows.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}, f,
                  indent=1)
    with open(os.path.join(args.out, "rows.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()})


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="one open-loop run; writes one row")
    r.add_argument("--urls", required=True, help="base URLs, comma-separated; each request picks one at random")
    r.add_argument("--variant", default="A")
    r.add_argument("--workload", default="mixed")
    r.add_argument("--api-key", default=env("API_KEY", ""))
    r.add_argument("--model", default=env("MODEL", "sim-model"))
    r.add_argument("--rate", type=float, default=float(env("RATE", "40")))
    r.add_argument("--duration", type=int, default=int(env("DURATION", "30")))
    r.add_argument("--seed", type=int, default=int(env("SEED", "1")))
    r.add_argument("--conversations", type=int, default=int(env("CONVERSATIONS", "24")))
    r.add_argument("--turns", type=int, default=int(env("TURNS", "6")))
    r.add_argument("--one-shot", type=float, default=float(env("ONE_SHOT", "0.3")),
                   help="fraction of arrivals that are one-shot prompts")
    r.add_argument("--system-bytes", type=int, default=int(env("SYSTEM_BYTES", "6144")))
    r.add_argument("--user-bytes", type=int, default=int(env("USER_BYTES", "300")))
    r.add_argument("--assistant-bytes", type=int, default=int(env("ASSISTANT_BYTES", "200")))
    r.add_argument("--one-shot-bytes", type=int, default=int(env("ONE_SHOT_BYTES", "2048")))
    r.add_argument("--max-tokens", type=int, default=int(env("MAX_TOKENS", "64")))
    r.add_argument("--max-in-flight", type=int, default=int(env("MAX_IN_FLIGHT", "512")))
    r.add_argument("--timeout", type=int, default=int(env("TIMEOUT_S", "30")),
                   help="seconds a request may take; also how long the run waits for answers in flight")
    r.add_argument("--sim-metrics", default="", help="replicas' /metrics URLs, comma-separated")
    r.add_argument("--router-metrics", default="", help="routers' /metrics URLs, comma-separated")
    r.add_argument("--pids", default="", help="router (or gateway) pids, comma-separated")
    r.add_argument("--idle-s", type=float, default=float(env("IDLE_S", "3")),
                   help="seconds of the routers' CPU measured idle before the load (idle_cpu_pct)")
    r.add_argument("--row-out", required=True)
    t = sub.add_parser("table", help="print rows as a table; write rows.json and rows.csv")
    t.add_argument("--out", required=True)
    t.add_argument("rows", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "run":
        if not 1 <= args.duration <= 600:
            p.error("--duration must be 1..600 seconds")
        if args.rate <= 0 or args.conversations < 1 or args.turns < 1:
            p.error("--rate, --conversations and --turns must be positive")
    return args


def main(argv):
    args = parse_args(argv)
    if args.cmd == "run":
        cmd_run(args)
    else:
        cmd_table(args)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Load test one OpenAI-style chat endpoint (a hivenet router, or anything that speaks the same API).

The load comes from `oha` (a maintained load generator): either a fixed number of connections for a
duration (closed loop, --concurrency), or a list of constant arrival rates, one step each (open
loop, --rates; `oha -q RATE --latency-correction`, so a request's latency counts from when it was
due, and queueing is not hidden by the generator waiting for answers).

Alongside oha, a small probe (Python asyncio + httpx) sends --probe-rate requests per second of the
same kind at a constant arrival rate and reads every answer: it counts errors by the error code of
the envelope {"error":{"code","message","source"}} (oha only sees HTTP statuses) and, for streams,
measures time to first token (TTFT: request due -> first SSE chunk with content) and inter-token
latency (ITL: gaps between content chunks). In rate mode the probe's requests are part of the
offered rate (oha sends RATE - probe rate).

Bounded: every step lasts --duration seconds plus at most --timeout for the answers still in flight
(oha -z with -w and -t); the count is at most rate x duration (open loop) and the probe keeps at most
--probe-max-in-flight requests open, skipping (and counting) the rest. oha is run under a hard
deadline as well.

Writes DIR/steps.json and DIR/steps.csv (one row per step) and prints a table. Needs `oha` on PATH
and httpx (perf/load.sh installs both when missing).
"""
import argparse
import asyncio
import csv
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter

CSV_FIELDS = [
    "label", "kind", "mode", "offered_rps", "concurrency", "duration_s", "run_s", "achieved_rps",
    "requests",
    "ok", "errors", "errors_by_status", "errors_by_code", "transport_errors",
    "p50_ms", "p90_ms", "p99_ms", "ttfb_p50_ms", "ttfb_p99_ms",
    "probe_requests", "probe_skipped", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
    "loadavg_1m",
]


def percentile(values, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 3)


def request_body(model, stream):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":"))


def error_code(text):
    """The `code` of an error envelope, else its `type`, else None."""
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    if not isinstance(err, dict):
        return None
    return err.get("code") or err.get("type") or "unknown"


# ---------------------------------------------------------------------------------------------
# oha
# ---------------------------------------------------------------------------------------------
def run_oha(args, url, body, rate, seconds):
    """One oha run; returns its JSON report. rate None: closed loop with --concurrency."""
    cmd = ["oha", "--no-tui", "--output-format", "json", "-m", "POST", "-T", "application/json",
           "-d", body, "-z", f"{seconds}s", "-w", "-t", f"{args.timeout}s",
           "-c", str(args.concurrency if rate is None else args.connections)]
    if args.api_key:
        cmd += ["-H", f"Authorization: Bearer {args.api_key}"]
    if rate is not None:
        cmd += ["-q", str(rate), "--latency-correction"]
    # Hard deadline: the run itself plus the answers in flight plus start-up.
    deadline_s = seconds + args.timeout + 30
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=deadline_s)
    if out.returncode != 0:
        raise RuntimeError(f"oha exited {out.returncode}: {out.stderr.strip()[:500]}")
    return json.loads(out.stdout)


# ---------------------------------------------------------------------------------------------
# Probe: constant arrival rate, reads every answer
# ---------------------------------------------------------------------------------------------
async def probe_one(client, url, headers, body, stream, due, stats):
    try:
        if not stream:
            resp = await client.post(url, content=body, headers=headers)
            stats["latency"].append(time.monotonic() - due)
            if resp.status_code == 200:
                stats["ok"] += 1
            else:
                stats["codes"][f"{resp.status_code} {error_code(resp.text) or '-'}"] += 1
            return
        async with client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                stats["codes"][f"{resp.status_code} {error_code(text) or '-'}"] += 1
                return
            last = None
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.monotonic()
                if '"error"' in data and error_code(data):
                    stats["codes"][f"200 event {error_code(data)}"] += 1
                    return
                if '"content"' not in data or '"content":""' in data:
                    continue  # role or finish chunk: no token
                if last is None:
                    stats["ttft"].append(now - due)
                else:
                    stats["itl"].append(now - last)
                last = now
            stats["latency"].append(time.monotonic() - due)
            if done:
                stats["ok"] += 1
            else:
                stats["codes"]["200 truncated"] += 1
    except Exception as exc:  # noqa: BLE001 - every failure is counted by kind, never raised
        stats["codes"][f"transport {type(exc).__name__}"] += 1


async def run_probe(args, url, body, rate, seconds):
    """Sends rate x seconds requests at a constant arrival rate; returns the stats."""
    import httpx

    stats = {"ok": 0, "latency": [], "ttft": [], "itl": [], "codes": Counter(), "sent": 0,
             "skipped": 0}
    if rate <= 0:
        return stats
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    stream = args.kind == "stream"
    limits = httpx.Limits(max_connections=args.probe_max_in_flight,
                          max_keepalive_connections=args.probe_max_in_flight)
    timeout = httpx.Timeout(args.timeout)
    count = int(rate * seconds)
    tasks = set()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        for i in range(count):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= args.probe_max_in_flight:
                stats["skipped"] += 1
                continue
            stats["sent"] += 1
            task = asyncio.create_task(probe_one(client, url, headers, body, stream, due, stats))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=args.timeout + 5)
        for task in tasks:
            task.cancel()
    return stats


# ---------------------------------------------------------------------------------------------
# One step
# ---------------------------------------------------------------------------------------------
async def run_step(args, url, rate):
    body = request_body(args.model, args.kind == "stream")
    probe_rate = 0.0
    oha_rate = rate
    if rate is not None:
        probe_rate = min(args.probe_rate, rate / 2.0)
        oha_rate = rate - probe_rate
    elif args.probe_rate > 0:
        probe_rate = args.probe_rate
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    oha_future = loop.run_in_executor(None, run_oha, args, url, body, oha_rate, args.duration)
    probe = await run_probe(args, url, body, probe_rate, args.duration)
    report = await oha_future
    elapsed = time.monotonic() - started

    statuses = {k: v for k, v in report.get("statusCodeDistribution", {}).items()}
    ok = sum(v for k, v in statuses.items() if k.startswith("2")) + probe["ok"]
    errors_by_status = Counter({k: v for k, v in statuses.items() if not k.startswith("2")})
    transport = Counter(report.get("errorDistribution", {}))
    for code, n in probe["codes"].items():
        if code.startswith("transport "):
            transport[code] += n
    errors_by_code = Counter({k: v for k, v in probe["codes"].items()
                              if not k.startswith("transport ")})
    requests = sum(statuses.values()) + sum(transport.values()) + probe["sent"] \
        - sum(n for c, n in probe["codes"].items() if c.startswith("transport "))
    # oha sends only during the step and then waits for the answers in flight; dividing by the
    # step's length, not by oha's total, keeps that tail (up to one answer's latency) from
    # lowering the rate.
    run_s = report["summary"].get("total") or elapsed
    try:
        with open("/proc/loadavg") as f:
            loadavg = f.read().split()[0]  # 1-minute load: was the machine busy with other work?
    except OSError:
        loadavg = None
    lat = report.get("latencyPercentiles") or {}
    ttfb = report.get("firstBytePercentiles") or {}
    return {
        "label": args.label, "kind": args.kind, "mode": "rate" if rate is not None else "concurrency",
        "offered_rps": rate, "concurrency": args.concurrency if rate is None else args.connections,
        "duration_s": args.duration, "achieved_rps": round(ok / args.duration, 1),
        "run_s": round(run_s, 3),
        "requests": requests, "ok": ok,
        # every probe code is an error: a non-200, an error event in a 200 stream, a truncation
        "errors": sum(errors_by_status.values()) + sum(transport.values())
        + sum(errors_by_code.values()),
        "errors_by_status": dict(errors_by_status), "errors_by_code": dict(errors_by_code),
        "transport_errors": dict(transport),
        "p50_ms": ms(lat.get("p50")), "p90_ms": ms(lat.get("p90")), "p99_ms": ms(lat.get("p99")),
        "ttfb_p50_ms": ms(ttfb.get("p50")), "ttfb_p99_ms": ms(ttfb.get("p99")),
        "probe_requests": probe["sent"], "probe_skipped": probe["skipped"],
        "ttft_p50_ms": ms(percentile(probe["ttft"], 50)), "ttft_p99_ms": ms(percentile(probe["ttft"], 99)),
        "itl_p50_ms": ms(percentile(probe["itl"], 50)), "itl_p99_ms": ms(percentile(probe["itl"], 99)),
        "loadavg_1m": loadavg,
    }


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, dict):
        return " ".join(f"{k}:{n}" for k, n in sorted(v.items())) or "-"
    return str(v)


def print_table(rows):
    cols = ["label", "kind", "offered_rps", "achieved_rps", "ok", "errors", "p50_ms", "p90_ms",
            "p99_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"]
    print(" ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(" ".join(f"{fmt(r[c]):>12}" for c in cols))
    for r in rows:
        detail = {k: r[k] for k in ("errors_by_status", "errors_by_code", "transport_errors") if r[k]}
        if detail:
            print(f"  {r['label']} {r['kind']} @ {r['offered_rps'] or r['concurrency']}: "
                  + "; ".join(f"{k} {fmt(v)}" for k, v in detail.items()))


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: perf/load.sh --url http://127.0.0.1:8080 --api-key sk-... --model m "
               "--kind stream --rates '200 400 800' --duration 5",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default=env("URL", "http://127.0.0.1:8080"),
                   help="base URL of the router; /v1/chat/completions is appended unless the URL has a path")
    p.add_argument("--api-key", default=env("API_KEY", ""), help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", default=env("MODEL", "sim-model"))
    p.add_argument("--kind", choices=["json", "stream"], default=env("KIND", "json"))
    p.add_argument("--duration", type=int, default=int(env("DURATION", "5")), help="seconds per step")
    p.add_argument("--rates", default=env("RATES", ""),
                   help="open loop: arrival rates in requests/s, one step each, e.g. '200 400 800'")
    p.add_argument("--concurrency", type=int, default=int(env("CONCURRENCY", "32")),
                   help="closed loop (when --rates is empty): connections each sending one request at a time")
    p.add_argument("--connections", type=int, default=int(env("CONNECTIONS", "256")),
                   help="open loop: oha's connections, the most requests in flight (raise it if a step's latency hits it)")
    p.add_argument("--warmup", type=int, default=int(env("WARMUP", "1")),
                   help="seconds of unrecorded load (at the lowest rate) before the first step; 0: none")
    p.add_argument("--timeout", type=int, default=int(env("TIMEOUT", "10")),
                   help="seconds a request may take; also how long a step waits for answers in flight")
    p.add_argument("--probe-rate", type=float, default=float(env("PROBE_RATE", "20")),
                   help="requests/s of the reading probe (error codes, TTFT, ITL); 0: none")
    p.add_argument("--probe-max-in-flight", type=int, default=int(env("PROBE_MAX_IN_FLIGHT", "64")))
    p.add_argument("--max-steps", type=int, default=int(env("MAX_STEPS", "10")),
                   help="refuse more rate steps than this (keeps a run bounded)")
    p.add_argument("--label", default=env("LABEL", "router"), help="name of the target in the output")
    p.add_argument("--out", default=env("OUT", "perf/results/load-latest"),
                   help="directory for steps.json and steps.csv")
    args = p.parse_args(argv)
    args.rate_list = [float(r) for r in args.rates.replace(",", " ").split()]
    if len(args.rate_list) > args.max_steps:
        p.error(f"{len(args.rate_list)} rate steps: more than --max-steps {args.max_steps}")
    if args.duration <= 0 or args.duration > 600:
        p.error("--duration must be 1..600 seconds")
    return args


def main(argv):
    args = parse_args(argv)
    url = args.url.rstrip("/")
    if url.count("/") <= 2:
        url += "/v1/chat/completions"
    if args.warmup > 0:
        # Opens oha's connections and warms the target; not recorded.
        rate = min(args.rate_list) if args.rate_list else None
        print(f"[load] {args.label} {args.kind}: warm-up {args.warmup}s", file=sys.stderr)
        run_oha(args, url, request_body(args.model, args.kind == "stream"), rate, args.warmup)
    rows = []
    for rate in args.rate_list or [None]:
        what = f"{rate:g} req/s" if rate is not None else f"{args.concurrency} connections"
        print(f"[load] {args.label} {args.kind}: {what} for {args.duration}s", file=sys.stderr)
        rows.append(asyncio.run(run_step(args, url, rate)))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "steps.json"), "w") as f:
        json.dump({"url": url, "model": args.model, "kind": args.kind, "date":
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": rows}, f, indent=1)
    with open(os.path.join(args.out, "steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()})
    print_table(rows)
    print(f"[load] written {args.out}/steps.json and steps.csv", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""The load and the figures of perf/site-chaos.sh (Python standard library only).

`load`: constant open-loop arrivals to some routers of the site, three streams per router: the
rate key (`requests_per_minute`) on the fast model, the daily key of the current phase (its name is
read from a file the orchestrator rewrites) on the fast model, and the budget model (`max_inflight`).
Every request goes on a fresh connection (`connection: close`) and is written, when it ends, as
one JSON line: when it was due and sent, when it ended, router, stream, key, HTTP status, the
envelope's error code, `usage.total_tokens` of a 200, or the transport error (`refused`, `reset`,
`timeout`, ...) when no status came. Bounded: at most --inflight-max requests open (the rest are
counted as `skipped`), each at most --timeout seconds, the run at most --max-seconds. With
--sample-url it also reads the budget model's engine metrics every 200 ms (sim_in_flight,
sim_running_peak, sim_requests_total).

`report`: reads the events the orchestrator wrote, the requests, the engine samples and the
routers' scrapes; prints a table per phase and window and the violated bounds; exits 1 when a
bound is broken.
"""
import argparse
import asyncio
import glob
import json
import math
import os
import re
import sys
import time
from collections import Counter, defaultdict

BODY = '{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}'


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------
def parse_response(raw):
    """(status, error code, total tokens) of a whole HTTP/1.1 response read to EOF."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    if any(line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
           for line in lines[1:]):
        data, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            data, rest = data + rest[:size], rest[size + 2:]
        body = data
    code, tokens = None, None
    try:
        value = json.loads(body)
        if status == 200:
            tokens = value.get("usage", {}).get("total_tokens")
        else:
            err = value.get("error") or {}
            code = err.get("code") or err.get("type")
    except (ValueError, AttributeError):
        code = None if status == 200 else "no_envelope"
    return status, code, tokens


class Load:
    def __init__(self, args):
        self.args = args
        self.out = open(args.out, "a", buffering=1 << 16)
        self.inflight = 0
        self.day_key = ""
        self.day_key_read = 0.0

    def current_day_key(self):
        now = time.monotonic()
        if now - self.day_key_read > 0.2:
            self.day_key_read = now
            try:
                with open(self.args.day_key_file) as f:
                    self.day_key = f.read().strip()
            except OSError:
                self.day_key = ""
        return self.day_key

    def stopped(self):
        return os.path.exists(self.args.stop_file)

    async def one(self, router, host, port, stream, key, model, due):
        sent = time.time()
        record = {"due": due, "t": sent, "r": router, "s": stream, "k": key}
        body = BODY.format(model=model)
        raw = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
               f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}").encode()
        writer = None
        try:
            async def exchange():
                nonlocal writer
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(raw)
                await writer.drain()
                return await reader.read()
            data = await asyncio.wait_for(exchange(), self.args.timeout)
            if not data:
                record["err"] = "closed"
            else:
                record["st"], record["code"], record["tok"] = parse_response(data)
        except asyncio.TimeoutError:
            record["err"] = "timeout"
        except ConnectionRefusedError:
            record["err"] = "refused"
        except (ConnectionResetError, BrokenPipeError):
            record["err"] = "reset"
        except (OSError, ValueError, IndexError) as e:
            record["err"] = type(e).__name__
        finally:
            if writer is not None:
                writer.close()
            self.inflight -= 1
        record["end"] = time.time()
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    async def stream(self, router, host, port, stream, rate, model, key_of, deadline):
        if rate <= 0:
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        index = 0
        tasks = set()
        while not self.stopped() and loop.time() < deadline:
            due = start + index / rate
            index += 1
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            key = key_of()
            if not key:
                continue
            if self.inflight >= self.args.inflight_max:
                self.out.write(json.dumps({"t": time.time(), "r": router, "s": stream, "k": key,
                                           "err": "skipped"}) + "\n")
                continue
            self.inflight += 1
            task = asyncio.ensure_future(
                self.one(router, host, port, stream, key, model, time.time() + (due - loop.time())))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)

    async def sample(self, deadline):
        host, port = self.args.sample_url.rsplit(":", 1)
        out = open(self.args.sample_out, "a", buffering=1)
        loop = asyncio.get_running_loop()
        while not self.stopped() and loop.time() < deadline:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
                writer.write(b"GET /metrics HTTP/1.1\r\nhost: sim\r\nconnection: close\r\n\r\n")
                data = (await asyncio.wait_for(reader.read(), 2)).decode(errors="replace")
                writer.close()
                values = {}
                for name in ("sim_in_flight", "sim_running_peak", "sim_requests_total"):
                    values[name] = metric(data, name, {"model_name": self.args.budget_model})
                values["t"] = time.time()
                out.write(json.dumps(values) + "\n")
            except (OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)

    async def run(self):
        args = self.args
        loop = asyncio.get_running_loop()
        deadline = loop.time() + args.max_seconds
        jobs = []
        for target in args.targets.split(","):
            router, addr = target.split("=")
            host, port = addr.rsplit(":", 1)
            router, port = int(router), int(port)
            jobs.append(self.stream(router, host, port, "rate", args.rate_rps, args.model,
                                    lambda: args.rate_key, deadline))
            jobs.append(self.stream(router, host, port, "day", args.day_rps, args.model,
                                    self.current_day_key, deadline))
            jobs.append(self.stream(router, host, port, "occ", args.occ_rps, args.budget_model,
                                    lambda: args.occ_key, deadline))
        if args.sample_url:
            jobs.append(self.sample(deadline))
        await asyncio.gather(*jobs)
        self.out.close()


def cmd_load(args):
    asyncio.run(Load(args).run())


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric(text, name, labels=None):
    """Sum of `name`'s samples whose labels include `labels`; None when there is none."""
    total = None
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        label_text = m.group(2) or ""
        if labels and not all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(m.group(3))
    return total


def read_events(path):
    events = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                events.append((float(parts[0]), parts[1], parts[2:]))
    return events


def read_jsonl(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    return rows


def cmd_report(args):
    settings = json.load(open(args.settings))
    routers = settings["routers"]
    rpm = settings["rpm"]
    rate_per_s = rpm / 60.0
    burst = settings["burst"]
    interval = settings["interval_s"]
    daily = settings["daily"]
    budget = settings["budget"]
    events = read_events(args.events)
    requests = read_jsonl(args.requests)
    samples = read_jsonl(args.samples)
    violations = []
    notes = []

    # Phases and windows from the events.
    phases = []
    current = None
    down = defaultdict(list)  # router -> [(from, to)] while the orchestrator had it down
    down_since = {}
    for t, name, rest in events:
        if name == "phase":
            current = {"name": rest[0], "start": t}
            phases.append(current)
        elif name in ("fault", "heal", "healed", "after_end") and current is not None:
            current[name] = t
        elif name == "heal_timeout" and current is not None:
            violations.append(f"{current['name']}: not healed within the deadline: {' '.join(rest)}")
        elif name == "router_down":
            down_since[int(rest[0])] = t
        elif name == "router_up":
            r = int(rest[0])
            down[r].append((down_since.pop(r, t), t))
        elif name == "note":
            notes.append(" ".join(rest))
    end_of_run = max((t for t, _, _ in events), default=0)
    for r, t in down_since.items():
        down[r].append((t, end_of_run))

    # A request in flight when the router went down may be cut by the kill too: one sent up to
    # the router's request timeout before (cut off from its agents, router 0 holds requests
    # that long in store-cut-kill).
    in_flight_s = settings.get("request_timeout_s", 5) + 1.0

    def router_down_at(r, t):
        return any(a - in_flight_s <= t <= b + 1.0 for a, b in down[r])

    # Every request answered with a status (the orchestrator's own down windows excepted).
    unanswered = Counter()
    excused = Counter()
    skipped = Counter()
    for q in requests:
        err = q.get("err")
        if not err:
            continue
        if err == "skipped":
            skipped[q["r"]] += 1
        elif router_down_at(q["r"], q["t"]):
            excused[(q["r"], err)] += 1
        else:
            unanswered[(q["r"], err)] += 1
    for (r, err), n in sorted(unanswered.items()):
        violations.append(f"router {r}: {n} requests without an answer ({err}) while it ran")
    for r, n in sorted(skipped.items()):
        violations.append(f"router {r}: the client skipped {n} requests (over --inflight-max): "
                          "the load was not open loop")

    cost_max = max((q.get("tok") or 0 for q in requests if q.get("s") == "day"), default=0)

    def window(rows, a, b):
        return [q for q in rows if a <= q["t"] < b]

    rows_out = []
    print()
    print(f"site-chaos: {routers} routers, rpm {rpm} (burst {burst}), tokens_per_day {daily} per "
          f"phase key, max_inflight {budget}, sync interval {interval}s; request cost up to "
          f"{cost_max} tokens")
    header = ("phase", "window", "secs", "rate 200 by router", "site", "bound", "min",
              "429", "other", "noans", "occ 200", "occ peak", "reaped")
    table = []
    for p in phases:
        fault, heal = p.get("fault"), p.get("heal")
        healed, after_end = p.get("healed"), p.get("after_end")
        windows = []
        if fault and heal:
            windows.append(("fault", fault, heal))
        if heal and healed:
            windows.append(("healing", heal, healed))
        if healed and after_end:
            windows.append(("after", healed, after_end))
        for wname, a, b in windows:
            secs = b - a
            rows = window(requests, a, b)
            rate_rows = [q for q in rows if q["s"] == "rate"]
            per_router = [sum(1 for q in rate_rows if q["r"] == r and q.get("st") == 200)
                          for r in range(routers)]
            site = sum(per_router)
            refused = sum(1 for q in rate_rows if q.get("st") == 429)
            other = Counter(f'{q["st"]} {q.get("code") or "-"}' for q in rows
                            if q.get("st") not in (None, 200, 429))
            other_429 = Counter(q.get("code") for q in rate_rows if q.get("st") == 429)
            noans = sum(1 for q in rows if q.get("err") and q["err"] != "skipped")
            # The rate's allowance over the window: rate x time plus the burst the bucket may
            # hold at the window's start, plus the seed's stated excess, one round's shares: each
            # router at most its share of the bucket (together one bucket) and the first request
            # of the round.
            bound = math.floor(rate_per_s * secs + burst + burst + routers)
            usable = math.floor(0.9 * rate_per_s * secs) if wname == "after" else 0
            if site > bound:
                violations.append(f"{p['name']}/{wname}: the rate key admitted {site} "
                                  f"{per_router} in {secs:.1f} s, bound {bound} (rate "
                                  f"{rate_per_s:g}/s x {secs:.1f} s + burst {burst} + one "
                                  f"round's shares {burst + routers})")
            if wname == "after" and site < usable:
                violations.append(f"{p['name']}/after: the rate key admitted {site} "
                                  f"{per_router} in {secs:.1f} s after healing, under 90 % of the "
                                  f"rate ({usable}): its budget is not usable again")
            if wname == "after":
                fair = rate_per_s * secs / routers
                for r, n in enumerate(per_router):
                    if n < fair / 2:
                        violations.append(f"{p['name']}/after: router {r} admitted {n} of the rate "
                                          f"key {per_router}, under half its fair share "
                                          f"{fair:.0f}")
            for code, n in other_429.items():
                if code != "rate_limit_exceeded":
                    notes.append(f"{p['name']}/{wname}: {n} rate-key 429s with code {code}")
            occ_ok = sum(1 for q in rows if q["s"] == "occ" and q.get("st") == 200)
            in_window = [s for s in samples if a <= s["t"] < b]
            occ_peak = max((s.get("sim_in_flight") or 0 for s in in_window), default=None)
            peak_text = "-" if occ_peak is None else f"{occ_peak:g}"
            table.append((p["name"], wname, f"{secs:.1f}", "/".join(map(str, per_router)),
                          str(site), str(bound), str(usable) if usable else "-", str(refused),
                          str(sum(other.values())), str(noans), str(occ_ok), peak_text, ""))
            rows_out.append({"phase": p["name"], "window": wname, "seconds": round(secs, 2),
                             "rate_admitted_by_router": per_router, "rate_admitted": site,
                             "rate_bound": bound, "rate_usable_min": usable,
                             "other_statuses": dict(other), "unanswered": noans,
                             "occ_admitted": occ_ok, "occ_in_flight_peak_sampled": occ_peak})
            if other:
                notes.append(f"{p['name']}/{wname}: other answers {dict(other)}")

    # Daily keys: one per phase, spent from its fault on.
    day_table = []
    for p in phases:
        key = f"sk-day-{p['name']}"
        rows = [q for q in requests if q.get("k") == key]
        if not rows:
            continue
        spent = sum(q.get("tok") or 0 for q in rows if q.get("st") == 200)
        per_router = [sum(q.get("tok") or 0 for q in rows if q.get("st") == 200 and q["r"] == r)
                      for r in range(routers)]
        # One round's usage at the offered load: what every router may admit in a round past
        # the last one it saw (its share, at least the round's first request), each request
        # costing its prompt and its answer.
        per_round = math.ceil(settings["day_rps"] * interval) + 1
        bound = daily + routers * per_round * cost_max
        refused = Counter(q.get("code") for q in rows if q.get("st") == 429)
        first_refusal = min((q["t"] for q in rows if q.get("code") == "token_limit_exceeded"),
                            default=None)
        if spent > bound:
            violations.append(f"{p['name']}: daily key {key} spent {spent} {per_router} of "
                              f"{daily} (bound {bound}: one round's usage of every router)")
        # Refused while a tenth of the budget was still unspent: it is not usable again. A phase
        # too short for its load to spend the budget refuses nothing and breaks no bound.
        if spent < 0.9 * daily and sum(refused.values()) > 0:
            violations.append(f"{p['name']}: daily key {key} spent only {spent} {per_router} of "
                              f"{daily} by the end of the phase, and refused {dict(refused)}: "
                              f"the budget is not usable again")
        # The seed's rule for an outage: each router spends at most what was left at the
        # outage's start divided by the routers.
        # A hang of the store cuts every router off; a partition cuts router 0 alone, and
        # store-cut-kill its route to the store (its run killed and restarted while cut off).
        cut_off = {"store-stop": range(routers), "partition": [0], "store-cut-kill": [0]}
        outage = None
        if p["name"] in cut_off and p.get("fault") and p.get("heal"):
            outage = (p["fault"], p["heal"])
        if outage:
            before = sum(q.get("tok") or 0 for q in rows if q.get("st") == 200 and q["t"] < outage[0])
            left = max(daily - before, 0)
            during = [sum(q.get("tok") or 0 for q in rows if q.get("st") == 200 and q["r"] == r
                          and outage[0] <= q["t"] < outage[1]) for r in range(routers)]
            share = left / routers
            for r in cut_off[p["name"]]:
                if during[r] > share + per_round * cost_max:
                    violations.append(f"{p['name']}: router {r} spent {during[r]} of daily key "
                                      f"{key} while cut off from the store; its share of the "
                                      f"{left} left is {share:.0f} (+ one round "
                                      f"{per_round * cost_max})")
            notes.append(f"{p['name']}: daily key spent while cut off {during}, share of the "
                         f"{left} left {share:.0f} each")
        day_table.append((p["name"], key, str(spent), "/".join(map(str, per_router)), str(daily),
                          str(bound), ",".join(f"{k}:{v}" for k, v in refused.items()) or "-",
                          "-" if first_refusal is None or not p.get("fault")
                          else f"{first_refusal - p['fault']:.1f}"))

    # The engine: budget model's peak.
    peak = max((s.get("sim_running_peak") or 0 for s in samples), default=None)
    served = max((s.get("sim_requests_total") or 0 for s in samples), default=None)
    if peak is None:
        violations.append("no engine sample of the budget model: sim_running_peak unknown")
    elif peak > budget:
        violations.append(f"the budget model's engine ran {peak:g} requests at once; "
                          f"max_inflight is {budget}")

    # The routers' scrapes: reaped must stay 0 in every scrape of every run.
    reaped_max = defaultdict(float)
    scraped = Counter()
    for path in sorted(glob.glob(os.path.join(args.metrics_dir, "*.txt"))):
        text = open(path).read()
        m = re.search(r"-r(\d+)\.txt$", path)
        if not m or not text.strip():
            continue
        r = int(m.group(1))
        value = metric(text, "hivenet_admission_reaped_total")
        if value is None:
            violations.append(f"{os.path.basename(path)}: no hivenet_admission_reaped_total series")
            continue
        scraped[r] += 1
        reaped_max[r] = max(reaped_max[r], value)
    for r in range(routers):
        if reaped_max[r] > 0:
            violations.append(f"router {r}: hivenet_admission_reaped_total {reaped_max[r]:g}")
        if scraped[r] == 0:
            violations.append(f"router {r}: never scraped")

    widths = [max(len(str(row[i])) for row in [header] + table) for i in range(len(header))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print("rate 200 by router: the rate key's admissions per router; bound: rate x secs + burst + "
          "one round's shares; min: 90 % of the rate (after healing); occ peak: the budget "
          "model's requests at the engine, sampled every 200 ms")
    dheader = ("phase", "daily key", "spent", "by router", "limit", "bound", "429 codes",
               "spent out at s")
    dwidths = [max(len(str(row[i])) for row in [dheader] + day_table) for i in range(len(dheader))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(dheader, dwidths)))
    for row in day_table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, dwidths)))
    print()
    print(f"engine (budget model): sim_running_peak {peak if peak is None else f'{peak:g}'} "
          f"(max_inflight {budget}); requests served {served if served is None else f'{served:g}'}")
    print("hivenet_admission_reaped_total, largest scrape per router: "
          + ", ".join(f"r{r} {reaped_max[r]:g} ({scraped[r]} scrapes)" for r in range(routers)))
    if excused:
        print("requests cut while the orchestrator had the router down (excused): "
              + ", ".join(f"r{r} {err} {n}" for (r, err), n in sorted(excused.items())))
    for note in notes:
        print(f"note: {note}")
    with open(args.json_out, "w") as f:
        json.dump({"windows": rows_out, "daily": day_table, "engine_peak": peak,
                   "violations": violations, "notes": notes}, f, indent=1)
    print()
    if violations:
        print("BOUNDS BROKEN:")
        for v in violations:
            print(f"  - {v}")
        return 1
    print("every bound held")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    load = sub.add_parser("load")
    load.add_argument("--targets", required=True, help="ROUTER=HOST:PORT,...")
    load.add_argument("--out", required=True)
    load.add_argument("--stop-file", required=True)
    load.add_argument("--day-key-file", required=True)
    load.add_argument("--rate-key", required=True)
    load.add_argument("--occ-key", required=True)
    load.add_argument("--model", default="sim-model")
    load.add_argument("--budget-model", default="budget-model")
    load.add_argument("--rate-rps", type=float, default=15)
    load.add_argument("--day-rps", type=float, default=2)
    load.add_argument("--occ-rps", type=float, default=20)
    load.add_argument("--timeout", type=float, default=30)
    load.add_argument("--inflight-max", type=int, default=2000)
    load.add_argument("--max-seconds", type=float, default=900)
    load.add_argument("--sample-url", default="")
    load.add_argument("--sample-out", default="")
    report = sub.add_parser("report")
    report.add_argument("--settings", required=True)
    report.add_argument("--events", required=True)
    report.add_argument("--requests", nargs="+", required=True)
    report.add_argument("--samples", nargs="*", default=[])
    report.add_argument("--metrics-dir", required=True)
    report.add_argument("--json-out", required=True)
    args = parser.parse_args()
    if args.cmd == "load":
        cmd_load(args)
        return 0
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())

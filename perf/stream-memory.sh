#!/usr/bin/env bash
# Memory per open stream of the router and the agent: STREAMS long streams held open at once
# through router -> agent -> sim (the sim pacing a token every 25 ms, a minute an answer), the
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
#                          '/tmp/before|' measures /tmp/before then the current build;
#                          'nginx2' measures nginx -> nginx -> sim instead (master and workers
#                          of both hops, in the "proxy" columns): '|nginx2'
#   SETTLE=3               seconds waited before each reading
#   PROMPT_BYTES=3000      the prompt's size (it is held while its stream is open)
#   ROUTER_ARGS=""         extra router flags for every variant
#   STEP=0                 > 0: then STEP more streams opened beside the first STREAMS, and a
#                          second reading: the slope (second reading less the first, over STEP)
#                          leaves out what a process allocates once, whatever the stream count
#                          (each shard's and thread heap's first pages, buffers kept for reuse),
#                          which the figure over the idle reading spreads over the streams. The
#                          agent's --capacity must hold both (AGENT_ARGS='--capacity 3000').
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
STEP=${STEP:-0}
# 2,400 tokens at 25 ms (a minute): every stream stays open for the whole reading.
OUTPUT_TOKENS=2400
SIM_ARGS="--ttft 20ms --itl 25ms $SIM_ARGS"

ulimit -n "$(ulimit -Hn)"
((2 * (STREAMS + STEP) + 200 <= $(ulimit -n))) || die "STREAMS=$STREAMS STEP=$STEP need more descriptors than ulimit -n"

ensure_pkg curl curl
build_release
check_ports_free
start_sim

# "rss_kb pss_kb" of the processes PIDS, summed
memory_of() { # pid...
  local pid rss=0 pss=0
  for pid in "$@"; do
    rss=$((rss + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")))
    pss=$((pss + $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")))
  done
  echo "$rss $pss"
}

# Opens COUNT streams on PORT in the background, each waiting for its first token; writes how
# many got one to MARKER, then holds them open until killed (at most 90 s more).
CLIENTS=()
open_streams() { # port count marker
  timeout 180 python3 - "$1" "$2" "$PROMPT_BYTES" "$MODEL" "$BENCH_API_KEY" "$3" <<'PY' &
import asyncio, json, sys, time
port, n, prompt, model, key, marker = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
body = json.dumps({"model": model, "stream": True, "max_tokens": 2400,
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
    await asyncio.sleep(90)
asyncio.run(main())
PY
  CLIENTS+=($!)
}

# Opens COUNT more streams on PORT, waits for their first tokens, reads the memory of PIDS:
# sets OPENED and READING.
open_and_read() { # label port count marker pids...
  local label=$1 port=$2 count=$3 marker=$4
  shift 4
  open_streams "$port" "$count" "$marker"
  wait_until 90 "$count streams to open" test -s "$marker"
  OPENED=$(cat "$marker")
  sleep "$SETTLE"
  READING=$(memory_of "$@")
  log "$label: $OPENED more open: $READING (rss pss kB)"
}

IFS='|' read -r -a variants <<<"$VARIANTS"
((${#variants[@]} > 0)) || variants=("")
# `read` drops a trailing empty field: '/tmp/before|' is /tmp/before, then the current build.
[[ $VARIANTS == *'|' ]] && variants+=("")
ROWS=()
index=0
for variant in "${variants[@]}"; do
  if [[ $variant == nginx2 ]]; then
    label="nginx → nginx"
    ensure_pkg nginx nginx
    start_nginx
    port=${NGINX2_STREAM##*:}
    read -r -a proxy <<<"$(nginx_pids | paste -sd' ')"
    helper=()
  else
    label=${variant:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo target/release)}
    start_router_stack "${variant:+@$variant }--auth-config-file $PERF/auth-bench.yaml --max-client-connections $((STREAMS + STEP + 1000)) $ROUTER_ARGS" "$index"
    port=${ROUTER_HTTP##*:}
    proxy=("${PID[router]}")
    helper=("${PID[agent]}")
  fi
  sleep "$SETTLE"
  idle=("$(memory_of "${proxy[@]}")" "$(memory_of "${helper[@]}")")
  log "$label: idle ${idle[0]}, agent ${idle[1]} (rss pss kB)"
  # Open every stream, wait for each one's first token, then read while all are open.
  open_and_read "$label" "$port" "$STREAMS" "$WORK/open-$index" "${proxy[@]}"
  opened=$OPENED
  open=("$READING" "$(memory_of "${helper[@]}")")
  stepped=0 step=("${open[@]}")
  if ((STEP > 0)); then
    open_and_read "$label" "$port" "$STEP" "$WORK/step-$index" "${proxy[@]}"
    stepped=$OPENED
    step=("$READING" "$(memory_of "${helper[@]}")")
  fi
  kill "${CLIENTS[@]}" 2>/dev/null || true
  wait "${CLIENTS[@]}" 2>/dev/null || true
  CLIENTS=()
  ROWS+=("$label|$opened|${idle[0]}|${open[0]}|${idle[1]}|${open[1]}|$stepped|${step[0]}|${step[1]}")
  if [[ $variant == nginx2 ]]; then stop_proc nginx; else stop_router_stack; fi
  index=$((index + 1))
done

# One table, from lines "label|count|proxy before|proxy after|agent before|agent after": each
# variant's memory of COUNT streams, the reading after less the reading before.
table() { # title count-heading
  echo
  echo "## $1"
  echo
  echo "| variant | $2 | proxy B/stream (RSS / Pss) | agent B/stream (RSS / Pss) | proxy + agent (RSS) |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  local label count pb pa hb ha proxy_b helper_b
  while IFS='|' read -r label count pb pa hb ha; do
    ((count > 0)) || { echo "| $label | 0 | – | – | – |"; continue; }
    proxy_b=$(per_unit "$pa" "$pb" "$count" 0)
    helper_b=$(per_unit "$ha" "$hb" "$count" 0)
    echo "| $label | $count | $proxy_b / $(per_unit "$pa" "$pb" "$count" 1) | $helper_b / $(per_unit "$ha" "$hb" "$count" 1) | $((proxy_b + helper_b)) |"
  done
}

echo
echo "The proxy is the router, or both nginx hops' master and workers (nginx has no agent: 0)."
for row in "${ROWS[@]}"; do
  IFS='|' read -r label opened ib ob ih oh _ _ _ <<<"$row"
  echo "$label|$opened|$ib|$ob|$ih|$oh"
done | table "Memory per open stream ($SHARDS shards, prompt $PROMPT_BYTES B)" open
((STEP > 0)) || exit 0
for row in "${ROWS[@]}"; do
  IFS='|' read -r label _ _ ob _ oh stepped sb sh <<<"$row"
  echo "$label|$stepped|$ob|$sb|$oh|$sh"
done | table "The slope: memory of $STEP more open streams beside the first $STREAMS" "more open"

#!/usr/bin/env bash
# Chaos run of occupancy credits (docs/several-routers.md): three routers of one site share a
# model's request budget (max_inflight: BUDGET) through one Valkey; one agent has a session with
# every router; one sim engine serves the model with slow answers. Each router is offered far more
# than the budget while faults happen: a router crashes and comes back under its ID, the store
# restarts without its data, the store hangs for a few seconds.
#
# Reports the most requests the engine ever ran at once (hivenet-sim's sim_running_peak) against
# the budget, and what each router answered. The target is a peak within the budget: none of the
# seed's stated excesses (a router cut off from the store when it lost its data) is provoked here.
#
# FAULTS=stall runs one fault instead: the store hangs (SIGSTOP) for STALL seconds a third of the
# way in, and reports what each router admitted and refused during the hang, against its share of
# the budget (issue 37: before the fix, routers refused almost everything 3.5 s into a hang).
#
# Environment: BUDGET=8  RATE=60 (per router, req/s)  DURATION=30  SKIP_BUILD=0  KEEP_TMP=0
#              PORT_BASE=26000  FAULTS=all|stall  STALL=10
set -Eeuo pipefail

LOG_TAG=credits-chaos
PORT_BASE=${PORT_BASE:-26000}
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BUDGET=${BUDGET:-8}
RATE=${RATE:-60}
DURATION=${DURATION:-30}
ROUTERS=3

http_port() { echo $((PORT_BASE + 100 + $1)); }
grpc_port() { echo $((PORT_BASE + 110 + $1)); }
metrics_port() { echo $((PORT_BASE + 120 + $1)); }
p2p_port() { echo $((PORT_BASE + 130 + $1)); }

start_router() { # index
  local i=$1 dir="$WORK/router-$1"
  mkdir -p "$dir"
  HIVENET_ROUTER_AUDIT_LOG_PATH=/dev/null start_bg "router$i" "$WORK/router-$i-$SECONDS.log" \
    "$BIN/hivenet-router" --http-port "$HOST:$(http_port "$i")" --grpc-port "$HOST:$(grpc_port "$i")" \
    --metrics-port "$HOST:$(metrics_port "$i")" --p2p-port "$(p2p_port "$i")" \
    --identity-path "$dir/router.key" --shards 1 --policy-model-dir "$WORK/policies" \
    --request-timeout 5s --sync-store valkey --sync-valkey-addrs "127.0.0.1:$VALKEY_PORT" \
    --router-id "router-$i" --sync-interval 200ms --sync-min-routers "$ROUTERS"
  wait_until 30 "router $i" curl -s "http://$HOST:$(http_port "$i")/health"
}

ensure_stack_tools
build_release
command -v oha >/dev/null || cargo install oha --locked --quiet
start_valkey
valkey SET 'hivenet:{default}:epoch' 1-credits-chaos >/dev/null
mkdir -p "$WORK/policies"
printf 'models:\n  - %s\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: %s\n' \
  "$MODEL" "$BUDGET" >"$WORK/policies/$MODEL.yaml"
# About 400 ms an answer: at RATE per router, far more requests than the budget are offered.
SIM_ARGS="--itl 20ms" OUTPUT_TOKENS=20 start_sim
for i in $(seq 0 $((ROUTERS - 1))); do start_router "$i"; done
routers=$(for i in $(seq 0 $((ROUTERS - 1))); do printf '%s:%s,' "$HOST" "$(grpc_port "$i")"; done)
start_bg agent "$WORK/agent.log" "$BIN/hivenet-agent" --backend-url "http://$SIM_ADDR" \
  --routers "${routers%,}" --identity-path "$WORK/agent.key" --capacity 1000
for i in $(seq 0 $((ROUTERS - 1))); do
  wait_until 30 "the model on router $i" \
    bash -c "curl -sf 'http://$HOST:$(http_port "$i")/v1/models' | grep -q '\"$MODEL\"'"
done

log "offering $RATE req/s to each of $ROUTERS routers for ${DURATION}s (budget $BUDGET at once)"
for i in $(seq 0 $((ROUTERS - 1))); do
  start_bg "oha$i" "$WORK/oha-$i.json" oha --no-tui --output-format json -z "${DURATION}s" \
    -q "$RATE" -c 200 -m POST -T application/json -D "$JSON_BODY" \
    "http://$HOST:$(http_port "$i")/v1/chat/completions"
done
at() { while ((SECONDS - started < $1)); do sleep 0.1; done; }
started=$SECONDS
responses() { # router index, status code
  curl -s "http://$HOST:$(metrics_port "$1")/metrics" \
    | awk -v c="$2" '$1 ~ /^hivenet_shard_responses_total/ && $1 ~ "code=\""c"\"" { s += $2 } END { print s + 0 }'
}
if [[ ${FAULTS:-all} == stall ]]; then
  STALL=${STALL:-10}
  at $((DURATION / 3))
  for i in $(seq 0 $((ROUTERS - 1))); do ok0[i]=$(responses "$i" 200); no0[i]=$(responses "$i" 429); done
  log "fault: the store hangs for ${STALL} s"
  kill -STOP "${PID[valkey]}"
  sleep "$STALL"
  for i in $(seq 0 $((ROUTERS - 1))); do ok1[i]=$(responses "$i" 200); no1[i]=$(responses "$i" 429); done
  kill -CONT "${PID[valkey]}"
  echo
  echo "during the ${STALL} s hang (budget $BUDGET at once, $ROUTERS routers: a share of $((BUDGET / ROUTERS)) or more each)"
  for i in $(seq 0 $((ROUTERS - 1))); do
    echo "router $i: $((ok1[i] - ok0[i])) admitted, $((no1[i] - no0[i])) refused (429)"
  done
fi
[[ ${FAULTS:-all} == stall ]] || {
  at $((DURATION / 5))
  log "fault: router 1 crashes (SIGKILL)"
  kill -KILL "${PID[router1]}"
  at $((DURATION * 3 / 10))
  log "fault: router 1 restarts under its ID"
  start_router 1
  at $((DURATION / 2))
  log "fault: the store restarts without its data"
  kill -KILL "${PID[valkey]}"
  wait "${PID[valkey]}" 2>/dev/null || true
  start_bg valkey "$WORK/valkey-2.log" "$VALKEY" --port "$VALKEY_PORT" --save "" --appendonly no
  at $((DURATION * 7 / 10))
  log "fault: the store hangs for 3 s"
  kill -STOP "${PID[valkey]}"
  sleep 3
  kill -CONT "${PID[valkey]}"
}
for i in $(seq 0 $((ROUTERS - 1))); do wait "${PID[oha$i]}" || true; unset "PID[oha$i]"; done

peak=$(curl -s "http://$SIM_ADDR/metrics" | awk -v m="$MODEL" '$1 ~ "^sim_running_peak" && $1 ~ m { print $2 }')
echo
echo "router  answered  2xx   429   other"
for i in $(seq 0 $((ROUTERS - 1))); do
  python3 - "$WORK/oha-$i.json" "$i" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
codes = report.get("statusCodeDistribution", {})
ok = sum(v for k, v in codes.items() if k.startswith("2"))
refused = codes.get("429", 0)
print(f"{sys.argv[2]:>6} {sum(codes.values()):>9} {ok:>5} {refused:>5} {sum(codes.values()) - ok - refused:>7}")
PY
done
for i in $(seq 0 $((ROUTERS - 1))); do
  curl -s "http://$HOST:$(metrics_port "$i")/metrics" \
    | grep -E '^hivenet_occupancy_credit_(reclaims|errors)_total|^hivenet_admission_reaped_total' \
    | sed "s/^/router $i: /" || true
done
echo
echo "engine peak: $peak requests running at once; budget $BUDGET"
if awk -v p="$peak" -v b="$BUDGET" 'BEGIN { exit !(p > b) }'; then
  echo "OVER BUDGET by $(awk -v p="$peak" -v b="$BUDGET" 'BEGIN { print p - b }')"
  exit 1
fi

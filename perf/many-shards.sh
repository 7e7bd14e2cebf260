#!/usr/bin/env bash
# Many shards on few cores: for each router configuration given as an argument (bench.sh's
# variant syntax, e.g. '@/tmp/build --shards 64'), start router + agent + sim, report how long the
# stack took to come up (the agent's tunnel to every shard) and the router's and agent's RSS, run
# wrk for DURATION seconds (JSON, CONNECTIONS connections, auth and limits on, one key), then the
# scrape's size and time, the mesh's counters (rings full, messages deferred and dropped), the
# tunnels open and the RSS after. Shards are not pinned. Needs a release build (SKIP_BUILD=1 uses
# the one in target/release) and wrk.
#
#   perf/many-shards.sh '--shards 2' '--shards 64' '--shards 128'
#
# Environment: DURATION (10), CONNECTIONS (256), and perf/lib.sh's (SKIP_BUILD, PORT_BASE, ...).
set -Eeuo pipefail

LOG_TAG=many-shards
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-256}
(($# > 0)) || die "give one or more router configurations, e.g. '--shards 64'"
ensure_pkg curl curl
ensure_pkg wrk wrk
build_release
start_sim
for v in "$@"; do
  t0=$(date +%s.%N)
  start_router_stack "$v --auth-config-file $PERF/auth-bench.yaml --pin-shards false" 0
  t1=$(date +%s.%N)
  echo "== $v: stack up in $(calc "$t1 - $t0" 2) s; router RSS $(awk '$1=="VmRSS:"{print $2}' /proc/${PID[router]}/status) KiB, agent $(awk '$1=="VmRSS:"{print $2}' /proc/${PID[agent]}/status) KiB"
  WRK_BODY_FILE=$JSON_BODY timeout $((DURATION + 30)) wrk -t 2 -c "$CONNECTIONS" -d "${DURATION}s" \
    --timeout 10s -s "$PERF/wrk-post.lua" "http://$ROUTER_HTTP/v1/chat/completions" >"$WORK/wrk.out" 2>&1 || true
  grep -E "Requests/sec|Non-2xx|Socket errors" "$WORK/wrk.out" || true
  s0=$(date +%s.%N)
  curl -s "http://$ROUTER_METRICS/metrics" >"$WORK/metrics.txt"
  s1=$(date +%s.%N)
  echo "scrape $(wc -c <"$WORK/metrics.txt") B in $(calc "$s1 - $s0" 3) s"
  grep -E "^hivenet_shard_mesh_(full_total|dropped_total|deferred)|^hivenet_shard_tunnels_open" "$WORK/metrics.txt" |
    awk '{split($1, a, "{"); s[a[1]] += $2} END {for (k in s) print k, s[k]}'
  echo "after: router RSS $(awk '$1=="VmRSS:"{print $2}' /proc/${PID[router]}/status) KiB, agent $(awk '$1=="VmRSS:"{print $2}' /proc/${PID[agent]}/status) KiB"
  stop_router_stack
done

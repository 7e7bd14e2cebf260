#!/usr/bin/env bash
# Memory of the router: bytes per API key (loaded from auth.yaml, then after one request with each
# key, when its quota holder exists) and bytes per idle client connection (opened without a
# request, then after one request each). Resident memory is read from /proc: VmRSS
# (/proc/PID/status), Pss and Private_Dirty (/proc/PID/smaps_rollup). See perf/README.md, "Memory".
#
# Environment (all optional; perf/lib.sh lists the stack's: SHARDS, PORT_BASE, SKIP_BUILD,
# SKIP_INSTALL, KEEP_TMP):
#   KEYS="0 10000 100000"   key counts, one router each (the first is the baseline; each file
#                          also holds the bench key the readiness check uses)
#   CONNS=10000            idle client connections opened on the first key count's router (0: skip)
#   CONCURRENCY=32         connections the client sends its requests on
#   SETTLE=2               seconds waited before each reading
#   ROUTER_ARGS=""         extra router flags
#   ROUTER_DIR=""          run DIR/hivenet-router and DIR/hivenet-agent instead of target/release
#                          (before vs after: an older build saved in /tmp/before)
#   AUTH_MODE=static       static: keys in auth.yaml; dynamic: the same keys loaded into the
#                          dynamic registry with one POST /admin/api-keys/replace once the router
#                          answers (the 16 MiB body limit holds about 60,000 keys: KEYS="0 50000")
#   ADMIN_WRITES=100       AUTH_MODE=dynamic: admin writes timed once the keys are loaded (a new
#                          key's PUT, then its DELETE, in turn; 0: none), reported per key count
# The router's allocator (mimalloc) keeps freed pages a while before giving them back; loading a
# large auth.yaml frees its parse tree, so the "loaded" figure includes pages the next
# allocations reuse. MIMALLOC_PURGE_DELAY=0 in the environment makes it give them back at once:
# the figure is then closer to the live data. The "touched" figure is the steady state.
#
# Bounded: each router start, key pass and connection pass has a timeout (perf/lib.sh's waits,
# TIMEOUT per request in perf/memory.py); the trap stops every process on exit.
set -Eeuo pipefail

LOG_TAG=memory
# shellcheck source=perf/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KEYS=${KEYS:-0 10000 100000}
CONNS=${CONNS:-10000}
export CONCURRENCY=${CONCURRENCY:-32}
export SETTLE=${SETTLE:-2}
ROUTER_ARGS=${ROUTER_ARGS:-}
ROUTER_DIR=${ROUTER_DIR:-}
AUTH_MODE=${AUTH_MODE:-static}
ADMIN_WRITES=${ADMIN_WRITES:-100}
export MODEL
case $AUTH_MODE in
  static) ;;
  dynamic)
    export ADMIN_API_KEY=memory-admin HIVENET_ROUTER_AUTH_MODE=dynamic
    export HIVENET_ROUTER_ADMIN_API_KEYS=$ADMIN_API_KEY
    load_dynamic_keys() { timeout 120 python3 "$PERF/memory.py" replace "${ROUTER_HTTP##*:}" "$1"; }
    ROUTER_STARTED_HOOK=load_dynamic_keys
    ;;
  *) die "AUTH_MODE is static or dynamic" ;;
esac

# Each connection is a descriptor in the router and in the client.
ulimit -n "$(ulimit -Hn)"
(( CONNS + 100 <= $(ulimit -n) )) || die "CONNS=$CONNS needs more descriptors than ulimit -n ($(ulimit -n))"

ensure_pkg curl curl
build_release
check_ports_free
start_sim

# "rss_kb pss_kb private_dirty_kb" of the router, after SETTLE seconds.
router_memory() {
  sleep "$SETTLE"
  local pid=${PID[router]}
  awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" | tr '\n' ' '
  awk '/^Pss:/ {pss=$2} /^Private_Dirty:/ {dirty=$2} END {print pss, dirty}' "/proc/$pid/smaps_rollup"
}

declare -A MEM=()   # "<keys>.<phase>" and "conns.<phase>" -> "rss pss dirty" (kB)
declare -A WRITES=()  # "<keys>" -> "count p50 p99 max" (ms) of the timed admin writes
FIRST=""
for n in $KEYS; do
  [[ -n $FIRST ]] || FIRST=$n
  auth_flags=""
  if [[ $AUTH_MODE == static ]]; then
    python3 "$PERF/memory.py" auth "$WORK/auth-$n.yaml" "$n"
    auth_flags="--auth-config-file $WORK/auth-$n.yaml"
  fi
  start_router_stack "${ROUTER_DIR:+@$ROUTER_DIR }$auth_flags --client-header-timeout 1h --max-client-connections $((CONNS + 1000)) $ROUTER_ARGS" "$n"
  MEM[$n.loaded]=$(router_memory)
  log "$n keys loaded: rss pss dirty (kB) = ${MEM[$n.loaded]}"
  if [[ $AUTH_MODE == dynamic && $ADMIN_WRITES -gt 0 ]]; then
    WRITES[$n]=$(timeout 300 python3 "$PERF/memory.py" writes "${ROUTER_HTTP##*:}" "$ADMIN_WRITES")
    log "$n keys, admin writes: count p50 p99 max (ms) = ${WRITES[$n]}"
  fi
  timeout $((120 + n / 100)) python3 "$PERF/memory.py" touch "${ROUTER_HTTP##*:}" "$n"
  MEM[$n.touched]=$(router_memory)
  log "$n keys touched: rss pss dirty (kB) = ${MEM[$n.touched]}"
  if [[ $n == "$FIRST" && $CONNS -gt 0 ]]; then
    timeout $((120 + CONNS / 50)) python3 "$PERF/memory.py" connections "${ROUTER_HTTP##*:}" \
      "${PID[router]}" "$CONNS" "$WORK/conns.txt"
    while read -r phase rss pss dirty; do
      MEM[conns.$phase]="$rss $pss $dirty"
      log "$CONNS connections, $phase: rss pss dirty (kB) = ${MEM[conns.$phase]}"
    done <"$WORK/conns.txt"
  fi
  stop_router_stack
done

echo
echo "## Router memory (${ROUTER_DIR:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')}, $SHARDS shards, $AUTH_MODE keys${MIMALLOC_PURGE_DELAY:+, MIMALLOC_PURGE_DELAY=$MIMALLOC_PURGE_DELAY})"
echo
echo "| case | VmRSS kB | Pss kB | Private_Dirty kB | B per key (RSS) | B per key (Pss) | B per key (Private_Dirty) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in $KEYS; do
  for phase in loaded touched; do
    read -r -a m <<<"${MEM[$n.$phase]}"
    per="| |"
    if [[ $n != "$FIRST" ]]; then
      base=${MEM[$FIRST.$phase]}
      units=$((n - FIRST))
      per="$(per_unit "${MEM[$n.$phase]}" "$base" "$units" 0) | $(per_unit "${MEM[$n.$phase]}" "$base" "$units" 1) | $(per_unit "${MEM[$n.$phase]}" "$base" "$units" 2)"
    fi
    echo "| $n keys, $phase | ${m[0]} | ${m[1]} | ${m[2]} | $per |"
  done
done
if [[ $CONNS -gt 0 ]]; then
  echo
  echo "| $CONNS client connections ($FIRST keys) | VmRSS kB | Pss kB | Private_Dirty kB | B per conn (RSS) | B per conn (Pss) | B per conn (Private_Dirty) |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for phase in none idle after_request; do
    read -r -a m <<<"${MEM[conns.$phase]}"
    per="| |"
    if [[ $phase != none ]]; then
      base=${MEM[conns.none]}
      per="$(per_unit "${MEM[conns.$phase]}" "$base" "$CONNS" 0) | $(per_unit "${MEM[conns.$phase]}" "$base" "$CONNS" 1) | $(per_unit "${MEM[conns.$phase]}" "$base" "$CONNS" 2)"
    fi
    echo "| $phase | ${m[0]} | ${m[1]} | ${m[2]} | $per |"
  done
fi
if [[ ${#WRITES[@]} -gt 0 ]]; then
  echo
  echo "| dynamic keys | admin writes (PUT, DELETE in turn) | p50 ms | p99 ms | max ms |"
  echo "| ---: | ---: | ---: | ---: | ---: |"
  for n in $KEYS; do
    read -r -a w <<<"${WRITES[$n]}"
    echo "| $n | ${w[0]} | ${w[1]} | ${w[2]} | ${w[3]} |"
  done
fi

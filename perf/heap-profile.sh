#!/usr/bin/env bash
# Where the router's heap goes under a perf script's load: the router built with the system
# allocator (feature `system-allocator`: heaptrack cannot see mimalloc), started by the perf script
# under heaptrack, then heaptrack_print's peak consumers, condensed to their first `src/` frames
# (perf/notes/2026-12-07-memory-under-churn.md is what it found first).
#
#   perf/heap-profile.sh                          # llm-load.sh, router only, 1,000 open streams
#   SCRIPT_ENV="STEP=0" perf/heap-profile.sh perf/stream-memory.sh
#
# The script given must start the router from $BIN and honour SKIP_BUILD and OUT (llm-load.sh,
# stream-memory.sh, bench.sh do), and stop it with SIGTERM (perf/lib.sh does): the router's exit
# is what completes heaptrack's data.
#
# Environment (all optional):
#   SCRIPT_ENV="TARGETS=router OPEN=1000 HOLD=10"   the script's environment (this default for
#                 llm-load.sh, none for the others)
#   TARGET_DIR=target/heap-profile   the profiling build (release, no LTO, line tables)
#   SKIP_BUILD=0  1: use the binaries already in TARGET_DIR and target/release
#   OUT=perf/results/heap-<UTC timestamp>   router.<pid>.gz (heaptrack's data), peaks-<pid>.txt
#                 (heaptrack_print), consumers-<pid>.txt (condensed), run/ (the script's output)
#   PEAKS=25      peak consumers listed
# Needs heaptrack (Debian: heaptrack). The agent and the sim come from target/release.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=$(readlink -f "${1:-$ROOT/perf/llm-load.sh}")
if [[ $(basename "$SCRIPT") == llm-load.sh ]]; then
  SCRIPT_ENV=${SCRIPT_ENV-TARGETS=router OPEN=1000 HOLD=10}
else
  SCRIPT_ENV=${SCRIPT_ENV-}
fi
TARGET_DIR=${TARGET_DIR:-$ROOT/target/heap-profile}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-$ROOT/perf/results/heap-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PEAKS=${PEAKS:-25}

log() { echo "[heap-profile $(date +%H:%M:%S)] $*" >&2; }

for tool in heaptrack heaptrack_print gzip setsid; do
  command -v "$tool" >/dev/null || { log "$tool is missing (Debian: apt-get install heaptrack)"; exit 1; }
done
HEAPTRACK_LIB=$(readlink -f "$(dirname "$(readlink -f "$(command -v heaptrack)")")/../lib/heaptrack")
PRELOAD=$HEAPTRACK_LIB/libheaptrack_preload.so
INTERPRETER=$HEAPTRACK_LIB/libexec/heaptrack_interpret
[[ -f $PRELOAD && -x $INTERPRETER ]] || { log "heaptrack's preload library or interpreter not found under $HEAPTRACK_LIB"; exit 1; }

if [[ $SKIP_BUILD != 1 ]]; then
  log "building the agent and the sim (target/release) and the router with the system allocator ($TARGET_DIR)"
  (cd "$ROOT" && cargo build --release --bin hivenet-agent --bin hivenet-sim)
  (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
    cargo build --release --features system-allocator --bin hivenet-router)
fi

# The BIN the script sees: the agent and the sim as built, the router behind a wrapper that
# keeps the router's pid (exec) so the script's SIGTERM reaches it, with heaptrack's preload
# library writing into a fifo that heaptrack's interpreter reads into a gzip of its own.
mkdir -p "$OUT/bin"
ln -sf "$ROOT/target/release/hivenet-agent" "$OUT/bin/hivenet-agent"
ln -sf "$ROOT/target/release/hivenet-sim" "$OUT/bin/hivenet-sim"
cat >"$OUT/bin/hivenet-router" <<EOF
#!/usr/bin/env bash
out="$OUT/router.\$\$"
rm -f "\$out.fifo" && mkfifo "\$out.fifo"
setsid bash -c '"\$0" < "\$1" | gzip > "\$2"' "$INTERPRETER" "\$out.fifo" "\$out.gz" </dev/null >/dev/null 2>&1 &
exec env LD_PRELOAD="$PRELOAD" DUMP_HEAPTRACK_OUTPUT="\$out.fifo" "$TARGET_DIR/release/hivenet-router" "\$@"
EOF
chmod +x "$OUT/bin/hivenet-router"

log "running $SCRIPT ($SCRIPT_ENV) with the router under heaptrack"
# shellcheck disable=SC2086 # SCRIPT_ENV is a list of assignments
env $SCRIPT_ENV BIN="$OUT/bin" SKIP_BUILD=1 OUT="$OUT/run" "$SCRIPT" >"$OUT/script.log" 2>&1 ||
  log "WARNING: $SCRIPT exited with $? (see $OUT/script.log); profiles written so far follow"

# The interpreters finish once their router has exited: wait for them, bounded.
for _ in $(seq 120); do
  pgrep -f "$INTERPRETER" >/dev/null || break
  sleep 0.5
done
rm -f "$OUT"/router.*.fifo

shopt -s nullglob
profiles=("$OUT"/router.*.gz)
((${#profiles[@]})) || { log "no heaptrack data in $OUT (did the router start?)"; exit 1; }
for profile in "${profiles[@]}"; do
  pid=${profile##*/router.}
  pid=${pid%.gz}
  heaptrack_print -f "$profile" --print-peaks 1 --print-allocators 0 --print-temporary 0 \
    --print-leaks 0 --peak-limit "$PEAKS" >"$OUT/peaks-$pid.txt" 2>&1
  # Each consumer's size and call count, then its first four frames in a `src/` path (this
  # crate's, or a dependency's that was built with relative paths).
  awk '/consumed over .* calls from/ { if (n >= 0) print line; line = $0; n = 0; next }
       /^ +at src\// && n < 4 { line = line " | " $2; n++ }
       END { if (n >= 0) print line }' n=-1 "$OUT/peaks-$pid.txt" >"$OUT/consumers-$pid.txt"
  log "router $pid: the peak's consumers ($OUT/consumers-$pid.txt):"
  head -n 12 "$OUT/consumers-$pid.txt" >&2
done
log "results in $OUT"

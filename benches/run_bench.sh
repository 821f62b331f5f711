#!/usr/bin/env bash
# redis-mem benchmark (the `make bench` entry point).
#
#   benches/run_bench.sh [--quick] [--parts 5,1,2,3,4,6] [--perf]
#   benches/run_bench.sh --density-only [density.py options]   (`make density`)
#   benches/run_bench.sh --instructions-only [instructions.py options]   (`make instructions`)
#
# Builds the release module, prepares a Python venv with redis-py
# (target/venv if it exists, else target/venv-bench), runs the tokenizer bench
# (cargo bench --bench tokenizer), then benches/bench.py, which starts its own
# redis-server on a free loopback port, prints one table and writes
# docs/PERFORMANCE.md (part 7, benches/agent_sim.py, simulates agents and summarizer
# workers for about 45 s), then benches/density.py (100,000 sessions against lists
# and JSON strings, per-command cost by session size; its own redis-servers, a
# kept section of docs/PERFORMANCE.md; 6-10 more minutes). About 10-15 minutes
# on a shared 2-core machine (plus the first compilation of the tokenizer bench). Extra
# arguments go to bench.py, or with --density-only to density.py alone.
set -u -o pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK="$ROOT/target/bench"
mkdir -p "$WORK"
START=$(date +%s)
log() { echo "[bench] $*" >&2; }
DENSITY_ONLY=""
if [ "${1:-}" = "--density-only" ]; then DENSITY_ONLY=1; shift; fi
INSTRUCTIONS_ONLY=""
if [ "${1:-}" = "--instructions-only" ]; then INSTRUCTIONS_ONLY=1; shift; fi

HARNESS=""
cleanup() {
    # The harness stops its own server on SIGTERM; then make sure of it.
    if [ -n "$HARNESS" ] && kill -0 "$HARNESS" 2>/dev/null; then
        kill -TERM "$HARNESS" 2>/dev/null || true
        wait "$HARNESS" 2>/dev/null || true
    fi
    local pidfile="$WORK/redis.pid" pid
    if [ -f "$pidfile" ]; then
        pid=$(cat "$pidfile" 2>/dev/null || true)
        if [ -n "$pid" ] && grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# --- tools -------------------------------------------------------------------
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v redis-benchmark >/dev/null 2>&1 || missing="$missing redis-tools"
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        log "installing:$missing"
        # RUNLEVEL=1 keeps Debian from starting its own redis-server on 6379.
        DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq $missing >/dev/null ||
            { log "apt-get install$missing failed"; exit 1; }
    else
        log "missing:$missing (install redis-tools / redis-server, or run as root)"; exit 1
    fi
fi

# --- module ------------------------------------------------------------------
log "cargo build --release"
if ! cargo build --release >"$WORK/build.log" 2>&1; then
    tail -20 "$WORK/build.log" >&2; log "build failed"; exit 1
fi
SO="$ROOT/target/release/libredis_mem.so"
[ -f "$SO" ] || { log "no $SO"; exit 1; }

# --- python ------------------------------------------------------------------
if [ -x "$ROOT/target/venv/bin/python" ]; then
    VENV="$ROOT/target/venv"
else
    VENV="$ROOT/target/venv-bench"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || { log "python3 -m venv failed"; exit 1; }
fi
# redis-py with its hiredis parser, as production Python clients run it (both
# the client-side way and MEM.APPEND are measured through the same client).
if ! "$VENV/bin/python" -c 'import redis, hiredis' 2>/dev/null; then
    log "pip install redis hiredis into $VENV"
    "$VENV/bin/python" -m pip install -q redis hiredis || { log "pip install redis hiredis failed"; exit 1; }
fi

# Runs a harness in the background and waits for it, so that a signal runs the trap at once.
harness() {
    "$@" &
    HARNESS=$!
    wait "$HARNESS"
    local rc=$?
    HARNESS=""
    return $rc
}

if [ -n "$INSTRUCTIONS_ONLY" ]; then
    # Under valgrind a server is ~50x slower: a run of 6,000 messages takes ~1-2 minutes.
    harness timeout --signal=TERM 1800 "$VENV/bin/python" "$ROOT/benches/instructions.py" \
        --module "$SO" "$@"
    rc=$?
    log "done in $(( $(date +%s) - START )) s"
    exit $rc
fi

if [ -n "$DENSITY_ONLY" ]; then
    if [ -n "${MAKELEVEL:-}" ]; then CMD="make density${*:+ DENSITY_ARGS=\"$*\"}"; else CMD="benches/run_bench.sh --density-only${*:+ $*}"; fi
    # With options (a partial or quicker run) it only prints, unless they say --out.
    OUT=(); [ $# -gt 0 ] || OUT=(--out "$ROOT/docs/PERFORMANCE.md")
    harness timeout --signal=TERM 1200 "$VENV/bin/python" "$ROOT/benches/density.py" \
        --module "$SO" --workdir "$WORK" "${OUT[@]}" --command "$CMD" "$@"
    rc=$?
    log "done in $(( $(date +%s) - START )) s"
    exit $rc
fi

# --- tokenizer bench (its failure is reported in the table) --------------------
log "cargo bench --bench tokenizer"
rm -f "$WORK/tokenizer.log"
if ! timeout 600 cargo bench --bench tokenizer >"$WORK/tokenizer.log" 2>"$WORK/tokenizer.err"; then
    log "tokenizer bench failed (see $WORK/tokenizer.err); going on"
fi

# --- server benchmarks ---------------------------------------------------------
if [ -n "${MAKELEVEL:-}" ]; then CMD="make bench"; else CMD="benches/run_bench.sh${*:+ $*}"; fi
export BENCH_PRE_SECS=$(( $(date +%s) - START ))
harness timeout --signal=TERM 900 "$VENV/bin/python" "$ROOT/benches/bench.py" \
    --module "$SO" --tokenizer-log "$WORK/tokenizer.log" --workdir "$WORK" \
    --out "$ROOT/docs/PERFORMANCE.md" --command "${BENCH_COMMAND:-$CMD}" "$@"
rc=$?

# --- many sessions, per-command cost by size (a kept section of the document) ---
log "benches/density.py"
QUICK=""
case " $* " in *" --quick "*) QUICK="--quick" ;; esac
harness timeout --signal=TERM 1200 "$VENV/bin/python" "$ROOT/benches/density.py" $QUICK \
    --module "$SO" --workdir "$WORK" --out "$ROOT/docs/PERFORMANCE.md" --command "${BENCH_COMMAND:-$CMD}"
drc=$?
[ $rc -ne 0 ] || rc=$drc
log "done in $(( $(date +%s) - START )) s"
exit $rc

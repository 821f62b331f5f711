#!/usr/bin/env bash
# Redis's own test suite (the tests/ of the Redis 8.0.2 source that
# `make test-compat` already fetches) run twice over the units below: once on
# a plain redis-server and once with the module loaded into every server the
# suite starts (`./runtest --config loadmodule <so>`). A test that fails with
# the module but passes without it is a module-caused failure: the script
# lists them and exits 1 if there is any.
#
#   tests/redis_suite/run.sh [UNIT...]     (default: all units below)
#   make redis-suite
#
# Environment:
#   REDIS_MEM_MODULE     the .so (default target/release/libredis_mem.so)
#   REDIS_SUITE_JOBS     runtest processes at a time (default 3); each runs one
#                        unit in its own copy of tests/ on its own port range
#   REDIS_SUITE_TIMEOUT  runtest --timeout, per test, seconds (default 1200)
#   REDIS_SUITE_RECHECK  1 (default): a unit with a module-only failure is run
#                        again both ways, alone, before it counts; 0: no rerun
#   REDIS_SUITE_DIR      work directory (default target/redis-suite)
#   REDIS_SUITE_ARGS     more runtest arguments for both runs (e.g. --dump-logs)
#
# How it runs: one `./runtest --single <unit> --clients 1 --durable` per unit
# and per side (plain, module), REDIS_SUITE_JOBS of them at once, the plain
# and the module run of a unit side by side (so both see the same machine
# load). --durable turns a test's exception into a failure of that test
# instead of aborting the unit; a unit that still dies (runtest exits non-zero
# without reporting a failed test) counts as one failure "<unit>: runtest
# exited N". Runtest's own parallelism (--clients) only spreads units over
# clients, so one unit per runtest with --clients 1 runs the same tests.
#
# What counts: a test (its "[err]: <name> in <file>" line) failing in the
# module run and not in the plain run. Flaky tests of this machine (failing
# in the plain run) never count. With REDIS_SUITE_RECHECK=1 every unit with
# such a test is run again, alone, both ways: a test counts only if it fails
# with the module both times and passes without it both times; the others are
# listed as "not reproduced" (timing on a loaded machine).
#
# Nothing is skipped by tag: every category of these units runs on a loopback
# machine (replication, AOF, RDB, DEBUG, fork). Tests tagged large-memory are
# skipped by runtest itself (no --large-memory), in both runs alike.
#
# The source tree: tests/compat/servers.sh redis-8.0 downloads trixie's
# redis_8.0.2.orig.tar.gz into target/compat/downloads and builds the
# binaries (it removes its build tree); this script extracts the same tarball
# into $REDIS_SUITE_DIR/redis-8.0.2 and puts those binaries in its src/
# (redis-server, redis-cli; redis-check-aof and redis-check-rdb are the
# server binary under another name, as `make` installs them). No second build.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
COMPAT="${REDIS_MEM_COMPAT_DIR:-$ROOT/target/compat}"
WORK="${REDIS_SUITE_DIR:-$ROOT/target/redis-suite}"
SO="${REDIS_MEM_MODULE:-$ROOT/target/release/libredis_mem.so}"
JOBS="${REDIS_SUITE_JOBS:-3}"
TIMEOUT="${REDIS_SUITE_TIMEOUT:-1200}"
RECHECK="${REDIS_SUITE_RECHECK:-1}"
read -r -a EXTRA <<<"${REDIS_SUITE_ARGS:-}"
VERSION=8.0.2

# The units of issue 18, by the names of the Redis tree's tests/ (slowest
# first, so that the long ones do not end the run alone).
UNITS_DEFAULT=(
    integration/replication
    integration/replication-psync
    integration/replication-4
    integration/replication-buffer
    integration/replication-rdbchannel
    integration/replication-2
    integration/replication-3
    unit/maxmemory
    unit/memefficiency
    unit/type/list
    unit/type/zset
    unit/type/hash-field-expire
    unit/type/stream
    unit/type/stream-cgroups
    unit/type/hash
    unit/type/set
    unit/type/list-3
    unit/type/list-2
    unit/type/string
    unit/type/incr
    unit/scripting
    unit/expire
    integration/aof
    integration/aof-multi-part
    integration/rdb
    unit/other
    unit/introspection
    unit/introspection-2
    unit/info
    unit/info-command
    unit/keyspace
    unit/dump
    unit/lazyfree
    unit/multi
    unit/latency-monitor
    unit/acl
    unit/acl-v2
    unit/pubsub
    unit/pubsubshard
    unit/shutdown
    integration/shutdown
    unit/slowlog
    unit/functions
)
if [ $# -gt 0 ]; then UNITS=("$@"); else UNITS=("${UNITS_DEFAULT[@]}"); fi

log() { echo "redis-suite: $*" >&2; }
die() { log "error: $*"; exit 2; }
now() { date +%s; }

[ -f "$SO" ] || die "no module at $SO (cargo build --release)"
command -v tclsh8.6 >/dev/null || command -v tclsh8.7 >/dev/null || command -v tclsh8.5 >/dev/null \
    || die "runtest needs tclsh 8.5+ (apt-get install tcl)"

# ------------------------------------------------------------ the source tree

line="$("$ROOT/tests/compat/servers.sh" redis-8.0)" || die "tests/compat/servers.sh redis-8.0 failed"
BIN="$(cut -f3 <<<"$line")"
CLI="$(cut -f4 <<<"$line")"
TARBALL="$COMPAT/downloads/redis_${VERSION}.orig.tar.gz"
[ -f "$TARBALL" ] || die "no $TARBALL (tests/compat/servers.sh keeps it there)"
TREE="$WORK/redis-$VERSION"
if [ ! -x "$TREE/runtest" ] || ! cmp -s "$BIN" "$TREE/src/redis-server"; then
    log "extracting $(basename "$TARBALL") into $TREE"
    rm -rf "$TREE"
    mkdir -p "$TREE"
    tar -xzf "$TARBALL" -C "$TREE" --strip-components=1 "redis-$VERSION/runtest" "redis-$VERSION/tests"
    mkdir -p "$TREE/src"
    cp "$BIN" "$TREE/src/redis-server"
    cp "$CLI" "$TREE/src/redis-cli"
    cp "$BIN" "$TREE/src/redis-check-aof"
    cp "$BIN" "$TREE/src/redis-check-rdb"
fi
for u in "${UNITS[@]}"; do
    [ -f "$TREE/tests/$u.tcl" ] || die "no unit $u in $TREE/tests"
done

# ------------------------------------------------------------------ the runs

RUN="$WORK/run"
rm -rf "$RUN"
mkdir -p "$RUN/plain" "$RUN/module" "$RUN/slots"

# One copy of the tree per slot: runtest cleans tests/tmp before and after a
# run, which would remove a concurrent run's servers.
slot_tree() {
    local d="$RUN/slots/$1"
    if [ ! -d "$d" ]; then
        mkdir -p "$d/src"
        cp -r "$TREE/tests" "$d/tests"
        cp "$TREE/runtest" "$d/"
        ln -s "$TREE"/src/* "$d/src/"
    fi
    echo "$d"
}

# runs one unit on one side in slot $3; ports: runtest uses [base, base+count)
# and the same +10000, its test clients [base-32, base): slot s gets its own.
run_unit() {
    local side="$1" unit="$2" slot="$3" out="$4"
    local d base t0 rc=0
    d="$(slot_tree "$slot")"
    base=$((12100 + slot * 1000))
    local args=(--single "$unit" --clients 1 --durable --timeout "$TIMEOUT"
        --baseport "$base" --portcount 800 "${EXTRA[@]}")
    [ "$side" = module ] && args+=(--config loadmodule "$SO")
    t0="$(now)"
    (cd "$d" && TERM=dumb ./runtest "${args[@]}") >"$out" 2>&1 </dev/null || rc=$?
    echo "$rc $(($(now) - t0))" >"$out.rc"
}

# A job list "side unit" run by $JOBS workers, each with its own slot.
run_jobs() {
    local list="$1" dir="$2"
    local n; n="$(wc -l <"$list")"
    echo 0 >"$list.next"
    local s
    for ((s = 0; s < JOBS; s++)); do
        (
            while :; do
                local i
                i="$(flock "$list.next" sh -c 'n=$(cat "$1"); echo $((n + 1)) >"$1"; echo $n' _ "$list.next")"
                [ "$i" -lt "$n" ] || break
                local side unit
                read -r side unit < <(sed -n "$((i + 1))p" "$list")
                local f="$dir/$side/${unit//\//_}.log"
                run_unit "$side" "$unit" "$s" "$f"
                read -r rc secs <"$f.rc"
                log "$(printf '%-6s %-34s %4ss  %s' "$side" "$unit" "$secs" "$(summary "$f")")"
            done
        ) &
    done
    wait
}

# "<ok> ok, <err> failed, <ignored> skipped" of one log
summary() {
    local f="$1" ok err ign
    ok="$(grep -c '^\[ok\]: ' "$f" || true)"
    err="$(failures "$f" | wc -l)"
    ign="$(grep -cE '^\[(ignore|skip)\]: ' "$f" || true)"
    echo "$ok ok, $err failed, $ign skipped (exit $(cut -d' ' -f1 "$f.rc"))"
}

# The failed tests of one log, one per line: the first line of each [err]
# (a test's is "<name> in tests/<unit>.tcl"; a --durable server-level error's
# is its message, digits blanked so ports and pids do not tell runs apart),
# each [exception], and "runtest exited N" when the run died without any.
failures() {
    local f="$1" rc
    {
        sed -n -E 's/^\[(err|exception)\]: (.*)$/\2/p' "$f" \
            | sed -E '/ in tests\/[^ ]+\.tcl$/! s/[0-9]+/N/g'
        rc="$(cut -d' ' -f1 "$f.rc")"
        if [ "$rc" != 0 ] && ! grep -qE '^\[(err|exception)\]: ' "$f"; then
            echo "runtest exited $rc without a test result (see ${f#"$ROOT"/})"
        fi
    } | sort -u
}

# The module is copied once (a rebuild during the run changes nothing) and
# loaded once by hand: the module run must really have it.
cp "$SO" "$RUN/libredis_mem.so"
SO="$RUN/libredis_mem.so"
check_port=$((12100 + 9 * 1000))
"$TREE/src/redis-server" --port "$check_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$RUN" --logfile "$RUN/preflight.log" --loadmodule "$SO" --daemonize yes \
    --pidfile "$RUN/preflight.pid" || die "redis-server --loadmodule $SO failed (log: $RUN/preflight.log)"
for _ in $(seq 100); do "$TREE/src/redis-cli" -p "$check_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
modules="$("$TREE/src/redis-cli" -p "$check_port" module list 2>&1 || true)"
"$TREE/src/redis-cli" -p "$check_port" shutdown nosave >/dev/null 2>&1 || true
grep -qx mem <<<"$modules" || die "the module did not load: $modules (log: $RUN/preflight.log)"
log "preflight: MODULE LIST: $(tr '\n' ' ' <<<"$modules")"

T0="$(now)"
log "module $SO ($(stat -c %s "$SO") bytes), server $("$BIN" --version | cut -d' ' -f3), ${#UNITS[@]} units x 2, $JOBS at a time"
: >"$RUN/jobs"
for u in "${UNITS[@]}"; do printf 'plain %s\nmodule %s\n' "$u" "$u" >>"$RUN/jobs"; done
run_jobs "$RUN/jobs" "$RUN"
T1="$(now)"

# ---------------------------------------------------------------- the verdict

report="$RUN/report.txt"
tot_ok_p=0 tot_ok_m=0 tot_err_p=0 tot_err_m=0
candidates=()
{
    printf '%-34s %16s %16s\n' unit "plain ok/failed" "module ok/failed"
    for u in "${UNITS[@]}"; do
        p="$RUN/plain/${u//\//_}.log" m="$RUN/module/${u//\//_}.log"
        okp="$(grep -c '^\[ok\]: ' "$p" || true)" okm="$(grep -c '^\[ok\]: ' "$m" || true)"
        ep="$(failures "$p" | wc -l)" em="$(failures "$m" | wc -l)"
        tot_ok_p=$((tot_ok_p + okp)) tot_ok_m=$((tot_ok_m + okm))
        tot_err_p=$((tot_err_p + ep)) tot_err_m=$((tot_err_m + em))
        printf '%-34s %16s %16s\n' "$u" "$okp/$ep" "$okm/$em"
    done
    printf '%-34s %16s %16s\n' total "$tot_ok_p/$tot_err_p" "$tot_ok_m/$tot_err_m"
} | tee "$report" >&2

: >"$RUN/module-only"
for u in "${UNITS[@]}"; do
    p="$RUN/plain/${u//\//_}.log" m="$RUN/module/${u//\//_}.log"
    only="$(comm -13 <(failures "$p") <(failures "$m"))"
    if [ -n "$only" ]; then
        candidates+=("$u")
        sed "s|^|$u\t|" <<<"$only" >>"$RUN/module-only"
    fi
    flaky="$(failures "$p")"
    [ -z "$flaky" ] || sed "s|^|plain-run failure (not counted): $u: |" <<<"$flaky" | tee -a "$report" >&2
done

confirmed="$RUN/module-caused"
cp "$RUN/module-only" "$confirmed"
if [ "$RECHECK" = 1 ] && [ ${#candidates[@]} -gt 0 ]; then
    log "rechecking ${#candidates[@]} unit(s) alone, both ways: ${candidates[*]}"
    mkdir -p "$RUN/recheck/plain" "$RUN/recheck/module"
    : >"$RUN/recheck/jobs"
    for u in "${candidates[@]}"; do printf 'plain %s\nmodule %s\n' "$u" "$u" >>"$RUN/recheck/jobs"; done
    JOBS=1 run_jobs "$RUN/recheck/jobs" "$RUN/recheck"
    : >"$confirmed"
    while IFS=$'\t' read -r u t; do
        p2="$RUN/recheck/plain/${u//\//_}.log" m2="$RUN/recheck/module/${u//\//_}.log"
        if failures "$m2" | grep -qxF -- "$t" && ! failures "$p2" | grep -qxF -- "$t"; then
            printf '%s\t%s\n' "$u" "$t" >>"$confirmed"
        else
            echo "not reproduced alone (not counted): $u: $t" | tee -a "$report" >&2
        fi
    done <"$RUN/module-only"
fi
T2="$(now)"

n="$(wc -l <"$confirmed")"
{
    echo "runtime: $((T1 - T0)) s for both runs ($JOBS at a time), $((T2 - T1)) s rechecking"
    if [ "$n" = 0 ]; then
        echo "module-caused failures: none"
    else
        echo "module-caused failures: $n"
        sed 's/\t/: /' "$confirmed" | sed 's/^/  /'
    fi
    echo "logs: ${RUN#"$ROOT"/}/{plain,module}/<unit>.log"
} | tee -a "$report" >&2
[ "$n" = 0 ]

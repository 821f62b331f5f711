#!/usr/bin/env bash
# `make test` and `make test-compat`: the integration tests (the one binary
# tests/it, not the unit tests) once per server of tests/compat/servers.sh,
# with REDIS_SERVER / REDIS_CLI pointing at that server's binaries,
# COMPAT_PARALLEL servers at once. Prints one summary line per server and
# exits non-zero if any server's run failed.
#
#   COMPAT_SERVERS="redis-7.0 valkey-8.1" tests/compat/run.sh   # a subset
#   extra arguments go to cargo test, e.g. `tests/compat/run.sh --test it smoke::`
#   (a module path of tests/it picks a feature: commands::append, replication, ...)
#
# Each run's full output: target/compat/logs/<server>.log.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
LOGS="$ROOT/target/compat/logs"
mkdir -p "$LOGS"

# shellcheck disable=SC2086
servers="$(tests/compat/servers.sh ${COMPAT_SERVERS:-})"

# `--test it`: the integration tests (all in tests/it) and no unit tests
# (`--tests` would run the library's unit tests again). Compiled once up front
# so the per-server timings are test time only.
targets=(--test it)
[ $# -eq 0 ] || targets=("$@")
cargo test --release --no-run "${targets[@]}" >&2
# Left to the Redis 7.0 run: tests that only compare the
# module's counts of texts with the reference tokenizers (through MEM.COUNT
# and MEM.APPEND); the counting is the module's own code, the same whatever
# server loads it, and they are ~45 s of each run. Everything that touches
# the server (workers, blocking, replication, persistence, cluster) runs on
# every server.
oracle_only=()
if [ $# -eq 0 ]; then
    oracle_only=(-- --skip models::encodings::every_family_counts_with_its_own_encoding
        --skip models::encodings::pathological_inputs_for_every_encoding
        --skip counting::tokens::)
fi

# One server's run: its log, and a summary line in $LOGS/<server>.summary
# ("passed failed verdict line").
run_server() {
    local name="$1" version="$2" bin="$3" cli="$4" port_base="$5"
    local log="$LOGS/$name.log" start rc secs passed failed ignored failures verdict line
    local filters=()
    [ "$name" = redis-7.0 ] || filters=("${oracle_only[@]}")
    echo "==== $name ($version): $bin" >&2
    start=$(date +%s)
    set +e
    REDIS_SERVER="$bin" REDIS_CLI="$cli" REDIS_MEM_TEST_PORT_BASE="$port_base" \
        cargo test --release --no-fail-fast "${targets[@]}" "${filters[@]}" >"$log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - start ))
    read -r passed failed ignored < <(awk '
        /^test result: / {
            for (i = 1; i <= NF; i++) {
                if ($(i+1) ~ /^passed;?$/) p += $i
                if ($(i+1) ~ /^failed;?$/) f += $i
                if ($(i+1) ~ /^ignored;?$/) g += $i
            }
        }
        END { print p + 0, f + 0, g + 0 }' "$log")
    # Failed tests, as "binary::module::test" (it::commands::append::...).
    failures="$(awk '
        /^     Running / { bin = $2; sub(/^tests\//, "", bin); sub(/\/main\.rs$/, "", bin); sub(/.*\//, "", bin); sub(/\.rs$/, "", bin) }
        / \.\.\. FAILED$/ { print bin "::" $2 }' "$log" | paste -sd' ' -)"
    if [ "$rc" -ne 0 ] || [ "$failed" -gt 0 ] || [ "$passed" -eq 0 ]; then
        verdict="FAILED"
    else
        verdict="ok"
    fi
    line="$name $version: $verdict, $passed passed, $failed failed, $ignored ignored (${secs} s)"
    [ -z "$failures" ] || line="$line; failed: $failures"
    echo "$line" >&2
    echo "$passed $failed $verdict $line" >"$LOGS/$name.summary"
}

# COMPAT_PARALLEL: how many servers' runs at once (default 1). Each run gets
# its own band of test ports.
parallel="${COMPAT_PARALLEL:-1}"
names=()
band=0
while IFS=$'\t' read -r name version bin cli; do
    [ -n "$name" ] || continue
    rm -f "$LOGS/$name.summary"
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
        wait -n || true
    done
    # Bands of 2,500 ports from 20,000 (cluster buses at +10,000 stay clear).
    run_server "$name" "$version" "$bin" "$cli" $((20000 + band * 2500)) &
    band=$((band + 1))
done <<<"$servers"
wait

# The summary, and for a failed run what its failed tests printed (their
# "---- name stdout ----" sections, 40 lines each), also in
# $LOGS/summary.txt: `make test` prints it again last, where a CI log's
# tail shows it.
status=0
total_passed=0
total_failed=0
{
    echo
    echo "test-compat summary (logs in target/compat/logs/):"
    for name in "${names[@]}"; do
        if ! read -r passed failed verdict line <"$LOGS/$name.summary"; then
            passed=0 failed=0 verdict=FAILED line="$name: no result"
        fi
        [ "$verdict" = ok ] || status=1
        total_passed=$((total_passed + passed))
        total_failed=$((total_failed + failed))
        echo "  $line"
    done
    echo "test-compat: $total_passed passed, $total_failed failed"
    for name in "${names[@]}"; do
        read -r _ _ verdict _ <"$LOGS/$name.summary" 2>/dev/null && [ "$verdict" = ok ] && continue
        echo "==== $name: what the failed tests printed (whole log: target/compat/logs/$name.log)"
        awk '/^---- .* stdout ----$/ { n = 40 } n > 0 { print; n-- } /^failures:$/ && seen++ { exit }' \
            "$LOGS/$name.log" 2>/dev/null || true
        grep -E "^error|panicked at|could not compile" "$LOGS/$name.log" 2>/dev/null | head -20 || true
    done
} >"$LOGS/summary.txt"
cat "$LOGS/summary.txt"
exit "$status"

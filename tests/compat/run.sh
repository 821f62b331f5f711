#!/usr/bin/env bash
# `make test-compat`: the integration tests (the one binary tests/it, not the
# unit tests)
# once per server of tests/compat/servers.sh, with REDIS_SERVER / REDIS_CLI
# pointing at that server's binaries. Prints one summary line per server and
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

summary=()
status=0
total_passed=0
total_failed=0
while IFS=$'\t' read -r name version bin cli; do
    [ -n "$name" ] || continue
    log="$LOGS/$name.log"
    echo "==== $name ($version): $bin" >&2
    start=$(date +%s)
    set +e
    REDIS_SERVER="$bin" REDIS_CLI="$cli" \
        cargo test --release --no-fail-fast "${targets[@]}" >"$log" 2>&1
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
        status=1
        verdict="FAILED"
    else
        verdict="ok"
    fi
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    line="$name $version: $verdict, $passed passed, $failed failed, $ignored ignored (${secs} s)"
    [ -z "$failures" ] || line="$line; failed: $failures"
    echo "$line" >&2
    summary+=("$line")
done <<<"$servers"

echo
echo "test-compat summary (logs in target/compat/logs/):"
for l in "${summary[@]}"; do echo "  $l"; done
echo "test-compat: $total_passed passed, $total_failed failed"
exit "$status"

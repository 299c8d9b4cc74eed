#!/usr/bin/env bash
# make test, after deps, venv and lab-up: the suites that use the lab (integration, molecule, then the newest
# ansible-core's lab run) one after another, and beside them, one at a time, the checks that need no lab (unit,
# planted, lint, sanity, the newest ansible-core's unit suite), which use the CPU the lab's suites leave idle while
# they wait on containers, apt and ssh. The checks' output is kept and shown when the lab's suites are done; the
# status is a failure if any of either failed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
make=${MAKE:-make}
log=$(mktemp /tmp/gpufleet-checks.XXXXXX)
trap 'rm -f "$log"' EXIT

started=$SECONDS
( $make --no-print-directory -k unit planted lint sanity newest-unit >"$log" 2>&1 ) &
checks=$!
$make --no-print-directory integration molecule
lab=$?
wait "$checks"
offline=$?
echo "=== unit, planted, lint, sanity, newest ansible-core's unit suite (run beside the lab's suites): status $offline ==="
cat "$log"
# the newest ansible-core's lab run shares its root with the unit run above: after it
[ "$lab" -eq 0 ] && { $make --no-print-directory newest-lab; lab=$?; }
echo "make test: the lab's suites $([ "$lab" -eq 0 ] && echo passed || echo FAILED), the checks without the lab" \
    "$([ "$offline" -eq 0 ] && echo passed || echo FAILED), in $((SECONDS - started)) s"
[ "$lab" -eq 0 ] && [ "$offline" -eq 0 ]

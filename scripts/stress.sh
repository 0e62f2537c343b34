#!/usr/bin/env bash
# Hunt races in job tests before CI does: run each given test K times, each run beside N CPU hogs.
#
#   scripts/stress.sh [--times K] [--hogs N] TEST...
#
# TEST is a pytest node id (tests/jobs/test_x.py::test_y, or a whole file). A hog is a busy loop
# at this script's own niceness, which the job's ranks inherit, in a session of its own as each
# rank is: it competes with them for the cores as another job on the machine would (a niced hog,
# or hogs sharing one session's autogroup, would leave them most of the CPU).
# The hogs run from the first run to the last and are killed at the end, on Ctrl-C too.
#
# Each run gets a pytest --basetemp of its own under one folder (STRESS_DIR, else a new
# /tmp/mft-stress.XXXXXX; printed first). A passing run's directory and log are deleted; a
# failing one's are kept (the job's run directory, events.jsonl, metrics.jsonl, console logs) to
# replay. A run passes when pytest exits 0 with something passed and nothing skipped (a skip
# is never a pass). One line per test: passes/runs and the slowest run's seconds. Exit status
# 1 when any run did not pass, 2 on bad arguments, 130 on Ctrl-C.
#
# It takes no lock: on a machine shared with others, wrap it (flock /tmp/mft-jobs.lock ...).
set -uo pipefail

usage() {
    echo "usage: scripts/stress.sh [--times K] [--hogs N] TEST... (K >= 1, N >= 0; TEST a pytest node id)" >&2
    exit 2
}

times=5
hogs=2
tests=()
while [ $# -gt 0 ]; do
    case "$1" in
        --times) [ $# -ge 2 ] || usage; times=$2; shift 2 ;;
        --times=*) times=${1#*=}; shift ;;
        --hogs) [ $# -ge 2 ] || usage; hogs=$2; shift 2 ;;
        --hogs=*) hogs=${1#*=}; shift ;;
        -h | --help) usage ;;
        -*) usage ;;
        *) tests+=("$1"); shift ;;
    esac
done
[[ "$times" =~ ^[0-9]+$ ]] && [ "$times" -ge 1 ] || usage
[[ "$hogs" =~ ^[0-9]+$ ]] || usage
[ ${#tests[@]} -gt 0 ] || usage

cd "$(dirname "$0")/.." || exit 2
repo=$PWD
python=${PYTHON:-$repo/.venv/bin/python}
for t in "${tests[@]}"; do
    if [ ! -e "${t%%::*}" ]; then
        echo "scripts/stress.sh: error: no test file ${t%%::*} (TEST is a path from the repository root, e.g. tests/jobs/test_x.py::test_y)" >&2
        exit 2
    fi
done

out=${STRESS_DIR:-$(mktemp -d /tmp/mft-stress.XXXXXX)}
mkdir -p "$out" || exit 2
echo "stress: ${#tests[@]} test(s) x $times beside $hogs hog(s); failed runs kept under $out"

hog_pids=()
current=""
stop_hogs() {
    for pid in "${hog_pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${hog_pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    hog_pids=()
}
interrupted() {
    stop_hogs
    [ -n "$current" ] && echo "stress: interrupted; the run in progress is kept: $current" >&2
    exit 130
}
trap stop_hogs EXIT
trap interrupted INT TERM

for _ in $(seq "$hogs"); do
    # A session of its own, as each rank has: the kernel's autogroups share the CPU among
    # sessions first, so hogs in this script's session would share one rank's worth between them.
    setsid bash -c 'while :; do :; done' &
    hog_pids+=($!)
done

failed=0
index=0
for t in "${tests[@]}"; do
    index=$((index + 1))
    passes=0
    slowest=0
    for run in $(seq "$times"); do
        # Short names: a job's run directory holds sockets, whose paths have a 108-byte limit.
        current=$out/t${index}r${run}
        log=$current.log
        echo "$t (run $run of $times, $hogs hog(s))" >"$log"
        start=$(date +%s.%N)
        PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH} "$python" -m pytest -q -p no:cacheprovider \
            --basetemp="$current" "$t" >>"$log" 2>&1
        rc=$?
        end=$(date +%s.%N)
        seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
        slowest=$(awk -v a="$slowest" -v b="$seconds" 'BEGIN { print (b > a ? b : a) }')
        # pytest -q's closing line ("1 passed in 80.1s"), wherever its teardown output leaves it.
        summary=$(grep -E '(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -n 1)
        if [ "$rc" = 0 ] && [[ "$summary" == *passed* ]] && [[ "$summary" != *skipped* ]]; then
            passes=$((passes + 1))
            rm -rf "$current" "$log"
        else
            echo "  run $run failed (${seconds} s, exit $rc): ${summary:-no pytest summary}; kept: $log$([ -d "$current" ] && echo " $current")"
            failed=1
        fi
    done
    current=""
    printf '%-100s %d/%d  slowest %s s\n' "$t" "$passes" "$times" "$slowest"
done
stop_hogs
rmdir "$out" 2>/dev/null || true
exit "$failed"

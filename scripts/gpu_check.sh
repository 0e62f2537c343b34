#!/usr/bin/env bash
# The CUDA/NCCL path checked end to end on whatever GPUs this machine has, in one go.
#
#   scripts/gpu_check.sh [--cross-group nccl|gloo] LOG_DIR    # on a GPU machine (< 5 min on one H200)
#   scripts/gpu_check.sh --cpu LOG_DIR                        # the same checks on CPU with gloo (dry run)
#   scripts/gpu_check.sh --only 1,6 ... LOG_DIR                # only those checks (default: every check, 1-6)
#
# One line per check ("check N name: ok (...)", "FAIL: reason" or "skip: reason"), then
# "gpu_checks passed=N failed=M"; exit 0 only when nothing failed. Every run's directory and
# console log is left under LOG_DIR (which must be new or empty), with this output in
# LOG_DIR/gpu_check.txt. Python: $PYTHON, else the repo's .venv/bin/python, else python3.
# GPU_CHECK_TIMEOUT_S: the limit per check (150 s on a GPU, 300 s with --cpu).
# --cross-group: the cross-group process group on the GPU (default nccl; when the replica
# groups share a GPU each group gets its own NCCL_HOSTID, see monarch_ft/common/devices.py).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USAGE="usage: scripts/gpu_check.sh [--cpu] [--cross-group nccl|gloo] [--only N,N...] LOG_DIR"

die() { # one line, non-zero exit
    echo "gpu_check: $1" >&2
    exit "${2:-2}"
}

MODE=cuda
XGROUP=
ONLY=1,2,3,4,5,6
LOG=
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu ;;
        --cross-group)
            [ $# -ge 2 ] || die "--cross-group needs a value: nccl or gloo ($USAGE)"
            XGROUP="$2"
            shift
            ;;
        --cross-group=*) XGROUP="${1#*=}" ;;
        --only)
            [ $# -ge 2 ] || die "--only needs check numbers, e.g. --only 1,6 ($USAGE)"
            ONLY="$2"
            shift
            ;;
        --only=*) ONLY="${1#*=}" ;;
        -h | --help)
            echo "$USAGE"
            exit 0
            ;;
        -*) die "unknown option $1 ($USAGE)" ;;
        *)
            [ -z "$LOG" ] || die "one LOG_DIR only, got '$LOG' and '$1' ($USAGE)"
            LOG="$1"
            ;;
    esac
    shift
done
[ -n "$LOG" ] || die "no log folder given ($USAGE)"
# --only: check numbers 1-6, comma-separated; the others print "skip: not selected".
[[ "$ONLY" =~ ^[1-6](,[1-6])*$ ]] || die "--only $ONLY: give check numbers 1-6, comma-separated (e.g. --only 1,6)"
case "$XGROUP" in
    "") XGROUP=$([ "$MODE" = cpu ] && echo gloo || echo nccl) ;;
    nccl) [ "$MODE" = cuda ] || die "--cross-group nccl needs a GPU; --cpu runs gloo across groups" ;;
    gloo) ;;
    *) die "--cross-group $XGROUP: choose nccl or gloo" ;;
esac

# At once where there is certainly no GPU (no NVIDIA device node, no nvidia-smi); else torch decides below.
if [ "$MODE" = cuda ] && ! ls /dev/nvidia* >/dev/null 2>&1 && ! command -v nvidia-smi >/dev/null 2>&1; then
    die "no GPU here (no /dev/nvidia* device, no nvidia-smi); nothing checked. Use --cpu for the dry run on CPU" 3
fi

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi
command -v "$PY" >/dev/null 2>&1 || die "no Python at '$PY' (set PYTHON=/path/to/python)"

if [ -e "$LOG" ] && [ -n "$(ls -A "$LOG" 2>/dev/null)" ]; then
    die "log folder $LOG is not empty: give a new one (runs append to what they find)"
fi
mkdir -p "$LOG" 2>/dev/null || die "cannot create the log folder $LOG"
LOG="$(cd "$LOG" && pwd)"
cd "$REPO" || die "cannot enter $REPO"

PROBE="$("$PY" scripts/gpu_check.py probe 2>"$LOG/probe.log")" || die "$PY cannot import torch (see $LOG/probe.log)"
read -r GPUS TORCH_VERSION TORCH_CUDA <<<"$PROBE"
if [ "$MODE" = cuda ] && [ "$GPUS" -lt 1 ]; then
    die "no GPU visible to torch $TORCH_VERSION (CUDA $TORCH_CUDA); nothing checked. Use --cpu for the dry run on CPU" 3
fi

# What differs between the two modes is only these overrides; the checks are the same.
if [ "$MODE" = cuda ]; then
    DEVICE=(training.device=cuda)
    MODEL=(model=debugmodel training.seq_len=128)
    XARGS=()
    if [ "$XGROUP" = gloo ]; then
        XARGS=(ft.cross_group_backend=gloo)
    elif [ "$GPUS" -lt 2 ]; then
        # Two groups on one GPU: NCCL refuses them in one communicator unless each group
        # has its own host id (then it uses its socket transport between them).
        XARGS=(ft.nccl_hostid_per_group=true)
    fi
    export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"          # NCCL's own account, in each rank's log
    export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"  # one machine: sockets, not an HCA loopback
else
    DEVICE=(training.device=cpu)
    MODEL=(model=tiny training.seq_len=64)
    XARGS=()
fi
TRAIN_STEPS=50
# Per check: a GPU run must fit a 10-minute slot even if a check hangs; 2 shared CPU cores are slow.
TIMEOUT_S="${GPU_CHECK_TIMEOUT_S:-$([ "$MODE" = cuda ] && echo 150 || echo 300)}"
PASSED=0
FAILED=0

say() { echo "$*" | tee -a "$LOG/gpu_check.txt"; }

# record N NAME VERDICT: VERDICT is "ok (...)", "FAIL: ..." or "skip: ..."
record() {
    say "check $1 $2: $3"
    case "$3" in
        ok*) PASSED=$((PASSED + 1)) ;;
        skip*) ;;
        *) FAILED=$((FAILED + 1)) ;;
    esac
}

# run NAME CMD...: run one job under the per-check timeout, console into LOG/NAME.console.log;
# prints "" on success or "FAIL: ..." naming the exit and the log.
run() {
    local name="$1"
    shift
    timeout --kill-after=30 "$TIMEOUT_S" "$@" >"$LOG/$name.console.log" 2>&1
    local code=$?
    if [ $code -eq 124 ] || [ $code -eq 137 ]; then
        echo "FAIL: timed out after ${TIMEOUT_S}s (log: $LOG/$name.console.log)"
    elif [ $code -ne 0 ]; then
        echo "FAIL: $name exited $code: $(tail -n 1 "$LOG/$name.console.log" | cut -c1-300) (log: $LOG/$name.console.log)"
    fi
}

# verdict NAME HELPER-ARGS...: the helper's one line (its run's directory is LOG/NAME)
verdict() {
    local name="$1"
    shift
    local out
    out="$("$PY" scripts/gpu_check.py "$@" 2>>"$LOG/$name.verdict.log")"
    echo "${out:-FAIL: the verdict printed nothing (log: $LOG/$name.verdict.log)}"
}

drill() { # drill NAME FAULTS [OVERRIDES...]: two groups of one rank, the faults injected
    local name="$1" faults="$2"
    shift 2
    run "$name" "$PY" recipes/drill.py "${DEVICE[@]}" "${MODEL[@]}" "${XARGS[@]}" \
        ft.replica_groups=2 ft.ranks_per_group=1 ft.standby_groups=0 chaos.tail_steps=5 "chaos.faults=$faults" "$@" "hydra.run.dir=$LOG/$name"
}

say "gpu_check: mode=$MODE gpus=$GPUS torch=$TORCH_VERSION cuda=$TORCH_CUDA cross_group=$XGROUP ${XARGS[*]} checks=$ONLY logs=$LOG"

# 1. The environment: the device, the backend, torchft's process group for it.
check_env() {
    local out
    out="$(timeout --kill-after=10 "$TIMEOUT_S" "$PY" scripts/gpu_check.py env --device "$MODE" 2>"$LOG/1_env.log")"
    record 1 environment "${out:-FAIL: the environment probe printed nothing (log: $LOG/1_env.log)}"
}

# 2. One group x one rank trains TRAIN_STEPS steps on the device; the loss falls.
check_train() {
    local err
    err="$(run 2_train "$PY" recipes/pretrain.py "${DEVICE[@]}" "${MODEL[@]}" \
        ft.replica_groups=1 ft.ranks_per_group=1 ft.standby_groups=0 training.steps=$TRAIN_STEPS "hydra.run.dir=$LOG/2_train")"
    [ -z "$err" ] || { record 2 train "$err"; return; }
    record 2 train "$(verdict 2_train train "$LOG/2_train" --device "$MODE" --steps $TRAIN_STEPS)"
}

# 3. Two replica groups (on one GPU if that is all there is); a process kill of one heals
#    from the other with bit-identical weights.
check_kill() {
    local err
    err="$(drill 3_process_kill '[{kind: process_kill, at_step: 10, target: 1}]')"
    [ -z "$err" ] || { record 3 process_kill "$err"; return; }
    record 3 process_kill "$(verdict 3_process_kill kill "$LOG/3_process_kill" --device "$MODE" --xgroup "$XGROUP")"
}

# 4. Collective faults: an abort (the cross-group group's abort: NCCL's on CUDA) discards
#    the step with no restart; a hang longer than the hang timeout gets the group replaced.
check_collective() {
    local err
    err="$(drill 4_collective '[{kind: collective, mode: abort, at_step: 8, target: 1}, {kind: collective, mode: hang, duration_s: 8, at_step: 16, target: 1}]')"
    [ -z "$err" ] || { record 4 collective "$err"; return; }
    record 4 collective "$(verdict 4_collective collective "$LOG/4_collective" --device "$MODE" --xgroup "$XGROUP")"
}

# 5. Standby groups: a killed group replaced by a standby (once ft.standby_groups exists).
check_standby() {
    if ! "$PY" scripts/gpu_check.py has-standby 2>/dev/null; then
        record 5 standby "skip: standby groups not in this build"
        return
    fi
    local err
    err="$(drill 5_standby '[{kind: process_kill, at_step: 10, target: 1}]' ft.standby_groups=1)"
    [ -z "$err" ] || { record 5 standby "$err"; return; }
    record 5 standby "$(verdict 5_standby standby "$LOG/5_standby" --device "$MODE" --xgroup "$XGROUP")"
}

# 6. benchmarks/ft_overhead.py in its smoke size (once it exists).
check_overhead() {
    if [ ! -f benchmarks/ft_overhead.py ]; then
        record 6 ft_overhead "skip: benchmarks/ft_overhead.py not in this build"
        return
    fi
    local err modes=noft,hsdp,localsgd,diloco
    # The CPU dry run proves the check's plumbing: localsgd runs the benchmark's code path of
    # diloco (another ft.mode), so it is left to the GPU run, where the numbers count.
    [ "$MODE" = cpu ] && modes=noft,hsdp,diloco
    err="$(run 6_ft_overhead "$PY" benchmarks/ft_overhead.py --smoke --modes "$modes")"
    [ -z "$err" ] || { record 6 ft_overhead "$err"; return; }
    record 6 ft_overhead "$(verdict 6_ft_overhead overhead "$LOG/6_ft_overhead.console.log")"
}

# Every check unless --only names some: the others are listed as skipped, so the output still
# accounts for all six.
CHECKS=(check_env check_train check_kill check_collective check_standby check_overhead)
NAMES=(environment train process_kill collective standby ft_overhead)
for n in 1 2 3 4 5 6; do
    if [[ ",$ONLY," == *",$n,"* ]]; then
        "${CHECKS[$((n - 1))]}"
    else
        record "$n" "${NAMES[$((n - 1))]}" "skip: not selected (--only $ONLY)"
    fi
done

say "gpu_checks passed=$PASSED failed=$FAILED"
[ "$FAILED" -eq 0 ]

#!/usr/bin/env bash
# Install monarch_ft and everything its tests need into .venv at the repository root.
# Safe to re-run; used by the README's commands and by .ci/run.
#
#   bash scripts/install.sh            torch's build detected (CUDA where nvidia-smi lists a GPU, else CPU), then printed
#   bash scripts/install.sh --cpu      torch's CPU build, from the PyTorch wheel index for CPU
#   bash scripts/install.sh --cuda     torch's CUDA build (CUDA_VARIANT, default cu130), from that build's PyTorch wheel index
#
# It installs the project editable with its [dev] extra: every optional feature the tests
# exercise (monarch, rdma, tensorboard, prometheus, wandb) and the test tools. A user who only
# runs jobs needs none of that: `pip install .` (or a wheel) gives the core and the monarch-ft
# command; extras as needed, e.g. `pip install ".[prometheus]"`.
#
# As root with apt-get it installs the system packages too, and pyverbs is then required.
# Without root or apt-get it installs the Python side only and says, one line each, what is
# unavailable and how to get it: training, drills, the MTTR bench and the CLI all work.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
PYTORCH_INDEX=https://download.pytorch.org/whl
build=""
for arg in "$@"; do
    case "$arg" in
        --cpu) build=cpu ;;
        --cuda) build=cuda ;;
        *)
            echo "install.sh: error: unknown option $arg: give --cpu or --cuda (or nothing: detected)" >&2
            exit 2
            ;;
    esac
done
if [ -z "$build" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        build=cuda
        echo "install.sh: torch build: cuda (detected: nvidia-smi lists a GPU; --cpu for the CPU build)"
    else
        build=cpu
        echo "install.sh: torch build: cpu (detected: no NVIDIA GPU listed by nvidia-smi; --cuda for the CUDA build)"
    fi
else
    echo "install.sh: torch build: $build (as asked)"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi

# System packages: libraries the Mooncake transfer engine links against (libibverbs,
# libnuma), pyverbs for RDMA discovery (see below), Slurm + munge for the local Slurm
# cluster the Slurm launcher's tests start, iproute2 for simulated hosts, and the
# Prometheus server that scrapes a job's /metrics in its test.
RDMA_PKGS="libibverbs1 libnuma1 python3-pyverbs"
HOST_PKGS="slurm-wlm munge iproute2 prometheus"
can_apt=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    can_apt=1
    missing=""
    for pkg in $RDMA_PKGS $HOST_PKGS; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        echo "install.sh: apt-get install$missing"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
elif [ "$(id -u)" != 0 ]; then
    why="not root"
else
    why="no apt-get"
fi

.venv/bin/python -m pip install -q --upgrade pip
# torch first, its build chosen through the PyTorch wheel index for that build: the CPU
# build by its own version (2.13.0+cpu), the CUDA one from its CUDA variant's index (on
# Linux, PyPI's plain torch is a CUDA build: a bare pin cannot say which). The project's
# range (>=2.13,<2.14) is then already satisfied, so nothing replaces it. Only torch itself
# comes from there (--no-deps): its own dependencies are resolved with the project's, from the
# ordinary index.
installed=$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "$build" = cpu ]; then
    .venv/bin/python -m pip install -q --no-deps "torch==$TORCH_VERSION+cpu" --index-url "$PYTORCH_INDEX/cpu"
else
    variant=${CUDA_VARIANT:-cu130}
    if [ "${installed#*+}" = cpu ]; then
        .venv/bin/python -m pip uninstall -q -y torch  # a CPU build satisfies ==$TORCH_VERSION too
    fi
    .venv/bin/python -m pip install -q --no-deps "torch==$TORCH_VERSION" --index-url "$PYTORCH_INDEX/$variant"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
echo "install.sh: $(.venv/bin/python -c 'import torch; cuda = torch.version.cuda; print(f"torch {torch.__version__}: the " + (f"CUDA {cuda} build" if cuda else "CPU build"))')"

# pyverbs (RDMA NIC discovery) is the distribution's build, made visible to the venv:
# it is built against the system libibverbs that the Mooncake engine loads too, and the
# system's NIC provider drivers must match that libibverbs release.  PyPI's pyverbs
# (59) needs rdma-core 59's own libibverbs.so.1, which cannot share a process with the
# system one (same soname) nor use the system's providers.  Only the pyverbs package
# directory is linked in: a .pth to dist-packages would expose every Debian package.
# Its extension modules are for the system Python's ABI; the venv must have the same
# (CPython keeps the ABI within a minor version, e.g. 3.11.2 and 3.11.7).
# Required where it can be installed (root with apt-get); otherwise linked if already
# there, and its absence is one line: the transport then uses TCP.
pyverbs_problem() {
    local pyverbs_dir ext site err
    pyverbs_dir=$(dpkg -L python3-pyverbs 2>/dev/null | grep '/pyverbs/__init__.py$' | head -1 | xargs -r dirname)
    if [ -z "$pyverbs_dir" ]; then
        echo "pyverbs needs the Debian package python3-pyverbs"
        return
    fi
    ext=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    if [ ! -e "$pyverbs_dir/device$ext" ]; then
        echo "python3-pyverbs in $pyverbs_dir is built for another Python than .venv's ($ext); make .venv with the system's Python minor version (PYTHON=python3.X)"
        return
    fi
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
    ln -sfn "$pyverbs_dir" "$site/pyverbs"
    if ! err=$(.venv/bin/python -c "import pyverbs.device" 2>&1); then
        echo "pyverbs does not import in .venv: ${err##*$'\n'}"
    fi
}
problem=$(pyverbs_problem)
if [ -n "$problem" ]; then
    if [ "$can_apt" = 1 ]; then
        echo "install.sh: error: $problem" >&2
        exit 1
    fi
    echo "install.sh: RDMA discovery (pyverbs) unavailable ($why: $problem): the transport uses TCP; to get it, on Debian or Ubuntu as root: apt-get install $RDMA_PKGS && bash scripts/install.sh"
fi

# Simulated hosts (network namespaces) and the local Slurm cluster need root when they run,
# and their packages.
if [ "$can_apt" = 0 ]; then
    absent=""
    for cmd in ip slurmctld slurmd munged; do
        command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || absent="$absent $cmd"
    done
    if [ "$(id -u)" != 0 ] || [ -n "$absent" ]; then
        echo "install.sh: simulated hosts (launcher=local_hosts, network faults) and the local Slurm cluster unavailable ($why${absent:+; missing$absent}): to get them, on Debian or Ubuntu as root: apt-get install $HOST_PKGS && bash scripts/install.sh, and run jobs and tests as root"
    fi
fi
if [ "$can_apt" = 0 ] && ! command -v prometheus >/dev/null 2>&1; then
    echo "install.sh: the Prometheus server is absent ($why): metrics.prometheus_port serves /metrics without it, but its job test needs it: on Debian or Ubuntu as root: apt-get install prometheus"
fi
echo "install.sh: ready (.venv)"

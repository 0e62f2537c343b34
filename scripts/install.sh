#!/usr/bin/env bash
# Install monarch_ft and everything it needs into .venv at the repository root.
# Safe to re-run; used by both README commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi

# System packages: libraries the Mooncake transfer engine links against (libibverbs,
# libnuma), Slurm + munge for the Slurm launcher and its tests, iproute2 for simulated hosts.
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    missing=""
    for pkg in libibverbs1 libnuma1 slurm-wlm munge iproute2; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        echo "install.sh: apt-get install$missing"
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
fi

.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: on a CPU machine this is the CPU wheel, and the project's
# own range (>=2.13,<2.14) is then already satisfied, so nothing pulls a CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "install.sh: ready (.venv)"

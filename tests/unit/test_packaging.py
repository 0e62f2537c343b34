"""What ``pip install .`` gives (pyproject.toml): a core without test tools, Mooncake or Monarch, one
extra per optional feature, the monarch-ft command, and every config shipped in the package."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("~")[0].strip().lower() for r in requirements}


def test_core_has_no_test_tools_no_rdma_and_no_monarch():
    core = _names(PROJECT["project"]["dependencies"])
    assert not core & {"pytest", "ruff", "import-linter", "build", "nbclient", "ipykernel", "mooncake-transfer-engine-non-cuda", "torchmonarch", "wandb"}
    # triton stays: `import torchtitan` imports it (see the comment beside it), on CPU too.
    assert {"torch", "torchft", "torchtitan", "triton", "hydra-core"} <= core


def test_each_feature_is_an_extra_and_dev_has_them_all():
    extras = PROJECT["project"]["optional-dependencies"]
    assert {"monarch", "rdma", "tensorboard", "prometheus", "wandb", "dev"} <= set(extras)
    assert _names(extras["monarch"]) == {"torchmonarch"} and _names(extras["rdma"]) == {"mooncake-transfer-engine-non-cuda"}
    assert "monarch_ft[monarch,rdma,tensorboard,prometheus,wandb]" in extras["dev"]
    mooncake = [r for group in extras.values() for r in group if r.startswith("mooncake")]
    assert len(mooncake) == 1, "Mooncake is listed once, in [rdma]"


def test_the_command_and_the_configs_are_in_the_package():
    assert PROJECT["project"]["scripts"] == {"monarch-ft": "monarch_ft.__main__:main"}
    patterns = PROJECT["tool"]["setuptools"]["package-data"]["monarch_ft"]
    package = REPO / "monarch_ft"
    configs = [str(p.relative_to(package)) for p in (package / "configs").rglob("*.yaml")]
    assert configs and all(any(fnmatch.fnmatch(c, pat) and c.count("/") == pat.count("/") for pat in patterns) for c in configs), configs

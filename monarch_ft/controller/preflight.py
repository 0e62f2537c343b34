"""The controller's checks before anything is launched: the config against this machine,
the launcher and the installed TorchTitan.

The config checks itself (:func:`monarch_ft.config.job.validate`); what it cannot know
without the launchers, the devices, the model catalog or the hosts is judged here, on the
controller, before a rank or a Lighthouse starts: a job that cannot run is refused with one
line naming the fix (:class:`~monarch_ft.records.errors.ConfigError`, exit 2), never found
out by every rank at start.
"""

from __future__ import annotations

import os

from monarch_ft.common.devices import cuda_device_count, device_problem, gpu_device_nodes
from monarch_ft.common.model_catalog import model_problem, param_count, shape_problem
from monarch_ft.config.job import JobConfig, validate
from monarch_ft.config.unused import refuse_unused
from monarch_ft.controller import memory_budget
from monarch_ft.controller.standby_pool import resolve_standby_groups
from monarch_ft.launcher import available_launchers, launcher_options, launcher_traits
from monarch_ft.launcher.hosts import Host
from monarch_ft.records.errors import ConfigError, require
from monarch_ft.transport.interface import InterfaceError, choose, local_interfaces


def preflight(cfg: JobConfig) -> None:
    """:func:`~monarch_ft.config.job.validate`, then what needs the launcher, this machine or
    TorchTitan's catalog: each failure one line naming the fix."""
    validate(cfg)
    require(
        cfg.launcher.name in available_launchers(),
        f"launcher={cfg.launcher.name!r}: choose one of {', '.join(available_launchers())}",
    )
    launcher_options(cfg.launcher)
    _check_transport_interface(cfg)
    problem = model_problem(cfg.model.name, cfg.model.flavor) or shape_problem(
        cfg.model.name, cfg.model.flavor, {"vocab_size": cfg.model.vocab_size, **cfg.model.overrides()}
    )
    require(problem is None, problem or "")
    ft, tr = cfg.ft, cfg.training
    if not launcher_traits(cfg.launcher).ranks_on_this_machine:
        refuse_unused(cfg.launcher, "launcher", ("max_ranks_per_core",), f"with launcher={cfg.launcher.name} (its ranks run on other machines)", "drop it")
    else:
        problem = device_problem(tr.device, ft.cross_group_backend, ft.nccl_hostid_per_group, ft.replica_groups, ft.ranks_per_group)
        require(problem is None, problem or "")
        total = ft.replica_groups * ft.ranks_per_group
        cores = os.cpu_count() or 1
        limit = max(4, cores * cfg.launcher.max_ranks_per_core)
        require(
            total <= limit,
            f"{total} ranks ({ft.replica_groups} groups x {ft.ranks_per_group}) exceed what this machine can run "
            f"({limit} = {cores} cores x launcher.max_ranks_per_core): lower ft.replica_groups or ft.ranks_per_group",
        )
        _check_memory(cfg)


def _check_memory(cfg: JobConfig) -> None:
    """Refuse a job whose ranks' training state cannot fit this host's memory (or, training on
    GPU, one GPU's): one line with the estimate and the limit (monarch_ft.controller.memory_budget).
    Only where every rank runs on this machine, whose memory is known here; a model that is
    not TorchTitan's llama3 is not estimated."""
    ft, tr, model = cfg.ft, cfg.training, cfg.model
    params = param_count(model.name, model.flavor, {"vocab_size": model.vocab_size, **model.overrides()})
    if params is None:
        return
    standbys = resolve_standby_groups(ft.standby_groups, launcher_traits(cfg.launcher).default_standby_groups, ft.recovery)
    if tr.device == "cuda" or (tr.device == "auto" and gpu_device_nodes() and cuda_device_count() > 0):
        gpus, limit = memory_budget.gpu_memory_bytes()
        where = "one GPU"
    else:
        gpus, limit, where = 0, memory_budget.host_memory_bytes(), "this host"
    est = memory_budget.estimate(params, ft.ranks_per_group, ft.replica_groups, standbys, gpus)
    one_group = memory_budget.estimate(params, ft.ranks_per_group, 1, 0, gpus)
    problem = memory_budget.refusal(f"{model.name}/{model.flavor}", est, limit, where, one_group)
    require(problem is None, problem or "")


def _check_transport_interface(cfg: JobConfig) -> None:
    """``ft.transport_interface`` must name an interface (or address) of the hosts the
    ranks run on.  Checked here where those interfaces are known before launch: this
    host's for ranks on this machine; a simulated host's are ``eth0`` and ``lo``, and
    each has its own address.  Ranks on other machines (slurm) check it at start."""
    value = cfg.ft.transport_interface
    if not value:
        return
    fix = "name one of them, an address one holds, or null for the default (the RDMA port's interface, else the route to the Lighthouse)"
    traits = launcher_traits(cfg.launcher)
    if traits.simulated_hosts:
        names = sorted({"lo", Host.ifname})
        require(
            value in names,
            f"ft.transport_interface={value!r}: a simulated host has the interfaces {', '.join(names)}, each host its own "
            "address: name one of them, or null for the default (the route to the Lighthouse)",
        )
        return
    if not traits.ranks_on_this_machine:
        return
    try:
        choose(value, local_interfaces())
    except InterfaceError as e:
        raise ConfigError(f"ft.transport_interface={value!r}: {e}: {fix}") from None

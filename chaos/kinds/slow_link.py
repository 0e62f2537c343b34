"""``slow_link``: the group's host link gets latency (tc netem) and/or a rate limit (netem or
tbf) for ``duration_s``; the job may absorb it without dropping the group. A fail-slow fault:
the link probe names the group a link straggler (controller.stragglers), and under
``ft.straggler=evict`` its standby on another host takes its place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from chaos.kinds.base import NetworkFault, NetworkOptions
from monarch_ft.records.errors import ConfigError


@dataclass
class SlowLinkOptions(NetworkOptions):
    LINK_STAYS: ClassVar[str] = "slowed"
    delay_ms: float = 0.0
    """Milliseconds of latency added to the link (tc netem)."""

    rate: Optional[str] = None
    """A rate limit on the link, e.g. ``1mbit`` (tc netem or tbf); null: none."""

    def check(self, where: str) -> None:
        super().check(where)
        if self.delay_ms < 0:
            raise ConfigError(f"{where}.delay_ms={self.delay_ms}: must be >= 0")
        if not self.delay_ms and not self.rate:
            raise ConfigError(f"{where}: a slow_link needs delay_ms > 0 and/or a rate (e.g. rate: 1mbit)")


class SlowLink(NetworkFault):
    name = "slow_link"
    options = SlowLinkOptions

    def check(self, fault, cfg, traits, where: str) -> None:
        super().check(fault, cfg, traits, where)
        from monarch_ft.launcher.hosts import qdisc_supported

        if fault.delay_ms and not qdisc_supported("netem"):
            raise ConfigError(
                f"{where}.delay_ms={fault.delay_ms:g}: this kernel has no tc netem qdisc (CONFIG_NET_SCH_NETEM) to add latency: "
                "give only a rate (delay_ms: 0, rate: 1mbit; tbf), or run on a kernel with netem"
            )
        if fault.rate and not fault.delay_ms and not qdisc_supported("tbf"):
            raise ConfigError(f"{where}.rate={fault.rate}: this kernel has no tc tbf qdisc (CONFIG_NET_SCH_TBF) to limit the rate")

    def inject(self, job, group: int, fault) -> dict[str, Any]:
        return job.slow_link(group, fault.delay_ms, fault.rate, fault.duration_s)


KIND = SlowLink()

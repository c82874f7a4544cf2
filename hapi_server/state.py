"""Everything one server instance holds: the extraction core's runtime, its Swift reader and
worker threads."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hapi_core import CoreRuntime

from .send_order import SendOrder
from .settings import ServerSettings
from .swift_io import SwiftReader

#: A response whose last frame left this long ago, its next not yet computed, holds no younger
#: one of its pipeline (``hapi_server.send_order``).
SEND_QUIET_S = 0.05


@dataclass(kw_only=True)
class ServerState(CoreRuntime):
    """Create it with ``ServerState.create(settings, swift=SwiftReader(...))``."""

    settings: ServerSettings
    swift: SwiftReader
    executor: ThreadPoolExecutor = field(init=False)
    """Image checks, model loads and heads: ``max_concurrent_per_device`` threads a device."""
    send_order: SendOrder = field(init=False)
    """Each client pipeline's responses, sent oldest first."""

    def __post_init__(self) -> None:
        workers = self.settings.max_concurrent_per_device * len(self.devices)
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hapi-compute")
        self.send_order = SendOrder(
            quiet_s=SEND_QUIET_S,
            max_wait_s=self.settings.send_order_wait_s,
            observe=self.metrics.send_order_wait_seconds.observe,
        )

    async def aclose(self) -> None:
        await self.swift.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)

"""Everything one server instance holds: the extraction core's runtime, its Swift reader and
worker threads."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hapi_core import CoreRuntime

from .settings import ServerSettings
from .swift_io import SwiftReader


@dataclass(kw_only=True)
class ServerState(CoreRuntime):
    """Create it with ``ServerState.create(settings, swift=SwiftReader(...))``."""

    settings: ServerSettings
    swift: SwiftReader
    executor: ThreadPoolExecutor = field(init=False)
    """Image checks, model loads and heads: ``max_concurrent_per_device`` threads a device."""

    def __post_init__(self) -> None:
        workers = self.settings.max_concurrent_per_device * len(self.devices)
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hapi-compute")

    async def aclose(self) -> None:
        await self.swift.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)

"""One engine replica of the Ray Serve application: the engine ``settings`` name (rapidocr, vllm, ...), started
in a Serve replica actor, streaming ``EngineChunk``s to the API's ``RayServeEngine`` (ray/engine.py).

Serve calls ``check_health`` every few seconds: an engine that is not ready makes the replica unhealthy, and
Serve replaces it. Serve drains a replica before it stops it (graceful_shutdown_timeout_s), then ``__del__``
stops the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..engines.base import EngineInfo
from ..types import EngineRequest

# The first item of every stream: which replica serves it (the API counts requests per replica).
HELLO = "hyocr.replica"


class EngineReplica:
    async def __init__(self, settings: Any) -> None:
        from ray import serve

        from ..engines.registry import create_engine

        self.engine = create_engine(settings)
        await self.engine.start()
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def engine_info(self) -> EngineInfo:
        """What the engine is and serves (what /v1/models says of it)."""
        return self.engine.info

    async def generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        """``(HELLO, replica id)``, then the engine's chunks for ``request``. Serve cancels this generator
        when the API side goes away: the engine's own clean-up (``finally``) aborts its work."""
        yield (HELLO, self.replica_id)
        stream = self.engine.generate(request)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()

    async def check_health(self) -> None:
        if not await self.engine.ready():
            raise RuntimeError(f"engine {self.engine.info.name} is not ready")

    async def __del__(self) -> None:
        await self.engine.stop()


"""The API side of the Ray Serve application: an ``Engine`` whose work is done by the engine deployment's
replicas (ray/replica.py), reached through a Serve deployment handle. Serve picks the replica (power of two
choices on requests in flight); everything above the engine interface (auth, limits, admission, metrics,
jobs) runs unchanged in the API process.

A replica that dies before a request's first chunk is retried once on another (nothing was sent yet); one
that dies mid-stream ends that request with a retryable 503. The replica list (``replicas``) comes from Serve's
controller, refreshed in the background; the requests each replica took are counted here, from the first item
of each stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ..engines.base import Engine, EngineInfo, Replica
from ..errors import ServiceUnavailable
from ..types import EngineChunk, EngineRequest
from .replica import HELLO

log = logging.getLogger(__name__)
APP = "hyocr"
ENGINE_DEPLOYMENT = "EngineReplica"
REFRESH_S = 2.0


class RayServeEngine(Engine):
    self_healing = True  # Serve replaces a replica that died or failed its health check

    def __init__(self, handle: Any, app: str = APP) -> None:
        self.handle = handle
        self.app = app
        self.info = EngineInfo(name="ray", model="", tasks=frozenset(), follows_prompts=False)
        self.served: Counter[str] = Counter()  # requests each replica took (by replica id)
        self._replicas: list[Replica] = []
        self._refresher: asyncio.Task | None = None

    async def start(self) -> None:
        engine: EngineInfo = await self.handle.engine_info.remote()  # waits for a replica if none is up yet
        # The API serves what the replicas' engine serves, named as it is, and says where it runs.
        self.info = replace(engine, details={**engine.details,
                                             "scale_out": f"Ray Serve deployment {self.app}/{ENGINE_DEPLOYMENT}"})
        await self.refresh()
        self._refresher = asyncio.create_task(self._refresh_forever(), name="hyocr-ray-replicas")

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None

    async def ready(self) -> bool:
        # Serve routes around a replica that is down and replaces it: one running replica can answer.
        return any(r.alive for r in self._replicas)

    def replicas(self) -> list[Replica]:
        return self._replicas

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

        for attempt in (1, 2):
            stream = self.handle.options(stream=True).generate.remote(request)
            started = False
            try:
                async for item in stream:
                    if isinstance(item, tuple) and item and item[0] == HELLO:
                        self.served[item[1]] += 1
                        continue
                    started = True
                    yield item
                return
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                if started or attempt == 2:
                    raise ServiceUnavailable("the engine replica serving this request stopped; retry",
                                             code="engine_replica_lost") from exc
                log.warning("engine replica lost before any output (%s): retrying on another", type(exc).__name__)
            except BackPressureError as exc:
                raise ServiceUnavailable("every engine replica is at its limit; retry shortly",
                                         code="overloaded") from exc
            except DeploymentUnavailableError as exc:
                raise ServiceUnavailable("the engine deployment is unavailable", code="engine_dead") from exc
            finally:
                stream.cancel()  # a no-op once finished; otherwise the replica's generator is cancelled

    async def refresh(self) -> None:
        self._replicas = await asyncio.to_thread(self._list_replicas)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except Exception as exc:  # the controller busy or restarting: keep the last list
                log.debug("replica list not refreshed: %s", exc)

    def _list_replicas(self) -> list[Replica]:
        """Each replica Serve's controller holds, by id, alive when RUNNING (starting, unhealthy and stopping
        ones are listed, not alive). The controller's instance details are what Serve's REST API and
        dashboard show (``ServeInstanceDetails``); the client call is Serve's own (2.5x-2.60)."""
        from ray.serve.context import _get_global_client

        details = _get_global_client().get_serve_details()
        app = (details.get("applications") or {}).get(self.app) or {}
        replicas = ((app.get("deployments") or {}).get(ENGINE_DEPLOYMENT) or {}).get("replicas") or []
        out = []
        for r in sorted(replicas, key=lambda r: r.get("start_time_s") or 0):
            rid = r["replica_id"]
            out.append(Replica(rid, r.get("state") == "RUNNING", {
                "state": r.get("state"), "pid": r.get("pid"), "node": (r.get("node_id") or "")[:12],
                "requests": self.served[rid]}))
        return out

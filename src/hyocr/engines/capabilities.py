"""Start-up checks of what an engine says it can do, so that /v1/models reports what works.

Structured outputs need more than the engine: vLLM 0.26 imports lm-format-enforcer while it validates any
constrained request, and on a machine without it every such request was a 500 while /v1/models said
``structured_outputs: true``. An engine that has the capability sends one constrained one-token request
through its own ``generate`` as it starts (after its warm-up). If that fails, the capability is off:
/v1/models says false and why (``structured_outputs_check``), and constrained requests get a 503
``structured_outputs_unavailable`` naming it (base.structured_refusal) instead of failing in the engine. A
failed check never fails the start: the engine serves everything else. Each start checks again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import replace

from ..errors import HyocrError, exception_chain, root_cause_type
from ..types import EngineRequest, SamplingParams, StructuredOutput, Task
from .base import Engine, EngineInfo

log = logging.getLogger(__name__)

STRUCTURED_CHECK = "structured_outputs_check"  # the engine details key /v1/models shows
CHECK_TIMEOUT = 120.0  # seconds; a grammar compile is well under one, a first decode step a few on a CPU
REASON_CHARS = 300
# A schema, as extraction and response_format send: vLLM validates and compiles it as it would theirs.
PROBE = StructuredOutput(json_schema='{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}')


async def check_structured(engine: Engine) -> None:
    """One constrained one-token request through ``engine.generate``; ``engine.info`` then says whether
    structured outputs work. Call it only on an engine that has them (it turns them on when the check
    passes, as after a restart that fixed what failed)."""
    request = EngineRequest("hyocr-structured-check", Task.TEXT, "ok", (),
                            sampling=SamplingParams(max_tokens=1, structured=PROBE, loop_guard=False))
    started = time.perf_counter()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            async for _ in engine.generate(request):
                pass
    except TimeoutError:
        failed = f"no answer in {CHECK_TIMEOUT:g}s", "TimeoutError"
    except Exception as exc:  # noqa: BLE001 - whatever fails, only the capability goes off
        log.debug("structured outputs check: %s", "".join(traceback.format_exception(exc)).rstrip())
        failed = _reason(exc), getattr(exc, "cause_type", None) or root_cause_type(exc)
    else:
        engine.info = checked(engine.info)
        log.info("structured outputs: the start-up check passed in %.2fs", time.perf_counter() - started)
        return
    engine.info = checked(engine.info, *failed)
    log.warning("structured outputs are off: the start-up check (one constrained token) failed: %s", failed[0])


def checked(info: EngineInfo, failure: str | None = None, cause_type: str | None = None) -> EngineInfo:
    """``info`` after a structured outputs check: passed (``failure`` None) or failed with its reason."""
    if failure is None:
        return replace(info, structured=True, structured_off="", details={**info.details, STRUCTURED_CHECK: "passed"})
    public = "its start-up check failed" + (f" ({cause_type})" if cause_type else "")  # never the message
    return replace(info, structured=False, structured_off=public,
                   details={**info.details, STRUCTURED_CHECK: f"failed: {failure}"})


def _reason(exc: BaseException) -> str:
    """What failed, for /v1/models and the log: an engine error's message holds its chain already."""
    return (exc.message if isinstance(exc, HyocrError) else exception_chain(exc))[:REASON_CHARS]


"""The one interface every engine implements. The server imports only this module.

An engine turns an ``EngineRequest`` (prompt + validated images) into a stream of ``EngineChunk``s.
Cancelling the consumer (``aclose()`` on the iterator, or ``CancelledError`` while awaiting it)
must abort the engine's work for that request: engines clean up in ``finally``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..errors import HyocrError, InvalidRequest, ServiceUnavailable
from ..types import EngineChunk, EngineRequest, Task


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an engine is and what it can do, as reported by ``/v1/models`` and used for routing."""

    name: str  # registry name: rapidocr, vllm, ...
    model: str  # served model name
    tasks: frozenset[Task]
    follows_prompts: bool  # a vision-language model that reads the prompt (vs. a fixed OCR pipeline)
    max_images: int = 1  # images per engine request
    adapters: tuple[str, ...] = ()  # LoRA adapters a request can select by model name
    structured: bool = False  # decodes under an output constraint (SamplingParams.structured)
    # Why ``structured`` is False on an engine that has the capability: its start-up check failed
    # (engines/capabilities.py). Safe to show a client: what failed and the root cause's type.
    structured_off: str = ""
    version: str = ""  # HunyuanOCR 1.0 | 1.5 (hunyuan/versions.py): the repetition rules follow it
    defaults: dict[str, float] = field(default_factory=dict)  # the checkpoint's decoding defaults
    details: dict[str, str] = field(default_factory=dict)  # revision, model path, versions


def structured_refusal(info: EngineInfo, param: str) -> HyocrError:
    """The error for a request with an output constraint that the engine will not take: a 503 where its
    start-up check turned the capability off (a fault of this server, which /v1/models reports), a 400
    where the engine has none."""
    if info.structured_off:
        return ServiceUnavailable(f"structured outputs are off on this server: {info.structured_off}; "
                                  "/v1/models (structured_outputs_check) and the server log say more",
                                  param=param, code="structured_outputs_unavailable")
    return InvalidRequest(f"the {info.name} engine cannot constrain its output to a schema "
                          "(vllm can; transformers with xgrammar installed; openai when its upstream can)",
                          param=param, code="structured_outputs_unsupported")


@dataclass(frozen=True, slots=True)
class Replica:
    """One of an engine's copies of the model serving side by side (a vLLM data-parallel engine core, a Ray
    Serve replica): what /ready, /v1/models and /metrics show of each."""

    id: str
    alive: bool
    details: dict[str, object] = field(default_factory=dict)  # pid, node, requests served, ...

    def body(self) -> dict[str, object]:
        return {"id": self.id, "alive": self.alive, **self.details}


class Engine(abc.ABC):
    """Base class for engines. Subclasses set ``info`` and implement ``generate``."""

    info: EngineInfo
    # The engine replaces its own failed parts (Ray Serve replaces replicas): a failed probe makes the server
    # not ready, but the supervisor never restarts it (that would fail the healthy replicas' requests too).
    self_healing: bool = False

    async def start(self) -> None:
        """Load models / connect. Called once before serving."""

    async def stop(self) -> None:
        """Release resources. Called once at shutdown; must not raise."""

    async def ready(self) -> bool:
        """True when the engine can answer a request now (loaded, alive)."""
        return True

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream the output for one request. The last chunk has a ``finish_reason``."""

    def expected_seconds(self, request: EngineRequest) -> float | None:
        """How long ``request`` should take once the engine has started on it, for an engine that answers
        in one piece (it signals the start with an empty chunk); None for an engine that streams, whose
        progress is judged by the rhythm of its output (the stall watchdog, pipeline/progress.py)."""
        return None

    async def abort(self, request_id: str) -> None:
        """Stop work on a request whose consumer went away. Idempotent."""

    def supports(self, task: Task) -> bool:
        return task in self.info.tasks

    def replicas(self) -> list[Replica]:
        """Its copies of the model, when it runs several (cheap: /ready and every scrape ask); empty for an
        engine that is one copy. ``ready`` says what a dead one means: vLLM's cores all or none (the
        supervisor restarts them), Ray Serve's replicas one at a time (Serve replaces it)."""
        return []


class SharedEngine(Engine):
    """An engine that may be one of several API processes' clients of an engine core another process owns
    (vLLM with ``API_PROCESSES`` > 1). The supervisor and ``/ready`` ask these two things of it only."""

    @property
    def restartable(self) -> bool:
        """False where this process cannot start the engine again (the core belongs to the parent): the
        supervisor then exits the process instead of restarting the engine."""
        return True

    def peers_ready(self) -> bool:
        """True when the server's other processes serving this engine are up too (/ready waits for them;
        the supervisor does not: a process waiting for its peers is healthy)."""
        return True

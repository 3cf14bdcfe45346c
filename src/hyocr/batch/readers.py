"""How a batch reads one document: in this process (``LocalReader``, the configured engine, as ``hyocr ocr``)
or as a job on a server (``RemoteReader``, through the client's jobs API)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..pipeline.media import is_pdf


class ReadFailed(Exception):
    """This document could not be read (the message says why); the others go on."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a reader needs beyond the bytes: names, the attempt's idempotency key, a job to re-attach."""

    param: str  # the file, for error messages
    idempotency_key: str
    job_id: str | None  # a job an interrupted run submitted for this attempt
    on_page: Callable[[], None]  # a page finished
    on_submitted: Callable[[str], None]  # --url: the job exists (record it before waiting)


class Reader(Protocol):
    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]: ...


class LocalReader:
    """``service.read(call)`` on the engine in this process; the /v1/ocr body of the result."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]:
        from ..api.bodies import ocr_body
        from ..errors import HyocrError
        from ..types import PageRead, ReadDone
        from .local import file_call

        result = None
        try:
            call = file_call(data, ticket.param, options)
            async for event in self.service.read(call):  # admitted and under the deadline, as on the server
                if isinstance(event, ReadDone):
                    result = event.result
                elif isinstance(event, PageRead):
                    ticket.on_page()
        except HyocrError as exc:
            raise ReadFailed(exc.message if exc.public else "internal error") from None
        if result is None:
            raise ReadFailed("the read ended without a result")
        return ocr_body(result)


class RemoteReader:
    """A job per document (``submit_job`` with the ticket's idempotency key, so a rerun re-attaches to the
    job an interrupted run submitted), its pages followed for progress, then its result."""

    def __init__(self, client: Any, poll: float = 1.0) -> None:
        self.client, self.poll = client, poll

    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]:
        from ..client import HyocrClientError

        pdf = is_pdf(data)
        sent = {k: v for k, v in options.items()
                if v not in (None, False) and (pdf or k not in ("pages", "prefer_text_layer"))}
        try:
            job = await self.client.submit_job(data, idempotency_key=ticket.idempotency_key, **sent)
            ticket.on_submitted(job.id)
            async for _position, _page in self.client.iter_job_pages(job.id, poll=self.poll):
                ticket.on_page()
            job = await self.client.wait(job.id, poll=self.poll)
            if job.status != "succeeded":
                message = (job.error or {}).get("message") or f"the job was {job.status}"
                raise ReadFailed(f"job {job.id}: {message}")
            return (await self.client.job_result(job.id)).raw
        except HyocrClientError as exc:
            raise ReadFailed(str(exc)) from None

"""The webhook outbox: deliveries queued in the jobs database, sent concurrently, retried on a schedule kept
in the database (so retries survive restarts).

At most WEBHOOK_CONCURRENCY deliveries are in flight, and at most WEBHOOK_HOST_CONCURRENCY to one receiver
(host and port): a receiver that answers after the timeout holds only its own slots, never another
caller's webhook. Before an attempt the delivery is claimed in the database (its ``next_at`` moved past
the attempt's deadline by a conditional UPDATE), so two replicas never send it at once, and one that dies
mid-attempt leaves it due again when that time passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..pipeline.fetch import FetchPolicy
from .loops import passes
from .schema import deliveries, jobs
from .webhooks import Delivery, WebhookSigner, deliver

log = logging.getLogger("hyocr.jobs")
PAGE = 64  # due deliveries read per query
MAX_SCAN = 1024  # due deliveries looked at per pass: a backlog for one busy receiver is skipped, not read whole
HOLD_MARGIN = 30.0  # seconds a claim outlasts the attempt's own deadline


@dataclass(frozen=True, slots=True)
class DueDelivery:
    id: str
    job_id: str
    url: str
    headers: dict
    body: bytes
    attempt: int  # the attempt this one would be (1-based)
    next_at: float  # when it fell due: the claim's condition and the scan's cursor
    owner: str  # the job's owner, whose secret signs the delivery


class Outbox:
    def __init__(self, db: AsyncEngine, settings, *, policy: FetchPolicy, metrics=None) -> None:
        self.db = db
        self.settings = settings
        self.policy = policy
        self.metrics = metrics
        self.signer: WebhookSigner | None = None  # set when the jobs open (the secret is read then)
        self._sending: dict[str, asyncio.Task] = {}
        self._hosts: Counter[str] = Counter()
        self.wake = asyncio.Event()  # a delivery queued here: send it now, not at the next poll

    # ------------------------------------------------------------------ the table

    async def add(self, delivery_id: str, job_id: str, url: str, headers: dict | None, body: bytes) -> None:
        """Queue a delivery, once per id (a job's event)."""
        try:
            async with self.db.begin() as db:
                await db.execute(insert(deliveries).values(id=delivery_id, job_id=job_id, url=url, headers=headers,
                                                           body=body, attempt=0, next_at=0.0, state="pending"))
        except IntegrityError:
            return
        self.wake.set()

    async def due(self, now: float, *, limit: int = PAGE, after: tuple[float, str] | None = None
                  ) -> list[DueDelivery]:
        """Pending deliveries due by ``now``, in (next_at, id) order, after the cursor ``after``."""
        where = and_(deliveries.c.state == "pending", deliveries.c.next_at <= now)
        if after is not None:
            where = and_(where, or_(deliveries.c.next_at > after[0],
                                    and_(deliveries.c.next_at == after[0], deliveries.c.id > after[1])))
        async with self.db.connect() as db:
            # joined to the job for its owner (a job's deliveries are deleted with it)
            rows = (await db.execute(select(deliveries, jobs.c.owner)
                                     .join(jobs, jobs.c.id == deliveries.c.job_id).where(where)
                                     .order_by(deliveries.c.next_at, deliveries.c.id).limit(limit))).mappings().all()
        return [DueDelivery(r["id"], r["job_id"], r["url"], r["headers"] or {}, r["body"], r["attempt"] + 1,
                            r["next_at"], r["owner"]) for r in rows]

    async def claim(self, due: DueDelivery, hold: float) -> bool:
        """Take ``due`` for one attempt (True), unless another replica took it first."""
        async with self.db.begin() as db:
            won = await db.execute(update(deliveries).where(
                deliveries.c.id == due.id, deliveries.c.state == "pending", deliveries.c.next_at == due.next_at)
                .values(next_at=time.time() + hold))
        return bool(won.rowcount)

    async def tried(self, delivery_id: str, *, attempt: int, delivered: bool, retry_in: float | None,
                    status: int | None, error: str | None) -> None:
        state = "delivered" if delivered else "pending" if retry_in is not None else "failed"
        async with self.db.begin() as db:
            await db.execute(update(deliveries).where(deliveries.c.id == delivery_id).values(
                attempt=attempt, state=state, next_at=time.time() + (retry_in or 0.0), last_status=status,
                last_error=(error or "")[:1000] or None))

    # ------------------------------------------------------------------ sending

    async def run(self, poll: float) -> None:
        """Start what is due when a delivery is queued, or every ``poll`` seconds (longer while nothing is due or
        sending: loops.passes), until cancelled (then the attempts in flight stop: their claims lapse and they are
        sent again, with the same webhook-id)."""
        async def one_pass() -> bool:
            return await self.start_due(time.time()) > 0 or bool(self._sending)

        try:
            await passes(one_pass, self.wake, poll, "webhook delivery")
        finally:
            for task in self._sending.values():
                task.cancel()
            await asyncio.gather(*self._sending.values(), return_exceptions=True)

    async def start_due(self, now: float) -> int:
        """Start attempts for due deliveries while there is room, overall and per receiver; how many started."""
        started, scanned, cursor = 0, 0, None
        hold = self.settings.webhook_timeout + HOLD_MARGIN
        while scanned < MAX_SCAN and len(self._sending) < self.settings.webhook_concurrency:
            batch = await self.due(now, after=cursor)
            for due in batch:
                cursor, scanned = (due.next_at, due.id), scanned + 1
                host = receiver(due.url)
                if due.id in self._sending or self._hosts[host] >= self.settings.webhook_host_concurrency:
                    continue
                if len(self._sending) >= self.settings.webhook_concurrency:
                    break
                if not await self.claim(due, hold):
                    continue
                self._hosts[host] += 1
                task = asyncio.create_task(self._attempt(due))
                self._sending[due.id] = task
                task.add_done_callback(lambda _t, key=due.id, host=host: self._ended(key, host))
                started += 1
            if len(batch) < PAGE:
                break
        return started

    def _ended(self, delivery_id: str, host: str) -> None:
        self._sending.pop(delivery_id, None)
        self._hosts[host] -= 1
        if self._hosts[host] <= 0:
            del self._hosts[host]

    async def _attempt(self, due: DueDelivery) -> None:
        assert self.signer is not None
        try:
            outcome = await deliver(Delivery(due.id, due.url, due.headers, due.body, due.attempt, due.owner),
                                    self.signer,
                                    self.policy, timeout=self.settings.webhook_timeout,
                                    max_attempts=self.settings.webhook_max_attempts)
        except Exception:  # deliver answers network trouble itself: this is a bug; the claim lapses, retried
            log.exception("webhook %s: the attempt failed", due.id)
            return
        with contextlib.suppress(Exception):  # the database is away: the claim lapses and it is sent again
            await self.tried(due.id, attempt=due.attempt, delivered=outcome.delivered, retry_in=outcome.retry_in,
                             status=outcome.status, error=outcome.error)
        result = "delivered" if outcome.delivered else "retried" if outcome.retry_in else "failed"
        if result == "failed":  # given up: said once, by its receiver's host (a query string may hold a token)
            log.warning("webhook %s to %s given up after attempt %d: %s", due.id, receiver(due.url), due.attempt,
                        outcome.error or f"HTTP {outcome.status}")
        if self.metrics is not None:
            self.metrics.webhooks.labels(result).inc()


def receiver(url: str) -> str:
    """The host and port a delivery goes to: what the per-receiver bound counts. A URL that does not parse
    (it would fail its attempt anyway) counts as its own receiver."""
    try:
        parts = urlsplit(url)
        return f"{(parts.hostname or '').lower()}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    except ValueError:
        return url

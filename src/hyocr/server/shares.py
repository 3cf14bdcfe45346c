"""What several API processes of one server divide between them (processes.py, core_processes.py): the
admission limits, the separate metrics port, and the listening socket, which forked children must not keep."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Settings


def share(total: int, index: int, count: int) -> int:
    """Process ``index``'s share of ``total`` split between ``count`` processes: the shares differ by at
    most one and sum to exactly ``total`` (the first ``total % count`` processes get the extra one)."""
    return total // count + (1 if index < total % count else 0)


def process_settings(settings: Settings, index: int, count: int) -> Settings:
    """One process's share of the server-wide limits (Settings refuses a MAX_CONCURRENCY below the
    process count, so every share is at least one). The separate metrics port (if any) is served by
    the first process only; in multiprocess mode it reports every process's figures anyway."""
    return settings.model_copy(update={
        "max_concurrency": share(settings.max_concurrency, index, count),
        "max_queue": share(settings.max_queue, index, count),
        "metrics_port": settings.metrics_port if index == 0 else None,
    })


def close_in_forks(sock: Any) -> None:
    """Close the listening socket in every process forked from this one. vLLM forks its engine core on a
    GPU (``VLLM_WORKER_MULTIPROC_METHOD``; CPU builds spawn), and a forked child keeps every descriptor:
    the core would hold the socket open after the front ends stopped accepting, and connections would wait
    in a backlog nobody accepts from until the core exits. Spawned processes (the front ends) get only the
    descriptors passed to them."""
    os.register_at_fork(after_in_child=sock.close)


def listen(settings: Settings) -> socket.socket:
    """The server's listening socket, bound before any engine loads (a port in use fails at once, and
    connections wait in the backlog until the API processes accept them), closed in forked children."""
    from ..config import SettingsError

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host, settings.port), family=family, backlog=4096)
    except OSError as exc:
        raise SettingsError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
    close_in_forks(sock)
    return sock

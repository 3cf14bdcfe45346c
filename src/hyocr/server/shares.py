"""What several API processes of one server divide between them (processes.py, core_processes.py): the
admission limits, the separate metrics port, and the port: one listening socket, which forked children must
not keep, or one socket a process in a SO_REUSEPORT group, where the kernel spreads the connections."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)


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


def _cannot_listen(settings: Settings, reason: str | None) -> Exception:
    from ..config import SettingsError

    return SettingsError(f"cannot listen on {settings.host}:{settings.port}: {reason}")


def listen(settings: Settings) -> socket.socket:
    """The server's listening socket, bound before any engine loads (a port in use fails at once, and
    connections wait in the backlog until the API processes accept them), closed in forked children."""
    try:
        sock = socket.create_server((settings.host, settings.port), family=_family(settings), backlog=4096)
    except OSError as exc:
        raise _cannot_listen(settings, exc.strerror) from None
    close_in_forks(sock)
    return sock


# ---------------------------------------------------------------- one socket a process (core_processes.py)
# Where a connection decides which engine cores its requests reach (core_processes.py), the spread of the
# connections is the spread of the load. On one shared socket the process woken first accepts every pending
# connection (asyncio's and libuv's accept loops), so a client opening its pool at once loads one process
# (and its cores) with up to several times another's share (H100, session 22: 2x at 256 connections, p99
# 11 s). With a socket each in a SO_REUSEPORT group the kernel hashes each connection to one of them:
# within ~1.2x at 256 connections, under 2x at 32-64 (benchmarks/accept_spread.py).


SHARED_SOCKET_ENV = "HYOCR_SHARED_SOCKET"  # "1": one shared socket anyway (a benchmark hook, README)


def spread_by_kernel() -> bool:
    """Linux's SO_REUSEPORT balances connections over the group's sockets (elsewhere it may not)."""
    return (sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
            and os.environ.get(SHARED_SOCKET_ENV) != "1")


def _family(settings: Settings) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in settings.host else socket.AF_INET


def _bound(settings: Settings, *, reuse_address: bool, reuse_port: bool) -> socket.socket:
    """A socket bound to the server's address (not listening), IPv6 only where the host is, as create_server."""
    sock = socket.socket(_family(settings))
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((settings.host, settings.port))
    except OSError:
        sock.close()
        raise
    return sock


class PortGroup:
    """What the parent holds for its API processes' SO_REUSEPORT group on the server's port: a lock among hyocr
    servers on that address (an abstract Unix socket, freed with the process), and a bound, never listening member
    of the group (it gets no connections) that refuses a plain bind of the port."""

    def __init__(self, lock: socket.socket, member: socket.socket) -> None:
        self.lock, self.member = lock, member

    def close(self) -> None:
        self.member.close()
        self.lock.close()


def _port_lock(settings: Settings) -> socket.socket:
    """One hyocr server at a time on host:port, even two started at the same instant (a plain bind alone would
    let both pass before either joined the group)."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0hyocr-port:{settings.host}:{settings.port}")
    except OSError:
        lock.close()
        raise _cannot_listen(settings, "another hyocr server holds it") from None
    close_in_forks(lock)
    return lock


def reserve_port(settings: Settings) -> PortGroup | None:
    """Hold the server's port for its API processes' SO_REUSEPORT group: fail at once if another hyocr server or
    anything listening has it, then keep a never listening member of the group for the server's life, which makes a
    later plain bind of the port fail. None where that member cannot bind (the port's TIME_WAIT connections of a
    server that ran without SO_REUSEPORT, for up to a minute): the caller then shares one socket, as before.
    A program of the same user that binds the port with SO_REUSEPORT itself would join the group (as beside any
    SO_REUSEPORT server): foreign_listeners() tells."""
    lock = _port_lock(settings)
    try:  # refused by a listener, or by another group's member
        _bound(settings, reuse_address=True, reuse_port=False).close()
    except OSError as exc:
        lock.close()
        raise _cannot_listen(settings, exc.strerror) from None
    try:  # without SO_REUSEADDR: with it, a probe like the one above would bind beside this member
        member = _bound(settings, reuse_address=False, reuse_port=True)
    except OSError as exc:
        lock.close()
        log.warning("port %s:%d: no SO_REUSEPORT group (%s); the API processes share one socket",
                    settings.host, settings.port, exc.strerror)
        return None
    close_in_forks(member)
    return PortGroup(lock, member)


def bind_early(settings: Settings) -> tuple[socket.socket, socket.socket | None]:
    """The single-process server's port, taken before its engine loads: (a lock among hyocr servers on the
    address, the socket bound but not listening), both held for the server's life. A second server on a port in
    use fails at once; it used to load its engine and start its job runner (which claims the jobs database's
    work) before its bind failed. Not listening yet, the port refuses connections while the engine loads;
    uvicorn listens once the app is up. A host name (not an address) gets the lock only: uvicorn binds every
    address the name resolves to (localhost: 127.0.0.1 and ::1), as before."""
    lock = _port_lock(settings)
    try:
        ipaddress.ip_address(settings.host)
    except ValueError:
        return lock, None
    try:
        sock = _bound(settings, reuse_address=True, reuse_port=False)  # refused by a listener, as create_server
    except OSError as exc:
        lock.close()
        raise _cannot_listen(settings, exc.strerror) from None
    close_in_forks(sock)
    return lock, sock


def hold_port(settings: Settings) -> tuple[Any, socket.socket | None]:
    """For the parent of several API processes: what it holds for the server's life, and the socket it hands
    each process: a SO_REUSEPORT group where the kernel spreads connections over the processes (None: each joins
    with a socket of its own, join_group), else one shared listening socket (the same socket twice)."""
    group = reserve_port(settings) if spread_by_kernel() else None
    log.info("the API processes listen %s", "each on its own socket of the port's SO_REUSEPORT group (the kernel "
             "spreads connections)" if group else "on one shared socket")
    if group is not None:
        return group, None
    sock = listen(settings)
    return sock, sock


def join_group(settings: Settings) -> socket.socket:
    """This API process's own socket in the port's SO_REUSEPORT group, bound but not yet listening: uvicorn
    listens once the process's cores are up, so that no connection waits in the backlog of a process still
    loading (the single-process server is refused while it loads, too)."""
    try:
        sock = _bound(settings, reuse_address=True, reuse_port=True)
    except OSError as exc:
        raise _cannot_listen(settings, exc.strerror) from None
    close_in_forks(sock)
    return sock


def foreign_listeners(port: int, pids: list[int]) -> list[int]:
    """The socket inodes listening on TCP ``port`` (any address) that none of ``pids`` holds: another program in
    the port's SO_REUSEPORT group, taking a share of the connections. Linux's /proc; [] where it cannot tell."""
    listening: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                listening.add(int(fields[9]))
    ours: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        ours.add(int(target[8:-1]))
    return sorted(listening - ours) if ours else []  # none of ours readable (or none listening yet): cannot tell


class ForeignWatch:
    """The parent's look, every ``interval`` seconds, for another program's socket in the port's group (an error
    logged once for each new set of intruders; the server goes on: the intruder would keep the port)."""

    def __init__(self, port: int, interval: float = 10.0) -> None:
        self.port, self.interval = port, interval
        self.due, self.intruders = time.monotonic() + interval, []

    def check(self, pids: list[int]) -> None:
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + self.interval
        found = foreign_listeners(self.port, pids)
        if found and found != self.intruders:
            log.error("another program listens on port %d in this server's SO_REUSEPORT group (socket inodes %s) "
                      "and takes a share of its connections: stop it, or set another PORT", self.port, found)
        self.intruders = found

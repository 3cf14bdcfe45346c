"""The port of `--api-processes K --engines-per-gpu N` (server/shares.py, core_processes.py): a socket each in a
SO_REUSEPORT group, so that the kernel spreads connections over the processes, while the port stays the server's
own (a listener on it, or a second hyocr, is refused). Real sockets and real TCP connections on loopback."""

from __future__ import annotations

import collections
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest
from servers import free_port

from hyocr.config import SettingsError, load_settings
from hyocr.server.shares import (
    ForeignWatch,
    PortGroup,
    foreign_listeners,
    join_group,
    listen,
    reserve_port,
    spread_by_kernel,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT balancing is Linux's")


def _settings(port: int):
    return load_settings(host="127.0.0.1", port=port)


def _listening_member(settings) -> socket.socket:
    sock = join_group(settings)
    sock.listen(64)  # what uvicorn does once the process serves
    return sock


def test_the_kernel_spreads_connections_over_the_groups_sockets_and_the_guard_gets_none(monkeypatch):
    monkeypatch.delenv("HYOCR_SHARED_SOCKET", raising=False)
    assert spread_by_kernel()
    settings = _settings(free_port())
    group = reserve_port(settings)
    assert isinstance(group, PortGroup)
    members = [_listening_member(settings) for _ in range(3)]
    accepted: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    def accept(index: int, sock: socket.socket) -> None:
        sock.settimeout(0.5)
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # the timeout included: no more connections
                return
            with lock:
                accepted[index] += 1
            conn.close()

    threads = [threading.Thread(target=accept, args=(i, s)) for i, s in enumerate(members)]
    for thread in threads:
        thread.start()
    clients = [socket.create_connection(("127.0.0.1", settings.port), timeout=5) for _ in range(150)]  # at once
    for thread in threads:
        thread.join(timeout=30)
    for sock in [*clients, *members]:
        sock.close()
    group.close()
    # Every connection reached a listening member (none waits on the guard, which never listens), and each
    # member took a share: the kernel hashes connections, ~50 each (one shared socket gave one process most
    # of a burst: benchmarks/accept_spread.py)
    assert sum(accepted.values()) == 150
    assert min(accepted[i] for i in range(3)) >= 20, accepted


def test_a_process_still_loading_takes_no_connections():
    # Its socket is in the group but not listening until uvicorn serves: a connection is refused (as the single
    # process server refuses while its model loads), not left in the backlog of a process minutes from ready.
    settings = _settings(free_port())
    group, loading = reserve_port(settings), join_group(settings)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", settings.port), timeout=5)
        ready = _listening_member(settings)
        socket.create_connection(("127.0.0.1", settings.port), timeout=5).close()  # the ready one answers
        ready.close()
    finally:
        loading.close()
        group.close()


def test_the_port_is_refused_where_anything_listens_on_it_or_another_hyocr_holds_it():
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # another program's listener
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_port(_settings(port))
    group = reserve_port(_settings(port))  # free again: hyocr's
    try:
        # a second hyocr with API processes, before and after the first one's processes listen
        with pytest.raises(SettingsError, match="another hyocr server holds it"):
            reserve_port(_settings(port))
        member = _listening_member(_settings(port))
        with pytest.raises(SettingsError, match="cannot listen"):
            reserve_port(_settings(port))
        with pytest.raises(SettingsError, match="cannot listen"):  # a second hyocr in one process
            listen(_settings(port))
        member.close()
    finally:
        group.close()
    reserve_port(_settings(port)).close()  # closed: the port is free for the next server


def test_a_port_held_by_sockets_outside_any_group_falls_back_to_one_shared_socket():
    # What a server that ran without SO_REUSEPORT leaves for a minute: its connections in TIME_WAIT, bound with
    # SO_REUSEADDR and not listening. A plain bind passes them, the group's member does not: no group (None, the
    # lock released), and core_processes.py shares one listening socket as before.
    port = free_port()
    with socket.socket() as lingering:
        lingering.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lingering.bind(("127.0.0.1", port))
        assert reserve_port(_settings(port)) is None
        shared = listen(_settings(port))
        shared.close()
    reserve_port(_settings(port)).close()


def test_the_benchmark_hook_brings_the_shared_socket_back(monkeypatch):
    monkeypatch.setenv("HYOCR_SHARED_SOCKET", "1")
    assert not spread_by_kernel()


def test_a_restart_forms_the_group_again_despite_the_last_runs_time_wait_connections():
    settings = _settings(free_port())
    group, member = reserve_port(settings), _listening_member(settings)
    clients = [socket.create_connection(("127.0.0.1", settings.port), timeout=5) for _ in range(5)]
    for conn in [member.accept()[0] for _ in clients]:
        conn.close()  # the server closes first, as at a keep-alive timeout: TIME_WAIT on the server's side
    for sock in [*clients, member]:
        sock.close()
    group.close()
    again = reserve_port(settings)  # the group's own TIME_WAIT connections share SO_REUSEPORT with it
    assert again is not None
    again.close()


def test_another_programs_socket_in_the_group_is_told_apart_from_the_servers_own(caplog):
    settings = _settings(free_port())
    group, member = reserve_port(settings), _listening_member(settings)
    intruder = None
    try:
        assert foreign_listeners(settings.port, [os.getpid()]) == []  # this process holds the group's member
        # another program of the same user binding the port with SO_REUSEPORT (nginx's reuseport, several vllm
        # serve API servers) joins the group: the parent names its socket (core_processes.py logs an error)
        intruder = subprocess.Popen(
            [sys.executable, "-c", "import socket, sys, time\n"
             f"s = socket.create_server(('127.0.0.1', {settings.port}), reuse_port=True)\n"
             "print('listening', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
        assert intruder.stdout.readline().strip() == "listening"
        assert len(foreign_listeners(settings.port, [os.getpid()])) == 1
        assert foreign_listeners(settings.port, [os.getpid(), intruder.pid]) == []
        # what the parents of processes.py and core_processes.py run: one error for a new intruder, not one a look
        watch = ForeignWatch(settings.port, interval=0)
        with caplog.at_level(logging.ERROR, logger="hyocr.server.shares"):
            for _ in range(3):
                watch.check([os.getpid()])
        assert len([r for r in caplog.records if "another program listens" in r.getMessage()]) == 1
    finally:
        if intruder is not None:
            intruder.kill()
            intruder.wait()
        member.close()
        group.close()

"""A TCP proxy on loopback that can cut a server off, or hang it, for the outage tests.

Between a client and the machine's real PostgreSQL or Redis, `cut()` does what a restarting
server or a failover does to its clients: every open connection is dropped, and new ones are
closed as soon as they open, until `restore()`. `hang()` does what a silent partition or a
frozen server does: connections stay open and new ones are accepted, but nothing is forwarded
either way until `restore()`, which then delivers what was held back (as TCP does when a
partition heals). The machine's server itself is never touched, so other tests keep using it.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class OutageProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port` until cut."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closed = False
        self._flowing = threading.Event()
        self._flowing.set()
        threading.Thread(target=self._accept_forever, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._lock:
            self._cut = True
            dropped, self._open = self._open, []
        for sock in dropped:
            _close(sock)

    def hang(self) -> None:
        """Keep every connection open, accept new ones, and forward nothing."""
        self._flowing.clear()

    def restore(self) -> None:
        """Let connections through again (and what a hang held back)."""
        with self._lock:
            self._cut = False
        self._flowing.set()

    def close(self) -> None:
        self.cut()
        self._closed = True
        _close(self._listener)

    def _accept_forever(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                pump = (source, sink, self._flowing)
                threading.Thread(target=_pump, args=pump, daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket, flowing: threading.Event) -> None:
    try:
        while data := source.recv(65536):
            flowing.wait()
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()

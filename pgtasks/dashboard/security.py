"""Who may see the dashboard and who may change anything.

- With a token, every page and API call needs it: ``Authorization: Bearer <token>``, or the
  HttpOnly cookie the login form sets (it holds a value derived from the token, not the token).
- Without a token, the server binds only to a loopback address (:func:`check_bind`), requests
  must name a loopback host (so a web page cannot reach it through DNS rebinding), and changes
  are accepted only from loopback clients.
- A change sent by a browser (a form, or JSON without a bearer token) must come from a page of
  the dashboard itself: its ``Origin`` must be the dashboard's, and forms carry a CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

COOKIE = "pgtasks_dashboard"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class UnsafeBind(ValueError):
    """Serving without a token on an address other machines can reach."""


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an IP address or a name) means this machine only."""
    if not host:
        return False
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _resolves_to_loopback(address: str) -> bool:
    if is_loopback(address):
        return True
    try:
        infos = socket.getaddrinfo(address, None)
    except OSError:
        return False
    found = {str(info[4][0]) for info in infos}
    return bool(found) and all(is_loopback(a.split("%")[0]) for a in found)


def check_bind(address: str, token: str | None) -> None:
    """Refuse to serve without a token on a non-loopback address."""
    if token:
        return
    if not _resolves_to_loopback(address):
        raise UnsafeBind(
            f"refusing to serve the dashboard on {address} without a token: anyone who can "
            "reach that address could requeue and discard tasks. Pass --token (or set "
            "PGTASKS_DASHBOARD_TOKEN), or bind to 127.0.0.1 and reach it through an SSH tunnel."
        )


def _mac(secret: bytes, purpose: str) -> str:
    return hmac.new(secret, f"pgtasks-dashboard:{purpose}".encode(), hashlib.sha256).hexdigest()


def _equal(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Security:
    """The checks of one dashboard app."""

    def __init__(self, token: str | None, allowed_hosts: Iterable[str] | None = None) -> None:
        self.token = token or None
        # Derived from the token, so sessions and open forms survive a restart; random when
        # there is no token.
        secret = self.token.encode() if self.token else secrets.token_bytes(32)
        self.session = _mac(secret, "session") if self.token else None
        self.csrf = _mac(secret, "csrf")
        self.allowed_hosts = (
            frozenset(h.lower() for h in allowed_hosts) if allowed_hosts is not None else None
        )

    def host_allowed(self, conn: HTTPConnection) -> bool:
        """With no token, only requests naming a loopback host (or an allowed one)."""
        name = _host_name(conn.headers.get("host", "")).lower()
        allowed = self.allowed_hosts
        if allowed is not None and (name in allowed or "*" in allowed):
            return True
        return self.token is not None or is_loopback(name)

    def bearer(self, conn: HTTPConnection) -> str | None:
        scheme, _, value = conn.headers.get("authorization", "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def bearer_ok(self, conn: HTTPConnection) -> bool:
        return _equal(self.bearer(conn), self.token)

    def cookie_ok(self, conn: HTTPConnection) -> bool:
        return _equal(conn.cookies.get(COOKIE), self.session)

    def token_ok(self, given: str | None) -> bool:
        return _equal(given, self.token)

    def csrf_ok(self, given: str | None) -> bool:
        return _equal(given, self.csrf)

    @staticmethod
    def client_is_loopback(conn: HTTPConnection) -> bool:
        return conn.client is not None and is_loopback(conn.client.host)

    @staticmethod
    def same_origin(conn: HTTPConnection) -> bool:
        """False for a request a browser sent from another site's page (``Origin``, or
        ``Referer`` when there is no ``Origin``, names another host)."""
        host = conn.headers.get("host", "").lower()
        origin = conn.headers.get("origin")
        if origin is None:
            referer = conn.headers.get("referer")
            if not referer:
                return True  # not sent by a browser's form or fetch (curl, scripts)
            return urlsplit(referer).netloc.lower() == host
        if origin == "null":
            return False
        return urlsplit(origin).netloc.lower() == host


def local_path(value: str | None, default: str = "/") -> str:
    """``value`` when it is a path on this site (a redirect target), else ``default``."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    return value

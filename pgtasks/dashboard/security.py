"""Who may see the dashboard and who may change anything.

- With a token, every page and API call needs it: ``Authorization: Bearer <token>``, or the
  HttpOnly session cookie the login form sets. A session is a random id the server keeps in
  memory (:class:`Sessions`): logging out ends it, and it expires. Wrong tokens are counted per
  client address, and a client that keeps guessing is told to wait (:class:`LoginLimiter`).
- Without a token the dashboard is read-only: nothing can be requeued, discarded or enqueued.
  It binds only to a loopback address (:func:`check_bind`), and requests must name a loopback
  host, so a web page cannot read it through DNS rebinding.
- A change sent by a browser must come from a page of the dashboard itself: its ``Origin``
  must be the dashboard's, and it carries its session's CSRF token.
- ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed only from the proxies named in
  ``forwarded_allow_ips`` (:class:`ForwardedHeaders`), as uvicorn's option of that name does.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "pgtasks_dashboard"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
#: The shortest token accepted.
MIN_TOKEN_LENGTH = 16
#: A command that prints a good token.
MAKE_TOKEN = """python -c "import secrets; print(secrets.token_urlsafe(32))\""""
#: Proxies whose forwarded headers are believed unless told otherwise (uvicorn's default,
#: with IPv6's loopback too).
DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1,::1"
#: What a write to a dashboard without a token is told.
READ_ONLY = (
    "this dashboard is read-only: it was started without a token. Start it with a token "
    "(PGTASKS_DASHBOARD_TOKEN or --token-file) to requeue, discard or enqueue."
)

Clock = Callable[[], float]


class UnsafeBind(ValueError):
    """Serving without a token on an address other machines can reach."""


class WeakToken(ValueError):
    """A dashboard token too short (or unusable in an HTTP header) to keep anyone out."""


def check_token(token: str) -> None:
    """Refuse a token shorter than :data:`MIN_TOKEN_LENGTH` characters, or one holding
    spaces, control or non-ASCII characters (an ``Authorization`` header cannot carry them)."""
    how = f"make one with: {MAKE_TOKEN}"
    if len(token) < MIN_TOKEN_LENGTH:
        raise WeakToken(
            f"the dashboard token is too short ({len(token)} characters): it needs at least "
            f"{MIN_TOKEN_LENGTH} random characters; {how}"
        )
    if not all("!" <= ch <= "~" for ch in token):
        raise WeakToken(
            "the dashboard token may hold only printable ASCII characters without spaces "
            f"(it is sent in an HTTP header); {how}"
        )


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
            "reach that address could read every task's arguments and errors. Set "
            "PGTASKS_DASHBOARD_TOKEN (or pass --token-file), or bind to 127.0.0.1 and reach "
            "it through an SSH tunnel."
        )


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def _equal(given: str | None, expected: str | None) -> bool:
    """``given == expected`` in time that depends on neither: digests of both are compared,
    so not even the length of ``expected`` shows."""
    if not given or not expected:
        return False
    return hmac.compare_digest(_digest(given), _digest(expected))


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


# -- proxies --------------------------------------------------------------------------------------


class TrustedProxies:
    """The addresses whose ``X-Forwarded-*`` headers are believed: a comma-separated list of
    IP addresses and networks (``127.0.0.1,10.0.0.0/8``), ``*`` for any, or empty for none."""

    def __init__(self, spec: str | Iterable[str]) -> None:
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        names = [item.strip() for item in items if item.strip()]
        self.any = "*" in names
        networks = []
        for name in names:
            if name == "*":
                continue
            try:
                networks.append(ipaddress.ip_network(name.strip("[]"), strict=False))
            except ValueError:
                raise ValueError(
                    f"forwarded-allow-ips: {name!r} is not an IP address or network "
                    "(give addresses like 127.0.0.1 or 10.0.0.0/8, comma-separated, or *)"
                ) from None
        self.networks = tuple(networks)

    def __contains__(self, host: object) -> bool:
        if self.any:
            return True
        if not isinstance(host, str):
            return False
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 client
        return any(address in network for network in self.networks)


def _header_values(scope: Scope, name: bytes) -> list[str]:
    """Every comma-separated value of the header ``name``, over all its lines, in order."""
    values: list[str] = []
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            values.extend(v.strip() for v in value.decode("latin-1").split(","))
    return [v for v in values if v]


class ForwardedHeaders:
    """ASGI middleware: for a request from a trusted proxy, the scheme its client used
    (``X-Forwarded-Proto``) and the client's address (``X-Forwarded-For``, read from the right
    past the trusted proxies), as uvicorn's ``--forwarded-allow-ips`` reads them. Anyone else's
    forwarded headers are ignored, so a client cannot claim https or another address."""

    def __init__(self, app: ASGIApp, trusted: TrustedProxies) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] in ("http", "websocket") and client and client[0] in self.trusted:
            scope = dict(scope)
            protos = _header_values(scope, b"x-forwarded-proto")
            if protos and protos[-1].lower() in ("http", "https"):
                scheme = protos[-1].lower()
                if scope["type"] == "websocket":
                    scheme = "wss" if scheme == "https" else "ws"
                scope["scheme"] = scheme
            hops = _header_values(scope, b"x-forwarded-for")
            if hops:
                # The nearest hop not one of ours is the client; every hop ours: the first.
                found = next((h for h in reversed(hops) if h not in self.trusted), hops[0])
                scope["client"] = (found, 0)
        await self.app(scope, receive, send)


# -- sessions and wrong tokens ------------------------------------------------------------------


class Sessions:
    """Logged-in browsers: random ids kept in memory (as digests, so a lookup's time tells
    nothing of the ids), each valid for ``lifetime`` seconds or until it is ended. At most
    ``limit`` are kept; past that the oldest is dropped. A restart ends them all."""

    def __init__(
        self, lifetime: float = 12 * 3600.0, limit: int = 10_000, clock: Clock = time.monotonic
    ) -> None:
        self.lifetime = lifetime
        self.limit = limit
        self.clock = clock
        self._expiry: dict[bytes, float] = {}  # in order of creation
        self._lock = threading.Lock()

    def create(self) -> str:
        """A new session's id (for the cookie)."""
        session = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._drop_expired(now)
            while len(self._expiry) >= self.limit:
                del self._expiry[next(iter(self._expiry))]
            self._expiry[_digest(session)] = now + self.lifetime
        return session

    def valid(self, session: str | None) -> bool:
        """Whether ``session`` is a live session's id."""
        if not session:
            return False
        with self._lock:
            expiry = self._expiry.get(_digest(session))
            if expiry is None:
                return False
            if expiry <= self.clock():
                del self._expiry[_digest(session)]
                return False
            return True

    def end(self, session: str | None) -> None:
        """Forget ``session``: its cookie is refused from now on."""
        if session:
            with self._lock:
                self._expiry.pop(_digest(session), None)

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired(self.clock())
            return len(self._expiry)

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, expiry in self._expiry.items() if expiry <= now]:
            del self._expiry[key]


def client_key(host: str | None) -> str:
    """Whom wrong tokens are counted against: the client's address, or for IPv6 its /64 (one
    machine usually holds a whole /64, and could otherwise change address at every guess)."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if address.version == 6:
        mapped = address.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class LoginLimiter:
    """At most ``failures`` wrong tokens per client in ``window`` seconds; past that, every
    try of a token from that client (right or wrong, so the answer tells nothing) waits until
    the oldest failure is ``window`` old. Kept in memory for at most ``max_clients`` clients."""

    def __init__(
        self,
        failures: int = 5,
        window: float = 60.0,
        clock: Clock = time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        self.failures = failures
        self.window = window
        self.clock = clock
        self.max_clients = max_clients
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait(self, client: str) -> int:
        """Whole seconds ``client`` must wait before trying a token again (0: it may now)."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if times is None or len(times) < self.failures:
                return 0
            return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str) -> None:
        """Count a wrong token from ``client``."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if times is None:
                if len(self._seen) >= self.max_clients:
                    self._forget_old(now)
                times = self._seen[client] = deque()
            times.append(now)
            while len(times) > self.failures:
                times.popleft()

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures: it has the token."""
        with self._lock:
            self._seen.pop(client, None)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._seen.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._seen[client]
            return None
        return times

    def _forget_old(self, now: float) -> None:
        for client in list(self._seen):
            self._recent(client, now)
        while len(self._seen) >= self.max_clients:
            del self._seen[next(iter(self._seen))]


# -- the checks of one app ------------------------------------------------------------------------


class Security:
    """The checks of one dashboard app."""

    def __init__(
        self,
        token: str | None,
        allowed_hosts: Iterable[str] | None = None,
        *,
        sessions: Sessions | None = None,
        limiter: LoginLimiter | None = None,
    ) -> None:
        if token is not None:
            check_token(token)
        self.token = token
        self.sessions = Sessions() if sessions is None else sessions
        self.limiter = LoginLimiter() if limiter is None else limiter
        # Signs each session's CSRF token and the pages' messages; new at every start, as the
        # sessions are.
        self._csrf_key = secrets.token_bytes(32)
        self.allowed_hosts = (
            frozenset(h.lower() for h in allowed_hosts) if allowed_hosts is not None else None
        )

    @property
    def read_only(self) -> bool:
        """No token: nothing may change."""
        return self.token is None

    def host_allowed(self, conn: HTTPConnection) -> bool:
        """With no token, only requests naming a loopback host (or an allowed one)."""
        name = _host_name(conn.headers.get("host", "")).lower()
        allowed = self.allowed_hosts
        if allowed is not None and (name in allowed or "*" in allowed):
            return True
        return self.token is not None or is_loopback(name)

    @staticmethod
    def bearer(conn: HTTPConnection) -> str | None:
        """The token of an ``Authorization: Bearer`` header, if there is one."""
        scheme, _, value = conn.headers.get("authorization", "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def token_ok(self, given: str | None) -> bool:
        """Whether ``given`` is the token (in constant time)."""
        return _equal(given, self.token)

    def session(self, conn: HTTPConnection) -> str | None:
        """The request's live session id, if its cookie holds one."""
        session = conn.cookies.get(COOKIE)
        return session if self.sessions.valid(session) else None

    def csrf_for(self, session: str | None) -> str:
        """The CSRF token of ``session``'s forms ("" without a session: no form may change
        anything then)."""
        if not session:
            return ""
        return hmac.new(self._csrf_key, session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, conn: HTTPConnection, given: str | None) -> bool:
        """Whether ``given`` is the CSRF token of the request's session."""
        return _equal(given, self.csrf_for(self.session(conn)))

    def sign(self, message: str) -> str:
        """A signature of ``message`` for a redirect's query string, so that only messages this
        dashboard wrote are shown as its own (a link cannot make it say "Discarded 500")."""
        digest = hmac.new(self._csrf_key, b"message:" + message.encode(), hashlib.sha256)
        return digest.hexdigest()[:32]

    def signed(self, message: str | None, signature: str | None) -> str | None:
        """``message`` when ``signature`` is its :meth:`sign`, else None."""
        if message is None or not _equal(signature, self.sign(message)):
            return None
        return message

    @staticmethod
    def client(conn: HTTPConnection) -> str:
        """Whom the request's wrong tokens count against (see :func:`client_key`)."""
        return client_key(conn.client.host if conn.client else None)

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
    """``value`` when it is a path on this site (a redirect target), else ``default``.

    Browsers drop tabs and line ends from a URL and read ``\\`` as ``/``, so ``/\\t/evil`` or
    ``/\\evil`` would lead to another site: any of those, or any other control character or
    space, makes ``value`` unusable.
    """
    if not value or not value.startswith("/") or value.startswith("//"):
        return default
    if "\\" in value or any(ch <= " " or ch == "\x7f" for ch in value):
        return default
    return value

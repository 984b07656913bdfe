"""The only code that talks SQL: one method per named query in ``sql/queries.sql``.

Connections come from a psycopg pool opened lazily in the process that uses it (so a forked
child never shares its parent's sockets). Every statement runs in autocommit mode: each named
query is one atomic statement, so there is no BEGIN/COMMIT round trip on the hot path. A caller's
own connection can be passed to the enqueue methods to enqueue inside the caller's transaction.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import psycopg
import structlog
from psycopg import abc, errors, generators, pq, sql
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import args_row, dict_row, tuple_row
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from pgtasks.exceptions import (
    EncodeError,
    ImproperlyConfigured,
    NotPermitted,
    PgTasksError,
    QuotaExceeded,
)
from pgtasks.headers import CONCURRENCY_KEY
from pgtasks.message import ClaimedTask, TaskMessage
from pgtasks.pools import LifoConnectionPool
from pgtasks.records import Failure, Plan, Pruned, Release, RetryAt, StoredResult, Success
from pgtasks.serialization import one_shot, read_json, too_large, whole_document
from pgtasks.sql import PSYCOPG_CACHED_LENGTH, native, queries

if TYPE_CHECKING:
    from pgtasks.worker.floors import FloorPlan

Row = dict[str, Any]
_T = TypeVar("_T")
_Item = TypeVar("_Item")

_FOREVER = datetime.max.replace(tzinfo=timezone.utc)
#: The earliest time Python holds: what a row's '-infinity' (set by hand) reads as.
NEVER_BEFORE = datetime.min.replace(tzinfo=timezone.utc)
_TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid
log = structlog.get_logger("pgtasks")

#: Session settings of a worker's claim and outcome connections: each prepared statement runs
#: one generic plan, made at its first executions, and that plan never reads the whole task
#: table. Every statement there finds its rows through an index; but a plan made while the
#: table was small (a new schema, a queue just drained) would scan the table instead, and keep
#: scanning it as the table grows, until statistics change (autovacuum's ANALYZE, up to a
#: minute or more later): claims of tens of rows then took 0.3 to 1.2 s at 2,000 tasks/s.
GENERIC_PLAN_SETTINGS = ("plan_cache_mode=force_generic_plan", "enable_seqscan=off")


class _TimestamptzLoader(Loader):
    """timestamptz with PostgreSQL's 'infinity' and '-infinity' (a row can hold them, set by
    hand) read as the latest and earliest datetimes instead of failing the statement's read.

    Other values go to psycopg's own loader (its C one where psycopg has it): a subclass of
    that loader would be its Python version, several times slower on every claimed row.
    """

    base: type[abc.Loader] = psycopg.adapters.get_loader(_TIMESTAMPTZ, pq.Format.TEXT) or (
        TimestamptzLoader
    )
    infinity = b"infinity"
    minus_infinity = b"-infinity"

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = self.base(oid, context).load

    def load(self, data: Buffer) -> datetime:
        if data == self.infinity:
            return _FOREVER
        if data == self.minus_infinity:
            return NEVER_BEFORE
        value: datetime = self._load(data)
        return value


class _TimestamptzBinaryLoader(_TimestamptzLoader):
    format = pq.Format.BINARY
    base = psycopg.adapters.get_loader(_TIMESTAMPTZ, pq.Format.BINARY) or TimestamptzBinaryLoader
    infinity = b"\x7f\xff\xff\xff\xff\xff\xff\xff"
    minus_infinity = b"\x80\x00\x00\x00\x00\x00\x00\x00"


#: The largest json or jsonb value a connection reads where no limit is given: the default of
#: max_payload_bytes.
MAX_JSON_BYTES = 10 * 1024 * 1024


class _JsonLoader(Loader):
    """json and jsonb, read by the json module's C scanner straight from the text.

    psycopg's loader hands the bytes to ``json.loads``, which first works out their encoding
    in Python: several times the cost of the parse itself for the small headers of every
    claimed row. The server sends a document and nothing else, in the connection's encoding
    (UTF-8 here).

    A value that does not read, or is over ``limit`` bytes (left unread), loads as
    ``Unreadable`` rather than failing the statement: anyone who may insert a row can write
    such a value (headers nested thousands deep, a number of 100,000 digits), and it must fail
    its own row, not a claim of many rows, nor a page listing them.
    """

    # A static method: a plain function stored on the class.
    _read = staticmethod(whole_document(json.JSONDecoder()))
    #: The largest value read, in bytes (see json_adapters).
    limit = MAX_JSON_BYTES

    def load(self, data: Buffer) -> Any:
        if len(data) > self.limit:
            return too_large(len(data), self.limit)
        raw = data if isinstance(data, bytes) else bytes(data)
        try:
            return self._read(raw.decode("utf-8"))
        except Exception:
            # Not UTF-8, not one document, or nested too deeply: json.loads works out the
            # bytes' encoding (a byte order mark included), then reads them or says why not.
            return read_json(raw, self.limit)


#: The adapters of pgtasks' connections: psycopg's, with the timestamptz and json loaders above
#: (kept off psycopg's global map, which belongs to the application).
_ADAPTERS = AdaptersMap(psycopg.adapters)
_ADAPTERS.register_loader("timestamptz", _TimestamptzLoader)
_ADAPTERS.register_loader("timestamptz", _TimestamptzBinaryLoader)
_ADAPTERS.register_loader("json", _JsonLoader)
_ADAPTERS.register_loader("jsonb", _JsonLoader)


@functools.lru_cache(maxsize=8)
def json_adapters(max_json_bytes: int) -> AdaptersMap:
    """The adapters of a broker's connections, which read json and jsonb values of up to
    ``max_json_bytes`` (its app's max_payload_bytes): a larger one, which no client of the app
    enqueues, loads as ``Unreadable`` without being parsed."""
    if max_json_bytes == _JsonLoader.limit:
        return _ADAPTERS
    loader = type("_JsonLoader", (_JsonLoader,), {"limit": max_json_bytes})
    adapters = AdaptersMap(_ADAPTERS)
    adapters.register_loader("json", loader)
    adapters.register_loader("jsonb", loader)
    return adapters


# Headers as COPY sends them: compact json, like the json document of ``insert_tasks``.
_HEADERS_JSON = one_shot(json.JSONEncoder(separators=(",", ":")))
_QUOTE = json.encoder.encode_basestring_ascii


def headers_json_maker(base: dict[str, Any]) -> Callable[[str, str], str] | None:
    """For ``apply_many``'s rows: a function of ``(argsrepr, kwargsrepr)`` that writes what
    ``_HEADERS_JSON`` writes for ``{**base, "argsrepr": ..., "kwargsrepr": ...}``, with
    ``base`` encoded once; None where ``base`` already has either key or is not json."""
    if "argsrepr" in base or "kwargsrepr" in base:
        return None
    try:
        start = _HEADERS_JSON(base)[:-1] + ("," if base else "") + '"argsrepr":'
    except (TypeError, ValueError):
        return None
    quote = _QUOTE

    def headers(argsrepr: str, kwargsrepr: str) -> str:
        return f'{start}{quote(argsrepr)},"kwargsrepr":{quote(kwargsrepr)}}}'

    return headers


# The attribute of a connection pgtasks opened that holds its cursors, one per row factory:
# a statement on a kept cursor skips building a cursor, which costs as much client time as
# sending and reading a short statement.
_KEPT = "_pgtasks_cursors"
#: The most cursors a connection keeps. Cursors are kept by row factory, and pgtasks uses a
#: few fixed ones; a factory made anew for each statement would otherwise keep a cursor per
#: statement, for as long as the connection lives.
_KEPT_MAX = 8


def keep_cursors(conn: psycopg.Connection[Any]) -> None:
    """Let ``conn``'s statements reuse cursors (for connections pgtasks opened and owns)."""
    setattr(conn, _KEPT, {})


# The attribute of a pooled connection that holds its _DirectState (see Broker._direct).
_DIRECT = "_pgtasks_direct"


class _DirectState:
    """What Broker._direct keeps on a pooled connection: the names of the statements prepared
    on it, and its client encoding (read once: pgtasks never changes it)."""

    __slots__ = ("encoding", "prepared")

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.prepared: set[bytes] = set()


def _text_param(value: Any, encoding: str) -> bytes | None:
    """A single enqueue's parameter in PostgreSQL's text format (see Broker._direct): the
    statement's casts and columns give each its type."""
    kind = type(value)
    if kind is str:
        encoded: bytes = value.encode(encoding)
        return encoded
    if value is None:
        return None
    if kind is bool:
        return b"t" if value else b"f"
    if kind is int:
        return b"%d" % value
    if kind is float:
        # Finite: countdown and expires are checked as the message is built.
        return repr(value).encode()
    if isinstance(value, datetime):
        return value.isoformat().encode()
    if isinstance(value, str):
        return value.encode(encoding)
    if isinstance(value, int):
        return b"%d" % value
    raise TypeError(f"unexpected parameter of type {type(value).__name__}")


class _DirectStatement(NamedTuple):
    """A single enqueue's statement as Broker._direct sends it."""

    name: bytes  # of the prepared statement, on every pooled connection
    query: bytes  # with $1 placeholders
    params: tuple[str, ...]  # the parameters, in placeholder order
    formats: tuple[int, ...]  # 0: text, 1: binary (the raw payload, bytea, sent as it is)

    def values(self, params: Mapping[str, Any], encoding: str) -> list[Any]:
        """The parameters of one execution, as sent. The common types are converted here
        rather than by a call of ``_text_param`` each: this runs on every ``delay()``."""
        out: list[Any] = []
        add = out.append
        for n, binary in zip(self.params, self.formats, strict=True):
            value = params[n]
            if binary or value is None:
                add(value)
            elif type(value) is str:
                add(value.encode(encoding))
            else:
                add(_text_param(value, encoding))
        return out


def direct_state(conn: Any) -> _DirectState:
    """The _DirectState of a pooled connection (sync or async), made on first use."""
    state: _DirectState | None = getattr(conn, _DIRECT, None)
    if state is None:
        state = _DirectState(conn.info.encoding)
        setattr(conn, _DIRECT, state)
    return state


def direct_gen(
    pg: pq.abc.PGconn,
    statement: _DirectStatement,
    params: Mapping[str, Any],
    state: _DirectState,
) -> Generator[Any, Any, list[pq.abc.PGresult]]:
    """Run ``statement`` with ``params`` (preparing it on the connection first if it is not
    yet): a generator for psycopg's ``Connection.wait`` (or ``AsyncConnection.wait``), which
    returns its results. A session that lost its prepared statements (DEALLOCATE ALL,
    DISCARD ALL) fails the statement, which changed nothing: it is prepared and run once
    more."""
    values = statement.values(params, state.encoding)
    results = yield from _run_prepared(pg, statement, values, state)
    last = results[-1]
    if (
        last.status == pq.ExecStatus.FATAL_ERROR
        and last.error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
    ):
        state.prepared.clear()
        results = yield from _run_prepared(pg, statement, values, state)
    return results


def _run_prepared(
    pg: pq.abc.PGconn, statement: _DirectStatement, values: Sequence[Any], state: _DirectState
) -> Generator[Any, Any, list[pq.abc.PGresult]]:
    if statement.name not in state.prepared:
        pg.send_prepare(statement.name, statement.query)
        _check_direct((yield from generators.execute(pg)), state.encoding)
        state.prepared.add(statement.name)
    pg.send_query_prepared(statement.name, values, statement.formats)
    results: list[pq.abc.PGresult] = yield from generators.execute(pg)
    return results


def direct_rows(results: Sequence[pq.abc.PGresult], encoding: str) -> list[Any]:
    """The rows of a statement direct_gen ran, as tuples of booleans (the only columns these
    statements return); its error raised as a cursor would raise it."""
    result = results[-1]
    if result.status == pq.ExecStatus.TUPLES_OK:
        if result.ntuples == 1 and result.nfields == 1:  # an enqueue's row: handed_off
            return [(result.get_value(0, 0) == b"t",)]
        return [
            tuple(result.get_value(row, col) == b"t" for col in range(result.nfields))
            for row in range(result.ntuples)
        ]
    _check_direct(results, encoding)
    return []


def _check_direct(results: Sequence[pq.abc.PGresult], encoding: str) -> None:
    """Raise the error of a statement sent by Broker._direct, as a cursor would."""
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=encoding)
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise psycopg.InterfaceError(f"unexpected result of an enqueue: {result.status!r}")


#: Claimed rows built positionally, as ClaimedTask (one factory for every claim, so that
#: claims share one kept cursor).
_CLAIMED_ROWS = args_row(ClaimedTask)


# Forks of this process so far, as seen by the child (a pool is never shared across a fork).
_forks = [0]


#: Every Broker of this process, whose kept connection a fork leaves with the parent.
_brokers: weakref.WeakSet[Broker] = weakref.WeakSet()


def _forked() -> None:
    _forks[0] += 1
    for broker in list(_brokers):
        broker.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel that announces due tasks for ``schema``."""
    return f"pgtasks_{schema}"[:63]


def cancel_channel(schema: str) -> str:
    """The channel that tells workers a running task of ``schema`` was revoked."""
    return f"pgtasks_c_{schema}"[:63]


def handoff_channel(schema: str, worker: str) -> str:
    """The channel a parked worker is handed tasks on (see ``Broker.park``)."""
    digest = hashlib.sha1(f"{schema}\x00{worker}".encode()).hexdigest()[:24]
    return f"pgtasks_h_{digest}"


#: The most ids one hand-off notification may name, and the longest it may be: a worker reads
#: nothing more of it (anyone who can connect can send one; see handed_ids).
HANDOFF_MAX_IDS = 16
HANDOFF_MAX_BYTES = 4096


def handed_ids(payload: str) -> list[str]:
    """The task ids a hand-off notification names (see ``insert_task_handoff``): a JSON array
    of strings. Anything else (too long, not an array of strings, too many) names nothing: a
    notification is a hint to look, and the worker runs only rows it then claims itself."""
    if len(payload) > HANDOFF_MAX_BYTES:
        return []
    try:
        ids = json.loads(payload)
    except ValueError:
        return []
    if not isinstance(ids, list) or len(ids) > HANDOFF_MAX_IDS:
        return []
    return [i for i in ids if isinstance(i, str) and i]


def _text(value: str | None) -> str | None:
    """Error text as a text column accepts it: PostgreSQL refuses NUL characters, and an
    exception message may carry one (a failed write there would stop the worker's completer)."""
    return value.replace("\x00", "\\x00") if value else value


def _options(dsn: str, settings: Sequence[str]) -> str:
    """The startup options for a session with ``settings`` (``name=value``): ours first, then
    those of the DSN (or PGOPTIONS, which libpq reads only when none are given), so that a
    setting the user chose there wins."""
    try:
        given = conninfo_to_dict(dsn).get("options")
    except psycopg.ProgrammingError:
        given = None  # connect() says what is wrong with the DSN
    if given is None:
        given = os.environ.get("PGOPTIONS")
    ours = " ".join(f"-c {setting}" for setting in settings)
    return f"{ours} {given}" if given else ours


#: The set_aside of claim_plain's one row when it met a row under a concurrency limit.
LIMITED = "LIMITED"


def _claim_order(row: ClaimedTask) -> tuple[bool, int, datetime, datetime]:
    """The claim's order (claimed rows first): priority (highest first), due time, age."""
    return (row.set_aside is not None, -row.priority, row.run_at, row.created_at)


def _ago(started: datetime | None, now: float) -> float | None:
    """Seconds from a run's start to ``now``, both read from this host's clock. Outcomes carry
    this age rather than the start itself, and the database subtracts it from its own ``now()``:
    a worker whose clock is off still records when its runs began on the database's clock."""
    return None if started is None else max(0.0, now - started.timestamp())


class Broker:
    """Named queries against one database and schema."""

    #: How many times a statement is sent again after meeting a connection the server closed.
    STALE_RETRIES = 3
    #: Seconds for which claims go on deciding concurrency limits (claim_batch) after a plain
    #: claim (claim_plain) met a due row under one, before a plain claim is tried again.
    LIMITS_PAUSE = 60.0

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        prepared_statements: bool = True,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        source: str | None = None,
        max_payload_bytes: int = MAX_JSON_BYTES,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        #: Of this broker's connections: json values are read up to max_payload_bytes.
        self.adapters = json_adapters(max_payload_bytes)
        #: Sent as the session's pgtasks.source: the source of the rows this process enqueues
        #: (see pgtasks.quotas); None: the database role.
        self.source = source
        self.q = queries(schema)
        #: The queries psycopg would convert to ``$1`` placeholders on every execution (see
        #: pgtasks.sql.native), converted once: each runs on a RawCursor, with its parameters
        #: in this order.
        self._native: dict[str, tuple[bytes, tuple[str, ...]]] = {
            name: native(query)
            for name, query in self.q.items()
            if isinstance(query, bytes) and len(query) > PSYCOPG_CACHED_LENGTH
        }
        #: The single enqueues' statements, sent through libpq itself (see _direct).
        self._direct_statements: dict[str, _DirectStatement] = {}
        for name in ("insert_task", "insert_task_handoff"):
            query = self.q[name]
            if isinstance(query, bytes):
                text, names = native(query)
                digest = hashlib.sha1(query).hexdigest()[:16]
                self._direct_statements[name] = _DirectStatement(
                    f"pgtasks_{name}_{digest}".encode(),
                    text,
                    names,
                    tuple(int(n == "payload_raw") for n in names),
                )
        self._copy_statement = sql.SQL(
            "COPY {}.tasks (id, name, queue, priority, run_at, expires_at, content_type,"
            " content_encoding, payload, payload_raw, headers, max_retries) FROM STDIN"
        ).format(sql.Identifier(schema))
        # Whether COPY may load tasks: not where row-level security applies to this role
        # (`pgtasks grants`), which PostgreSQL refuses COPY FROM for. None: not known yet.
        self._copy_ok: bool | None = None
        #: Whether hand-offs may commit before the WAL flush (see early_commits).
        self.early_ok: bool | None = None
        # Until when single enqueues do not offer hand-offs (see insert_statement).
        self._handoff_again = 0.0
        # Until when claims decide concurrency limits whatever they meet (see claim_all).
        self._limits_until = 0.0
        self.prepare_threshold: int | None = 5 if prepared_statements else None
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self._pool: ConnectionPool | None = None
        self._pool_forks = -1
        self._inherited: list[ConnectionPool] = []
        self._lock = threading.Lock()
        # The connection single enqueues keep between calls (see _pooled), taken from the pool
        # (the one in _hot_pool) at _hot_since; used by one thread at a time, under _hot_lock.
        self._hot: psycopg.Connection[Any] | None = None
        self._hot_pool: ConnectionPool | None = None
        self._hot_since = 0.0
        self._hot_lock = threading.Lock()
        self._inherited_hot: list[psycopg.Connection[Any]] = []
        _brokers.add(self)

    # -- connections -------------------------------------------------------------------------

    def _conn_kwargs(self, *settings: str) -> dict[str, Any]:
        """Connection arguments; ``settings`` are extra ``name=value`` session settings."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": self.prepare_threshold,
            "connect_timeout": max(1, int(self.connect_timeout)),
            "context": self.adapters,
        }
        if self.prepare_threshold is not None:
            # No JIT compilation: it never pays for these short statements. A claim's plan is
            # costed for the worst case (thousands of rows of one concurrency key), over
            # jit_above_cost once the table holds a large analyzed backlog, and compiling it
            # took 90 ms to 1.7 s a claim, against 5 ms to run it. Not sent where PgBouncer
            # (prepared_statements=False) may refuse startup options: see docs/operating.md.
            settings = ("jit=off", *settings)
        if self.source:
            settings = (f"pgtasks.source={self.source}", *settings)
        if settings:
            kwargs["options"] = _options(self.dsn, settings)
        return kwargs

    @property
    def pool(self) -> ConnectionPool:
        """The process's connection pool, opened on first use (and again after a fork)."""
        # The fork count, not os.getpid(), on the hot path: a system call per statement costs
        # microseconds on some virtual machines.
        if self._pool is None or self._pool_forks != _forks[0]:
            with self._lock:
                if self._pool is None or self._pool_forks != _forks[0]:
                    if self._pool is not None:
                        # A pool inherited through fork: its sockets belong to the parent.
                        # Keep a reference so that garbage collection never closes them here.
                        self._inherited.append(self._pool)
                    self._pool = LifoConnectionPool(
                        self.dsn,
                        min_size=self.min_size,
                        max_size=self.max_size,
                        kwargs=self._conn_kwargs(),
                        configure=keep_cursors,
                        open=False,
                        name=f"pgtasks-{os.getpid()}",
                    )
                    self._pool.open(wait=False)
                    self._pool_forks = _forks[0]
        return self._pool

    @contextmanager
    def connection(
        self, conn: psycopg.Connection[Any] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection when given, else one from the pool."""
        if conn is not None:
            yield conn
            return
        with self.pool.connection(timeout=self.connect_timeout) as pooled:
            yield pooled

    def connect(self, autocommit: bool = True) -> psycopg.Connection[Any]:
        """A dedicated connection outside the pool (LISTEN, migrations, admin commands)."""
        return psycopg.connect(self.dsn, autocommit=autocommit, context=self.adapters)

    @property
    def own_connections(self) -> bool:
        """Whether workers claim and write outcomes on connections of their own, with session
        settings of their own (``claim_connection``, ``completion_connection``). Not behind
        PgBouncer (``prepared_statements=False``), which would not keep a session's settings."""
        return self.prepare_threshold is not None

    def _own_connection(self, *settings: str) -> psycopg.Connection[Any]:
        """A worker's connection outside the pool, with ``settings``, keeping its cursors."""
        conn = psycopg.connect(self.dsn, **self._conn_kwargs(*settings))
        keep_cursors(conn)
        return conn

    def claim_connection(self) -> psycopg.Connection[Any]:
        """A worker's connection for claims, with ``synchronous_commit`` off.

        A claim is a promise to run, not an outcome. One lost in a database crash (it can only
        be the last few hundred milliseconds of claims: any later synchronous commit, such as
        the worker's next completion, flushes it) leaves its rows PENDING, so they run again,
        as at-least-once delivery allows, under the attempt number the lost claim had taken.
        When another worker claims such a row, the first run's outcome fails its fenced write;
        when this worker does, the run that ends first is recorded and the other's outcome is
        discarded. Every outcome, retry and renewal is still committed durably.

        Claims here run their prepared statement's generic plan, planned once (see
        ``GENERIC_PLAN_SETTINGS``): left to choose, the server plans a claim again for every
        execution (its custom plans look cheaper), and planning the claim takes longer than
        running it.
        """
        return self._own_connection("synchronous_commit=off", *GENERIC_PLAN_SETTINGS)

    def completion_connection(self) -> psycopg.Connection[Any]:
        """A worker's connection for its outcomes (committed durably, as on any connection).

        As for claims, the fenced writes run their prepared statement's generic plan, planned
        once: on pooled connections each statement was planned again for its first executions
        on every connection the pool handed out, and planning a completion takes a third of
        the time of running one for tens of rows.
        """
        return self._own_connection(*GENERIC_PLAN_SETTINGS)

    def listen_connection(self, *channels: str) -> psycopg.Connection[Any]:
        """A connection listening on the wake-up and cancel channels, and on ``channels``."""
        conn = self.connect()
        for channel in (notify_channel(self.schema), cancel_channel(self.schema), *channels):
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return conn

    def close(self) -> None:
        # Waits for an enqueue on the kept connection; one still running after
        # connect_timeout keeps it, and the next enqueue closes it.
        if self._hot_lock.acquire(timeout=self.connect_timeout):
            try:
                self._drop_hot()
            finally:
                self._hot_lock.release()
        if self._pool is not None and self._pool_forks == _forks[0]:
            self._pool.close()
        self._pool = None

    def _all(
        self,
        name: str,
        params: dict[str, Any],
        conn: psycopg.Connection[Any] | None = None,
        row_factory: Any = dict_row,
    ) -> list[Row]:
        if conn is not None:
            return self._run(conn, name, params, row_factory)
        return self._pooled(lambda c: self._run(c, name, params, row_factory), name)

    #: Seconds single enqueues keep one connection out of the pool before they hand it back
    #: and take the pool's next (so that its health checks and lifetime apply to it too).
    HOT_FOR = 30.0

    def forked(self) -> None:
        """In a child process just forked (one thread): the kept connection, whose socket is
        the parent's, is set aside (referenced, so that garbage collection never closes it
        here), and its lock, which another thread of the parent may have held, made anew."""
        if self._hot is not None:
            self._inherited_hot.append(self._hot)
        self._hot = self._hot_pool = None
        self._hot_lock = threading.Lock()

    def _take_hot(self, pool: ConnectionPool) -> psycopg.Connection[Any]:
        """The connection single enqueues keep (under _hot_lock): the one kept, or a new one
        from ``pool`` when there is none, it came from another pool (closed since), or it has
        been kept for HOT_FOR seconds."""
        conn = self._hot
        if conn is not None:
            if self._hot_pool is pool and time.monotonic() - self._hot_since < self.HOT_FOR:
                return conn
            self._drop_hot()
        conn = self._hot = pool.getconn(timeout=self.connect_timeout)
        self._hot_pool = pool
        self._hot_since = time.monotonic()
        return conn

    def _drop_hot(self) -> None:
        """Hand the kept connection back to its pool (under _hot_lock), which keeps it, resets
        it or, broken, replaces it; closed, where that pool has been closed."""
        conn, pool = self._hot, self._hot_pool
        self._hot = self._hot_pool = None
        if conn is None:
            return
        if pool is not None and pool is self._pool:
            pool.putconn(conn)
        else:
            conn.close()

    def _pooled(
        self, run: Callable[[psycopg.Connection[Any]], _T], name: str, hot: bool = False
    ) -> _T:
        """``run`` on a pooled connection, once more on another when that one was broken.

        ``hot`` (single enqueues): on the connection this broker keeps out of the pool between
        calls, when no other thread is using it. Taking and returning a pooled connection
        (two locks, the pool's checks and bookkeeping) cost about 17 µs of the caller's CPU a
        ``delay()`` in a loop, with the caches cold between round trips; a pool of one
        connection is left to the pool alone.
        """
        # A pooled connection may have been closed by the server since its last use (a restart,
        # a failover, pg_terminate_backend): the pool drops a broken connection when it comes
        # back, so the statement is sent again on another one. Every named query is one
        # statement in autocommit mode, so a failed attempt changed nothing, or — when the
        # connection broke during the commit — the retry meets the committed row (enqueue treats
        # the unique task id as proof) or a fenced write that no longer matches.
        for attempt in range(1, self.STALE_RETRIES + 2):
            used: psycopg.Connection[Any] | None = None
            try:
                # getconn/putconn rather than pool.connection(): no generator, no commit of an
                # autocommit connection, no usage statistics; putconn still resets or replaces a
                # connection left in a bad state.
                pool = self.pool
                if (
                    hot
                    and attempt == 1
                    and self.max_size > 1
                    and self._hot_lock.acquire(blocking=False)
                ):
                    try:
                        c = used = self._take_hot(pool)
                        try:
                            return run(c)
                        except BaseException:
                            # The pool looks at it: kept, reset, or replaced if broken.
                            self._drop_hot()
                            raise
                    finally:
                        self._hot_lock.release()
                c = used = pool.getconn(timeout=self.connect_timeout)
                try:
                    return run(c)
                finally:
                    pool.putconn(c)
            except errors.UniqueViolation:
                if attempt > 1 and name in _INSERTS:
                    # The first attempt committed before its connection broke.
                    return cast(_T, [])
                raise
            except psycopg.OperationalError:
                # Retry only when the connection itself broke, not on a statement's own error.
                if attempt > self.STALE_RETRIES or used is None or not used.broken:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _run(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        params: dict[str, Any],
        row_factory: Any = dict_row,
    ) -> list[Row]:
        # A long query (the claims) runs with its own ``$1`` placeholders on a RawCursor,
        # kept apart from the connection's plain cursor of the same row factory.
        converted = self._native.get(name)
        query: Any
        args: Any
        if converted is None:
            query, args, key = self.q[name], params, row_factory
        else:
            query, names = converted
            args, key = [params[n] for n in names], (row_factory, psycopg.RawCursor)
        kept: dict[Any, psycopg.Cursor[Any]] | None = getattr(conn, _KEPT, None)
        cur = kept.get(key) if kept is not None else None
        if cur is None:
            if converted is None:
                cur = conn.cursor(row_factory=row_factory)
            else:
                cur = psycopg.RawCursor(conn, row_factory=row_factory)
            if kept is None or len(kept) >= _KEPT_MAX:
                # A caller's connection (or one keeping all it may): a cursor for this
                # statement alone.
                with cur:
                    return self._fetch(cur, query, args)
            kept[key] = cur
        return self._fetch(cur, query, args)

    @staticmethod
    def _fetch(cur: psycopg.Cursor[Any], query: Any, params: Any) -> list[Row]:
        cur.execute(query, params)
        # The result's status rather than cur.description, which builds column objects.
        result = cur.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        return cur.fetchall()

    def direct_statement(self, name: str) -> _DirectStatement | None:
        """How a single enqueue's statement goes without a cursor on a pooled connection (see
        _direct); None where it cannot: behind PgBouncer (no prepared statements), or for a
        schema whose name is not ASCII (its queries stay composed)."""
        if self.prepare_threshold is None:
            return None
        return self._direct_statements.get(name)

    def _direct(self, name: str, params: dict[str, Any]) -> list[Any]:
        """A single enqueue's statement on a pooled connection, its rows as tuples.

        Sent with libpq's own calls rather than through a cursor: the statement is prepared
        once per connection under a name of its own, and each call sends its parameters as
        text (the raw payload as binary). A cursor's bookkeeping (query conversion, typed
        adaptation, the prepared-statement cache, the result's description) took a fifth of
        the caller's CPU in a ``delay()`` loop, and a tenth of its time.
        """
        statement = self._direct_statements[name]
        return self._pooled(lambda c: self._send_direct(c, statement, params), name, hot=True)

    @staticmethod
    def _send_direct(
        conn: psycopg.Connection[Any], statement: _DirectStatement, params: dict[str, Any]
    ) -> list[Any]:
        state = direct_state(conn)
        with conn.lock:
            results = conn.wait(direct_gen(conn.pgconn, statement, params, state))
        return direct_rows(results, state.encoding)

    def _statuses(
        self,
        name: str,
        params: dict[str, Any],
        conn: psycopg.Connection[Any] | None = None,
        sources: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """id -> status from a fenced write returning ``id, status, limit_key, ...`` (as
        tuples); rows blocked on the concurrency limits it freed are moved on. With
        ``sources``, the write returns each row's source fourth, and it is kept there."""
        rows: list[Any] = self._all(name, params, conn, row_factory=tuple_row)
        self.unblock([row[2] for row in rows], conn)
        if sources is not None:
            sources.update((row[0], row[3]) for row in rows)
        return {row[0]: row[1] for row in rows}

    def _one(
        self, name: str, params: dict[str, Any], conn: psycopg.Connection[Any] | None = None
    ) -> Row | None:
        rows = self._all(name, params, conn)
        return rows[0] if rows else None

    # -- enqueue -----------------------------------------------------------------------------

    @staticmethod
    def _params(msg: TaskMessage) -> dict[str, Any]:
        return {
            "id": msg.id,
            "name": msg.name,
            "queue": msg.queue,
            "priority": msg.priority,
            "eta": msg.eta,
            "countdown": msg.countdown,
            "expires_at": msg.expires_at,
            "expires_in": msg.expires_in,
            "content_type": msg.body.content_type,
            "content_encoding": msg.body.content_encoding,
            "payload": msg.body.json_text,
            "payload_raw": msg.body.raw,
            "headers": _HEADERS_JSON(msg.headers),
            "max_retries": msg.max_retries,
            # A hand-off may commit before the WAL flush (see insert_task_handoff) only where
            # the caller waits for the flush afterwards: enqueue sets it.
            "early": False,
        }

    def insert_statement(self, msg: TaskMessage, in_transaction: bool) -> str:
        """The statement for a single enqueue of ``msg`` (not unique): one that may hand it to
        a parked worker, except inside a caller's transaction (whose commit may come long
        after the lease starts), where a concurrency limit must count it first, and on a
        schema without hand-offs (one migrated by an older pgtasks, asked again now and
        then)."""
        if (
            in_transaction
            or CONCURRENCY_KEY in msg.headers
            or time.monotonic() < self._handoff_again
        ):
            return "insert_task"
        return "insert_task_handoff"

    def handoff_missing(self) -> None:
        """The hand-off failed where the plain insert did not (a schema migrated by an older
        pgtasks, or a producer role granted its rights before the schema had the hand-off's
        table): enqueue without it for a while."""
        self._handoff_again = time.monotonic() + 60.0

    def enqueue(self, msg: TaskMessage, conn: psycopg.Connection[Any] | None = None) -> str:
        """Insert one task row (committed on return unless ``conn`` is in a transaction).

        Returns the id of the task that holds the call: ``msg.id``, or, for a unique task whose
        key another task holds, that task's id (and nothing is inserted).
        """
        with _storage_errors(msg.id):
            if msg.unique is None:
                name = self.insert_statement(msg, conn is not None)
                params = self._params(msg)
                if name == "insert_task_handoff":
                    params["early"] = self.early_commits()
                direct = conn is None and self.direct_statement(name) is not None
                try:
                    found: list[Any] = (
                        self._direct(name, params)
                        if direct
                        else self._all(name, params, conn, row_factory=tuple_row)
                    )
                except NO_HANDOFF:
                    if name == "insert_task":
                        raise
                    if direct:
                        self._direct("insert_task", params)
                    else:
                        self._all("insert_task", params, conn)
                    self.handoff_missing()
                else:
                    if self.committed_early(name, params, found):
                        self._all("flush_commit", {}, row_factory=tuple_row)
                return msg.id
            return self._enqueue_unique(msg, conn)

    def early_commits(self) -> bool:
        """Whether hand-offs may commit before the WAL flush, this role being allowed to
        wait for the flush afterwards (see flush_commit); asked once per process."""
        if self.early_ok is None:
            return self.note_early_commits(
                self._all("early_commit_allowed", {}, row_factory=tuple_row)
            )
        return self.early_ok

    def note_early_commits(self, found: Sequence[Any]) -> bool:
        """Keep early_commit_allowed's answer (``found``, its rows as tuples) for this process,
        and return it (pgtasks.aio asks the same question on its own connections)."""
        self.early_ok = bool(found and found[0][0])
        return self.early_ok

    @staticmethod
    def committed_early(name: str, params: Mapping[str, Any], found: Sequence[Any]) -> bool:
        """Whether an enqueue's statement may have committed before the WAL flush: a hand-off
        (see insert_task_handoff), whose caller then runs flush_commit before it returns. No
        row back means a retry on a new connection met the row of an attempt that committed
        as its connection broke, which may have been a hand-off."""
        if name != "insert_task_handoff" or not params.get("early"):
            return False
        return not found or bool(found[0][0])

    #: How often a unique enqueue looks again for a holder that changed as it looked.
    UNIQUE_TRIES = 20

    def unique_plan(self, msg: TaskMessage) -> tuple[str, dict[str, Any], int]:
        """How a unique call is enqueued (here and by pgtasks.aio): the statement, its
        parameters, and how many times to run it while it names no holder.

        A window's upsert always names one (no row only when a retry on a new connection met
        the row it had just written: then it is this call). The index's insert names none when
        the holder committed after the statement's snapshot, or finished as it looked: a new
        statement sees either it or a free key.
        """
        unique = msg.unique
        assert unique is not None
        params = self._params(msg)
        params["unique_key"] = unique.key
        if unique.window is not None:
            params["window"] = unique.window
            return "insert_task_unique_window", params, 1
        params["until_started"] = unique.until_started
        return "insert_task_unique", params, self.UNIQUE_TRIES

    def unique_unsettled(self, msg: TaskMessage, name: str) -> str:
        """What a unique enqueue returns (or raises) after ``unique_plan``'s runs named no
        holder."""
        if name == "insert_task_unique_window":
            return msg.id
        raise PgTasksError(
            f"cannot enqueue {msg.name}: its unique key {msg.unique_key!r} changed hands "
            f"{self.UNIQUE_TRIES} times as it was looked up; try again"
        )

    def _enqueue_unique(self, msg: TaskMessage, conn: psycopg.Connection[Any] | None) -> str:
        name, params, tries = self.unique_plan(msg)
        for _ in range(tries):
            found: list[Any] = self._all(name, params, conn, row_factory=tuple_row)
            if found:
                return str(found[0][0])
        return self.unique_unsettled(msg, name)

    def enqueue_many(
        self, msgs: Sequence[TaskMessage], conn: psycopg.Connection[Any] | None = None
    ) -> list[str]:
        """Insert many task rows in one statement; returns the id holding each call (see
        ``enqueue``).

        Rows whose times need no arithmetic on the database clock (no ``countdown`` or
        relative ``expires``) are sent with COPY, which the server reads about twice as fast as
        any INSERT; the others travel as one json document that ``insert_tasks`` expands.
        Unique tasks take a statement each, all in one transaction.
        """
        if not msgs:
            return []
        if any(m.unique is not None for m in msgs):
            with self.connection(conn) as c:
                if conn is not None and not conn.autocommit:
                    return self._enqueue_some_unique(msgs, c)
                with c.transaction():
                    return self._enqueue_some_unique(msgs, c)
        self._enqueue_plain(msgs, conn)
        return [m.id for m in msgs]

    def enqueue_stream(
        self, msgs: Iterable[TaskMessage], conn: psycopg.Connection[Any] | None = None
    ) -> list[TaskMessage]:
        """``enqueue_many`` for messages with no unique key and no time relative to the
        database clock, read from ``msgs`` while the rows are sent: the server stores the
        first rows with COPY while the caller builds the next. Returns the messages. An error
        raised while they are built aborts the COPY, and nothing is stored."""
        source = iter(msgs)
        with _storage_errors(None):
            if self.copy_refused(conn):
                built = list(source)
                self._insert_json(built, conn)
                return built
            try:
                return self._stream(source, copy_row, conn)
            except CopyRefused as refused:
                # Row-level security applies to this role: INSERT from now on (nothing was
                # stored; what was built is sent again, then the rest).
                built = [*cast(list[TaskMessage], refused.built), *source]
                self._insert_json(built, conn)
                return built

    def enqueue_rows(
        self, rows: Iterable[tuple[Any, ...]], conn: psycopg.Connection[Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """``enqueue_stream`` for rows already in COPY's column order (see ``copy_row``), read
        from ``rows`` while they are sent; returns them. Raises CopyRefused, having stored
        nothing, where COPY may not load tasks (ask ``copy_refused`` first)."""
        with _storage_errors(None):
            return self._stream(iter(rows), None, conn)

    def copy_refused(self, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Whether tasks must be inserted rather than loaded with COPY, as far as is known:
        row-level security applies to this role (asked once per process, on the caller's
        connection; on a pooled one, found out by the first COPY)."""
        return self._copy_ok is False or (conn is not None and not self._copy_allowed(conn))

    def _stream(
        self,
        source: Iterator[_Item],
        to_row: Callable[[_Item], tuple[Any, ...]] | None,
        conn: psycopg.Connection[Any] | None,
    ) -> list[_Item]:
        """COPY the rows of ``source`` (``to_row`` of each item, or the items themselves) as
        they are read; returns the items. Raises CopyRefused with what was read."""
        built: list[_Item] = []

        def items() -> Iterator[_Item]:
            for item in source:
                built.append(item)
                yield item

        tries = 0

        def copy(c: psycopg.Connection[Any]) -> None:
            nonlocal tries
            tries += 1
            # Sent again on another connection (see _pooled): what was built, then the rest.
            todo = items() if tries == 1 else itertools.chain(list(built), items())
            rows = cast(Iterator[tuple[Any, ...]], todo) if to_row is None else map(to_row, todo)
            self._copy_tasks(c, rows)

        if conn is not None:
            # Asked before (copy_refused): a refusal here is the caller's transaction's error.
            copy(conn)
            return built
        try:
            self._pooled(copy, "insert_tasks")
        except errors.FeatureNotSupported:
            self._copy_ok = False
            raise CopyRefused(built) from None
        return built

    def _enqueue_some_unique(
        self, msgs: Sequence[TaskMessage], conn: psycopg.Connection[Any]
    ) -> list[str]:
        plain = [m for m in msgs if m.unique is None]
        if plain:
            self._enqueue_plain(plain, conn)
        held: dict[str, str] = {}
        for m in msgs:
            if m.unique is not None:
                with _storage_errors(m.id):
                    held[m.id] = self._enqueue_unique(m, conn)
        return [held.get(m.id, m.id) for m in msgs]

    def _enqueue_plain(
        self, msgs: Sequence[TaskMessage], conn: psycopg.Connection[Any] | None
    ) -> None:
        if any(m.countdown is not None or m.expires_in is not None for m in msgs):
            with _storage_errors(None):
                self._insert_json(msgs, conn)
        else:
            self.enqueue_stream(msgs, conn)

    def _insert_json(
        self, msgs: Sequence[TaskMessage], conn: psycopg.Connection[Any] | None
    ) -> None:
        rows = json.dumps([_json_row(msg) for msg in msgs], separators=(",", ":"))
        self._all("insert_tasks", {"rows": rows}, conn)

    def _copy_allowed(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether COPY may load tasks for this role (asked at most once per process)."""
        if self._copy_ok is None:
            found = self._all("tasks_row_security", {"schema": self.schema}, conn)
            self._copy_ok = not (found and found[0]["active"])
        return self._copy_ok

    def _copy_tasks(self, conn: psycopg.Connection[Any], rows: Iterable[tuple[Any, ...]]) -> None:
        """COPY the rows in (a transaction of its own on an autocommit connection)."""
        with conn.cursor() as cur, cur.copy(self._copy_statement) as copy:
            write = copy.write_row
            for row in rows:
                write(row)

    # -- periodic tasks ----------------------------------------------------------------------

    def sync_schedule(
        self, entries: Sequence[tuple[str, str, str]], now: datetime | None = None
    ) -> None:
        """Record periodic entries ``(name, task, schedule text)``."""
        if not entries:
            return
        self._all(
            "sync_schedule",
            {
                "names": [e[0] for e in entries],
                "tasks": [e[1] for e in entries],
                "schedules": [e[2] for e in entries],
                "now": now,
            },
        )

    def schedule_state(
        self, names: Sequence[str]
    ) -> tuple[datetime, dict[str, tuple[datetime | None, datetime]]]:
        """The database clock, and name -> (last tick, created) for the recorded entries."""
        row = self._one("schedule_state", {"names": list(names)})
        assert row is not None
        found = zip(row["names"] or (), row["last_ticks"] or (), row["created"] or (), strict=True)
        return row["now"], {name: (last, created) for name, last, created in found}

    def enqueue_tick(
        self, msg: TaskMessage, entry: str, tick_at: datetime, next_tick: datetime
    ) -> bool:
        """Enqueue one periodic tick's task unless another scheduler already did."""
        params = self._params(msg)
        params.update(entry=entry, tick_at=tick_at, next_tick=next_tick)
        with _storage_errors(msg.id):
            row = self._one("enqueue_tick", params)
        return bool(row and row["enqueued"])

    def schedule_entries(self) -> list[Row]:
        """Every recorded periodic entry with its last and next tick."""
        return self._all("schedule_entries", {})

    # -- the worker's statements -------------------------------------------------------------

    def claim(
        self,
        worker: str,
        queues: Sequence[str],
        limit: int,
        lease: float,
        conn: psycopg.Connection[Any] | None = None,
        floors: FloorPlan | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> list[ClaimedTask]:
        """Claim up to ``limit`` due tasks in priority order (one statement); with ``floors``,
        reading each known queue and priority from its floor on (see pgtasks.worker.floors).

        ``rates`` maps rate-limited task names to the seconds between their starts: a row of
        such a task starts only at its start time, and waits PENDING for a later one."""
        return self.claim_counting(worker, queues, limit, lease, conn, floors, rates)[0]

    def claim_counting(
        self,
        worker: str,
        queues: Sequence[str],
        limit: int,
        lease: float,
        conn: psycopg.Connection[Any] | None = None,
        floors: FloorPlan | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> tuple[list[ClaimedTask], int]:
        """``claim``, and how many rows it took in all: the claimed ones and those it set
        aside (BLOCKED over a concurrency limit, or waiting for a rate limit's start time),
        which are not returned."""
        rows = self.claim_all(worker, queues, limit, lease, conn, floors, rates)
        claimed = [row for row in rows if row.set_aside is None]
        return claimed, len(rows)

    def claim_all(
        self,
        worker: str,
        queues: Sequence[str],
        limit: int,
        lease: float,
        conn: psycopg.Connection[Any] | None = None,
        floors: FloorPlan | None = None,
        rates: Mapping[str, float] | None = None,
        scan: int = 0,
    ) -> list[ClaimedTask]:
        """``claim``, with the rows set aside too (``set_aside`` holds their status); the
        claimed rows in claim order, the others after them. The claim reads up to ``scan``
        due rows (``limit`` at least), setting aside every one waiting for a rate limit's
        start time, and claims ``limit`` of the others.

        With no rate limit to decide and no floors, the plain claim (claim_plain) is tried
        first; when it meets a due row under a concurrency limit, this claim and those of the
        next LIMITS_PAUSE seconds decide limits (claim_batch)."""
        if (
            floors is None
            and not rates
            and scan <= limit
            and time.monotonic() >= self._limits_until
        ):
            plain = {"worker": worker, "scan": limit, "lease": lease, "queues": list(queues)}
            found: list[Any] = self._all("claim_plain", plain, conn, row_factory=_CLAIMED_ROWS)
            if not found or found[0].set_aside != LIMITED:
                found.sort(key=_claim_order)
                return found
            # A row under a concurrency limit was due: claims decide limits for a while.
            self._limits_until = time.monotonic() + self.LIMITS_PAUSE
        params: dict[str, Any] = {
            "worker": worker,
            "limit": limit,
            "scan": max(limit, scan),
            "lease": lease,
            "rate_names": list(rates or ()),
            "rate_every": list((rates or {}).values()),
        }
        if floors is None:
            name = "claim_batch"
            params["queues"] = list(queues)
        else:
            name = "claim_batch_from_floors"
            params.update(floors.params())
        # Columns come back in ClaimedTask's field order: built positionally, no dict per row.
        rows: list[Any] = self._all(name, params, conn, row_factory=_CLAIMED_ROWS)
        # The statement returns its rows in no set order; they start in claim order.
        rows.sort(key=_claim_order)
        waiting = [r.headers for r in rows if r.set_aside == "PENDING" and r.headers]
        if waiting:
            # A row of a limited key that now waits for its rate limit's start time may have
            # been the one moved on when a place came free: move on the next (a key without
            # blocked rows or without room moves nothing).
            keys = (h.get(CONCURRENCY_KEY) for h in waiting if isinstance(h, dict))
            self.unblock(key if isinstance(key, str) else None for key in keys)
        return rows

    def unblock(
        self, keys: Iterable[str | None], conn: psycopg.Connection[Any] | None = None
    ) -> int:
        """Move rows blocked on the concurrency limits ``keys`` back to PENDING where a key
        has room (after a statement gave its count back); returns how many moved. None
        stands for a row without a limit: with no key at all, nothing is sent."""
        wanted = sorted({key for key in keys if key is not None})
        if not wanted:
            return 0
        row = self._one("unblock", {"keys": wanted, "channel": notify_channel(self.schema)}, conn)
        return int(row["n"]) if row else 0

    def blocked_keys(self, after: str = "", limit: int = 1000) -> list[str]:
        """Keys (after ``after``, in order) with blocked rows and room to start one."""
        return [r["key"] for r in self._all("blocked_keys", {"after": after, "limit": limit})]

    def prune_concurrency_limits(self, limit: int = 1000) -> int:
        """Forget the counts of keys idle for an hour; returns how many went."""
        with self.connection() as conn:
            return conn.execute(self.q["prune_concurrency_limits"], {"limit": limit}).rowcount

    def prune_parked_workers(self, limit: int = 1000) -> int:
        """Forget waits in parked_workers that ran out a minute ago or more (workers killed
        while parked leave theirs); returns how many went."""
        with self.connection() as conn:
            return conn.execute(self.q["prune_parked_workers"], {"limit": limit}).rowcount

    def behind_floors(self, floors: FloorPlan) -> dict[tuple[str, int], datetime]:
        """For each of ``floors``' bands with due PENDING rows behind its floor, the earliest
        one's ``run_at`` (a read, no locks)."""
        rows = self._all("rows_behind_floors", floors.params())
        return {(r["queue"], r["priority"]): r["run_at"] for r in rows}

    def renew(self, worker: str, owned: Sequence[tuple[str, int]], lease: float) -> dict[str, bool]:
        """Extend the leases of ``owned`` (id, attempt) pairs; returns id -> cancel_requested for
        the rows still owned. A pair missing from the answer was lost.

        A renewal never waits for a row lock: a row another transaction holds (most often this
        worker's own write of its outcome) is answered still owned (False) but not extended;
        the next renewal extends it, or finds it lost."""
        if not owned:
            return {}
        rows = self._all(
            "renew_leases",
            {
                "worker": worker,
                "ids": [i for i, _ in owned],
                "attempts": [a for _, a in owned],
                "lease": lease,
            },
        )
        return {row["id"]: row["cancel_requested"] for row in rows}

    def complete(
        self,
        worker: str,
        items: Sequence[Success],
        conn: psycopg.Connection[Any] | None = None,
        keep: bool = True,
        sources: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """Fenced successes; returns id -> new status for the rows this worker still owned
        (and fills ``sources``, when given, with their sources).

        ``keep=False`` (a worker whose finished_task_retention is 0) deletes each succeeded row,
        with its attempt history and effects, instead of keeping it COMPLETED for the pruner; a
        row revoked while it ran is kept as CANCELLED either way.
        """
        now = time.time()
        outcomes: list[dict[str, Any]] = []
        # Most batches keep no result: their statement has no results part, whose statement
        # triggers would fire for nothing.
        stored = False
        for i in items:
            # Only what differs from the statement's defaults: most outcomes keep no result.
            outcome: dict[str, Any] = {"id": i.id, "attempt": i.attempt}
            ago = _ago(i.started, now)
            if ago is not None:
                # Whole microseconds: an integer is written several times faster than a float.
                outcome["started_us"] = round(ago * 1e6)
            if i.store:
                stored = True
                outcome["store"] = True
                outcome["content_type"] = i.content_type
                if i.result is not None:
                    outcome["result"] = base64.b64encode(i.result).decode("ascii")
            if i.state != "SUCCESS":
                outcome["state"] = i.state
            outcomes.append(outcome)
        name = "complete_batch" if keep else "complete_batch_drop"
        return self._statuses(
            name if stored else f"{name}_unstored",
            {"worker": worker, "rows": json.dumps(outcomes, separators=(",", ":"))},
            conn,
            sources,
        )

    def fail(
        self,
        worker: str,
        items: Sequence[Failure],
        conn: psycopg.Connection[Any] | None = None,
        sources: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """Fenced terminal failures (FAILED, DEAD or CANCELLED); ``sources`` as complete's."""
        now = time.time()
        return self._statuses(
            "fail_batch",
            {
                "worker": worker,
                "ids": [i.id for i in items],
                "attempts": [i.attempt for i in items],
                "statuses": [i.status for i in items],
                "errors": [_text(i.error) for i in items],
                "tracebacks": [_text(i.traceback) for i in items],
                "store": [i.store for i in items],
                "content_types": [i.content_type for i in items],
                "results": [i.result for i in items],
                "started_ago": [_ago(i.started, now) for i in items],
            },
            conn,
            sources,
        )

    def retry(
        self, worker: str, items: Sequence[RetryAt], conn: psycopg.Connection[Any] | None = None
    ) -> dict[str, str]:
        """Fenced retries: PENDING again at the given time, retry count written with it."""
        now = time.time()
        return self._statuses(
            "retry_batch",
            {
                "worker": worker,
                "ids": [i.id for i in items],
                "attempts": [i.attempt for i in items],
                "retries": [i.retries for i in items],
                "delays": [i.delay for i in items],
                "etas": [i.eta for i in items],
                "errors": [_text(i.error) for i in items],
                "tracebacks": [_text(i.traceback) for i in items],
                "outcomes": [i.outcome for i in items],
                "started_ago": [_ago(i.started, now) for i in items],
                "content_types": [i.content_type for i in items],
                "results": [i.result for i in items],
            },
            conn,
        )

    def release(
        self, worker: str, items: Sequence[Release], conn: psycopg.Connection[Any] | None = None
    ) -> dict[str, str]:
        """Fenced hand-back of claimed rows that never ran."""
        return self._statuses(
            "release_batch",
            {
                "worker": worker,
                "ids": [i.id for i in items],
                "attempts": [i.attempt for i in items],
                "delays": [i.delay for i in items],
                "errors": [_text(i.error) for i in items],
            },
            conn,
        )

    def reclaim(
        self,
        max_lost: int,
        limit: int = 1000,
        chord_ready: Callable[[Row, list[Row]], Plan] | None = None,
    ) -> list[Row]:
        """Put expired leases back in the queue (or dead-letter them), naming the previous owner.

        A chord member that ends here (dead-lettered, or cancelled) is counted by its chord in
        the same transaction, as a failed member, so the chord's error is recorded.
        """
        return self.reclaim_from(None, max_lost, limit, chord_ready)[0]

    def reclaim_from(
        self,
        floor: datetime | None,
        max_lost: int,
        limit: int = 1000,
        chord_ready: Callable[[Row, list[Row]], Plan] | None = None,
    ) -> tuple[list[Row], datetime]:
        """``reclaim`` of the leases that ran out at ``floor`` or later (None: any), with the
        time (database clock) up to which they were all taken back: the transaction's start,
        or the oldest lease from ``floor`` on that ran out before it and is still RUNNING (its
        row held by another transaction, or past ``limit``)."""
        with self.pool.connection(timeout=self.connect_timeout) as conn, conn.transaction():
            rows = self._all(
                "reclaim_expired", {"max_lost": max_lost, "limit": limit, "floor": floor}, conn
            )
            hits = [(r["chord"], r["id"]) for r in rows if r["chord"] and r["status"] != "PENDING"]
            if hits and chord_ready is not None:
                self._count_chords(conn, Plan(chord_hits=hits), chord_ready)
            row = self._one("reclaimed_until", {"floor": floor}, conn)
        assert row is not None
        self.unblock(r["limit_key"] for r in rows)
        return rows, row["until"]

    def register_worker(
        self, worker: str, host: str, pid: int, queues: Sequence[str], concurrency: int
    ) -> None:
        self._all(
            "register_worker",
            {
                "id": worker,
                "host": host,
                "pid": pid,
                "queues": list(queues),
                "concurrency": concurrency,
            },
        )

    def heartbeat_worker(self, worker: str) -> None:
        self._all("heartbeat_worker", {"id": worker})

    def unregister_worker(self, worker: str) -> None:
        self._all("unregister_worker", {"id": worker})

    # -- direct hand-off ---------------------------------------------------------------------

    def park(
        self,
        worker: str,
        queues: Sequence[str],
        lease: float,
        seconds: float,
        skip_names: Sequence[str] = (),
        handoff: bool = True,
    ) -> None:
        """Mark ``worker`` waiting for the next ``seconds`` (database clock): enqueues of due
        tasks to ``queues`` notify it, and where ``handoff``, single enqueues to ``queues``
        name their row to it alone on ``handoff_channel`` (which the worker must be listening
        on; it then claims that row, see claim_handed); ``skip_names`` are claimed the usual
        way only. Single enqueues that looked for a waiting worker before
        this and found none have committed when it returns: a claim after it sees them."""
        params = {
            "worker": worker,
            "channel": handoff_channel(self.schema, worker),
            "queues": list(queues),
            "skip_names": list(skip_names),
            "lease": lease,
            "seconds": seconds,
            "handoff": handoff,
            "channel_due": notify_channel(self.schema),
        }
        self._all("park_worker", params)

    def unpark(self, worker: str, waking: float | None = None) -> None:
        """No more hand-offs to ``worker``: once this returns, any task handed to it before
        is committed (and readable by ``adopt``). With ``waking``, enqueues go on notifying
        it for that many seconds (it went back to work, and may wait again soon); without,
        they stop."""
        if waking is None:
            self._all("unpark_worker", {"worker": worker})
        else:
            self._all("busy_worker", {"worker": worker, "seconds": waking})

    def adopt(self, worker: str, known: Iterable[str] = ()) -> list[ClaimedTask]:
        """``worker``'s RUNNING rows other than ``known``: tasks handed to it whose
        notification it missed."""
        params = {"worker": worker, "known": list(known)}
        rows: list[Any] = self._all("adopt", params, row_factory=_CLAIMED_ROWS)
        return rows

    def claim_handed(
        self,
        worker: str,
        ids: Sequence[str],
        queues: Sequence[str],
        lease: float,
        conn: psycopg.Connection[Any] | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> list[ClaimedTask]:
        """Claim the rows ``ids`` a hand-off named, as ``claim`` would claim them (PENDING,
        due, of ``queues``, limits decided): the rows this worker now owns."""
        params: dict[str, Any] = {
            "worker": worker,
            "ids": list(ids),
            "queues": list(queues),
            "limit": len(ids),
            "scan": len(ids),
            "lease": lease,
            "rate_names": list(rates or ()),
            "rate_every": list((rates or {}).values()),
        }
        # The plain claim leaves rows of rate-limited tasks alone, and says when a row under a
        # concurrency limit needs the full one.
        rows: list[Any] = self._all("claim_handed_plain", params, conn, row_factory=_CLAIMED_ROWS)
        if rows and rows[0].set_aside == LIMITED:
            rows = self._all("claim_handed", params, conn, row_factory=_CLAIMED_ROWS)
        claimed = [row for row in rows if row.set_aside is None]
        claimed.sort(key=_claim_order)
        return claimed

    def may_follow(self, task_id: str, name: str, queue: str, priority: int) -> bool:
        """Whether the source of the row ``task_id`` may enqueue ``name`` to ``queue`` at
        ``priority`` (see producer_rules); False when the row is gone."""
        row = self._one(
            "may_follow", {"id": task_id, "name": name, "queue": queue, "priority": priority}
        )
        return bool(row and row["allowed"])

    def cancel_state(self, worker: str, task_id: str, attempt: int) -> tuple[bool, str | None]:
        """Whether the row ``task_id`` that ``worker`` runs (at ``attempt``) was revoked, and
        the signal the revoke asked to stop it with: what a worker acts on, whatever a
        notification said."""
        row = self._one("cancel_state", {"id": task_id, "worker": worker, "attempt": attempt})
        if row is None:
            return False, None
        return bool(row["cancel_requested"]), row["signal"]

    # -- results and control -----------------------------------------------------------------

    def revoke(self, task_id: str, signal: str | None = None, by: str | None = None) -> str | None:
        """Cancel a task; returns its status afterwards, or None if it was not pending/running.

        A running task's worker is told at once (NOTIFY on the cancel channel), and asked to
        stop it with ``signal`` where one is given (``revoke(terminate=True)``). ``by`` names
        who cancelled (default: the app's task_source, else the database role).
        """
        row = self._one(
            "revoke",
            {"id": task_id, "signal": signal, "by": by, "channel": cancel_channel(self.schema)},
        )
        return row["status"] if row else None

    def record_effect(
        self, task_id: str, name: str, conn: psycopg.Connection[Any] | None = None
    ) -> bool:
        """Record that ``task_id`` did effect ``name`` (in ``conn``'s transaction when given);
        True when no run of the task had recorded it before."""
        return bool(self._all("record_effect", {"task_id": task_id, "name": name}, conn))

    def effect_recorded(self, task_id: str, name: str) -> bool:
        row = self._one("effect_recorded", {"task_id": task_id, "name": name})
        return bool(row and row["recorded"])

    def revoke_signal(self, task_id: str) -> str | None:
        """The signal a revoke asked a running task to be stopped with, if any."""
        row = self._one("revoke_signal", {"id": task_id})
        return row["signal"] if row else None

    def cancel_requested(self, task_id: str) -> bool:
        """Whether the task was revoked (False for a task not in the table)."""
        row = self._one("cancel_requested", {"id": task_id})
        return bool(row and row["cancel_requested"])

    def get_result(self, task_id: str) -> Row | None:
        row = self._one("get_result", {"id": task_id})
        if row is None or (row["status"] is None and row["state"] is None):
            return None
        return row

    def get_task(self, task_id: str) -> Row | None:
        return self._one("get_task", {"id": task_id})

    def forget(self, task_id: str) -> None:
        self._all("forget_result", {"id": task_id})

    def purge(self, queues: Sequence[str] | None = None, until: datetime | None = None) -> int:
        """Delete the waiting tasks of ``queues`` (None: all); with ``until`` (from
        ``count_waiting``), only those enqueued by then. Returns how many were deleted."""
        params = {"queues": list(queues) if queues else None, "until": until}
        with self.connection() as c:
            return c.execute(self.q["purge"], params).rowcount

    def count_waiting(self, queues: Sequence[str] | None = None) -> tuple[int, datetime]:
        """How many tasks ``purge(queues)`` would delete now, and when they were counted."""
        row = self._one("count_waiting", {"queues": list(queues) if queues else None})
        assert row is not None
        return int(row["n"]), row["counted_at"]

    def prune(
        self,
        task_age: float,
        result_age: float,
        limit: int = 10000,
        floors: tuple[datetime | None, datetime | None] = (None, None),
    ) -> Pruned:
        """Delete up to ``limit`` finished rows and results past their age, and no older than
        ``floors`` (finished tasks', results'; None: no floor)."""
        row = self._one(
            "prune_finished",
            {
                "task_age": task_age,
                "result_age": result_age,
                "limit": limit,
                "task_floor": floors[0],
                "result_floor": floors[1],
            },
        )
        assert row is not None
        return Pruned(
            row["tasks"],
            row["results"],
            row["task_cutoff"],
            row["result_cutoff"],
            row["task_last"],
            row["result_last"],
        )

    def count_unfinished(self, queues: Sequence[str]) -> int:
        """Waiting (due or scheduled) and running tasks of ``queues``."""
        row = self._one("count_unfinished", {"queues": list(queues)})
        return int(row["n"]) if row else 0

    def any_unfinished(self, queues: Sequence[str]) -> bool:
        """Whether ``queues`` hold any waiting or running task (``count_unfinished() > 0``,
        without counting them)."""
        row = self._one("any_unfinished", {"queues": list(queues)})
        return bool(row and row["any"])

    def counts(self) -> list[Row]:
        return self._all("count_by_status", {})

    def schema_version(self) -> int | None:
        """The newest applied migration; None when the schema is absent."""
        try:
            row = self._one("schema_version", {})
        except errors.UndefinedTable:
            return None
        return None if row is None else row["version"]

    # -- inspection (status, inspect) -------------------------------------------------------

    def announce_tasks(self, worker: str, tasks: Sequence[str]) -> None:
        """Record the task names ``worker`` has registered."""
        self._all("announce_worker_tasks", {"id": worker, "tasks": list(tasks)})

    def task_known(self, name: str, queue: str, within: float) -> bool:
        """Whether a live worker consuming ``queue`` (heartbeat within ``within`` s) knows it."""
        row = self._one("task_known", {"name": name, "queue": queue, "within": within})
        return bool(row and row["known"])

    def live_workers(self, within: float) -> list[Row]:
        """Workers whose last heartbeat is newer than ``within`` seconds."""
        return self._all("live_workers", {"within": within})

    def running_tasks(self) -> list[Row]:
        """Every RUNNING row with its owner."""
        return self._all("running_tasks", {})

    def scheduled_tasks(self, limit: int = 1000) -> list[Row]:
        """PENDING rows not yet due, soonest first."""
        return self._all("scheduled_tasks", {"limit": limit})

    def worker_totals(self, workers: Sequence[str]) -> list[Row]:
        """Finished attempts per worker and task name."""
        return self._all("worker_totals", {"workers": list(workers)})

    def revoked_ids(self, limit: int = 1000) -> list[str]:
        """Ids of revoked tasks still in the table, newest first."""
        return [row["id"] for row in self._all("revoked_tasks", {"limit": limit})]

    # -- canvas: chords, follow-ups, group results --------------------------------------------

    def apply_plan(self, plan: Plan, conn: psycopg.Connection[Any] | None = None) -> None:
        """Write what applying a canvas produced in one transaction: chord counters first, then
        every task row in one statement, then results decided up front."""
        with self.connection(conn) as c:
            if conn is not None and not conn.autocommit:
                # The caller's transaction holds the rows: commit and rollback are its own.
                self._write_plan(c, plan)
                return
            with c.transaction():
                self._write_plan(c, plan)

    def _write_plan(
        self, conn: psycopg.Connection[Any], plan: Plan, followups: bool = False
    ) -> None:
        """Write ``plan``; with ``followups``, as what outcomes triggered (see
        _write_followups)."""
        if plan.chords:
            self._all(
                "insert_chords",
                {
                    "ids": [ch.id for ch in plan.chords],
                    "members": [Jsonb(list(ch.member_ids)) for ch in plan.chords],
                    "bodies": [Jsonb(ch.body) for ch in plan.chords],
                    "sources": [plan.follows.get(ch.id) for ch in plan.chords],
                },
                conn,
            )
        if plan.messages:
            if followups:
                self._write_followups(conn, plan)
            else:
                self.enqueue_many(plan.messages, conn)
        if plan.results:
            self._all(
                # Results an outcome decides for tasks that never run (a failed chain's later
                # steps, a chord's failed body) name ids its row's headers chose: only ids of
                # no task and no result yet, never another task's.
                "store_decided_results" if followups else "store_results",
                {
                    "ids": [r.task_id for r in plan.results],
                    "states": [r.state for r in plan.results],
                    "content_types": [r.content_type for r in plan.results],
                    "results": [r.result for r in plan.results],
                    "tracebacks": [_text(r.traceback) for r in plan.results],
                },
                conn,
            )

    def _write_followups(self, conn: psycopg.Connection[Any], plan: Plan) -> None:
        """The task rows outcomes triggered, each held to the rules of the source it follows
        (``plan.follows``): one that source could not have enqueued itself is written
        dead-lettered with the reason, and logged."""
        rows = []
        for msg in plan.messages:
            row = _json_row(msg)
            row["source"] = plan.follows.get(msg.id)
            rows.append(row)
        written = self._all(
            "insert_followups", {"rows": json.dumps(rows, separators=(",", ":"))}, conn
        )
        for row in written:
            if row["status"] == "DEAD":
                log.error(
                    "task.followup_refused",
                    task_id=row["id"],
                    task_name=row["name"],
                    source=row["source"],
                    hint="the producer it follows may not enqueue it (see pgtasks grants); "
                    "it is dead-lettered, and an administrator may requeue it",
                )

    def store_state(self, item: StoredResult) -> None:
        """Record a state a running task reports (``Task.update_state``)."""
        self._all(
            "store_results",
            {
                "ids": [item.task_id],
                "states": [item.state],
                "content_types": [item.content_type],
                "results": [item.result],
                "tracebacks": [_text(item.traceback)],
            },
        )

    def finalise(
        self,
        worker: str,
        items: Sequence[Success] | Sequence[Failure],
        chord_ready: Callable[[Row, list[Row]], Plan],
        keep: bool = True,
    ) -> dict[str, str]:
        """Fenced completions or failures together with their follow-ups, in one transaction.

        Follow-ups (link callbacks, the next chain step, chord counting) are written only for
        the rows the fenced statement still found owned by ``worker``; a chord whose counter
        reaches zero here gets its body from ``chord_ready`` (given the counter row and its
        members' outcomes in header order), enqueued in this same transaction. ``keep`` is
        complete's.
        """
        with self.pool.connection(timeout=self.connect_timeout) as conn, conn.transaction():
            sources: dict[str, str] = {}
            if items and isinstance(items[0], Success):
                statuses = self.complete(worker, items, conn, keep, sources)  # type: ignore[arg-type]
            else:
                statuses = self.fail(worker, items, conn, sources)  # type: ignore[arg-type]
            plan = Plan()
            for item in items:
                status = statuses.get(item.id)
                if status is None or item.followups is None:
                    continue
                follow = item.followups
                chosen = follow.on_success if status == "COMPLETED" else follow.on_failure
                if status != "CANCELLED" and chosen is not None:
                    # What the row's links and chain trigger is held to the rules of the
                    # row's own source.
                    plan.extend(chosen, follows=sources[item.id])
                if follow.chord:
                    plan.chord_hits.append((follow.chord, item.id))
            self._count_chords(conn, plan, chord_ready)
        return statuses

    def _count_chords(
        self,
        conn: psycopg.Connection[Any],
        plan: Plan,
        chord_ready: Callable[[Row, list[Row]], Plan],
    ) -> None:
        """Write ``plan``, counting its chord hits; a chord brought to zero gets its body (or
        its error) from ``chord_ready``, written in this same transaction."""
        # A fired chord's body may itself finish an outer chord (a chord error), so count
        # until nothing is left to count.
        while plan.chord_hits:
            hits, plan.chord_hits = plan.chord_hits, []
            self._write_plan(conn, plan, followups=True)
            plan = Plan(chord_hits=plan.chord_hits)
            counted = self._all(
                "decrement_chords",
                {"chords": [chord for chord, _ in hits], "members": [m for _, m in hits]},
                conn,
            )
            fired = [r for r in counted if r["remaining"] == 0]
            for row in fired:
                members = self._all("chord_member_results", {"ids": row["member_ids"]}, conn)
                # A chord's body is held to the rules of the chord's own source.
                plan.extend(chord_ready(row, members), follows=row["source"])
            if fired:
                self._all("delete_chords", {"ids": [r["id"] for r in fired]}, conn)
        self._write_plan(conn, plan, followups=True)

    def save_group(self, group_id: str, result_ids: Sequence[str]) -> None:
        """Store a group's member ids (GroupResult.save)."""
        self._all("save_group_result", {"id": group_id, "result_ids": list(result_ids)})

    def restore_group(self, group_id: str) -> list[str] | None:
        """The member ids saved for a group, or None."""
        row = self._one("restore_group_result", {"id": group_id})
        return None if row is None else list(row["result_ids"])

    def delete_group(self, group_id: str) -> None:
        """Forget a saved group."""
        self._all("delete_group_result", {"id": group_id})

    def children(self, task_id: str) -> list[Row]:
        """Tasks enqueued by the completion of ``task_id`` (id, name), oldest first."""
        return self._all("task_children", {"id": task_id})

    def result_listen_connection(self) -> psycopg.Connection[Any]:
        """A dedicated connection listening for stored results (AsyncResult.get's wake-up)."""
        conn = self.connect()
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(result_channel(self.schema))))
        return conn

    # -- operators ---------------------------------------------------------------------------

    def queue_stats(
        self, window_seconds: float = 300.0, queues: Sequence[str] | None = None
    ) -> list[Row]:
        """What each queue holds and how fast it drains, in one statement.

        One dict per queue that has any row (only ``queues`` when given), by queue name:
        ``queue``, ``pending_due`` (PENDING, run_at passed), ``scheduled`` (PENDING, run_at in
        the future), ``blocked`` (BLOCKED: held back by a concurrency limit, see
        pgtasks.concurrency), ``running``, ``expired_leases`` (RUNNING past lease_until: their
        worker is gone or cut off), ``dead``, ``completed``/``failed``/``cancelled`` (rows
        that finished within the window), ``oldest_due_age`` (seconds the oldest due PENDING
        row has waited since its run_at; None when nothing is due), ``finished_attempts``
        (attempts that ended within the window) and ``throughput`` (those attempts per
        minute).
        """
        rows = self._all(
            "queue_stats",
            {"window": window_seconds, "queues": list(queues) if queues else None},
        )
        for row in rows:
            row["throughput"] = row["finished_attempts"] * 60.0 / window_seconds
        return rows

    def dead_letters(
        self,
        limit: int = 50,
        offset: int = 0,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> list[Row]:
        """Dead-lettered rows, newest first: dicts of ``id``, ``name``, ``queue``, ``error``,
        ``attempt``, ``retries`` and ``updated_at`` (when it was dead-lettered)."""
        return self._all(
            "dead_letters",
            {"limit": limit, "offset": offset, "name": task_name, "queue": queue},
        )

    def dead_letter(self, task_id: str) -> Row | None:
        """One dead-lettered row as :meth:`task_detail` returns it; None unless it is DEAD."""
        found = self.task_detail(task_id)
        return found if found is not None and found["status"] == "DEAD" else None

    def requeue_dead(
        self,
        ids: Sequence[str] | None = None,
        task_name: str | None = None,
        all: bool = False,
        *,
        by: str = "operator",
        chunk: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Put dead letters back in their queue, due now; returns how many were requeued.

        The given ``ids`` (sent ``chunk`` at a time), or with ``all`` every row dead when the
        call starts (``task_name`` narrows either), ``chunk`` rows per statement. Only rows still
        DEAD change. Each gets a fresh budget: ``retries`` is 0, and ``attempt`` moves one past
        the last into ``requeued_attempt``, from which the reclaimer counts lost workers again;
        the attempt history keeps its rows and gains a ``requeued`` row (worker ``by``, the last
        error). The stored result is dropped, so the task's result reads PENDING until it runs.
        ``progress`` is called with the running total after each statement.
        """
        return self._chunked("requeue_dead", ids, task_name, all, chunk, progress, {"by": by})

    def discard_dead(
        self,
        ids: Sequence[str] | None = None,
        task_name: str | None = None,
        all: bool = False,
        *,
        chunk: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete dead letters and their stored results; returns how many were deleted.

        Selection, chunking, fencing and ``progress`` as in :meth:`requeue_dead`. The attempt
        history stays.
        """
        return self._chunked("discard_dead", ids, task_name, all, chunk, progress, {})

    def _chunked(
        self,
        name: str,
        ids: Sequence[str] | None,
        task_name: str | None,
        everything: bool,
        chunk: int,
        progress: Callable[[int], None] | None,
        extra: dict[str, Any],
    ) -> int:
        if ids is None and task_name is None and not everything:
            raise ValueError("give task ids, a task name, or all=True")
        total = 0
        if ids is not None:
            wanted = list(ids)
            for start in range(0, len(wanted), chunk):
                batch = {"ids": wanted[start : start + chunk], "name": task_name}
                row = self._one(name, {**batch, "until": None, "limit": None, **extra})
                total += int(row["n"]) if row else 0
                if progress is not None:
                    progress(total)
            return total
        # Rows dead-lettered after the first statement are left for another call, so a task
        # that keeps dying cannot keep this loop going.
        until: datetime | None = None
        while True:
            row = self._one(
                name, {"ids": None, "name": task_name, "until": until, "limit": chunk, **extra}
            )
            assert row is not None
            until = row["until"]
            total += int(row["n"])
            if progress is not None:
                progress(total)
            if int(row["n"]) < chunk:
                return total

    def autovacuum_off(self) -> bool:
        """True when autovacuum is off on the server or for one of the tables that grow with
        every task (the tasks, their results and their attempt history)."""
        row = self._one("autovacuum_off", {"schema": self.schema})
        return bool(row and row["off"])

    def health_report(
        self, window_seconds: float = 60.0, live_within: float = 30.0, timeout: float | None = None
    ) -> Row:
        """One statement on a connection of its own (opened within ``timeout`` seconds, default
        the broker's ``connect_timeout``), for probes: a psycopg error means unhealthy.

        Returns ``now`` (database time), ``oldest_due_age`` (seconds the oldest due PENDING row
        has waited; None when none is due), ``expired_leases``, ``dead_total``, ``dead_recent``
        (rows dead-lettered within ``window_seconds``), ``dead_per_minute`` (``dead_recent`` per
        minute) and ``live_workers`` (heartbeat within ``live_within`` seconds).
        """
        wait = self.connect_timeout if timeout is None else timeout
        with psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=max(1, round(wait))
        ) as conn:
            row = self._one(
                "health_report", {"window": window_seconds, "within": live_within}, conn
            )
        assert row is not None
        row["dead_per_minute"] = row["dead_recent"] * 60.0 / window_seconds
        return row

    def task_list(
        self,
        state: str | None = None,
        queue: str | None = None,
        name: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Row]:
        """Task rows, most recently changed first; ``state`` is a row status (PENDING, RUNNING,
        COMPLETED, FAILED, CANCELLED, DEAD), ``since``/``until`` bound ``updated_at``.

        Dicts of ``id``, ``name``, ``queue``, ``priority``, ``status``, ``run_at``, ``attempt``,
        ``retries``, ``max_retries``, ``claimed_by``, ``lease_until``, ``error``, ``created_at``
        and ``updated_at``.
        """
        return self._all(
            "task_list",
            {
                "status": state,
                "queue": queue,
                "name": name,
                "since": since,
                "until": until,
                "limit": limit,
                "offset": offset,
            },
        )

    def task_detail(self, task_id: str) -> Row | None:
        """Everything about one task, or None when its row is gone.

        The row's columns (``payload`` as JSON text for json payloads, else None with
        ``payload_raw_bytes`` the binary payload's size), ``result_state`` and
        ``result_date_done`` (the stored result's, or None), and ``attempts``: the run history,
        oldest first, as dicts of ``attempt``, ``worker``, ``started_at``, ``finished_at``,
        ``outcome`` (completed, failed, dead, cancelled, retry, lost, rejected, ignored,
        requeued) and ``error``.
        """
        row = self._one("task_detail", {"id": task_id})
        if row is None:
            return None
        row["attempts"] = self._all("task_attempts", {"id": task_id})
        return row

    def overview(self, window_seconds: float = 3600.0, live_within: float = 30.0) -> Row:
        """The dashboard's front page.

        ``minutes``: dicts of ``minute`` (start of the minute), ``outcome`` and ``n``, attempts
        finished per minute and outcome within the window, oldest first (minutes without any
        are absent); ``totals``: status -> rows, every PENDING, BLOCKED, RUNNING and DEAD row
        and the COMPLETED, FAILED and CANCELLED rows finished within the window (statuses
        without rows are 0); ``workers``: the live workers as :meth:`live_workers` returns them.
        """
        params = {"window": window_seconds}
        totals = dict.fromkeys(
            ("PENDING", "BLOCKED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "DEAD"), 0
        )
        totals.update({row["status"]: int(row["n"]) for row in self._all("status_totals", params)})
        return {
            "minutes": self._all("finished_per_minute", params),
            "totals": totals,
            "workers": self.live_workers(live_within),
        }


class CopyRefused(Exception):
    """COPY may not load tasks for this role (row-level security applies to it); nothing was
    stored. ``built``: the items read before it was refused."""

    def __init__(self, built: list[Any]) -> None:
        super().__init__("COPY refused: row-level security applies to this role")
        self.built = built


def copy_row(msg: TaskMessage) -> tuple[Any, ...]:
    """``msg`` as a row of Broker._copy_statement, its columns in that order."""
    body = msg.body
    return (
        msg.id,
        msg.name,
        msg.queue,
        msg.priority,
        "now" if msg.eta is None else msg.eta,
        msg.expires_at,
        body.content_type,
        body.content_encoding,
        body.json_text,
        body.raw,
        _HEADERS_JSON(msg.headers),
        msg.max_retries,
    )


def _json_row(msg: TaskMessage) -> dict[str, Any]:
    """One row of ``insert_tasks`` (times as ISO 8601 with their offset, bytes as base64)."""
    raw = msg.body.raw
    return {
        "id": msg.id,
        "name": msg.name,
        "queue": msg.queue,
        "priority": msg.priority,
        "eta": msg.eta.isoformat() if msg.eta is not None else None,
        "countdown": msg.countdown,
        "expires_at": msg.expires_at.isoformat() if msg.expires_at is not None else None,
        "expires_in": msg.expires_in,
        "content_type": msg.body.content_type,
        "content_encoding": msg.body.content_encoding,
        "payload": msg.body.json_text,
        "payload_raw": base64.b64encode(raw).decode("ascii") if raw is not None else None,
        "headers": msg.headers,
        "max_retries": msg.max_retries,
    }


class _storage_errors:
    """Turn the database's refusals of a payload into the errors a caller can act on.

    ``with _storage_errors(task_id): ...`` around a write. A class rather than a generator
    context manager: it is entered on every ``delay()``."""

    __slots__ = ("task_id",)

    def __init__(self, task_id: str | None) -> None:
        self.task_id = task_id

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, errors.UniqueViolation):
            raise ValueError(
                f"a task with id {self.task_id!r} already exists; task ids must be unique"
            ) from None
        if isinstance(
            exc,
            (
                errors.InvalidTextRepresentation,
                errors.UntranslatableCharacter,
                errors.DataException,
            ),
        ):
            raise EncodeError(
                "the task payload cannot be stored as JSON "
                f"({exc.diag.message_primary}); NaN and Infinity are not valid JSON"
            ) from None
        if isinstance(exc, errors.UndefinedTable):
            raise ImproperlyConfigured(
                "the pgtasks schema does not exist in this database; run `pgtasks migrate`"
            ) from None
        if isinstance(exc, errors.ConfigurationLimitExceeded):
            hint = f"; {exc.diag.message_hint}" if exc.diag.message_hint else ""
            raise QuotaExceeded(f"{exc.diag.message_primary}{hint}") from None
        if isinstance(exc, errors.InsufficientPrivilege):
            raise NotPermitted(
                f"the database refused to store the task ({exc.diag.message_primary}): this role "
                "may not enqueue it; `pgtasks grants` sets the queues and task names a producer "
                "role may use"
            ) from None


# -- canvas data: what the canvas layer asks the broker to write ------------------------------


def result_channel(schema: str) -> str:
    """The channel announcing stored results for ``schema`` (see migration 0002)."""
    return f"pgtasks_r_{schema}"[:63]


#: What the hand-off insert can meet where the plain one would not fail (also pgtasks.aio's).
NO_HANDOFF = (
    errors.UndefinedTable,
    errors.UndefinedColumn,
    errors.UndefinedFunction,
    errors.InsufficientPrivilege,
)
_INSERTS = (
    "insert_task",
    "insert_task_handoff",
    "insert_tasks",
    "insert_task_unique",
    "insert_task_unique_window",
)

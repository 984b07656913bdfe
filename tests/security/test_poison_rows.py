"""Rows written to hurt the workers that read them, by someone allowed to insert into the task
table (a producer's role) or, for results, to write a result.

Each row is inserted with SQL, as such a role would, beside innocent rows that one claim takes
with it. Whatever the poison (a decompression bomb, a document nested thousands deep, a number
of 100,000 digits, a payload far over the limit, headers of the wrong types), the poisoned row
ends DEAD with a reason naming the problem, logged with its task id and the worker's id; the
rows claimed with it run and complete in that claim; the worker goes on taking work.
"""

from __future__ import annotations

import bz2
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from pgtasks import Celery
from pgtasks.broker import handoff_channel
from pgtasks.serialization import ContentDisallowed, DecodeError, Unreadable
from tests.apps.harness import attempts, one, wait_until

#: max_payload_bytes of these tests' app: small, so that rows over it stay cheap to write (and
#: over a number of 100,000 digits).
LIMIT = 256 * 1024
#: Innocent rows claimed with each poisoned one.
BESIDE = 3

DEEP = "[" * 3000 + "]" * 3000
HUGE_INT = "9" * 100_000
OVERSIZE_JSON = f'[["{"a" * LIMIT}"], {{}}]'
#: 20 MB of zeros in about 50 bytes (the bomb found in review: 2.3 KB, 6.35 GB).
BOMB = bz2.compress(b"\0" * 20_000_000)


@dataclass(frozen=True)
class Poison:
    """A row as an attacker inserts it: the columns it sets, and what its error must say."""

    error: str
    payload: str | None = "[[1], {}]"
    payload_raw: bytes | None = None
    headers: str = "{}"
    content_type: str = "application/json"
    content_encoding: str = "utf-8"


POISONS: dict[str, Poison] = {
    # -- decoding bombs: kombu's trusted content types and codecs.decode ----------------------
    "bz2 bomb as application/data": Poison(
        "cannot decode payload: Refusing to deserialize untrusted content of type application/data",
        payload=None,
        payload_raw=BOMB,
        content_type="application/data",
        content_encoding="bz2_codec",
    ),
    "bz2 bomb as application/text": Poison(
        "cannot decode payload: Refusing to deserialize untrusted content of type application/text",
        payload=None,
        payload_raw=BOMB,
        content_type="application/text",
        content_encoding="bz2_codec",
    ),
    "bz2 bomb without a content type": Poison(
        "cannot decode payload: Refusing to deserialize untrusted content of type application/data",
        payload=None,
        payload_raw=BOMB,
        content_type="",
        content_encoding="bz2_codec",
    ),
    "text/plain": Poison(
        "cannot decode payload: Refusing to deserialize untrusted content of type text/plain",
        payload=None,
        payload_raw=b"[[1], {}]",
        content_type="text/plain",
    ),
    "json under a decompressing encoding": Poison(
        "cannot decode payload: content encoding 'zlib_codec' is not accepted",
        content_encoding="zlib_codec",
    ),
    # -- headers: read by the claim itself ----------------------------------------------------
    "headers nested 3000 deep": Poison(
        "cannot decode headers: nested too deeply to read", headers=f'{{"x": {DEEP}}}'
    ),
    "a header number of 100000 digits": Poison(
        "cannot decode headers: Exceeds the limit (4300 digits) for integer string conversion",
        headers=f'{{"x": {HUGE_INT}}}',
    ),
    "headers over max_payload_bytes": Poison(
        "cannot decode headers: ",  # the size as jsonb sends it, then the limit
        headers=f'{{"x": "{"a" * LIMIT}"}}',
    ),
    # -- headers the worker reads, of the wrong type ------------------------------------------
    "ignore_result a string": Poison(
        "cannot decode headers: 'ignore_result' must be a boolean or null, not a string",
        headers='{"ignore_result": "no"}',
    ),
    "argsrepr an object": Poison(
        "cannot decode headers: 'argsrepr' must be a string or null, not an object",
        headers='{"argsrepr": {"a": 1}}',
    ),
    "root_id an array": Poison(
        "cannot decode headers: 'root_id' must be a string or null, not an array",
        headers='{"root_id": ["x"]}',
    ),
    "timelimit a string": Poison(
        "cannot decode headers: 'timelimit' must be [hard, soft]: two numbers of seconds or "
        "nulls, not a string",
        headers='{"timelimit": "soon"}',
    ),
    "a compressed body": Poison(
        "cannot decode headers: 'compression' must be absent: compressed payloads are not "
        "supported, not a string",
        headers='{"compression": "application/x-gzip"}',
    ),
    # -- payloads -----------------------------------------------------------------------------
    "payload nested 3000 deep": Poison(
        "cannot decode payload: nested too deeply to read", payload=f"[[{DEEP}], {{}}]"
    ),
    "a payload number of 100000 digits": Poison(
        "cannot decode payload: Exceeds the limit (4300 digits) for integer string conversion",
        payload=f"[[{HUGE_INT}], {{}}]",
    ),
    "json payload over max_payload_bytes": Poison(
        f"cannot decode payload: {len(OVERSIZE_JSON)} bytes, over the {LIMIT}-byte limit "
        "(max_payload_bytes)",
        payload=OVERSIZE_JSON,
    ),
    "raw payload over max_payload_bytes": Poison(
        f"cannot decode payload: {LIMIT + 1} bytes, over the {LIMIT}-byte limit "
        "(max_payload_bytes)",
        payload=None,
        payload_raw=b"\x92" * (LIMIT + 1),
        content_type="application/x-msgpack",
        content_encoding="binary",
    ),
    "invalid UTF-8 as json": Poison(
        "cannot decode payload: 'utf-8' codec can't decode byte 0xff",
        payload=None,
        payload_raw=b"[[1], {}]\xff",
    ),
}


@dataclass
class Claim:
    """A poisoned row and the innocent ones inserted with it, due together."""

    poisoned: str
    innocent: list[str]


@pytest.fixture
def limited(app: Celery) -> Celery:
    """The app, with a small max_payload_bytes, and the task every row names."""
    app.conf.max_payload_bytes = LIMIT

    @app.task(name="poison.echo")
    def echo(*args: Any, **kwargs: Any) -> list[Any]:
        return [list(args), kwargs]

    return app


def insert(db: psycopg.Connection[Any], poison: Poison, **columns: Any) -> str:
    """Insert a row with SQL alone, as a role that may insert into the task table would."""
    task_id = str(uuid.uuid4())
    names = ", ".join(columns)
    marks = "".join(", %s" for _ in columns)
    db.execute(
        "INSERT INTO tasks (id, name, content_type, content_encoding, payload, payload_raw,"
        f" headers{', ' + names if names else ''})"
        f" VALUES (%s, 'poison.echo', %s, %s, %s::json, %s, %s::jsonb{marks})",
        (
            task_id,
            poison.content_type,
            poison.content_encoding,
            poison.payload,
            poison.payload_raw,
            poison.headers,
            *columns.values(),
        ),
    )
    return task_id


def insert_claim(db: psycopg.Connection[Any], poison: Poison, **columns: Any) -> Claim:
    """The poisoned row and BESIDE innocent ones, committed together (so due together)."""
    innocent = Poison("", payload='[["innocent"], {}]')
    with db.transaction():
        poisoned = insert(db, poison, **columns)
        beside = [insert(db, innocent, **columns) for _ in range(BESIDE)]
    return Claim(poisoned, beside)


def finished(db: psycopg.Connection[Any], task_id: str) -> dict[str, Any] | None:
    """The row's status and error once it has finished, else None."""
    row = one(db, "SELECT status, error FROM tasks WHERE id = %s", (task_id,))
    return row if row["status"] in ("DEAD", "COMPLETED", "FAILED") else None


def assert_poisoned_alone(
    app: Celery,
    db: psycopg.Connection[Any],
    worker: Any,
    logs: list[dict[str, Any]],
    claim: Claim,
    error: str,
) -> None:
    """The poisoned row is DEAD with ``error`` and logged so; the innocent rows ran in the
    claim that took it (their first attempt); the worker still takes work."""
    for task_id in claim.innocent:
        assert app.AsyncResult(task_id).get(timeout=10) == [["innocent"], {}]
        assert attempts(db, task_id) == [(1, worker.id, "completed")]
    row = wait_until(lambda: finished(db, claim.poisoned), timeout=10, what="the poisoned row")
    assert row["status"] == "DEAD", row
    assert row["error"].startswith(error), row["error"]
    assert attempts(db, claim.poisoned) == [(1, worker.id, "dead")]
    [logged] = [e for e in logs if e.get("task_id") == claim.poisoned and e["log_level"] == "error"]
    assert (logged["event"], logged["worker_id"]) == ("task.dead_lettered", worker.id)
    assert logged["error"] in row["error"]
    # Alive and taking work.
    fresh = app.send_task("poison.echo", args=("after",))
    assert fresh.get(timeout=10) == [["after"], {}]


@pytest.mark.parametrize("case", list(POISONS))
def test_a_poisoned_row_is_dead_lettered_alone(
    limited: Celery, db: psycopg.Connection[Any], worker_factory: Any, case: str
) -> None:
    poison = POISONS[case]
    claim = insert_claim(db, poison)
    # Started after the rows are due: its first claim takes all of them.
    with capture_logs() as logs, worker_factory(concurrency=1 + BESIDE) as worker:
        assert_poisoned_alone(limited, db, worker, logs, claim, poison.error)
    assert limited.AsyncResult(claim.poisoned).state == "FAILURE"


def test_an_accepted_type_without_a_decoder_is_read_only_as_utf8_or_binary(
    limited: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    # An application that accepts raw data still never runs a decompressor on a row.
    limited.conf.accept_content = ["json", "application/data"]
    poison = Poison(
        "cannot decode payload: content encoding 'bz2_codec' is not accepted",
        payload=None,
        payload_raw=BOMB,
        content_type="application/data",
        content_encoding="bz2_codec",
    )
    claim = insert_claim(db, poison)
    with capture_logs() as logs, worker_factory(concurrency=1 + BESIDE) as worker:
        assert_poisoned_alone(limited, db, worker, logs, claim, poison.error)


def test_arguments_nested_deeper_than_a_child_process_can_be_sent(
    limited: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    # 600 levels read as JSON (about 990 do), but pickle, which hands a job to a prefork
    # child, stops at about 500: the worker's loop died on it, leaving its slots taken.
    deep = "[" * 600 + "]" * 600
    poison = Poison(
        "cannot hand the call to a child process: nested too deeply to pickle",
        payload=f"[[{deep}], {{}}]",
    )
    claim = insert_claim(db, poison)
    with capture_logs() as logs, worker_factory(pool="prefork", concurrency=1 + BESIDE) as worker:
        assert_poisoned_alone(limited, db, worker, logs, claim, poison.error)


def held_by(db: psycopg.Connection[Any], worker: str) -> dict[str, Any]:
    """The columns of a row held RUNNING by ``worker`` (attempt 1, a minute's lease), as a
    hand-off writes it."""
    lease = one(db, "SELECT now() + interval '1 minute' AS t")["t"]
    return {"status": "RUNNING", "claimed_by": worker, "attempt": 1, "lease_until": lease}


def test_a_poisoned_row_among_those_a_worker_adopts_is_read_alone(
    limited: Celery, db: psycopg.Connection[Any]
) -> None:
    # Rows handed to a worker that it has not heard of are read by one statement (adopt): a
    # poisoned one among them failed the statement, and every row stayed RUNNING unseen until
    # its lease ran out.
    owner = f"adopter-{uuid.uuid4().hex[:6]}"
    poison = POISONS["headers nested 3000 deep"]
    claim = insert_claim(db, poison, **held_by(db, owner))
    found = {row.id: row for row in limited.broker.adopt(owner)}
    assert set(found) == {claim.poisoned, *claim.innocent}
    marker = found[claim.poisoned].headers
    assert isinstance(marker, Unreadable)
    assert marker.error.startswith("nested too deeply to read")
    assert all(found[i].headers == {} for i in claim.innocent)


def test_a_worker_handed_a_poisoned_row_dead_letters_it_alone(
    limited: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    poison = POISONS["a header number of 100000 digits"]
    with capture_logs() as logs, worker_factory(concurrency=1 + BESIDE) as worker:
        # Waiting rows named to the worker by id, as a hand-off names them.
        claim = insert_claim(db, poison)
        channel = handoff_channel(limited.broker.schema, worker.id)
        for task_id in (claim.poisoned, *claim.innocent):
            db.execute("SELECT pg_notify(%s, json_build_array(%s::text)::text)", (channel, task_id))
        assert_poisoned_alone(limited, db, worker, logs, claim, poison.error)


# -- results -------------------------------------------------------------------------------------


def store_result(db: psycopg.Connection[Any], content_type: str, encoding: str, data: bytes) -> str:
    """A result row as a role that may write results could write it."""
    task_id = str(uuid.uuid4())
    db.execute(
        "INSERT INTO results (task_id, state, content_type, content_encoding, result, date_done)"
        " VALUES (%s, 'SUCCESS', %s, %s, %s, now())",
        (task_id, content_type, encoding, data),
    )
    return task_id


@pytest.mark.parametrize(
    ("content_type", "encoding", "data", "error", "match"),
    [
        ("application/json", "utf-8", DEEP.encode(), DecodeError, "nested too deeply to read"),
        ("application/json", "utf-8", HUGE_INT.encode(), DecodeError, "4300 digits"),
        ("application/data", "bz2_codec", BOMB, ContentDisallowed, "application/data"),
        ("application/json", "zlib_codec", b"1", ContentDisallowed, "zlib_codec"),
    ],
    ids=["nested 3000 deep", "100000 digits", "bz2 bomb", "decompressing encoding"],
)
def test_a_poisoned_result_gives_its_reader_a_clear_error(
    limited: Celery,
    db: psycopg.Connection[Any],
    content_type: str,
    encoding: str,
    data: bytes,
    error: type[Exception],
    match: str,
) -> None:
    poisoned = store_result(db, content_type, encoding, data)
    fine = store_result(db, "application/json", "utf-8", b'{"ok": 1}')
    with pytest.raises(error, match=match):
        limited.AsyncResult(poisoned).get(timeout=5)
    assert limited.AsyncResult(fine).get(timeout=5) == {"ok": 1}


def test_a_junk_ignore_result_header_leaves_the_state_readable(
    limited: Celery, db: psycopg.Connection[Any]
) -> None:
    """``get_result`` reads ``ignore_result`` from the row's headers, which its producer
    wrote: a value that is not a boolean is no boolean, not an error for every reader."""
    sent = limited.send_task("poison.any", headers={"ignore_result": "maybe"})
    assert limited.AsyncResult(sent.id).state == "PENDING"


def test_the_dashboard_shows_a_row_whose_headers_do_not_read(
    limited: Celery, db: psycopg.Connection[Any]
) -> None:
    """The operator must be able to look at the dead letter a poisoned row became."""
    from pgtasks.dashboard.data import task_detail

    db.execute(
        "INSERT INTO tasks (id, name, status, headers, error, payload)"
        " VALUES ('deep', 'poison.any', 'DEAD', %s::jsonb, 'cannot decode headers', '[[], {}]')",
        (DEEP,),
    )
    detail = task_detail(limited, "deep")
    assert detail is not None
    assert detail["headers"]["unreadable"].startswith("nested too deeply to read")
    assert (detail["argsrepr"], detail["state"]) == (None, "FAILURE")

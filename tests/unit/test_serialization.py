"""The kombu serializer bridge: what a row stores and how it comes back."""

from __future__ import annotations

import bz2
import json
import pickle
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import serialization
from kombu.utils import json as kombu_json

from pgtasks.message import ClaimedTask, malformed
from pgtasks.serialization import (
    JSON,
    ContentDisallowed,
    DecodeError,
    Encoded,
    EncodeError,
    decode,
    encode,
    find_unencodable,
    one_shot,
)

offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=offsets
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(),
    st.datetimes(),
    aware_datetimes,
    st.dates(),
    st.times(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.uuids(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(), inner, max_size=5)
    ),
    max_leaves=20,
)


def round_trip(value: Any, serializer: str = "json") -> Any:
    body = encode(value, serializer)
    return decode(body.data, body.content_type, body.content_encoding, accept=[serializer])


def same(a: Any, b: Any) -> bool:
    """Equal, of the same type, and for datetimes with the same UTC offset, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (datetime, time)) and a.utcoffset() != b.utcoffset():
        return False
    if isinstance(a, Decimal):
        return bool(a.as_tuple() == b.as_tuple())
    return bool(a == b)


@settings(deadline=None)
@given(values)
def test_json_round_trip_keeps_value_and_type(value: Any) -> None:
    assert same(round_trip(value), value)


@settings(deadline=None)
@given(st.lists(values, max_size=4), st.dictionaries(st.text(), values, max_size=4))
def test_args_kwargs_envelope_round_trips(args: list[Any], kwargs: dict[str, Any]) -> None:
    body = encode([args, kwargs], "json")
    assert body.content_type == JSON
    assert body.json_text is not None and body.raw is None
    back = decode(body.json_text, body.content_type, body.content_encoding, accept=["json"])
    assert same(back, [args, kwargs])


encoders = [
    kombu_json.JSONEncoder(),
    json.JSONEncoder(separators=(",", ":")),
    kombu_json.JSONEncoder(ensure_ascii=False),
]


@settings(deadline=None)
@given(st.one_of(values, st.floats(), st.tuples(values, values)))
def test_one_shot_writes_what_encode_writes(value: Any) -> None:
    for encoder in encoders:
        try:
            expected = encoder.encode(value)
        except TypeError as exc:
            with pytest.raises(TypeError, match=str(exc).split(" is not")[0]):
                one_shot(encoder)(value)
        else:
            assert one_shot(encoder)(value) == expected


def test_one_shot_refuses_a_circular_value_and_settings_it_does_not_cover() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        one_shot(json.JSONEncoder())(loop)
    indented = json.JSONEncoder(indent=2, sort_keys=True)
    assert one_shot(indented)({"b": [1], "a": 2}) == indented.encode({"b": [1], "a": 2})


def test_kombu_types_survive_exactly() -> None:
    moment = datetime(
        2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5, minutes=30))
    )
    value = {
        "when": moment,
        "naive": datetime(2000, 1, 1, 0, 0),
        "day": date(1999, 12, 31),
        "at": time(12, 30, 15, 5),
        "money": Decimal("12345678901234567890.000000000001"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "blob": b"\x00\xff\xfe binary",
        "text_bytes": b"plain",
        "nested": [{"deep": [Decimal("-0.5"), {"deeper": moment}]}],
        "big": 2**100,
    }
    back = round_trip(value)
    assert same(back, value)
    assert back["when"].utcoffset() == timedelta(hours=5, minutes=30)


def test_tuples_come_back_as_lists() -> None:
    assert round_trip((1, (2, 3))) == [1, [2, 3]]


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(object(), "object"), ({1, 2}, "set"), (frozenset(), "frozenset"), (1j, "complex")],
)
def test_unencodable_values_raise_kombu_encode_error(value: Any, type_name: str) -> None:
    with pytest.raises(EncodeError, match=type_name):
        encode([value], "json")


def test_find_unencodable_names_the_first_bad_argument() -> None:
    assert find_unencodable([1, "a", {2}], {"k": object()}, "json") == "args[2] (set)"
    assert find_unencodable([1], {"ok": 2, "k": object()}, "json") == "kwargs['k'] (object)"
    assert find_unencodable([1, [datetime.now()]], {"d": Decimal(1)}, "json") is None


def test_unknown_serializer_is_an_encode_error() -> None:
    with pytest.raises(EncodeError):
        encode([1], "no-such-serializer")


def test_pickle_is_stored_as_bytes() -> None:
    body = encode([[{1, 2}], {}], "pickle")
    assert body.content_type == "application/x-python-serialize"
    assert body.json_text is None
    assert body.raw == body.data
    assert decode(body.data, body.content_type, body.content_encoding, ["pickle"]) == [
        [{1, 2}],
        {},
    ]


def test_content_not_accepted_is_refused_before_it_is_unpickled(tmp_path: Any) -> None:
    marker = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (marker.mkdir, ())

    data = pickle.dumps([[Boom()], {}])
    with pytest.raises(ContentDisallowed):
        decode(data, "application/x-python-serialize", "binary", accept=["json"])
    assert not marker.exists()
    # The same bytes do run code once pickle is accepted: the check above is what stops it.
    decode(data, "application/x-python-serialize", "binary", accept=["json", "pickle"])
    assert marker.exists()


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b"{not json", JSON),
        (b"\xff\xfe\xfa", JSON),
        (b'{"__type__": "martian", "__value__": 1}', JSON),
        (b"garbage", "application/x-python-serialize"),
        (b"[[1], {}] [2]", JSON),
        (b"[[1], {}]x", JSON),
        (b"[[1], {}", JSON),
        (b"   ", JSON),
    ],
)
def test_undecodable_data_raises_decode_error(data: bytes, content_type: str) -> None:
    with pytest.raises(DecodeError):
        decode(data, content_type, "utf-8", accept=["json", "pickle"])


@pytest.mark.parametrize("data", [b"[[1], {}]", b" [[1], {}]", b"[[1], {}] \n", b"\t[[1],{}]\r\n"])
def test_json_around_whitespace_reads_as_json(data: bytes) -> None:
    assert decode(data, JSON, "utf-8", accept=["json"]) == [[1], {}]
    assert decode(data.decode(), JSON, "utf-8", accept=["json"]) == [[1], {}]


def test_unknown_content_type_is_refused() -> None:
    with pytest.raises((ContentDisallowed, DecodeError)):
        decode(b"x", "application/x-martian", "binary", accept=["json"])


def test_decode_accepts_text_and_bytes_alike() -> None:
    body = encode({"a": [1, 2]}, "json")
    as_text = decode(body.data.decode(), JSON, "utf-8", accept=None)
    as_bytes = decode(body.data, JSON, "utf-8", accept=None)
    assert as_text == as_bytes == {"a": [1, 2]}


def test_encoded_columns() -> None:
    json_body = Encoded(JSON, "utf-8", b"[[], {}]")
    assert (json_body.json_text, json_body.raw) == ("[[], {}]", None)
    raw_body = Encoded("application/x-msgpack", "binary", b"\x92\x90\x80")
    assert (raw_body.json_text, raw_body.raw) == (None, b"\x92\x90\x80")


# -- what a row holds is written by whoever may insert one -------------------------------------

#: 20 MB of zeros in about 50 bytes.
BOMB = bz2.compress(b"\0" * 20_000_000)


@pytest.mark.parametrize("content_type", ["application/data", "application/text", ""])
def test_kombus_trusted_content_types_are_refused_unless_accepted(content_type: str) -> None:
    # kombu reads these (and a missing type, as application/data) whatever accept says, and
    # runs codecs.decode on them with the stored encoding: a decompression bomb.
    with pytest.raises(ContentDisallowed, match=r"application/(data|text)"):
        decode(BOMB, content_type, "bz2_codec", accept=["json"])


@pytest.mark.parametrize(
    "encoding", ["bz2_codec", "zlib_codec", "base64_codec", "hex", "rot13", "utf-16", "", "x"]
)
def test_only_utf8_and_binary_encodings_are_read(encoding: str) -> None:
    refused = f"content encoding {encoding!r} is not accepted"
    with pytest.raises(ContentDisallowed, match=refused):
        decode(BOMB, "application/data", encoding, accept=["json", "application/data"])
    with pytest.raises(ContentDisallowed, match=refused):
        decode(b"[[1], {}]", JSON, encoding, accept=["json"])


@pytest.mark.parametrize("encoding", ["utf-8", "UTF-8", "utf8", "binary", "ascii-8bit"])
def test_the_encodings_kombu_writes_read_in_any_case(encoding: str) -> None:
    assert decode(b"[[1], {}]", JSON, encoding, accept=["json"]) == [[1], {}]
    data = decode(b"\x00raw", "application/data", encoding, accept=["application/data"])
    assert data == (b"\x00raw" if encoding.lower() in ("binary", "ascii-8bit") else "\x00raw")


def test_a_serializer_registered_with_an_encoding_of_its_own_still_reads() -> None:
    serialization.register(
        "ascii-json",
        lambda value: json.dumps(value).encode("ascii"),
        json.loads,
        content_type="application/x-ascii-json",
        content_encoding="us-ascii",
    )
    try:
        body = encode([[1], {}], "ascii-json")
        assert body.content_encoding == "us-ascii"
        assert decode(body.data, body.content_type, "us-ascii", ["ascii-json"]) == [[1], {}]
        # Its encoding is read for its own content type only.
        with pytest.raises(ContentDisallowed, match="'us-ascii' is not accepted"):
            decode(body.data, JSON, "us-ascii", ["json"])
    finally:
        serialization.unregister("ascii-json")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"[" * 3000 + b"]" * 3000, "nested too deeply to read"),
        (b"[" + b"9" * 100_000 + b"]", r"Exceeds the limit \(4300 digits\)"),
    ],
)
def test_what_python_cannot_read_is_a_decode_error_saying_why(data: bytes, error: str) -> None:
    for encoding in ("utf-8", "utf8"):  # the fast path, and kombu's
        with pytest.raises(DecodeError, match=error):
            decode(data, JSON, encoding, accept=["json"])


# -- claimed rows, checked before their payload is decoded ------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
header_names = st.sampled_from(
    [
        *("argsrepr", "kwargsrepr", "ignore_result", "result_serializer", "parent_id"),
        *("root_id", "group", "timelimit", "compression", "chord", "eta", "retries", "x"),
    ]
)


def claimed(
    headers: Any, payload: str | None = "[[], {}]", raw: bytes | None = None
) -> ClaimedTask:
    now = datetime.now(timezone.utc)
    return ClaimedTask(
        "id", "t", "q", 0, 1, 0, None, JSON, "utf-8", payload, raw, headers, now, None, False, now
    )


@settings(deadline=None)
@given(st.dictionaries(header_names, json_values, max_size=4) | json_values)
def test_a_row_passes_only_with_headers_the_worker_can_read(headers: Any) -> None:
    problem = malformed(claimed(headers), 1024)
    if problem is not None:
        reason, error = problem
        assert reason == "malformed headers"
        assert error.startswith("cannot decode headers: ")
        return
    assert isinstance(headers, dict)
    for name in ("argsrepr", "kwargsrepr", "result_serializer", "parent_id", "root_id", "group"):
        assert isinstance(headers.get(name), (str, type(None)))
    assert isinstance(headers.get("ignore_result"), (bool, type(None)))
    assert headers.get("compression") is None
    limits = headers.get("timelimit")
    assert limits is None or (
        len(limits) == 2 and all(isinstance(v, (int, float)) or v is None for v in limits)
    )


@pytest.mark.parametrize(
    ("payload", "raw", "size"),
    [
        ("é" * 512, None, 1024),
        ("é" * 513, None, 1026),
        (None, b"x" * 1025, 1025),
        ("[]", b"x" * 1023, 1025),
    ],
)
def test_a_payload_is_measured_in_bytes_as_stored(
    payload: str | None, raw: bytes | None, size: int
) -> None:
    problem = malformed(claimed({}, payload, raw), 1024)
    if size <= 1024:
        assert problem is None
    else:
        assert problem == (
            "oversize payload",
            f"cannot decode payload: {size} bytes, over the 1024-byte limit (max_payload_bytes)",
        )

"""How pgtasks' connections read json and jsonb: the same values as ``json.loads``; what it
refuses (or what is over the limit) loads as ``Unreadable`` with the reason, never an error, so
that one value fails its own row and not the statement that read it with others."""

from __future__ import annotations

import json
import json.scanner
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks.broker import MAX_JSON_BYTES, json_adapters
from pgtasks.serialization import DecodeError, Unreadable, whole_document

JSONB = 3802


def loader() -> Any:
    """The jsonb loader of a broker's connections, as psycopg finds it (text format)."""
    found = json_adapters(MAX_JSON_BYTES).get_loader(JSONB, 0)
    assert found is not None
    return found(JSONB)


documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(documents, st.booleans(), st.booleans())
def test_a_document_reads_as_json_loads_reads_it(
    value: Any, compact: bool, ascii_only: bool
) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    data = json.dumps(value, separators=separators, ensure_ascii=ascii_only).encode("utf-8")
    read = loader()
    assert read.load(data) == json.loads(data)
    assert read.load(memoryview(data)) == json.loads(data)


@pytest.mark.parametrize(
    "data",
    [b"", b"nul", b'{"a": 1} x', b"[1, 2", b"\xff", b'"\xc3(', b'{"a": NaX}'],
)
def test_what_json_loads_refuses_loads_as_unreadable_with_its_error(data: bytes) -> None:
    with pytest.raises(Exception) as expected:
        json.loads(data)
    got = loader().load(data)
    assert isinstance(got, Unreadable)
    assert got.error == str(expected.value)
    assert got.text == data.decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"a": ' + b"[" * 3000 + b"]" * 3000 + b"}", "nested too deeply to read"),
        (b'{"a": ' + b"9" * 100_000 + b"}", "Exceeds the limit (4300 digits)"),
    ],
    ids=["nested 3000 deep", "a number of 100000 digits"],
)
def test_what_python_cannot_read_loads_as_unreadable(data: bytes, error: str) -> None:
    got = loader().load(memoryview(data))
    assert isinstance(got, Unreadable)
    assert got.error.startswith(error), got.error
    assert got.text == data.decode()
    assert bool(got)
    # Used as a document anywhere, it says why it is not one.
    with pytest.raises(DecodeError, match="cannot read a JSON value from the database"):
        got.get("a")
    with pytest.raises(DecodeError):
        list(got)


def test_a_value_over_the_limit_loads_unread() -> None:
    loader = json_adapters(64).get_loader(JSONB, 0)
    assert loader is not None
    assert loader(JSONB).load(b'{"a": "' + b"x" * 50 + b'"}') == {"a": "x" * 50}
    got = loader(JSONB).load(b'{"a": "' + b"x" * 60 + b'"}')
    assert isinstance(got, Unreadable)
    assert got.error == "69 bytes, over the 64-byte limit (max_payload_bytes)"
    assert got.text is None


@pytest.mark.parametrize("data", [b'  {"a": 1}\n', b"NaN", b"-Infinity", b"1e400", b'"\\u00e9"'])
def test_what_the_scanner_alone_would_not_take_reads_as_json_loads_reads_it(data: bytes) -> None:
    loaded, expected = loader().load(data), json.loads(data)
    assert repr(loaded) == repr(expected)


def test_documents_read_with_the_pure_python_scanner_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the C scanner is missing, make_scanner returns a plain function."""
    monkeypatch.setattr(json.scanner, "make_scanner", json.scanner.py_make_scanner)
    read = whole_document(json.JSONDecoder())
    assert read('{"a": [1, "b", null]}') == {"a": [1, "b", None]}
    assert read(' {"a": 1}\n') == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        read('{"a": 1} x')

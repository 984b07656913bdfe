"""How pgtasks' connections read json and jsonb: the same values and errors as ``json.loads``."""

from __future__ import annotations

import json
import json.scanner
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks.broker import _JsonLoader

JSONB = 3802

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
    loader = _JsonLoader(JSONB)
    assert loader.load(data) == json.loads(data)
    assert loader.load(memoryview(data)) == json.loads(data)


@pytest.mark.parametrize(
    "data",
    [b"", b"nul", b'{"a": 1} x', b"[1, 2", b"\xff", b'"\xc3(', b'{"a": NaX}'],
)
def test_what_json_loads_refuses_fails_with_its_error(data: bytes) -> None:
    with pytest.raises(Exception) as expected:
        json.loads(data)
    with pytest.raises(type(expected.value)) as got:
        _JsonLoader(JSONB).load(data)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("data", [b'  {"a": 1}\n', b"NaN", b"-Infinity", b"1e400", b'"\\u00e9"'])
def test_what_the_scanner_alone_would_not_take_reads_as_json_loads_reads_it(data: bytes) -> None:
    loaded, expected = _JsonLoader(JSONB).load(data), json.loads(data)
    assert repr(loaded) == repr(expected)


def test_the_loader_works_with_the_pure_python_scanner_too() -> None:
    """Where the C scanner is missing, make_scanner returns a plain function."""

    class PurePython(_JsonLoader):
        _scan = staticmethod(json.scanner.py_make_scanner(json.JSONDecoder()))

    assert PurePython(JSONB).load(b'{"a": [1, "b", null]}') == {"a": [1, "b", None]}

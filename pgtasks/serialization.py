"""The bridge to kombu's serializer registry: task arguments and results in and out of rows.

json (kombu's, so datetimes, UUIDs and Decimals survive as in Celery) is the default and is stored
as JSONB so operators can query payloads; any other content type is stored as bytes.
"""

from __future__ import annotations

import functools
import json
import json.scanner
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kombu import serialization
from kombu.exceptions import ContentDisallowed, DecodeError, EncodeError
from kombu.utils import json as kombu_json

JSON = "application/json"


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, its C encoder built once rather than on every call.

    ``JSONEncoder.encode`` builds a new C encoder for each value it writes, which costs twice
    the writing of a short value. The text is the same; only a circular reference reads
    differently (RecursionError, rather than ValueError). Falls back to ``encoder.encode``
    where there is no C encoder, for settings it does not cover, and for a subclass that
    writes its own way.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    cls = type(encoder)
    if (
        make is None
        or encoder.indent is not None
        or encoder.sort_keys
        or cls.encode is not json.JSONEncoder.encode
        or cls.iterencode is not json.JSONEncoder.iterencode
    ):
        return encoder.encode
    quote = json.encoder.encode_basestring_ascii
    if not encoder.ensure_ascii:
        quote = json.encoder.encode_basestring
    write = make(
        None,  # no markers: nothing to share between threads
        encoder.default,
        quote,
        None,
        encoder.key_separator,
        encoder.item_separator,
        False,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    join = "".join

    def encode(value: Any) -> str:
        return join(write(value, 0))

    return encode


def whole_document(decoder: json.JSONDecoder) -> Callable[[str], Any]:
    """``decoder.decode``, by the decoder's scanner alone where the scanner reads the whole text.

    ``JSONDecoder.decode`` matches whitespace before and after its scan, which costs as much as
    scanning a short document. Text the scanner does not read to its end (leading or trailing
    whitespace, extra data, nothing it can read) goes to ``decoder.decode``, which reads it or
    raises its own error.
    """
    scan = json.scanner.make_scanner(decoder)  # type: ignore[arg-type]
    slow = decoder.decode

    def decode(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except (StopIteration, ValueError):
            return slow(text)
        if end != len(text):
            return slow(text)
        return value

    return decode


# kombu's json codec, with the encoder and decoder built once rather than on every call. Used
# only while kombu's own json codec is the registered one (a replacement is always honoured).
_JSON_ENCODE = one_shot(kombu_json.JSONEncoder())
_JSON_DECODE = whole_document(json.JSONDecoder(object_hook=kombu_json.object_hook))


@dataclass(unsafe_hash=True)
class Encoded:
    """A serialized value as a row stores it."""

    content_type: str
    content_encoding: str
    data: bytes

    @property
    def json_text(self) -> str | None:
        """The text for a JSONB column, or None when this is not json."""
        return self.data.decode("utf-8") if self.content_type == JSON else None

    @property
    def raw(self) -> bytes | None:
        """The bytes for the bytea column, or None when this is json."""
        return None if self.content_type == JSON else self.data


_JSON_NULL = Encoded(JSON, "utf-8", b"null")


def encode(value: Any, serializer: str) -> Encoded:
    """Serialize with kombu's registry; raises kombu's ``EncodeError`` with the reason."""
    return encoder(serializer)(value)


def encoder(serializer: str) -> Callable[[Any], Encoded]:
    """``encode`` with ``serializer`` for many values: the choice of codec made once."""
    if serializer == "json" and _kombu_json_codec():
        return _encode_json
    return functools.partial(_encode_with_kombu, serializer=serializer)


def json_text_encoder(serializer: str) -> Callable[[Any], str] | None:
    """The text ``encoder(serializer)`` encodes a value's bytes from (UTF-8), where it is
    json by kombu's own codec; None for any other serializer."""
    return _JSON_ENCODE if encoder(serializer) is _encode_json else None


def _encode_json(value: Any) -> Encoded:
    """json while it is kombu's own codec, without going through kombu's registry."""
    if value is None:  # what most tasks return
        return _JSON_NULL
    try:
        return Encoded(JSON, "utf-8", _JSON_ENCODE(value).encode("utf-8"))
    except Exception as exc:
        raise EncodeError(str(exc)) from exc


def _encode_with_kombu(value: Any, serializer: str) -> Encoded:
    try:
        content_type, encoding, data = serialization.dumps(  # type: ignore[no-untyped-call]
            value, serializer=serializer
        )
    except EncodeError:
        raise
    except Exception as exc:  # kombu wraps most errors; be sure every one reads the same
        raise EncodeError(str(exc)) from exc
    if isinstance(data, str):
        data = data.encode(encoding or "utf-8")
    return Encoded(content_type, encoding or "binary", data)


def decode(
    data: bytes | str,
    content_type: str,
    content_encoding: str,
    accept: Iterable[str] | None,
) -> Any:
    """Deserialize; raises ``ContentDisallowed`` for a content type not in ``accept`` or a
    content encoding other than UTF-8 and binary, ``DecodeError`` for data that does not read.

    Unlike kombu, no content type is trusted without being accepted: kombu reads
    ``application/data`` and ``application/text`` (and a missing type) whatever ``accept`` says,
    running ``codecs.decode`` with the message's content encoding, which may name a
    decompressor (``bz2_codec``: a few kilobytes become gigabytes). A row's every column can be
    written by anyone who may insert one, so only the accepted content types and the encodings
    kombu itself writes are read. ``accept`` None (a value this process just encoded) leaves the
    content type to kombu's registry of disabled types.
    """
    allowed = None if accept is None else _allowed(tuple(accept))
    fast = (
        content_type == JSON
        and content_encoding == "utf-8"
        and data
        and allowed is not None
        and JSON in allowed
    )
    if fast and _kombu_json_codec():
        try:
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            return _JSON_DECODE(text)
        except Exception as exc:
            raise unreadable_error(exc) from exc
    kind = content_type or "application/data"  # as kombu reads a missing content type
    if allowed is not None and kind not in allowed:
        raise ContentDisallowed(f"Refusing to deserialize untrusted content of type {_alias(kind)}")
    encoding = (content_encoding or "").lower()
    if encoding not in ENCODINGS and not _registered_encoding(kind, encoding):
        raise ContentDisallowed(
            f"content encoding {content_encoding!r} is not accepted (only utf-8 and binary are)"
        )
    try:
        return serialization.loads(  # type: ignore[no-untyped-call]
            data, kind, encoding, accept=allowed
        )
    except (ContentDisallowed, DecodeError) as exc:
        # kombu wraps its codec's error, as the DecodeError's argument.
        cause = exc.args[0] if exc.args else None
        if isinstance(cause, RecursionError):
            raise unreadable_error(cause) from exc
        raise
    except Exception as exc:
        raise unreadable_error(exc) from exc


#: The content encodings a stored value may name: those kombu's own serializers write (text as
#: UTF-8, bytes as they are: ``binary``, and ``ascii-8bit``, which kombu reads as binary), in
#: any case. kombu hands any other name to ``codecs.decode`` for a content type without a
#: decoder of its own; only a serializer an application registered with an encoding of its own
#: adds that encoding, for its content type (see _registered_encoding).
ENCODINGS = frozenset({"utf-8", "utf8", "binary", "ascii-8bit"})


def _registered_encoding(content_type: str, encoding: str) -> bool:
    """Whether ``encoding`` is the one a serializer registered with kombu writes for
    ``content_type``, which has a decoder (the decoder reads the bytes; codecs never run)."""
    registry = serialization.registry
    if content_type not in registry._decoders:
        return False
    codec = registry._encoders.get(registry.type_to_name.get(content_type))
    return codec is not None and (codec.content_encoding or "").lower() == encoding


def _alias(content_type: str) -> str:
    """A content type as kombu names it in its refusals: ``json (application/json)``."""
    name = serialization.registry.type_to_name.get(content_type)
    return f"{name} ({content_type})" if name else content_type


def unreadable_error(exc: BaseException) -> DecodeError:
    """The ``DecodeError`` for a value that did not read, saying why in plain words where the
    reader's own message would not (a document nested deeper than the reader recurses)."""
    if isinstance(exc, RecursionError):
        return DecodeError(f"nested too deeply to read ({exc})")
    return DecodeError(str(exc))


class Unreadable:
    """What a json or jsonb column that did not read holds in a row read from the database:
    the error, and the text where it was read (None where it was refused unread, for its size).

    A connection's loader returns one rather than raising, so that one such value fails its
    own row rather than the statement that read it with others (a claim of many rows). Any
    use of it as a document raises ``DecodeError`` with the reason.
    """

    __slots__ = ("error", "text")

    def __init__(self, error: str, text: str | None = None) -> None:
        self.error = error
        self.text = text

    def __repr__(self) -> str:
        return f"<unreadable JSON: {self.error}>"

    def __bool__(self) -> bool:
        return True

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise DecodeError(f"cannot read a JSON value from the database: {self.error}")

    __getitem__ = __iter__ = __len__ = __contains__ = _refuse
    get = keys = values = items = _refuse


def too_large(size: int, limit: int) -> Unreadable:
    """What a value of ``size`` bytes, over ``limit``, loads as: unread."""
    return Unreadable(f"{size} bytes, over the {limit}-byte limit (max_payload_bytes)")


def read_json(raw: bytes, limit: int) -> Any:
    """A json or jsonb value from the text the server sent: the document, or ``Unreadable``
    (never an error) for one that does not read or is over ``limit`` bytes.

    For the documents a fast reader gave up on, and for reporting: ``json.loads`` works out
    the bytes' encoding (a byte order mark included), then reads them or says why not.
    """
    if len(raw) > limit:
        return too_large(len(raw), limit)
    try:
        return json.loads(raw)
    except Exception as exc:
        return Unreadable(str(unreadable_error(exc)), raw.decode("utf-8", "replace"))


def _kombu_json_codec() -> bool:
    """Whether json is still kombu's own codec (an application may register another)."""
    registry = serialization.registry
    codec = registry._encoders.get("json")
    return (
        codec is not None
        and codec.encoder is kombu_json.dumps
        and registry._decoders.get(JSON) is kombu_json.loads
    )


@functools.lru_cache(maxsize=64)
def _allowed(accept: tuple[str, ...]) -> set[str]:
    """kombu's accepted content types for serializer names (computed once per setting)."""
    return serialization.prepare_accept_content(list(accept))  # type: ignore[no-any-return,no-untyped-call]


def find_unencodable(args: Iterable[Any], kwargs: dict[str, Any], serializer: str) -> str | None:
    """Name the first argument that will not serialize (for the error message), if any."""
    for index, arg in enumerate(args):
        try:
            encode(arg, serializer)
        except EncodeError:
            return f"args[{index}] ({type(arg).__name__})"
    for key, value in kwargs.items():
        try:
            encode(value, serializer)
        except EncodeError:
            return f"kwargs[{key!r}] ({type(value).__name__})"
    return None


__all__ = [
    "ENCODINGS",
    "JSON",
    "ContentDisallowed",
    "DecodeError",
    "EncodeError",
    "Encoded",
    "Unreadable",
    "decode",
    "encode",
    "find_unencodable",
    "read_json",
    "too_large",
    "unreadable_error",
]

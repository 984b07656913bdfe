"""task_routes in Celery's forms: exact names, globs, regexes, functions, lists, in order."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu import Queue

from pgtasks import Celery
from pgtasks.routing import route

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,3}", fullmatch=True)


@given(names)
def test_no_routes_means_default(name: str) -> None:
    assert route(None, name) is None
    assert route({}, name) is None
    assert route([], name) is None


@given(names, names)
def test_exact_name_wins_over_glob(name: str, queue: str) -> None:
    routes = {"*": {"queue": "everything"}, name: {"queue": queue}}
    assert route(routes, name) == queue


@given(names)
def test_glob_matches_the_whole_name(name: str) -> None:
    prefix = name.split(".")[0]
    assert route({f"{prefix}.*": {"queue": "io"}}, name) == ("io" if "." in name else None)
    assert route({f"{prefix}*": "io"}, name) == "io"


def test_regex_keys_and_kombu_queues() -> None:
    routes = {re.compile(r"^video\."): {"queue": Queue("media")}}
    assert route(routes, "video.encode") == "media"
    assert route(routes, "audio.encode") is None


def test_functions_and_lists_are_tried_in_order() -> None:
    seen: list[tuple[str, tuple[object, ...]]] = []

    def router(name: str, args: tuple[object, ...], kwargs: dict, options: dict, **kw: object):
        seen.append((name, args))
        return {"queue": "big"} if args and args[0] == "big" else None

    routes = [router, {"proj.*": {"queue": "proj"}}]
    assert route(routes, "proj.x", ("big",)) == "big"
    assert route(routes, "proj.x", ("small",)) == "proj"
    assert route(routes, "other", ("small",)) is None
    assert seen[0] == ("proj.x", ("big",))


def test_bad_router_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="task_routes entries"):
        route([42], "x")  # type: ignore[list-item]


def test_precedence_explicit_then_task_then_routes_then_default() -> None:
    app = Celery("r", broker="postgresql://localhost/x", set_as_current=False)
    app.conf.task_routes = {"t.*": {"queue": "routed"}}

    @app.task(name="t.plain")
    def plain() -> None: ...

    @app.task(name="t.own", queue="own")
    def own() -> None: ...

    @app.task(name="u.none")
    def none() -> None: ...

    assert plain.build_message().queue == "routed"
    assert plain.build_message(queue="explicit").queue == "explicit"
    assert own.build_message().queue == "own"
    assert none.build_message().queue == "celery"

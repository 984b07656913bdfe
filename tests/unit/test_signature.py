"""Signatures and canvas composition: Celery's merge rules, immutability, dict form, operators."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from pgtasks import Celery, chain, chord, group, signature
from pgtasks.canvas import Planner, Signature, maybe_signature
from pgtasks.result import AsyncResult, GroupResult


@pytest.fixture
def app() -> Celery:
    """An app that never connects: nothing here is applied."""
    return Celery("unit", broker="postgresql://nobody@localhost:1/none", set_as_current=False)


@pytest.fixture
def add(app: Celery) -> Any:
    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    return add


def test_s_holds_partial_arguments(add: Any) -> None:
    sig = add.s(1, y=2)
    assert sig.task == "add" and sig.args == (1,) and sig.kwargs == {"y": 2}
    assert not sig.immutable and sig.options == {}


def test_merge_prepends_new_args_and_new_kwargs_and_options_win(add: Any) -> None:
    sig = add.s(2, z=1).set(queue="a", priority=1)
    merged = sig.clone((1,), {"z": 2}, priority=9)
    assert merged.args == (1, 2)
    assert merged.kwargs == {"z": 2}
    assert merged.options == {"queue": "a", "priority": 9}
    assert (sig.args, sig.kwargs, sig.options) == ((2,), {"z": 1}, {"queue": "a", "priority": 1})


def test_immutable_signature_keeps_its_arguments_but_takes_options(add: Any) -> None:
    sig = add.si(1, 2)
    assert sig.immutable
    merged = sig.clone((99,), {"x": 0}, queue="q")
    assert (merged.args, merged.kwargs, merged.options) == ((1, 2), {}, {"queue": "q"})


def test_clone_is_independent_and_merges(add: Any) -> None:
    sig = add.s(2)
    sig.link(add.s(10))
    copy = sig.clone((1,), queue="q")
    assert copy.args == (1, 2) and copy.options["queue"] == "q"
    copy.options["link"].append(add.s(20))
    assert len(sig.options["link"]) == 1
    assert sig.args == (2,) and "queue" not in sig.options


def test_set_and_set_immutable(add: Any) -> None:
    sig = add.s(1).set(immutable=True, countdown=5)
    assert sig.immutable and sig.options == {"countdown": 5}


def test_link_and_link_error_return_the_callback(add: Any) -> None:
    sig = add.s(1)
    cb, eb = add.s(2), add.s(3)
    assert sig.link(cb) is cb and sig.link_error(eb) is eb
    assert sig.options["link"] == [cb] and sig.options["link_error"] == [eb]
    assert sig.on_error(add.s(4)) is sig


def test_dict_form_round_trips_through_json_and_pickle(app: Celery, add: Any) -> None:
    sig = add.s(1, y=2).set(queue="q")
    sig.link(add.si(3, 4))
    again = signature(json.loads(json.dumps(sig)), app=app)
    assert again == sig and isinstance(again, Signature)
    assert maybe_signature(again.options["link"][0]).immutable
    assert pickle.loads(pickle.dumps(sig)) == sig


def test_canvas_types_round_trip(app: Celery, add: Any) -> None:
    canvas = chain(add.s(1, 1), group(add.s(1), add.s(2)), chord([add.s(3)], add.s(4)))
    again = signature(json.loads(json.dumps(canvas)), app=app)
    assert isinstance(again, chain)
    assert isinstance(again.tasks[1], group) and isinstance(again.tasks[2], chord)
    assert again.tasks[2].body.task == "add"


def test_pipe_builds_chains_and_upgrades_group_to_chord(add: Any) -> None:
    c = add.s(1, 1) | add.s(2) | add.s(3)
    assert isinstance(c, chain) and [s.args for s in c.tasks] == [(1, 1), (2,), (3,)]
    assert isinstance(group(add.s(1), add.s(2)) | add.s(3), chord)
    longer = c | (add.s(4) | add.s(5))
    assert isinstance(longer, chain) and len(longer.tasks) == 5
    with_body = chord([add.s(1)], add.s(2)) | add.s(3)
    assert isinstance(with_body, chord) and isinstance(with_body.body, chain)


def test_chain_prepared_upgrades_a_group_followed_by_a_task(add: Any) -> None:
    steps = chain(add.s(1, 1), group(add.s(1), add.s(2)), add.s(3)).prepared()
    assert [type(s).__name__ for s in steps] == ["Signature", "chord"]


def test_freeze_assigns_ids_kept_when_applied(add: Any) -> None:
    sig = add.s(1, 2)
    res = sig.freeze()
    assert isinstance(res, AsyncResult) and sig.id == res.id
    c = add.s(1, 1) | add.s(2)
    last = c.freeze()
    assert last.id == c.tasks[-1].id and last.parent.id == c.tasks[0].id


def test_group_freeze_gives_members_group_and_index(add: Any) -> None:
    g = group(add.s(1), add.s(2) | add.s(3))
    res = g.freeze()
    assert isinstance(res, GroupResult) and len(res) == 2
    assert g.tasks[0].options["group_id"] == res.id and g.tasks[0].options["group_index"] == 0
    # A chain member is represented by its last step
    assert res.results[1].id == g.tasks[1].tasks[-1].id


def test_planner_writes_chain_rest_into_the_first_rows_headers(app: Celery, add: Any) -> None:
    planner = Planner(app)
    result = planner.add(add.s(1, 1) | add.s(2) | add.si(0, 0))
    (msg,) = planner.plan.messages
    assert [s["args"] for s in msg.headers["chain"]] == [[2], [0, 0]]
    assert msg.headers["chain"][-1]["options"]["task_id"] == result.id
    assert msg.headers["root_id"] == msg.id


def test_planner_chord_creates_the_counter_with_members_in_order(app: Celery, add: Any) -> None:
    planner = Planner(app)
    res = planner.add(chord([add.s(i, i) for i in range(3)], add.s()))
    (spec,) = planner.plan.chords
    assert list(spec.member_ids) == [m.id for m in planner.plan.messages]
    assert all(m.headers["chord"] == spec.id for m in planner.plan.messages)
    assert spec.body["options"]["task_id"] == res.id
    assert res.parent.id == spec.id


def test_chord_member_must_stand_for_one_result(app: Celery, add: Any) -> None:
    # Nested groups are unrolled, so this is fine...
    Planner(app).add(chord([group(add.s(1, 1), add.s(2, 2)), add.s(3, 3)], add.s()))
    # ... but a member that ends in a group stands for several results: its chord could not
    # say which the body receives, so it is refused before anything is written.
    fanning = chain(add.s(2, 2), group(add.s(1), add.s(2)))
    planner = Planner(app)
    with pytest.raises(ValueError, match="must stand for one result"):
        planner.add(chord([add.s(1, 1), fanning], add.s()))
    assert not planner.plan.messages and not planner.plan.chords


def test_task_signature_options_and_subtask(add: Any) -> None:
    sig = add.signature((1, 2), countdown=3)
    assert sig.options == {"countdown": 3}
    assert add.subtask((1,), {"y": 2}).kwargs == {"y": 2}
    assert add.signature((1,), immutable=True).immutable


def test_calling_a_signature_runs_the_task_here(add: Any) -> None:
    assert add.s(2)(1) == 3
    assert add.si(2, 2)(100) == 4


def test_link_option_travels_in_headers(add: Any) -> None:
    msg = add.build_message((1, 2), link=add.s(9), link_error=[add.si(1, 1)])
    assert msg.headers["link"][0]["args"] == [9]
    assert msg.headers["link_error"][0]["immutable"] is True


def test_eager_canvas_runs_here(app: Celery, add: Any) -> None:
    app.conf.task_always_eager = True
    assert (add.s(1, 1) | add.s(2) | add.s(3)).apply_async().get() == 7
    assert group(add.s(1, 1), add.s(2, 2)).apply_async().get() == [2, 4]

    @app.task(name="total")
    def total(values: list[int]) -> int:
        return sum(values)

    assert chord([add.s(1, 1), add.s(2, 2)], total.s()).apply_async().get() == 6

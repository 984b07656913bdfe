"""Canvas: signatures, chain, group, chord, link, link_error, map/starmap/chunks."""

from scenarios import WAIT, clean, outcome, scenario, token, wait_state


@scenario("signatures")
def signature_calls(obs):
    """``.s()``, partial arguments, ``signature()`` by name, ``.set()`` options."""
    from celery import signature

    from proj.tasks import add, where

    obs["s_delay"] = add.s(2, 3).delay().get(timeout=WAIT)
    obs["partial"] = add.s(2).delay(5).get(timeout=WAIT)
    obs["by_name"] = signature("proj.tasks.add", args=(4, 5)).apply_async().get(timeout=WAIT)
    obs["set_queue"] = where.s().set(queue="explicit").apply_async().get(timeout=WAIT)
    as_dict = dict(add.s(1, y=2))
    fields = ("task", "args", "kwargs", "options", "subtask_type", "immutable")
    obs["sig_fields"] = clean({k: as_dict.get(k, "<absent>") for k in fields})


@scenario("chain")
def chain_pipe(obs):
    """``add.s(1, 2) | add.s(3) | mul.s(2)``: 12, with ``.parent`` results along the chain."""
    from proj.tasks import add, mul

    res = (add.s(1, 2) | add.s(3) | mul.s(2)).apply_async()
    obs["get"] = res.get(timeout=WAIT)
    obs["parent"] = res.parent.get(timeout=WAIT)
    obs["grandparent"] = res.parent.parent.get(timeout=WAIT)


@scenario("chain")
def chain_function_and_si(obs):
    """``chain(...)`` with an immutable ``.si()`` step that ignores the previous result."""
    from celery import chain

    from proj.tasks import add

    obs["chain"] = chain(add.s(1, 1), add.s(1)).delay().get(timeout=WAIT)
    obs["immutable"] = (add.s(1, 1) | add.si(5, 5)).delay().get(timeout=WAIT)


@scenario("chain")
def chain_error_stops(obs):
    """An error in the middle of a chain reaches the caller; later steps never run."""
    from proj import journal
    from proj.tasks import add, fail, record

    t = token()
    res = (add.s(1, 1) | fail.si("in chain") | record.si(t, "after")).apply_async()
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["after_ran"] = journal.wait(t, 1, timeout=1)


@scenario("chain")
def chain_request_ids(obs):
    """Inside a chain, ``request.parent_id`` is the previous task and ``root_id`` the first."""
    from proj.tasks import add, introspect

    res = (add.s(1, 1) | add.s(1) | introspect.s()).apply_async()
    seen = res.get(timeout=WAIT)
    obs["args"] = seen["args"]
    obs["parent_is_previous"] = seen["parent_id"] == res.parent.id
    obs["root_is_first"] = seen["root_id"] == res.parent.parent.id


@scenario("group and GroupResult")
def group_results(obs):
    """``group(add.s(i, i) for i in range(5))``: a GroupResult with five ordered results."""
    from celery import group

    from proj.tasks import add

    res = group(add.s(i, i) for i in range(5)).apply_async()
    obs["class"] = type(res).__name__
    obs["get"] = res.get(timeout=WAIT)
    obs["len"] = len(res.results)
    obs["completed_count"] = res.completed_count()
    obs["ready"], obs["successful"] = res.ready(), res.successful()


@scenario("group and GroupResult")
def group_partial_failure(obs):
    """A group with one failing member: get() raises; propagate=False returns the exception."""
    from celery import group

    from proj.tasks import add, fail

    res = group(add.s(1, 1), fail.s("member failed"), add.s(2, 2)).apply_async()
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["no_propagate"] = clean(res.get(timeout=WAIT, propagate=False))
    obs["failed"] = res.failed()


@scenario("group and GroupResult")
def group_request_and_restore(obs):
    """Members see ``request.group``; ``GroupResult.save()``/``restore()`` by id."""
    from celery import group
    from celery.result import GroupResult

    from proj.tasks import introspect

    res = group(introspect.s(i) for i in range(2)).apply_async()
    seen = res.get(timeout=WAIT)
    obs["group_ids_match"] = [s["group"] == res.id for s in seen]
    res.save()
    restored = GroupResult.restore(res.id)
    obs["restored"] = len(restored.get(timeout=WAIT)) if restored is not None else None


@scenario("chord")
def chord_sum(obs):
    """``chord(add.s(i, i) for i in range(5))(tsum.s())``: 20."""
    from celery import chord

    from proj.tasks import add, tsum

    obs["get"] = chord(add.s(i, i) for i in range(5))(tsum.s()).get(timeout=WAIT)


@scenario("chord")
def chord_from_group_pipe(obs):
    """``group(...) | tsum.s()`` becomes a chord."""
    from celery import group

    from proj.tasks import add, tsum

    obs["get"] = (group(add.s(1, 1), add.s(2, 2)) | tsum.s()).delay().get(timeout=WAIT)


@scenario(
    "chord",
    differs={
        "get": "Celery raises the member's error when its check of the chord's parents (made "
        "between polls) meets the failed member first, and the body's ChordError naming it "
        "when the body's failure arrives first; pgtasks raises the member's error. The body's "
        "own result is compared.",
    },
)
def chord_member_fails(obs):
    """A failing chord member: the callback never runs; get() raises the member's error, and
    once every member has finished the body's result is a ChordError naming it."""
    from celery import chord

    from proj.tasks import add, fail, tsum

    res = chord([add.s(1, 1), fail.s("chord member")])(tsum.s())
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    # get() raises as soon as the member fails; the body's error is recorded when the last
    # member has finished, so wait for it rather than read a state still on its way.
    obs["state"] = wait_state(res, {"SUCCESS", "FAILURE", "REVOKED"}, timeout=WAIT)
    obs["result"] = clean(res.result)


@scenario("link and link_error")
def link_callback(obs):
    """``apply_async(link=on_done.s(token))``: the callback receives the return value."""
    from proj import journal
    from proj.canvas_tasks import on_done
    from proj.tasks import add

    t = token()
    obs["get"] = add.apply_async((2, 2), link=on_done.s(t)).get(timeout=WAIT)
    obs["callback"] = journal.wait(t, 1, timeout=5)


@scenario("link and link_error")
def link_error_errback(obs):
    """``link_error=on_error.s(token)``: the errback gets (request, exc, traceback)."""
    from proj import journal
    from proj.canvas_tasks import on_error
    from proj.tasks import fail

    t = token()
    res = fail.apply_async(("linked failure",), link_error=on_error.s(t))
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    events = journal.wait(t, 1, timeout=5)
    obs["errback"] = [{**e, "id": e["id"] == res.id} for e in events]


@scenario("map, starmap, chunks")
def task_map(obs):
    """``tsum.map([[1, 2], [3, 4]])``: one task applying tsum to each item."""
    from proj.tasks import tsum

    obs["get"] = outcome(lambda: tsum.map([[1, 2], [3, 4]]).delay().get(timeout=WAIT))


@scenario("map, starmap, chunks")
def task_starmap(obs):
    """``add.starmap([(1, 1), (2, 2)])``: one task applying add to each argument tuple."""
    from proj.tasks import add

    obs["get"] = outcome(lambda: add.starmap([(1, 1), (2, 2)]).delay().get(timeout=WAIT))


@scenario("map, starmap, chunks")
def task_chunks(obs):
    """``add.chunks(pairs, 3)``: six calls in two tasks of three."""
    from proj.tasks import add

    pairs = list(zip(range(6), range(6), strict=True))
    obs["get"] = outcome(lambda: add.chunks(pairs, 3).apply_async().get(timeout=WAIT))


@scenario("signatures")
def signature_from_dict(obs):
    """A signature passed around as a dict (as in task arguments) is rebuilt with
    ``signature(d)`` and called."""
    from celery import signature

    from proj.tasks import add

    as_dict = dict(add.s(2, 3).set(countdown=0.1))
    rebuilt = signature(as_dict)
    obs["task"] = rebuilt.task
    obs["get"] = rebuilt.delay().get(timeout=WAIT)

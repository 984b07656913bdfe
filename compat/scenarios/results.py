"""Results: states over time, revoke, ignore_result, AsyncResult by id, eager mode."""

from scenarios import WAIT, clean, outcome, scenario, token, wait_state


@scenario(
    "result states",
    note="The project sets task_track_started=True, so a running task reports STARTED.",
)
def states_over_time(obs):
    """PENDING before, STARTED while running (task_track_started), SUCCESS after."""
    from proj.tasks import sleep_then

    res = sleep_then.apply_async((1.0, "done"), countdown=0.5)
    obs["before"] = res.state
    obs["while_running"] = wait_state(res, {"STARTED", "SUCCESS"})
    obs["get"] = res.get(timeout=WAIT)
    obs["after"] = res.state
    obs["date_done_set"] = res.date_done is not None


@scenario("revoke")
def revoke_pending(obs):
    """Revoking a task still waiting on its countdown: it never runs, get() raises."""
    from proj import journal
    from proj.tasks import record

    t = token()
    res = record.apply_async((t, "ran"), countdown=1.5)
    res.revoke()
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["ran"] = journal.read(t)


@scenario("revoke")
def control_revoke_by_id(obs):
    """``app.control.revoke(id)`` on a waiting task, then ``AsyncResult(id)`` sees REVOKED."""
    from proj.celery import app
    from proj.tasks import record

    res = record.apply_async((token(), "ran"), countdown=1.5)
    app.control.revoke(res.id)
    handle = app.AsyncResult(res.id)
    obs["get"] = outcome(lambda: handle.get(timeout=WAIT))
    obs["state"] = handle.state


@scenario("ignore_result")
def ignore_result(obs):
    """An ``ignore_result=True`` task runs, but its result stays PENDING."""
    from proj import journal
    from proj.tasks import fire_and_forget

    t = token()
    res = fire_and_forget.delay(t)
    obs["ran"] = journal.wait(t, 1)
    obs["state"] = res.state
    obs["get"] = outcome(lambda: res.get(timeout=0.5))


@scenario("ignore_result")
def ignore_result_per_call(obs):
    """``apply_async(ignore_result=True)`` on an ordinary task stores nothing."""
    from proj import journal
    from proj.tasks import record

    t = token()
    res = record.apply_async((t, "ran"), ignore_result=True)
    journal.wait(t, 1)
    obs["state_after_run"] = wait_state(res, {"SUCCESS"}, timeout=1.0)


@scenario("AsyncResult by id")
def async_result_by_id(obs):
    """``AsyncResult(id)`` and ``app.AsyncResult(id)`` rebuilt from a bare id."""
    from celery.result import AsyncResult

    from proj.celery import app
    from proj.tasks import add

    task_id = add.delay(20, 22).id
    obs["app_asyncresult"] = outcome(lambda: app.AsyncResult(task_id).get(timeout=WAIT))
    obs["module_asyncresult"] = outcome(lambda: AsyncResult(task_id).get(timeout=WAIT))
    obs["unknown_id_state"] = app.AsyncResult("no-such-task-id").state


@scenario("AsyncResult by id")
def apply_async_task_id(obs):
    """``apply_async(task_id=...)`` uses the caller's id."""
    from proj.tasks import add

    res = add.apply_async((1, 1), task_id="compat-fixed-id-" + token())
    obs["id_prefix"] = res.id.startswith("compat-fixed-id-")
    obs["get"] = res.get(timeout=WAIT)


@scenario("task_always_eager")
def always_eager(obs):
    """``task_always_eager``: delay() runs in the caller; the request is eager."""
    from proj.celery import app
    from proj.tasks import add, fail, introspect

    app.conf.task_always_eager = True
    res = add.delay(2, 3)
    obs["result_class"] = type(res).__name__
    obs["get"], obs["state"] = res.get(), res.state
    seen = introspect.delay("a")
    obs["is_eager"] = seen.get()["is_eager"]
    obs["failure"] = outcome(lambda: fail.delay("eager boom").get())
    app.conf.task_eager_propagates = True
    obs["propagates"] = outcome(lambda: fail.delay("eager raise"))


@scenario("custom states and update_state")
def update_state_progress(obs):
    """``self.update_state(state="PROGRESS", meta=...)`` is visible to the caller while running."""
    from proj import journal
    from proj.tasks import progress

    t = token()
    res = progress.delay(t)
    obs["state_seen"] = wait_state(res, {"PROGRESS", "SUCCESS", "FAILURE"}, timeout=5)
    obs["info_seen"] = clean(res.info)
    journal.note(t, "go on")
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))


@scenario("AsyncResult by id")
def forget(obs):
    """``forget()`` drops a stored result: the id reads as PENDING again."""
    from proj.tasks import add

    res = add.delay(1, 2)
    obs["get"] = res.get(timeout=WAIT)
    res.forget()
    obs["state_after_forget"] = res.app.AsyncResult(res.id).state


@scenario("result states")
def get_timeout(obs):
    """``get(timeout=0.5)`` on a task still running raises TimeoutError; the task still ends."""
    from proj.tasks import sleep_then

    res = sleep_then.delay(1.5, "late")
    obs["get"] = outcome(lambda: res.get(timeout=0.5))
    obs["later"] = res.get(timeout=WAIT)

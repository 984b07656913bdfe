"""Calling tasks: delay, apply_async options, routing, direct calls, send_task, shared_task."""

import datetime
import json
import os
import signal
import subprocess
import time

from scenarios import WAIT, outcome, scenario, token


@scenario("delay() and get()")
def delay_get(obs):
    """``add.delay(2, 3).get()`` returns 5 and the result reports SUCCESS."""
    from proj.tasks import add

    res = add.delay(2, 3)
    obs["get"] = res.get(timeout=WAIT)
    obs["state"] = res.state
    obs["ready"], obs["successful"], obs["failed"] = res.ready(), res.successful(), res.failed()
    obs["result"] = res.result


@scenario("apply_async(args, kwargs)")
def apply_async_args_kwargs(obs):
    """``apply_async(args=..., kwargs=...)`` passes both through."""
    from proj.tasks import add, introspect

    obs["add"] = add.apply_async(args=(1,), kwargs={"y": 2}).get(timeout=WAIT)
    seen = introspect.apply_async(("a",), {"b": [1, 2]}).get(timeout=WAIT)
    obs["args"], obs["kwargs"] = seen["args"], seen["kwargs"]


@scenario("apply_async(countdown=)")
def countdown(obs):
    """A countdown of 3 s: still PENDING at once, run no sooner than the countdown."""
    from proj import journal
    from proj.tasks import stamp

    t = token()
    sent = time.time()
    res = stamp.apply_async((t,), countdown=3)
    obs["state_at_once"] = res.state
    obs["get"] = res.get(timeout=WAIT) == t
    obs["waited_countdown"] = journal.wait(t, 1)[0] - sent >= 2.9


@scenario("apply_async(eta=)")
def eta(obs):
    """An aware ETA 3 s ahead: still PENDING at once, run no sooner than the ETA."""
    from proj import journal
    from proj.tasks import stamp

    t = token()
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3)
    res = stamp.apply_async((t,), eta=when)
    obs["state_at_once"] = res.state
    obs["get"] = res.get(timeout=WAIT) == t
    obs["not_before_eta"] = journal.wait(t, 1)[0] >= when.timestamp() - 0.1


@scenario("apply_async(expires=)")
def expires_in_past(obs):
    """A task whose ``expires`` has passed never runs; its result is REVOKED."""
    from proj import journal
    from proj.tasks import record

    t = token()
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)
    res = record.apply_async((t, "ran"), expires=past)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["ran"] = journal.read(t)


@scenario("apply_async(expires=)")
def expires_before_countdown(obs):
    """``countdown=2, expires=0.5``: expired by the time it is due, so it is REVOKED."""
    from proj import journal
    from proj.tasks import record

    t = token()
    res = record.apply_async((t, "ran"), countdown=2, expires=0.5)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["ran"] = journal.read(t)


@scenario("apply_async(expires=)")
def expires_in_future(obs):
    """``expires=60`` on a task due now: it runs normally."""
    from proj.tasks import add

    obs["get"] = add.apply_async((4, 4), expires=60).get(timeout=WAIT)


@scenario(
    "priority",
    note="Celery leaves priority order to the broker: on Redis (queue_order_strategy=priority) "
    "lower numbers run first, on RabbitMQ (x-max-priority) higher numbers do. Only that every "
    "task ran with its priority accepted is compared; the observed order is shown, not compared.",
    timeout=45,
)
def priority(obs):
    """Six tasks with priorities 0-9 queued before a one-slot worker starts on their queue."""
    from proj import journal
    from proj.tasks import report_priority

    t = token()
    labels = [("p0", 0), ("p9", 9), ("p3", 3), ("p6", 6), ("p9b", 9), ("p0b", 0)]
    results = [report_priority.apply_async((t, lab), priority=p, queue="prio") for lab, p in labels]
    cmd = [*json.loads(os.environ["COMPAT_WORKER_CMD"]), "-Q", "prio", "-c", "1", "-P", "solo"]
    cmd += ["-n", f"prio-{t[:6]}@%h"]
    worker = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        obs["results"] = [r.get(timeout=WAIT * 2) for r in results]
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    obs["info"] = {"order": journal.read(t)}


@scenario("task_routes")
def task_routes(obs):
    """``task_routes`` sends ``proj.tasks.routed`` to queue ``routed``; the worker sees it there."""
    from proj.tasks import routed, where

    obs["get"] = routed.delay("x").get(timeout=WAIT)
    obs["default_queue"] = where.delay().get(timeout=WAIT)


@scenario("apply_async(queue=)")
def explicit_queue(obs):
    """``apply_async(queue="explicit")`` is consumed from that queue."""
    from proj.tasks import where

    obs["routing_key"] = where.apply_async(queue="explicit").get(timeout=WAIT)


@scenario("calling a task directly")
def direct_call(obs):
    """``add(2, 3)`` runs in the caller; a bound task sees ``called_directly`` True, no id."""
    from proj.tasks import add, introspect

    obs["add"] = add(2, 3)
    seen = introspect("a", b=1)
    obs["request"] = {k: seen[k] for k in ("id", "args", "kwargs", "called_directly", "is_eager")}


@scenario("send_task by name")
def send_task_by_name(obs):
    """``app.send_task("proj.tasks.add", (2, 3))`` without importing the task."""
    from proj.celery import app

    res = app.send_task("proj.tasks.add", (2, 3))
    obs["get"] = res.get(timeout=WAIT)
    obs["state"] = res.state


@scenario("shared_task")
def shared_task_calls(obs):
    """``@shared_task`` tasks bind to the app: delay, a custom name, bound ``self.name``."""
    from proj.shared import named, shout

    obs["shout"] = shout.delay("hi").get(timeout=WAIT)
    obs["named"] = named.delay(7).get(timeout=WAIT)
    obs["task_name"] = named.name


@scenario("calling a task directly")
def apply_locally(obs):
    """``add.apply((2, 3))`` runs in the caller and returns an EagerResult."""
    from proj.tasks import add, fail

    res = add.apply((2, 3))
    obs["class"] = type(res).__name__
    obs["get"], obs["state"] = res.get(), res.state
    failed = fail.apply(("local failure",))
    obs["failed_state"] = failed.state
    obs["failed_get"] = outcome(lambda: failed.get())


@scenario("task names and registry")
def task_names(obs):
    """Generated names are ``module.function``; the app's registry holds them."""
    from proj.celery import app
    from proj.tasks import add

    obs["name"] = add.name
    obs["registered"] = "proj.tasks.add" in app.tasks
    obs["registry_name"] = app.tasks["proj.tasks.add"].name


@scenario("send_task by name")
def send_task_unregistered(obs):
    """``send_task`` of a name no worker knows: what the caller sees within 1.5 s."""
    from proj.celery import app

    res = app.send_task("proj.tasks.no_such_task", (1,))
    obs["get"] = outcome(lambda: res.get(timeout=1.5))
    obs["state"] = res.state


@scenario("rate_limit")
def rate_limit(obs):
    """``rate_limit="5/s"``: six calls are spread over at least 0.8 s by the worker."""
    from proj import journal
    from proj.tasks import rate_limited

    t = token()
    results = [rate_limited.delay(t) for _ in range(6)]
    obs["all_ran"] = all(r.get(timeout=WAIT) == t for r in results)
    times = sorted(journal.read(t))
    obs["spread_at_least_0_8s"] = times[-1] - times[0] >= 0.8
    obs["info"] = {"spread_seconds": round(times[-1] - times[0], 2)}

"""Soft and hard time limits (prefork worker on the ``limits`` queue)."""

from scenarios import WAIT, outcome, scenario


@scenario("time limits")
def soft_time_limit(obs):
    """``soft_time_limit=0.5``: SoftTimeLimitExceeded is raised inside the task, which cleans up."""
    from proj.limits import soft_limited

    res = soft_limited.delay()
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state


@scenario("time limits")
def hard_time_limit(obs):
    """``time_limit=0.5``: the task is killed; get() raises TimeLimitExceeded."""
    from proj.limits import hard_limited, limit_ping

    res = hard_limited.delay()
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["worker_still_serves"] = outcome(lambda: limit_ping.delay().get(timeout=WAIT))


@scenario(
    "time limits",
    differs={
        "longer_call_limit": "Celery lets a call's time_limit replace the task's, a longer one "
        "too; pgtasks lets a call lower the limits its task or worker sets, never lift them, so "
        "a producer that may only enqueue cannot keep a worker busy on a task past the bound "
        "its code sets (see docs/migrating-from-celery.md).",
    },
)
def call_time_limit(obs):
    """A task with ``time_limit=1.5``: a call's ``time_limit=0.5`` stops it sooner; a call's
    ``time_limit=10`` on a 3 s run."""
    from proj.limits import bounded_sleep

    lowered = bounded_sleep.apply_async((5,), time_limit=0.5)
    obs["lowered"] = outcome(lambda: lowered.get(timeout=WAIT))
    lifted = bounded_sleep.apply_async((3,), time_limit=10)
    obs["longer_call_limit"] = outcome(lambda: lifted.get(timeout=WAIT))

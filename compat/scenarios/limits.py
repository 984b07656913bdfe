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

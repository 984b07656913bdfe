"""Retries: self.retry with countdown and max_retries, autoretry_for with backoff."""

from scenarios import WAIT, outcome, scenario, token, wait_state


@scenario("self.retry(countdown=)")
def retry_then_succeed(obs):
    """Two retries, then success; request.retries counts 0, 1, 2."""
    from proj import journal
    from proj.retrying import succeed_after

    t = token()
    obs["get"] = succeed_after.delay(t, 2).get(timeout=WAIT)
    obs["retries_seen"] = journal.read(t)


@scenario("max_retries and MaxRetriesExceededError")
def retry_exhausted_without_exc(obs):
    """``self.retry()`` without exc past max_retries=2: MaxRetriesExceededError, 3 runs."""
    from proj import journal
    from proj.retrying import retry_forever

    t = token()
    res = retry_forever.delay(t)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["retries_seen"] = journal.read(t)


@scenario("max_retries and MaxRetriesExceededError")
def retry_exhausted_with_exc(obs):
    """``self.retry(exc=Flaky(...))`` past max_retries: the original exception is raised."""
    from proj import journal
    from proj.retrying import retry_with_exc

    t = token()
    res = retry_with_exc.delay(t)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["retries_seen"] = journal.read(t)


@scenario("max_retries and MaxRetriesExceededError")
def retry_max_retries_argument(obs):
    """``self.retry(max_retries=1)`` overrides the task's limit."""
    from proj import journal
    from proj.retrying import retry_override_max

    t = token()
    res = retry_override_max.delay(t)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["retries_seen"] = journal.read(t)


@scenario("result states")
def retry_state(obs):
    """While a retry waits (countdown 2 s) the state is RETRY with the exception as info."""
    from proj.retrying import retry_slowly

    res = retry_slowly.delay(token())
    obs["waiting_state"] = wait_state(res, {"RETRY", "SUCCESS", "FAILURE"})
    obs["waiting_info"] = outcome(lambda: res.info)
    obs["get"] = res.get(timeout=WAIT)
    obs["final_state"] = res.state


@scenario("autoretry_for and retry_backoff")
def autoretry_exhausted(obs):
    """``autoretry_for=(KeyError,)``, max_retries=2, backoff: 3 runs, then the KeyError."""
    from proj import journal
    from proj.retrying import auto_always

    t = token()
    res = auto_always.delay(t)
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["retries_seen"] = journal.read(t)


@scenario("autoretry_for and retry_backoff")
def autoretry_then_succeed(obs):
    """``autoretry_for`` with ``retry_kwargs``: fails once, retried, succeeds."""
    from proj import journal
    from proj.retrying import auto_once

    t = token()
    obs["get"] = auto_once.delay(t).get(timeout=WAIT)
    obs["retries_seen"] = journal.read(t)

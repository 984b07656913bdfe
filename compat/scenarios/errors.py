"""Exceptions: type and message reach the caller; propagate=False; Ignore; Reject; bad input."""

from scenarios import WAIT, clean, exc, outcome, scenario, token, wait_state


@scenario("exceptions propagate to the caller")
def exception_propagates(obs):
    """A task raising ``ValueError("bad value 42")``: get() raises it; state FAILURE."""
    from proj.tasks import fail

    res = fail.delay("bad value 42")
    obs["get"] = outcome(lambda: res.get(timeout=WAIT))
    obs["state"] = res.state
    obs["result"] = clean(res.result)
    obs["failed"], obs["successful"] = res.failed(), res.successful()
    obs["traceback_names_error"] = "ValueError" in (res.traceback or "")


@scenario("exceptions propagate to the caller")
def builtin_type_error(obs):
    """A task hitting a TypeError of Python's own: type and message reach the caller."""
    from proj.tasks import type_error

    obs["get"] = outcome(lambda: type_error.delay().get(timeout=WAIT))


@scenario("exceptions propagate to the caller")
def custom_exception(obs):
    """The project's own exception class comes back as that class."""
    from proj.errors import PaymentDeclined
    from proj.tasks import decline

    res = decline.delay(12)
    try:
        res.get(timeout=WAIT)
        obs["raised"] = None
    except Exception as e:
        obs["raised"] = exc(e)
        obs["is_project_class"] = isinstance(e, PaymentDeclined)


@scenario("get(propagate=False)")
def propagate_false(obs):
    """``get(propagate=False)`` returns the exception instead of raising it."""
    from proj.tasks import fail

    res = fail.delay("quietly")
    obs["value"] = clean(res.get(timeout=WAIT, propagate=False))
    obs["state"] = res.state


@scenario("Ignore")
def ignore(obs):
    """A task raising ``Ignore``: it ran, no final state is stored."""
    from proj import journal
    from proj.tasks import ignored

    t = token()
    res = ignored.delay(t)
    obs["ran"] = journal.wait(t, 1)
    wait_state(res, {"SUCCESS", "FAILURE", "REVOKED", "IGNORED"}, timeout=1.5)
    obs["state"] = res.state
    obs["ready"] = res.ready()


@scenario("Reject")
def reject(obs):
    """A task raising ``Reject(requeue=False)``: it ran once and is not requeued."""
    from proj import journal
    from proj.tasks import rejected

    t = token()
    res = rejected.delay(t)
    journal.wait(t, 1)
    wait_state(res, {"SUCCESS", "FAILURE", "REVOKED", "REJECTED"}, timeout=1.5)
    obs["ran"] = journal.read(t)
    obs["state"] = res.state
    obs["ready"] = res.ready()


@scenario("unencodable arguments")
def unencodable_argument(obs):
    """``delay(object())`` with the json serializer: EncodeError at the call, nothing runs."""
    from proj.tasks import add

    try:
        add.delay(object(), 1)
        obs["raised"] = None
    except Exception as e:
        obs["raised"] = type(e).__name__
        obs["info"] = {"message": str(e)}

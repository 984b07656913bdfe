"""Task base-class hooks, worker signals, task logging."""

from scenarios import WAIT, outcome, scenario, token


@scenario("base= Task subclass hooks")
def hooks_on_success(obs):
    """``before_start``, ``on_success``, ``after_return`` in that order."""
    from proj import journal
    from proj.hooks import audited_ok

    t = token()
    obs["get"] = audited_ok.delay(t).get(timeout=WAIT)
    obs["hooks"] = journal.wait(t, 3, timeout=3)


@scenario("base= Task subclass hooks")
def hooks_on_failure(obs):
    """``before_start``, ``on_failure`` (with the exception), ``after_return:FAILURE``."""
    from proj import journal
    from proj.hooks import audited_fail

    t = token()
    obs["get"] = outcome(lambda: audited_fail.delay(t).get(timeout=WAIT))
    obs["hooks"] = journal.wait(t, 3, timeout=3)


@scenario("base= Task subclass hooks")
def hooks_on_retry(obs):
    """A retried task: ``on_retry`` then, on the second run, ``on_success``."""
    from proj import journal
    from proj.hooks import audited_retry

    t = token()
    obs["get"] = audited_retry.delay(t).get(timeout=WAIT)
    obs["hooks"] = journal.wait(t, 6, timeout=3)


@scenario("signals")
def signals_success(obs):
    """task_prerun, task_success, task_postrun for a task that returns."""
    from proj import journal
    from proj.signal_handlers import signalled_ok

    t = token()
    obs["get"] = signalled_ok.delay(t).get(timeout=WAIT)
    obs["signals"] = journal.wait(t, 3, timeout=3)


@scenario("signals")
def signals_failure(obs):
    """task_prerun, task_failure, task_postrun for a task that raises."""
    from proj import journal
    from proj.signal_handlers import signalled_fail

    t = token()
    obs["get"] = outcome(lambda: signalled_fail.delay(t).get(timeout=WAIT))
    obs["signals"] = journal.wait(t, 3, timeout=3)


@scenario("get_task_logger")
def task_logger(obs):
    """``get_task_logger(__name__)`` works inside a task."""
    from proj.logs import log_something

    obs["get"] = log_something.delay("hello").get(timeout=WAIT)


@scenario("signals")
def signals_publish(obs):
    """``before_task_publish`` and ``after_task_publish`` fire in the caller with the task name."""
    from celery.signals import after_task_publish, before_task_publish

    from proj.tasks import add

    seen = []

    def before(sender=None, headers=None, **extra):
        seen.append(("before_task_publish", sender, (headers or {}).get("task")))

    def after(sender=None, headers=None, **extra):
        seen.append(("after_task_publish", sender, (headers or {}).get("task")))

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    obs["get"] = add.delay(1, 1).get(timeout=WAIT)
    obs["signals"] = seen

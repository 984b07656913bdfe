"""Worker-side signal handlers, noting each signal for the task's first argument."""

from celery.signals import task_failure, task_postrun, task_prerun, task_success

from proj import journal
from proj.celery import app


def _token(args):
    return args[0] if args and isinstance(args[0], str) else None


@task_prerun.connect
def prerun(sender=None, task_id=None, task=None, args=None, kwargs=None, **extra):
    if sender.name.startswith("proj.signal_handlers.") and _token(args):
        journal.note(_token(args), "task_prerun")


@task_postrun.connect
def postrun(sender=None, task_id=None, task=None, args=None, kwargs=None, state=None, **extra):
    if sender.name.startswith("proj.signal_handlers.") and _token(args):
        journal.note(_token(args), f"task_postrun:{state}")


@task_success.connect
def success(sender=None, result=None, **extra):
    if sender.name.startswith("proj.signal_handlers."):
        journal.note(sender.request.args[0], f"task_success:{result}")


@task_failure.connect
def failure(sender=None, task_id=None, exception=None, args=None, **extra):
    if sender.name.startswith("proj.signal_handlers.") and _token(args):
        journal.note(_token(args), f"task_failure:{type(exception).__name__}")


@app.task
def signalled_ok(token):
    return "yes"


@app.task
def signalled_fail(token):
    raise LookupError("nope")

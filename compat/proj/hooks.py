"""A ``base=`` Task subclass whose hooks note what happened."""

from celery import Task

from proj import journal
from proj.celery import app


class Audited(Task):
    def before_start(self, task_id, args, kwargs):
        journal.note(args[0], "before_start")

    def on_success(self, retval, task_id, args, kwargs):
        journal.note(args[0], f"on_success:{retval}")

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        journal.note(args[0], f"on_failure:{type(exc).__name__}:{exc}")

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        journal.note(args[0], f"on_retry:{type(exc).__name__}")

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        journal.note(args[0], f"after_return:{status}")


@app.task(base=Audited)
def audited_ok(token):
    return "fine"


@app.task(base=Audited)
def audited_fail(token):
    raise RuntimeError("broken")


@app.task(base=Audited, bind=True, max_retries=1)
def audited_retry(self, token):
    if self.request.retries == 0:
        raise self.retry(countdown=0.1)
    return "retried"

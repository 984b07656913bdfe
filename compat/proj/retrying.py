"""Retries: explicit ``self.retry`` and ``autoretry_for``."""

from proj import journal
from proj.celery import app


class Flaky(Exception):
    pass


@app.task(bind=True, max_retries=3)
def succeed_after(self, token, failures):
    journal.note(token, self.request.retries)
    if self.request.retries < failures:
        raise self.retry(countdown=0.2)
    return f"ok after {self.request.retries}"


@app.task(bind=True, max_retries=2)
def retry_forever(self, token):
    journal.note(token, self.request.retries)
    raise self.retry(countdown=0.1)


@app.task(bind=True, max_retries=2)
def retry_with_exc(self, token):
    journal.note(token, self.request.retries)
    raise self.retry(exc=Flaky(f"flaky attempt {self.request.retries}"), countdown=0.1)


@app.task(bind=True)
def retry_override_max(self, token):
    journal.note(token, self.request.retries)
    raise self.retry(countdown=0.1, max_retries=1)


@app.task(bind=True, max_retries=3)
def retry_slowly(self, token):
    journal.note(token, self.request.retries)
    if self.request.retries == 0:
        raise self.retry(exc=Flaky("wait"), countdown=2)
    return "second time"


@app.task(
    bind=True,
    autoretry_for=(KeyError,),
    max_retries=2,
    retry_backoff=0.1,
    retry_backoff_max=0.5,
    retry_jitter=False,
)
def auto_always(self, token):
    journal.note(token, self.request.retries)
    return {}["missing"]


@app.task(bind=True, autoretry_for=(Flaky,), retry_kwargs={"max_retries": 3, "countdown": 0.1})
def auto_once(self, token):
    journal.note(token, self.request.retries)
    if self.request.retries == 0:
        raise Flaky("first try")
    return self.request.retries

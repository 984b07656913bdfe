"""Tasks used as canvas callbacks and errbacks."""

from proj import journal
from proj.celery import app


@app.task
def on_done(value, token):
    journal.note(token, {"callback": value})
    return value


@app.task
def on_error(request, exc, traceback, token):
    journal.note(token, {"errback": type(exc).__name__, "message": str(exc), "id": request.id})

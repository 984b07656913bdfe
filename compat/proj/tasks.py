"""Everyday tasks: arithmetic, request introspection, errors, results, serialization."""

import datetime
import decimal
import time
import uuid

from celery import current_app
from celery.exceptions import Ignore, Reject

from proj import journal
from proj.celery import app
from proj.errors import PaymentDeclined


@app.task
def ping():
    return "pong"


@app.task
def add(x, y):
    return x + y


@app.task
def mul(x, y):
    return x * y


@app.task
def tsum(numbers):
    return sum(numbers)


@app.task
def record(token, value):
    """Note ``value`` under ``token`` and return it (ordering scenarios read the journal)."""
    journal.note(token, value)
    return value


@app.task
def stamp(token):
    journal.note(token, time.time())
    return token


@app.task
def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


@app.task
def routed(token):
    return token


@app.task(bind=True)
def where(self):
    return self.request.delivery_info.get("routing_key")


@app.task(bind=True)
def introspect(self, a, b=None):
    r = self.request
    return {
        "id": r.id,
        "args": list(r.args),
        "kwargs": dict(r.kwargs),
        "retries": r.retries,
        "called_directly": r.called_directly,
        "is_eager": r.is_eager,
        "hostname_set": bool(r.hostname),
        "routing_key": (r.delivery_info or {}).get("routing_key"),
        "parent_id": r.parent_id,
        "root_id": r.root_id,
        "root_is_self": r.root_id == r.id,
        "group": r.group,
    }


@app.task
def fail(message):
    raise ValueError(message)


@app.task
def decline(amount):
    raise PaymentDeclined(f"card declined for {amount}")


@app.task
def type_error():
    return len(None)


@app.task(ignore_result=True)
def fire_and_forget(token):
    journal.note(token, "ran")
    return "not stored"


@app.task
def ignored(token):
    journal.note(token, "ran")
    raise Ignore()


@app.task
def rejected(token):
    journal.note(token, "ran")
    raise Reject("not today", requeue=False)


@app.task
def echo_types(values):
    return {
        "types": {k: type(v).__name__ for k, v in values.items()},
        "values": values,
    }


@app.task
def typed_values():
    return {
        "when": datetime.datetime(2024, 5, 17, 12, 30, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2024, 5, 17),
        "amount": decimal.Decimal("12.50"),
        "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "pair": (1, 2),
    }


@app.task
def config_value(key):
    return current_app.conf.get(key)


@app.task(bind=True)
def report_priority(self, token, label):
    journal.note(token, label)
    return label


@app.task(bind=True)
def progress(self, token):
    self.update_state(state="PROGRESS", meta={"done": 1, "total": 2})
    journal.wait(token, 1, timeout=5)
    return "finished"


@app.task(rate_limit="5/s")
def rate_limited(token):
    journal.note(token, time.time())
    return token


@app.task
def beat_tick(key):
    """Run by a beat_schedule entry: note when it ran."""
    journal.note(key, time.time())

"""Time limits (routed to the ``limits`` queue, served by a prefork worker)."""

import time

from celery.exceptions import SoftTimeLimitExceeded

from proj.celery import app


@app.task(soft_time_limit=0.5)
def soft_limited():
    try:
        time.sleep(5)
    except SoftTimeLimitExceeded:
        return "cleaned up after soft limit"
    return "finished"


@app.task(time_limit=0.5)
def hard_limited():
    time.sleep(5)
    return "finished"


@app.task(time_limit=1.5)
def bounded_sleep(seconds):
    time.sleep(seconds)
    return "finished"


@app.task
def limit_ping():
    return "pong"

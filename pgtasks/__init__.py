"""pgtasks: Celery's API with PostgreSQL's guarantees, and no broker.

>>> from pgtasks import Celery
>>> app = Celery("proj", broker="postgresql://localhost/app")
"""

from pgtasks.app import Celery, current_app, shared_task
from pgtasks.canvas import Signature, chain, chord, group, signature
from pgtasks.exceptions import (
    Ignore,
    MaxRetriesExceededError,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
)
from pgtasks.result import AsyncResult, GroupResult
from pgtasks.schedules import crontab, schedule
from pgtasks.task import Task

__version__ = "0.1.0"

__all__ = [
    "AsyncResult",
    "Celery",
    "GroupResult",
    "Ignore",
    "MaxRetriesExceededError",
    "Reject",
    "Retry",
    "Signature",
    "SoftTimeLimitExceeded",
    "Task",
    "TimeLimitExceeded",
    "__version__",
    "chain",
    "chord",
    "crontab",
    "current_app",
    "group",
    "schedule",
    "shared_task",
    "signature",
]

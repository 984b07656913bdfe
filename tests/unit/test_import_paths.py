"""The import paths Celery users have work with ``celery`` renamed to ``pgtasks``."""

from __future__ import annotations

import importlib

import pytest

CELERY_NAMES = [
    ("pgtasks", ["Celery", "Task", "shared_task", "current_app", "AsyncResult"]),
    ("pgtasks.signals", ["Signal", "before_task_publish", "after_task_publish", "task_prerun"]),
    ("pgtasks.signals", ["task_postrun", "task_success", "task_failure", "task_retry"]),
    ("pgtasks.signals", ["task_revoked", "task_unknown", "task_rejected", "task_received"]),
    ("pgtasks.signals", ["worker_init", "worker_ready", "worker_shutdown", "worker_process_init"]),
    ("pgtasks.signals", ["worker_shutting_down", "worker_process_shutdown", "setup_logging"]),
    ("pgtasks.signals", ["after_setup_logger", "after_setup_task_logger", "celeryd_init"]),
    ("pgtasks.signals", ["celeryd_after_setup", "beat_init", "import_modules"]),
    ("pgtasks.utils", ["uuid", "gen_unique_id"]),
    ("pgtasks.utils.log", ["get_task_logger", "get_logger", "task_logger", "base_logger"]),
    ("pgtasks.result", ["AsyncResult", "EagerResult"]),
    ("pgtasks.schedules", ["crontab", "schedule", "maybe_schedule"]),
    ("pgtasks", ["crontab", "schedule"]),
    (
        "pgtasks.states",
        ["PENDING", "RECEIVED", "STARTED", "SUCCESS", "FAILURE", "REVOKED", "REJECTED", "RETRY"],
    ),
    (
        "pgtasks.states",
        ["IGNORED", "READY_STATES", "UNREADY_STATES", "EXCEPTION_STATES", "PROPAGATE_STATES"],
    ),
    ("pgtasks.states", ["ALL_STATES", "precedence", "state"]),
    (
        "pgtasks.exceptions",
        ["CeleryError", "TaskError", "ImproperlyConfigured", "NotRegistered", "QueueNotFound"],
    ),
    (
        "pgtasks.exceptions",
        ["InvalidTaskError", "ChordError", "AlreadyRegistered", "TimeoutError", "Retry"],
    ),
    (
        "pgtasks.exceptions",
        ["MaxRetriesExceededError", "TaskRevokedError", "WorkerLostError", "Ignore", "Reject"],
    ),
    (
        "pgtasks.exceptions",
        ["SoftTimeLimitExceeded", "TimeLimitExceeded", "WorkerShutdown", "WorkerTerminate"],
    ),
    (
        "pgtasks.exceptions",
        ["SystemTerminate", "RetryTaskError", "BackendError", "SecurityError", "CeleryWarning"],
    ),
    ("pgtasks.exceptions", ["EncodeError", "DecodeError", "OperationalError", "reraise"]),
]


@pytest.mark.parametrize(("module", "names"), CELERY_NAMES)
def test_celery_names_import(module: str, names: list[str]) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_exception_hierarchy_matches_celery() -> None:
    from kombu import exceptions as kombu_exceptions

    from pgtasks import exceptions as exc

    assert exc.CeleryError is exc.PgTasksError
    for cls in (
        exc.NotRegistered,
        exc.TimeoutError,
        exc.MaxRetriesExceededError,
        exc.TaskRevokedError,
        exc.QueueNotFound,
        exc.InvalidTaskError,
        exc.ChordError,
    ):
        assert issubclass(cls, exc.TaskError), cls
    assert issubclass(exc.NotRegistered, KeyError)
    assert issubclass(exc.QueueNotFound, KeyError)
    assert issubclass(exc.WorkerShutdown, SystemExit)
    assert exc.RetryTaskError is exc.Retry
    assert exc.EncodeError is kombu_exceptions.EncodeError
    assert exc.DecodeError is kombu_exceptions.DecodeError


def test_state_precedence_orders_like_celery() -> None:
    from pgtasks import states

    assert states.state(states.SUCCESS) > states.state(states.PENDING)
    assert states.state(states.PENDING) < states.state(states.STARTED)
    assert states.state("CUSTOM") > states.state(states.REVOKED)
    assert states.precedence(states.SUCCESS) == 0


def test_uuid_is_a_fresh_string_id() -> None:
    from pgtasks.utils import uuid

    first, second = uuid(), uuid()
    assert isinstance(first, str) and len(first) == 36 and first != second


def test_uuid_is_a_canonical_version_4_uuid() -> None:
    import uuid as stdlib_uuid

    from pgtasks.utils import uuid

    ids = [uuid() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = stdlib_uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == stdlib_uuid.RFC_4122
    # Every variant digit (8, 9, a, b) turns up: the two variant bits are fixed, the rest random.
    assert {text[19] for text in ids} == set("89ab")

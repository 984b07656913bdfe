"""Settings: pydantic-settings with the ``PGTASKS_`` prefix, and the one table that maps Celery's
setting names to ours.

Precedence, highest first: ``PGTASKS_*`` environment variables, then values given in code
(``Celery(broker=...)``, ``app.conf.update(...)``, ``config_from_object``), then the defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pgtasks.exceptions import ImproperlyConfigured

#: Celery setting name -> pgtasks field name. Celery's names are accepted at the boundary only.
CELERY_NAMES: dict[str, str] = {
    "broker_url": "database_url",
    "broker": "database_url",
    "BROKER_URL": "database_url",
    "task_default_queue": "default_queue",
    "task_default_priority": "default_priority",
    "task_serializer": "task_serializer",
    "result_serializer": "result_serializer",
    "accept_content": "accept_content",
    "result_accept_content": "result_accept_content",
    "task_ignore_result": "ignore_result",
    "result_expires": "result_expires",
    "worker_concurrency": "concurrency",
    "worker_prefetch_multiplier": "prefetch_multiplier",
    "task_default_retry_delay": "default_retry_delay",
    "task_always_eager": "always_eager",
    "task_eager_propagates": "eager_propagates",
    "task_time_limit": "task_time_limit",
    "task_soft_time_limit": "task_soft_time_limit",
    "worker_max_tasks_per_child": "max_tasks_per_child",
    "worker_max_memory_per_child": "max_memory_per_child",
    "task_default_rate_limit": "default_rate_limit",
    "task_acks_late": "acks_late",
    "task_reject_on_worker_lost": "reject_on_worker_lost",
    "task_track_started": "track_started",
    "beat_max_loop_interval": "beat_max_interval",
    "worker_disable_rate_limits": "disable_rate_limits",
}


class Settings(BaseSettings):
    """Every setting pgtasks reads, with its default."""

    # enable_decoding=False: list settings from the environment are comma-separated (or a JSON
    # list), parsed by the validators below rather than required to be JSON.
    model_config = SettingsConfigDict(
        env_prefix="PGTASKS_", extra="ignore", validate_assignment=True, enable_decoding=False
    )

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL or libpq key=value string. None: an embedded PostgreSQL.",
    )
    schema_name: str = Field(default="pgtasks", description="Schema holding every pgtasks table.")
    task_source: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:-]{1,63}$",
        description="Source recorded on the rows this app enqueues, which quotas count by "
        "(None: the database role).",
    )
    default_queue: str = "celery"
    default_priority: int = 0
    task_serializer: str = "json"
    result_serializer: str = "json"
    accept_content: list[str] = Field(default_factory=lambda: ["json"])
    result_accept_content: list[str] | None = Field(
        default=None, description="Content types results may have (None: accept_content)."
    )
    ignore_result: bool = False
    result_expires: float = Field(default=86400.0, description="Seconds results are kept.")
    finished_task_retention: float = Field(
        default=3600.0,
        description="Seconds finished rows stay in the task table (0: a success deletes its row "
        "as it completes).",
    )
    default_retry_delay: float = 180.0
    concurrency: int | None = None
    prefetch_multiplier: int = Field(
        default=1, ge=1, description="Claim up to this many tasks per slot (1: adaptive)."
    )
    prefetch_window: float = Field(
        default=0.05,
        ge=0,
        description=(
            "Seconds of work a worker may claim beyond its free slots, at most 250 rows a slot"
            " or 1,000 a worker; up to four times this while claims come back full (0: none)."
        ),
    )
    lease_seconds: float = Field(default=30.0, gt=0.5)
    poll_interval: float = Field(default=0.5, gt=0)
    listen_notify: bool = Field(default=True, description="False: poll only (PgBouncer).")
    handoff: bool = Field(
        default=True,
        description="Idle workers take tasks straight from .delay() with no claim (needs "
        "listen_notify).",
    )
    prepared_statements: bool = Field(default=True, description="False for PgBouncer.")
    max_lost_attempts: int = Field(
        default=3, ge=1, description="Workers a task may lose before it is dead-lettered."
    )
    unknown_task_delay: float = Field(
        default=10.0,
        ge=0,
        description="Seconds before a task this worker has not registered, but another live "
        "worker has, is offered again.",
    )
    shutdown_grace: float = Field(default=30.0, ge=0)
    task_time_limit: float | None = Field(
        default=None, gt=0, description="Seconds before a task's process is killed (prefork)."
    )
    task_soft_time_limit: float | None = Field(
        default=None, gt=0, description="Seconds before SoftTimeLimitExceeded is raised in a task."
    )
    default_rate_limit: str | float | None = Field(
        default=None,
        description="Rate limit of tasks that set none ('10/s', '100/m', '2/h'); held across "
        "all workers.",
    )
    disable_rate_limits: bool = Field(
        default=False, description="Run rate-limited tasks without waiting for their slots."
    )
    queue_concurrency_limits: dict[str, int] = Field(
        default_factory=dict,
        description="Queue name -> the most tasks of that queue running at once, across all "
        "workers (applied when a task is sent; a JSON object in the environment).",
    )
    timezone: str | None = Field(
        default=None,
        description="Time zone of crontab schedules and of naive eta/expires datetimes "
        "(an IANA name such as 'Europe/Berlin'). None: UTC (or the local zone with "
        "enable_utc off).",
    )
    enable_utc: bool = Field(
        default=True, description="With no timezone set: UTC when on, the local zone when off."
    )
    acks_late: bool = Field(
        default=False,
        description="Accepted for Celery compatibility: every task is held under a lease and "
        "runs again if its worker dies, as with acks_late.",
    )
    reject_on_worker_lost: bool | None = Field(
        default=None,
        description="Accepted for Celery compatibility: a task whose worker dies runs again, "
        "up to max_lost_attempts, then is dead-lettered.",
    )
    track_started: bool = Field(
        default=False,
        description="Accepted for Celery compatibility: a running task always reads STARTED.",
    )
    beat_max_interval: float = Field(
        default=5.0, gt=0, description="Longest sleep of a scheduler between two passes."
    )
    beat_grace: float = Field(
        default=60.0,
        ge=0,
        description="Seconds late a tick may be and still run under the 'skip' missed-tick policy.",
    )
    beat_missed_ticks: Literal["once", "skip", "all"] = Field(
        default="once",
        description="What a periodic entry does with ticks missed while no scheduler ran: "
        "'once' (run the latest once), 'skip', or 'all' (catch up).",
    )
    max_tasks_per_child: int | None = Field(
        default=None, ge=1, description="Tasks a prefork child runs before it is replaced."
    )
    max_memory_per_child: int | None = Field(
        default=None,
        ge=0,
        description="Resident memory in KiB a prefork child may reach: past it, the child is "
        "replaced once its task's outcome is delivered (0 or None: no limit).",
    )
    max_payload_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    always_eager: bool = False
    eager_propagates: bool = False
    embedded_dir: str | None = Field(
        default=None, description="Data folder of the embedded PostgreSQL."
    )
    pool_min_size: int = 1
    pool_max_size: int = Field(
        default=10,
        description="Connections of a process's pool. Above one, single enqueues keep the "
        "connection they used last out of the pool between calls (handed back every 30 s).",
    )
    connect_timeout: float = Field(
        default=10.0, gt=0, description="Seconds to wait for a database connection."
    )

    @field_validator("accept_content", "result_accept_content", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().startswith("["):
                return json.loads(value)
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: Any) -> Any:
        if value in (None, ""):
            return None
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}: use an IANA name such as 'Europe/Berlin'"
            ) from None
        return value

    @field_validator("queue_concurrency_limits", mode="before")
    @classmethod
    def _queue_limits(cls, value: Any) -> Any:
        from pgtasks.concurrency import check_queue_limits

        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError(
                    'queue_concurrency_limits must be a JSON object such as {"reports": 2}'
                ) from None
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(
                f"queue_concurrency_limits must map queue names to limits, not {value!r}"
            )
        try:
            return check_queue_limits(value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("default_rate_limit")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        from pgtasks.ratelimits import rate

        rate(value)
        return value


def _env_names() -> set[str]:
    import os

    return {field for field in Settings.model_fields if f"PGTASKS_{field.upper()}" in os.environ}


def normalise(values: Mapping[str, Any]) -> dict[str, Any]:
    """Map Celery names to ours; names we do not know are kept aside, as Celery keeps them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = CELERY_NAMES.get(key, CELERY_NAMES.get(key.lower(), key.lower()))
        out[name] = value
    return out


def build(values: Mapping[str, Any]) -> Settings:
    """Settings from code-given values, with ``PGTASKS_*`` environment variables winning."""
    known = {k: v for k, v in normalise(values).items() if k in Settings.model_fields}
    for name in _env_names():
        known.pop(name, None)
    try:
        return Settings(**known)
    except ValidationError as exc:
        raise ImproperlyConfigured(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid pgtasks setting: {problems}"


class Conf(dict[str, Any]):
    """``app.conf``: a dict of settings under their Celery (or pgtasks) names.

    Unknown names are stored, as Celery does; known names are validated when the app reads them.
    Attribute access works too (``app.conf.task_default_queue``).
    """

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def update_from(self, items: Iterable[tuple[str, Any]]) -> None:
        for key, value in items:
            self[key] = value

"""Retry policy: pure functions with Celery's defaults and formula."""

from __future__ import annotations

import random


def exponential_backoff(
    retries: int,
    factor: float = 1.0,
    maximum: float = 600.0,
    full_jitter: bool = True,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``retries + 1``.

    ``min(factor * 2**retries, maximum)``, then with full jitter a uniform whole number of seconds
    in ``[0, that]`` — Celery's ``get_exponential_backoff_interval``. Never negative.
    """
    if retries < 0:
        raise ValueError("retries must be >= 0")
    # Cap the exponent first so huge retry counts cannot overflow.
    exp = min(retries, 64)
    countdown = min(maximum, factor * (2.0**exp))
    countdown = max(0.0, countdown)
    if full_jitter:
        countdown = float((rng or random).randrange(int(countdown) + 1))
    return max(0.0, countdown)


def retries_left(retries: int, max_retries: int | None) -> bool:
    """Whether another retry is allowed (``max_retries=None`` means no limit)."""
    return max_retries is None or retries < max_retries

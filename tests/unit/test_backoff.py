"""The retry backoff: Celery's formula, min(factor * 2**n, max), with full jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks.retry import exponential_backoff, retries_left

# Up to 2**64 the exponential is exact; past that it is pinned at the cap (tested below).
retries_st = st.integers(min_value=0, max_value=64)
factor_st = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
maximum_st = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(deadline=None)
@given(retries=retries_st, factor=factor_st, maximum=maximum_st, seed=st.integers())
def test_jittered_backoff_stays_between_zero_and_the_cap(
    retries: int, factor: float, maximum: float, seed: int
) -> None:
    delay = exponential_backoff(retries, factor, maximum, True, random.Random(seed))
    assert 0 <= delay <= min(maximum, factor * 2**retries)
    assert delay == int(delay), "full jitter draws a whole number of seconds"


@settings(deadline=None)
@given(retries=retries_st, factor=factor_st, maximum=maximum_st)
def test_unjittered_backoff_is_exactly_the_capped_exponential(
    retries: int, factor: float, maximum: float
) -> None:
    delay = exponential_backoff(retries, factor, maximum, full_jitter=False)
    assert delay == min(maximum, factor * 2**retries)


@settings(deadline=None)
@given(retries=st.integers(min_value=0, max_value=200), factor=factor_st)
def test_unjittered_backoff_never_shrinks_as_retries_grow(retries: int, factor: float) -> None:
    first = exponential_backoff(retries, factor, 600.0, full_jitter=False)
    second = exponential_backoff(retries + 1, factor, 600.0, full_jitter=False)
    assert first <= second <= 600.0


@settings(deadline=None)
@given(retries=st.integers(min_value=65, max_value=10**9), seed=st.integers())
def test_huge_retry_counts_do_not_overflow(retries: int, seed: int) -> None:
    assert exponential_backoff(retries, 1.0, 600.0, full_jitter=False) == 600.0
    delay = exponential_backoff(retries, 1.0, 600.0, True, random.Random(seed))
    assert 0 <= delay <= 600.0


@settings(deadline=None)
@given(factor=st.floats(max_value=-1e-9, min_value=-1e9), retries=retries_st)
def test_negative_factor_never_gives_a_negative_delay(factor: float, retries: int) -> None:
    assert exponential_backoff(retries, factor, 600.0, full_jitter=False) == 0.0
    assert exponential_backoff(retries, factor, 600.0, full_jitter=True) == 0.0


def test_celery_defaults_for_the_first_retries() -> None:
    assert [exponential_backoff(n, full_jitter=False) for n in range(12)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        32.0,
        64.0,
        128.0,
        256.0,
        512.0,
        600.0,
        600.0,
    ]


def test_full_jitter_covers_the_whole_range() -> None:
    rng = random.Random(1234)
    draws = {exponential_backoff(2, 1.0, 600.0, True, rng) for _ in range(500)}
    assert draws == {0.0, 1.0, 2.0, 3.0, 4.0}


def test_same_seed_gives_the_same_delays() -> None:
    first = [exponential_backoff(n, 1.0, 600.0, True, random.Random(7)) for n in range(20)]
    second = [exponential_backoff(n, 1.0, 600.0, True, random.Random(7)) for n in range(20)]
    assert first == second


def test_negative_retries_are_rejected() -> None:
    with pytest.raises(ValueError, match="retries must be >= 0"):
        exponential_backoff(-1)


@settings(deadline=None)
@given(retries=st.integers(min_value=0, max_value=1000))
def test_no_retry_limit_always_allows_another(retries: int) -> None:
    assert retries_left(retries, None)


@settings(deadline=None)
@given(
    retries=st.integers(min_value=0, max_value=1000),
    limit=st.integers(min_value=0, max_value=1000),
)
def test_retry_limit_is_exclusive(retries: int, limit: int) -> None:
    assert retries_left(retries, limit) is (retries < limit)

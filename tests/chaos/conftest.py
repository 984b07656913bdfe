"""Fixtures shared by the chaos runs."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_dead_letters_for_lost_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many faults can cost one task several workers; the run checks that it still completes
    # (the dead-lettering of a task that keeps killing its worker is tested on its own).
    monkeypatch.setenv("PGTASKS_MAX_LOST_ATTEMPTS", "1000")

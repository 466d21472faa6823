"""malloc_tuning: glibc accepts the thresholds (this project's machines run glibc)."""

from __future__ import annotations

import platform

import pytest

from broker.malloc_tuning import tune_malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds() -> None:
    assert tune_malloc() is True
    # Idempotent: a second call (e.g. an embedded broker in a tuned process) is accepted too.
    assert tune_malloc() is True

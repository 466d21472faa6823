"""Session-wide test configuration.

Tests that need external services find them through environment variables that `make test`
sets after starting them (a throwaway PostgreSQL cluster) or through binaries it installs (etcd).
Run by hand without them, those tests are skipped with a reason naming the make target.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from broker import logging as gazette_logging

gazette_logging.configure("console", os.environ.get("GAZETTE_TEST_LOG_LEVEL", "warning"))

settings.register_profile(
    "default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def pg_url() -> str:
    """SQLAlchemy URL of the throwaway PostgreSQL cluster started by `make test`."""
    url = os.environ.get("GAZETTE_TEST_PG_URL")
    if not url:
        pytest.skip("PostgreSQL not provisioned: run through `make test` (or `make pg-start`)")
    return url

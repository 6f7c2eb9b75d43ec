"""Fixtures of the high-level tests: one SparkSession for the whole test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from highlevel.session import get_session

    # the session is process-wide and reused by every test (start-up costs seconds)
    return get_session()

"""Fixtures of the Python SDK's tests.

The cluster tests need a running Shale cluster: its endpoints in
SHALE_ENDPOINTS (comma-separated). internal/proctest's TestPythonSDK starts a
3-process cluster from the built binaries (initial splits g, n, t) and runs
these tests against it; by hand, against `make run`:

    SHALE_ENDPOINTS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 \\
        PYTHONPATH=clients/python /usr/bin/python3 -m pytest -q clients/python/tests

The tests delete every key of the cluster they run against.
"""

from __future__ import annotations

import os
from typing import Iterator, List

import pytest

import shale
from tests.helpers import wire  # noqa: F401  (the fixture)


@pytest.fixture(scope="session")
def endpoints() -> List[str]:
    """The cluster's endpoints, from SHALE_ENDPOINTS."""
    eps = os.environ.get("SHALE_ENDPOINTS", "")
    if not eps:
        pytest.skip("SHALE_ENDPOINTS is not set: no cluster to test against")
    return eps.split(",")


@pytest.fixture
def client(endpoints: List[str]) -> Iterator[shale.Client]:
    """A client on an empty cluster: every key is deleted first."""
    with shale.Client(endpoints) as c:
        c.delete_range(None, None)
        assert list(c.scan()) == []
        yield c

"""Fixtures of the TLS and authentication tests (TestPythonSDKTLSAuth): a
cluster with TLS for clients and authentication enabled, users root (role
root) and alice (read-write on the prefix alice/). The environment holds
SHALE_ENDPOINTS, SHALE_TLS_CA (the CA of the nodes' certificates),
SHALE_TLS_OTHER_CA (a CA that signed none of them), SHALE_ROOT_PASSWORD and
SHALE_ALICE_PASSWORD."""

from __future__ import annotations

import os
from typing import Dict, Iterator, List

import pytest

import shale
from tests.helpers import wire  # noqa: F401  (the fixture)


@pytest.fixture(scope="session")
def env() -> Dict[str, str]:
    """The cluster's settings from the environment."""
    names = ("SHALE_ENDPOINTS", "SHALE_TLS_CA", "SHALE_TLS_OTHER_CA", "SHALE_ROOT_PASSWORD", "SHALE_ALICE_PASSWORD")
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not set: no TLS cluster with authentication to test against")
    return {n: os.environ[n] for n in names}


@pytest.fixture(scope="session")
def endpoints(env: Dict[str, str]) -> List[str]:
    """The cluster's endpoints."""
    return env["SHALE_ENDPOINTS"].split(",")


@pytest.fixture
def tls(env: Dict[str, str]) -> shale.TLSConfig:
    """TLS with the nodes' CA."""
    return shale.TLSConfig(ca_file=env["SHALE_TLS_CA"])


@pytest.fixture
def root(endpoints: List[str], tls: shale.TLSConfig, env: Dict[str, str]) -> Iterator[shale.Client]:
    """A client authenticated as root, on a cluster without keys."""
    with shale.Client(endpoints, tls=tls, user="root", password=env["SHALE_ROOT_PASSWORD"]) as c:
        c.delete_range(None, None)
        yield c

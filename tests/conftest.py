"""Shared pytest fixtures."""

from __future__ import annotations

import itertools

import pytest

from tests.standins.kfp_api import KfpStandIn


@pytest.fixture
def kfp_api():
    """A running KFP v2beta1 API stand-in; point ``kfp.Client(host=kfp_api.url)`` at it.

    Its clock advances one second per reading, so every object gets a distinct ``created_at``
    (KFP stores whole seconds) and "newest version" is deterministic.
    """
    ticks = itertools.count(1_767_225_600)  # 2026-01-01T00:00:00Z
    with KfpStandIn(clock=lambda: next(ticks)) as api:
        yield api

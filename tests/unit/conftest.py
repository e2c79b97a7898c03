"""Fixtures of the controller unit tests: one region's operators over the fakes of every port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from regionfakes import Plane


@pytest.fixture
async def plane() -> AsyncIterator[Plane]:
    plane = Plane()
    try:
        yield plane
    finally:
        await plane.close()

"""Fixtures of the protocol tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.protocol.columnar_support import KERNELS, use_kernel


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test on the C columnar kernel, then on its pure-Python twin."""
    with use_kernel(request.param):
        yield request.param

"""A test module whose tests share one `toolbus serve` imports these three fixtures, which
override conftest's (see `module_client` there): `from tests.one_server import anyio_backend,
client, nvim_address`."""

from __future__ import annotations

import pytest
from mcp import Client


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """The module's tests run in one event loop, the one its server's client lives in."""
    return "asyncio"


@pytest.fixture
def nvim_address(module_nvim_address: str) -> str:
    return module_nvim_address


@pytest.fixture
def client(module_client: Client) -> Client:
    return module_client

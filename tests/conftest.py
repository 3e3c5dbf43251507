"""Fixtures only; helpers live in ``tests/helpers.py``.  Tests under ``tests/e2e`` are ``slow``."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter.proxy.app import create_app
from exporter.proxy.wire.stamped import SO_TIMESTAMPNS, read_stamped

from .helpers import LiveStack, Upstream, make_config, require_prometheus, run_live_stack

E2E = Path(__file__).parent / "e2e"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m "not slow"`` (the fast loop) deselects every test under ``tests/e2e``: their modules are
    not even imported then."""
    if config.getoption("markexpr", "") == "not slow" and (collection_path == E2E or E2E in collection_path.parents):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def kernel_receive_stamps() -> Iterator[None]:
    """Linux stamps what it receives only while some socket asks it to, and starts doing so a
    moment after the first one asks (deferred work): a packet that comes in that moment is read
    without a stamp, and a test of a proxy whose sockets are the process's first to ask would see
    an unstamped read now and then.  One socket asks for the whole session, which starts once a
    read of it came stamped (a few milliseconds at most)."""
    if SO_TIMESTAMPNS is None:
        yield
        return
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # what it accepts inherits it
        with socket.create_connection(listener.getsockname()) as out, listener.accept()[0] as into:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                out.sendall(b"x")
                if read_stamped(into)[1] is not None:
                    break
                time.sleep(0.005)
            else:
                raise RuntimeError("the kernel gave no receive stamp in 10 s")
            yield


@pytest.fixture
async def upstream(aiohttp_server: Any) -> tuple[Upstream, TestServer]:
    up = Upstream()
    server = await aiohttp_server(up.app())
    return up, server


@pytest.fixture
def proxy_factory(aiohttp_client: Any, tmp_path: Path) -> Callable[..., Awaitable[TestClient]]:
    async def make(port: int, **extra: Any) -> TestClient:
        app = create_app(make_config(tmp_path, port, **extra))
        return await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
    return make


@pytest.fixture(scope="session")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """Simulated engines, the real proxy (4 simulated GPUs) and a real Prometheus with the
    repo's prometheus.yml and rules, fed by the load driver through both engines in turn."""
    require_prometheus()
    with run_live_stack(tmp_path_factory.mktemp("live")) as stack:
        yield stack

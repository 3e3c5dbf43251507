"""Tests under ``tests/unit`` start no process: each phase of a test not marked ``slow`` runs
under the guard of ``tests/process_guard.py``."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.process_guard import guarded_phase


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from guarded_phase(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from guarded_phase(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from guarded_phase(item, "tear-down"))

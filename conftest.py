"""Project-wide pytest options: slow tests run only with --runslow; --bounds-check compiles every model the
op-test helpers (tests/conftest.py `check`, `check_op`, ...) build as a bounds-checked debug build, and skips the
tests marked `same_under_bounds_check` (they build their models themselves — the cross-ISA runs under qemu, with
their own bounds-checked variants where there is one —, so that run would repeat them unchanged)."""
from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")
    parser.addoption("--bounds-check", action="store_true", default=False,
                     help="compile the op-test helpers' models with bounds_check=True (same as KILN_BOUNDS_CHECK=1)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--bounds-check"):
        os.environ["KILN_BOUNDS_CHECK"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--bounds-check"):
        same = pytest.mark.skip(reason="builds its models itself: the run without --bounds-check runs it unchanged")
        for item in items:
            if "same_under_bounds_check" in item.keywords:
                item.add_marker(same)
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

"""Fixtures of the fault suite: a rig per test, torn down (agents, receiver, namespaces, nft
table, iptables chain) whatever the outcome, with the agents' logs printed on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .rig import FIGURES, Rig, require_tools, required

pytestmark = pytest.mark.faults


@pytest.fixture
def tools() -> None:
    """Fails under CI=1, else skips, when the machine cannot run the fault suite."""
    why = require_tools()
    if why is not None:
        if required():
            pytest.fail(f"{why} (CI=1: the fault suite must run)")
        pytest.skip(why)


@pytest.fixture
def rig(tools: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    made = Rig(tmp_path)
    try:
        made.start()
        yield made
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is None or rep.failed:
            print(made.logs())
        made.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures each fault test measured (term churn, counts), whatever the outcome."""
    if FIGURES:
        terminalreporter.section("fault suite figures")
        for line in FIGURES:
            terminalreporter.write_line(line)

"""Fixtures of the fault suite: a rig per test, torn down (agents, receiver, namespaces, nft
table, iptables chain) whatever the outcome, with the agents' logs printed when a test of the module failed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.conftest import make_cluster, sink  # noqa: F401 - shared with the cluster tests

from .rig import FIGURES, Rig, require_tools, required

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def tools() -> None:
    """Fails under CI=1, else skips, when the machine cannot run the fault suite."""
    why = require_tools()
    if why is not None:
        if required():
            pytest.fail(f"{why} (CI=1: the fault suite must run)")
        pytest.skip(why)


@pytest.fixture(scope="module")
def rig(tools: None, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """One cluster per module (starting one costs ~10 s of the suite's budget); each test
    waits for it to deliver again before its own fault and judges only its own window."""
    failed = request.session.testsfailed
    made = Rig(tmp_path_factory.mktemp("faults"))
    try:
        made.start()
        yield made
    finally:
        if request.session.testsfailed > failed:
            print(made.logs())
        made.close()


@pytest.fixture(autouse=True)
def recovered(request: pytest.FixtureRequest) -> None:
    """Before each test that uses the rig: the cluster whole and delivering, no fault on record."""
    if "rig" in request.fixturenames:
        made: Rig = request.getfixturevalue("rig")
        made.net.calm()
        made.faults.clear()
        made.wait_recovered()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures each fault test measured (term churn, counts), whatever the outcome."""
    if FIGURES:
        terminalreporter.section("fault suite figures")
        for line in FIGURES:
            terminalreporter.write_line(line)

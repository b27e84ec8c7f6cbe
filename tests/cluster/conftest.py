from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.required import missing_tool

from .harness import REPORT, Cluster, Sink, libfaketime

pytestmark = pytest.mark.cluster


@pytest.fixture
def make_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(size: int = 3, **kw: Any) -> Cluster:
        c = Cluster.create(tmp_path / f"c{len(made)}", size, **kw)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for c in made:
            print(c.dump_logs())


@pytest.fixture(scope="session")
def faketime_lib() -> Path:
    """libfaketime's preload library, for the tests that skew an agent's clock."""
    lib = libfaketime()
    if lib is None:
        missing_tool("libfaketime is not installed (Debian package faketime: apt-get install faketime)")
    return lib


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Figures the tests asked to have quoted (e.g. the clock-skew cases), whatever the outcome
    and without -s."""
    if REPORT:
        terminalreporter.section("cluster figures")
        for line in REPORT:
            terminalreporter.write_line(line)

"""The soak of ``python -m tests.faults``, short (24 s of faults each), with three fixed seeds on one cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from .rig import FIGURES, Rig
from .soak import Soak

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_soak(seed: int, rig: Rig, tmp_path: Path) -> None:
    lines: list[str] = []
    soak = Soak(seed, 0.4, tmp_path, say=lines.append)
    verdict = soak.run(rig)
    FIGURES.append(f"faults: soak seed {seed}: {lines[-1] if lines else ''}; {verdict.line()}")
    assert sum(soak.done.values()) >= 2, f"seed {seed} drew too few faults: {lines}"
    assert verdict.ok, "\n".join([*lines, verdict.report()])

"""The cluster's clock with real agent processes: every member's offset to the leader in
/v1/cluster, with one agent's wall clock shifted by libfaketime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, wait_for

pytestmark = pytest.mark.cluster

LIBFAKETIME = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
                                Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
                                Path("/usr/lib/faketime/libfaketime.so.1")) if p.exists()), None)


@pytest.mark.parametrize("skew", [0.0, pytest.param(3.0, marks=pytest.mark.skipif(
    LIBFAKETIME is None, reason="libfaketime is not installed (Debian package faketime)"))], ids=["same", "n2+3s"])
def test_every_node_reports_every_members_offset_to_the_leader(tmp_path: Path, skew: float) -> None:
    c = Cluster.create(tmp_path)
    if skew:
        c.nodes[1].env.update({"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"+{skew:g}s"})
    skews = {"n1": 0.0, "n2": skew, "n3": 0.0}
    c.start()
    try:
        c.wait_registered(60)

        def views() -> list[dict[str, Any]] | None:
            bodies = [n.get("/v1/cluster") for n in c.nodes]
            leaders = {(b["leader"] or {}).get("node_id") for b in bodies}
            known = all(m["clock_offset_ms"] is not None for b in bodies for m in b["members"])
            return bodies if known and len(leaders) == 1 and None not in leaders else None

        bodies = wait_for("every node to know every member's offset to one leader", views, 30)
        for body in bodies:
            lead = body["leader"]["node_id"]
            for m in body["members"]:
                truth_ms = (skews[m["node_id"]] - skews[lead]) * 1000
                # rounded to the microsecond in the answer, hence the 0.002 ms
                assert abs(m["clock_offset_ms"] - truth_ms) <= m["clock_error_ms"] + 0.002, (body["node_id"], m)
                assert m["clock_error_ms"] < 100, (body["node_id"], m)
    finally:
        c.stop()

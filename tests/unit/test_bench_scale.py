"""bench.scale's reading of a restart's samples: what each agent did until the first write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bench.scale as scale


def _sample(ts: float, tid: int, frames: list[str], open_: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """py-spy's chrometrace events taking thread ``tid``'s stack from ``open_`` to ``frames`` at ``ts`` (us)."""
    keep = 0
    while keep < min(len(frames), len(open_)) and frames[keep] == open_[keep]:
        keep += 1
    events = [{"ph": "E", "name": f, "ts": ts, "tid": tid, "args": {}} for f in reversed(open_[keep:])]
    events += [{"ph": "B", "name": f, "ts": ts, "tid": tid, "args": {}} for f in frames[keep:]]
    return events, frames


def test_a_restart_is_read_as_spans_of_restore_and_apply_until_the_first_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale, "RESULTS", tmp_path)
    raft = ["_bootstrap", "RaftNode._own"]
    tick = ["_bootstrap", "SyncObj._onTick"]
    timeline = [  # (seconds from the start, thread, its stack as sampled)
        (0.0, 1, ["<module>", "_find_and_load"]),
        (0.5, 2, [*raft, "State.restore", "RunTable.load_values"]),
        (0.5, 1, ["<module>", "Event.wait"]),
        (1.0, 2, [*raft, "State.restore", "_unpack_sections"]),  # the same frame, sampled again
        (1.5, 2, [*raft, "quiet_restore"]),
        (1.51, 2, [*raft, "State.restore", "RunTable.check"]),  # left and back within two samples: one span
        (2.5, 2, [*tick, "SyncObj.__applyLogEntries", "State.apply"]),
        (4.0, 2, [*tick, "poll"]),
        (4.1, 2, [*tick, "SyncObj.__applyLogEntries", "State.apply"]),  # a live entry: 20 ms, too short
        (4.12, 2, [*tick, "poll"]),
        (5.0, 2, [*tick, "SyncObj.__applyLogEntries", "State.apply"]),  # after the first write
        (5.5, 2, [*tick, "poll"]),
    ]
    events: list[dict[str, Any]] = []
    held: dict[int, list[str]] = {}
    for at, tid, frames in timeline:
        more, held[tid] = _sample(at * 1e6, tid, frames, held.get(tid, []))
        events += more
    (tmp_path / "profile-restart-n1.json").write_text(json.dumps(events))
    assert scale._restart_phases("n1", until_s=4.5) == {"restore": [[0.5, 2.5]], "apply": [[2.5, 4.0]]}
    # The first write in the middle of the replay: the span is cut there.
    assert scale._restart_phases("n1", until_s=3.0) == {"restore": [[0.5, 2.5]], "apply": [[2.5, 3.0]]}
    assert scale._restart_phases("n9", until_s=4.5) == {}  # no profile of that node

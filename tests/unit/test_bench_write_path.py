"""bench.write_path: how one PUT's interval is cut into hops by the agents' marks, and the
marks themselves (raftlog.trace), on and off."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import raftlog.trace
from bench.write_path import CHAIN, STAGES, _stage_us, cut, leader_sync

Rows = list[tuple[int, str]]


def _put(start: int, leader: Rows, followers: list[Rows], *, late_follower: int = 0,
         own_sync: int = 50) -> tuple[int, int]:
    """Marks of one PUT from ``start`` (us from then: 10 per hop on the leader's side), follower 0
    holding the entry ``late_follower`` us after follower 1 when that is positive; the leader's
    own journal sync begins 5 us after its second send and takes ``own_sync`` us."""
    t = start
    ns = 1000

    def at(rows: Rows, tag: str, step: int = 10) -> None:
        nonlocal t
        t += step * ns
        rows.append((t, tag))

    first, second = (followers[1], followers[0]) if late_follower > 0 else (followers[0], followers[1])
    for tag in ("http_in", "propose", "woken", "send_entries", "tx"):
        at(leader, tag)
    leader.append((t + 1 * ns, "tx"))  # the same entries to the other follower
    leader.append((t + 6 * ns, "disk_sync"))
    leader.append((t + (6 + own_sync) * ns, "disk_synced"))
    for rows in (first, second):
        rows.append((t + 20 * ns, "rx"))
        rows.append((t + 30 * ns, "entries_in"))
        rows.append((t + 40 * ns, "sync"))
    first.append((t + 100 * ns, "synced"))
    second.append((t + 100 * ns + late_follower * ns, "synced"))
    t += 100 * ns
    at(first, "tx")
    for tag in ("rx", "ack_in", "apply", "applied", "callback", "settled", "proposed", "http_out"):
        at(leader, tag)
    return start, t + 50 * ns


def test_each_put_is_cut_by_the_leader_and_the_follower_that_held_its_entry_first() -> None:
    leader: Rows = [(0, "tx")]  # a keepalive before the PUT: not the PUT's
    followers: list[Rows] = [[], []]
    spans = [_put(1_000_000, leader, followers), _put(5_000_000, leader, followers, late_follower=30)]
    for rows in (leader, *followers):
        rows.sort()
    hops, left_out = cut(spans, leader, followers)
    assert left_out == 0
    keys = ["client", *(f"{w}:{t}" for w, t in CHAIN), "client_end"]
    assert list(hops) == [f"{a}->{b}" for a, b in zip(keys, keys[1:], strict=False)]
    assert hops["client->L:http_in"] == [10.0, 10.0]
    assert hops["L:http_in->L:propose"] == [10.0, 10.0]
    assert hops["L:propose->L:send_entries"] == [20.0, 20.0]  # the wake-up's mark is not in the chain
    assert hops["L:tx->F:rx"] == [20.0, 20.0]
    assert hops["F:sync->F:synced"] == [60.0, 60.0]  # the follower whose sync ended first, each time
    assert hops["L:http_out->client_end"] == [50.0, 50.0]
    stages = _stage_us(hops)
    assert list(stages) == [name for name, _, _ in STAGES]
    assert sum(stages.values()) == pytest.approx(sum(sum(v) for v in hops.values()) / 2)


def test_a_put_whose_entries_went_out_otherwise_is_left_out_and_counted() -> None:
    leader: Rows = []
    followers: list[Rows] = [[], []]
    start, end = _put(1_000_000, leader, followers)
    leader.remove(next(r for r in leader if r[1] == "send_entries"))  # sent by a heartbeat, not eagerly
    hops, left_out = cut([(start, end)], leader, followers)
    assert hops == {} and left_out == 1
    leader2: Rows = []
    start, end = _put(1_000_000, leader2, followers := [[], []])
    leader2[:] = [r for r in leader2 if r[1] != "http_out"]  # a mark missing from the PUT's interval
    hops, left_out = cut([(start, end)], leader2, followers)
    assert hops == {} and left_out == 1


def test_the_leaders_own_sync_is_timed_and_said_when_it_ended_after_the_answer_left() -> None:
    leader: Rows = []
    followers: list[Rows] = [[], []]
    # The first follower's answer leaves 110 us after the leader's second send; the leader's own
    # sync begins 6 us after that send.
    spans = [_put(1_000_000, leader, followers, own_sync=50), _put(5_000_000, leader, followers, own_sync=200)]
    for rows in (leader, *followers):
        rows.sort()
    got = leader_sync(spans, leader, followers)
    assert got["puts"] == 2
    assert got["took_p50_us"] == pytest.approx(125.0)  # the median of 50 and 200
    assert got["began_after_send_p50_us"] == pytest.approx(16.0)  # the first tx 10 us after the send, then 6
    assert got["ended_after_the_answer_left"] == 0.5  # the 200 us one


def test_a_frame_of_something_else_read_inside_a_put_leaves_its_stages_whole() -> None:
    leader: Rows = []
    followers: list[Rows] = [[], []]
    spans = [_put(1_000_000, leader, followers)]
    clean = _stage_us(cut(spans, sorted(leader), [sorted(f) for f in followers])[0])
    # A keepalive read by each follower just after the leader's send, and a heartbeat's
    # answer (sync, synced, tx) by follower 0 before the entries reached it.
    sent = next(t for t, tag in leader if tag == "send_entries")
    followers[0] += [(sent + 15_000, "rx"), (sent + 16_000, "sync"), (sent + 17_000, "synced"), (sent + 18_000, "tx")]
    followers[1].append((sent + 15_000, "rx"))
    leader.append((sent + 60_000, "rx"))  # and a frame the leader read while the followers synced
    hops, left_out = cut(spans, sorted(leader), [sorted(f) for f in followers])
    assert left_out == 0
    assert hops["L:tx->F:rx"] != [20.0], "the keepalive's frame was taken for the entries'"
    assert _stage_us(hops) == clean
    got = leader_sync(spans, sorted(leader), [sorted(f) for f in followers])
    assert got["ended_after_the_answer_left"] == 0.0, "the heartbeat's answer is not the entry's"


def test_marks_go_to_a_file_per_process_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(raftlog.trace.ENV, raising=False)
    off = importlib.reload(raftlog.trace)
    off.mark("nothing")
    assert off.mark.__name__ == "_nothing" and not any(tmp_path.iterdir())
    monkeypatch.setenv(raftlog.trace.ENV, str(tmp_path / "marks"))
    on = importlib.reload(raftlog.trace)
    try:
        on.mark("http_in")
        on.mark("http_out")
        assert on._out is not None
        on._out.flush()  # as at the process's exit
        (written,) = (tmp_path / "marks").iterdir()
        lines = [line.split() for line in written.read_text(encoding="ascii").splitlines()]
        assert [tag for tag, _ in lines] == ["http_in", "http_out"]
        assert int(lines[0][1]) <= int(lines[1][1])
    finally:
        if on._out is not None:
            on._out.close()
        monkeypatch.delenv(raftlog.trace.ENV)
        importlib.reload(raftlog.trace)

"""bench.threads reads each thread's CPU from /proc and sums it by thread name."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.threads import ENDED, TICKS, process_times, spent, summarise, thread_times


def _stat(tid: int, name: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"{tid} ({name}) S 1 1 1 0 -1 4194560 10 0 0 0 {utime} {stime} 0 0 20 0 3 0 100 0 0\n"


def _proc(root: Path, pid: int, threads: dict[int, tuple[str, int, int]]) -> None:
    for tid, (name, utime, stime) in threads.items():
        d = root / str(pid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(_stat(tid, name, utime, stime))


def test_threads_are_read_by_name_and_summed_between_two_readings(tmp_path: Path) -> None:
    _proc(tmp_path, 40, {40: ("python", 10, 2), 41: ("raftcron-raft", 50, 5), 42: ("python", 1, 0),
                         43: ("a (b) c", 0, 0)})  # a name holding parentheses and spaces
    before = thread_times(40, tmp_path)
    assert before[40] == ("main", 10 / TICKS, 2 / TICKS)
    assert before[43][0] == "a (b) c"
    _proc(tmp_path, 40, {40: ("python", 30, 4), 41: ("raftcron-raft", 90, 9), 42: ("python", 3, 1),
                         44: ("python", 2, 2)})  # 44 started meanwhile
    (tmp_path / "40" / "task" / "43" / "stat").unlink()  # 43 ended meanwhile
    got = spent(before, thread_times(40, tmp_path))
    near = 1e-3  # spent() rounds to milliseconds
    assert got == {"main": pytest.approx({"user": 20 / TICKS, "system": 2 / TICKS}, abs=near),
                   "raftcron-raft": pytest.approx({"user": 40 / TICKS, "system": 4 / TICKS}, abs=near),
                   "python": pytest.approx({"user": 4 / TICKS, "system": 3 / TICKS}, abs=near)}
    assert thread_times(999, tmp_path) == {}  # a process gone


def _process(root: Path, pid: int, utime: int, stime: int) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(_stat(pid, "python", utime, stime))


def test_the_cpu_of_threads_that_ended_between_the_readings_is_counted_apart(tmp_path: Path) -> None:
    """Before, a thread that ended between the readings took its CPU with it: the sum of the
    threads read fell short of what the process spent."""
    _proc(tmp_path, 40, {40: ("python", 10, 2), 41: ("worker", 5, 1)})
    _process(tmp_path, 40, 15, 3)
    before, whole0 = thread_times(40, tmp_path), process_times(40, tmp_path)
    (tmp_path / "40" / "task" / "41" / "stat").unlink()  # 41 ended after 20 more ticks, another began and ended
    _proc(tmp_path, 40, {40: ("python", 30, 4)})
    _process(tmp_path, 40, 15 + 20 + 20 + 7, 3 + 2 + 3 + 1)  # main 20 + 2, thread 41 20 + 3, the other 7 + 1
    whole1 = process_times(40, tmp_path)
    got = spent(before, thread_times(40, tmp_path), ((whole0, whole0), (whole1, whole1)))
    near = 1e-3
    assert got == {"main": pytest.approx({"user": 20 / TICKS, "system": 2 / TICKS}, abs=near),
                   ENDED: pytest.approx({"user": 31 / TICKS, "system": 0.0}, abs=near)}
    assert process_times(999, tmp_path) is None


def test_no_thread_ended_reads_as_none_whatever_the_process_spent_while_read() -> None:
    """Its threads and the process are read one after another: CPU spent in between is not an
    ended thread's (spinning threads gave 0.08-0.27 s of it over two seconds, before the
    reading was bracketed), nor are the kernel's different divisions of user and system."""
    before = {40: ("main", 1.00, 0.50), 41: ("raftcron-raft", 2.00, 0.10)}
    after = {40: ("main", 2.00, 0.50), 41: ("raftcron-raft", 2.50, 0.20)}
    # The threads spent 1.6 s between the readings. The process spent 0.3 s while each reading was
    # taken (from its start to its end: 2.2 s), and divides user and system otherwise than its threads.
    first = ((3.40, 0.20), (3.60, 0.30))
    last = ((5.20, 0.30), (5.50, 0.30))
    got = spent(before, after, (first, last))
    assert ENDED not in got
    assert got["main"] == pytest.approx({"user": 1.0, "system": 0.0})


def test_the_summary_is_per_write_by_role() -> None:
    run = {"roles": {"n1": "leader", "n2": "follower", "n3": "follower"}, "idle_seconds": 10.0, "writes": 1000,
           "writes_per_s": 100.0,
           "idle": {n: {"main": {"user": 0.1, "system": 0.0}, "raftcron-raft": {"user": 0.4, "system": 0.0}}
                    for n in ("n1", "n2", "n3")},
           "load": {"n1": {"main": {"user": 0.5, "system": 0.1}, "raftcron-raft": {"user": 0.2, "system": 0.0}},
                    "n2": {"main": {"user": 0.03, "system": 0.0}, "raftcron-raft": {"user": 0.3, "system": 0.0}},
                    "n3": {"main": {"user": 0.03, "system": 0.0}, "raftcron-raft": {"user": 0.2, "system": 0.1}}}}
    s = summarise([run])
    assert s["writes_per_s"] == 100.0
    assert s["idle_cores_three"] == pytest.approx(0.15)
    assert s["leader_us_per_write"] == pytest.approx({"main": 600.0, "raftcron-raft": 200.0})
    assert s["follower_us_per_write"] == pytest.approx({"main": 30.0, "raftcron-raft": 300.0})
    assert s["leader_system_us_per_write"] == pytest.approx(100.0)
    assert s["follower_system_us_per_write"] == pytest.approx(50.0)

"""The environment the clock-skew tests start agents in (``harness.faketime_env``) must skew
the wall clock and nothing else: no change to how the interpreter's threads take turns.

libfaketime 0.9.10 on glibc 2.36 turns on its "monotonic fix" by itself, and then every
``pthread_cond_timedwait`` on a monotonic condition returns at once, the GIL's among them: a
thread that wants the GIL asks a busy holder for it at once instead of after the switch
interval, and spins on it meanwhile. Agents under it used twice the CPU, their raft thread went
silent for up to a second at a time, and the skewed-leader case failed CI on elections the skew
did not cause. These tests run a probe under that environment and fail if the interpreter's
switch interval is cut short, or if the offset, ``time.sleep`` or a timed wait misbehave.

Needs libfaketime (Debian package ``faketime``), as ``test_skew.py`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .harness import faketime_env

pytestmark = pytest.mark.cluster

# A thread back from a short sleep waits for a busy holder of the GIL for the switch interval
# (5 ms by default) before it asks for it; load on the machine can only make that longer. With
# the library's monotonic fix on, the median was 0.2 ms; without the library, 5.3-5.4 ms.
SWITCH_INTERVAL = 0.005
HANDOVER_FLOOR = 0.8 * SWITCH_INTERVAL

PROBE = r"""
import json, select, sys, threading, time

def handovers(n):
    stop = False
    def spin():
        x = 0
        while not stop:
            x += 1
    busy = threading.Thread(target=spin)
    busy.start()
    waits = []
    try:
        for _ in range(n):
            start = time.monotonic()
            select.select([], [], [], 0.01)  # releases the GIL; the spinning thread takes it
            waits.append(time.monotonic() - start - 0.01)
    finally:
        stop = True
        busy.join()
    return sorted(waits)[len(waits) // 2]

wall = time.time()
offset = wall - float(sys.argv[1])
start = time.monotonic()
time.sleep(0.05)
slept = time.monotonic() - start
event = threading.Event()
start = time.monotonic()
event.wait(0.05)
waited = time.monotonic() - start
print(json.dumps({"offset": offset, "slept": slept, "waited": waited, "switch": sys.getswitchinterval(),
                  "handover": handovers(int(sys.argv[2]))}))
"""


def _probe(tmp_path: Path, library: Path, offset: str, rounds: int = 41) -> dict[str, float]:
    clock = tmp_path / "probe.faketime"
    clock.write_text(offset + "\n")
    env = {**os.environ, **faketime_env(library, clock)}
    out = subprocess.run([sys.executable, "-c", PROBE, repr(time.time()), str(rounds)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return dict(json.loads(out))


@pytest.mark.parametrize("offset", ["+0s", "+3s", "-3s"])
def test_threads_take_turns_as_without_the_library(tmp_path: Path, faketime_lib: Path, offset: str) -> None:
    got = _probe(tmp_path, faketime_lib, offset)
    assert got["switch"] == SWITCH_INTERVAL
    assert got["handover"] >= HANDOVER_FLOOR, (
        f"at {offset}, a thread took the GIL from a busy one after {got['handover'] * 1e3:.2f} ms (median), "
        f"short of the {SWITCH_INTERVAL * 1e3:g} ms switch interval: the library's timed waits return early "
        f"(FAKETIME_FORCE_MONOTONIC_FIX)")


@pytest.mark.parametrize(("offset", "seconds"), [("+3s", 3.0), ("-3s", -3.0), ("+30s", 30.0)])
def test_the_wall_clock_moves_and_waits_keep_their_length(tmp_path: Path, faketime_lib: Path, offset: str,
                                                          seconds: float) -> None:
    got = _probe(tmp_path, faketime_lib, offset, rounds=3)
    # The probe reads its clock after the parent's, so the offset it sees is the library's plus
    # the start-up of an interpreter (well under a second here, more on a loaded machine).
    assert seconds - 0.05 <= got["offset"] < seconds + 5.0, got
    assert 0.05 <= got["slept"] < 5.0, got  # time.sleep mended by faketime_site, at its length
    assert 0.05 <= got["waited"] < 5.0, got  # a timed wait of a thread, at its length

"""Imported at start-up (as ``sitecustomize``) by agents the cluster tests run under libfaketime.

With the monotonic clock left unfaked (see ``tests/cluster/harness.py``, ``faketime_env``),
libfaketime 0.9.10 breaks Python 3.11's ``time.sleep``: Python sleeps with
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...)``, the library mishandles that absolute
monotonic deadline and hands the kernel a negative time, and ``time.sleep`` raises EINVAL
(reported upstream as libfaketime issue 426). pysyncobj's tick thread sleeps that way.
``select`` takes a relative timeout, which the library passes on unchanged at normal speed
(measured: ``select(0.2)`` waited 0.200 s), and Python retries it with the time left when a
signal interrupts it; so ``time.sleep`` is swapped for it here, in these agents only, before
the agent's own code runs.
"""

from __future__ import annotations

import os
import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


if "libfaketime" in os.environ.get("LD_PRELOAD", ""):
    time.sleep = _sleep

"""APScheduler 3 as the single-process peer of bench.compare, run as its own process.

One ``AsyncIOScheduler`` with its defaults (memory job store, the asyncio executor,
misfire grace 1 s, coalescing on, one instance of a job at a time) holds ``--jobs``
jobs that fire every second; each fire POSTs to ``--url`` with one shared aiohttp
session, carrying the same headers a raftcron HTTP job sends (``X-Raftcron-Job``,
``X-Raftcron-Slot``, ``X-Raftcron-Attempt``), so the same sink times both.

- ``--mode aligned``: ``CronTrigger(second="*")``, every job due at each second's start;
- ``--mode spread``: ``IntervalTrigger(seconds=1)`` with the jobs' start dates spread evenly
  over one second, as raftcron's ``@every 1s`` jobs created over a second are.

The slot a fire belongs to is the run time APScheduler scheduled it for: the executor
below hands it to the job through a context variable (the only place this reaches into
APScheduler, hence the pinned version in pyproject.toml). The runs APScheduler reports
skipping (more than the grace late, or the job's previous fire still running) are counted
from its events and written with the process's CPU time to ``--out`` at SIGTERM; run times it
coalesces away raise no event, so the slots not delivered are counted at the sink, not here.

    python -m bench.apscheduler_peer --jobs 1000 --url http://127.0.0.1:PORT/hook --out stats.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import math
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

SLOT: contextvars.ContextVar[datetime] = contextvars.ContextVar("slot")


class SlotExecutor(AsyncIOExecutor):  # type: ignore[misc]
    """AsyncIOExecutor, with the scheduled run time visible to the job it starts."""

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        token = SLOT.set(run_times[-1])  # coalescing (the default) submits one run time
        try:
            super()._do_submit_job(job, run_times)  # the task it creates copies this context
        finally:
            SLOT.reset(token)


async def _serve(a: argparse.Namespace) -> None:
    counts = {"fired": 0, "post_errors": 0, "missed": 0, "max_instances": 0, "job_errors": 0}
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def fire(name: str) -> None:
        slot = SLOT.get().astimezone(UTC)
        counts["fired"] += 1
        headers = {"X-Raftcron-Job": name, "X-Raftcron-Slot": slot.isoformat().replace("+00:00", "Z"),
                   "X-Raftcron-Attempt": "1"}
        try:
            async with session.post(a.url, headers=headers) as resp:
                await resp.read()
        except (TimeoutError, aiohttp.ClientError):
            counts["post_errors"] += 1

    stopping = False

    def on_event(event: JobEvent) -> None:
        if stopping:  # the shutdown cancels the fires in flight: those are not the scheduler's errors
            return
        key = {EVENT_JOB_MISSED: "missed", EVENT_JOB_MAX_INSTANCES: "max_instances", EVENT_JOB_ERROR: "job_errors"}
        counts[key[event.code]] += 1

    scheduler = AsyncIOScheduler(executors={"default": SlotExecutor()}, timezone=UTC)
    scheduler.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
    first = datetime.fromtimestamp(math.ceil(time.time()) + 1, UTC)
    for i in range(a.jobs):
        name = f"{a.prefix}{i}"
        if a.mode == "aligned":
            trigger: Any = CronTrigger(second="*", timezone=UTC)
        else:
            trigger = IntervalTrigger(seconds=1, start_date=first + timedelta(seconds=i / a.jobs), timezone=UTC)
        scheduler.add_job(fire, trigger, args=[name], id=name)
    scheduler.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    stopping = True
    scheduler.shutdown(wait=False)
    await session.close()
    cpu = time.process_time()
    with open(a.out, "w") as f:
        json.dump({**counts, "cpu_s": round(cpu, 3)}, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True, help="JSON written at SIGTERM: fires, skips by reason, CPU seconds")
    p.add_argument("--mode", choices=("aligned", "spread"), default="aligned")
    p.add_argument("--prefix", default="l", help="job names are PREFIX0..PREFIX{N-1} (the sink analysis reads 'l')")
    p.add_argument("--log", default=None, help="APScheduler's warnings go here (as the agents log theirs to a file)")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, filename=a.log, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_serve(a))


if __name__ == "__main__":
    main()

"""A cheap HTTP sink for executor deliveries, run as its own process.

Each request is answered 200 at once (a path ``/slow?s=S``: after S seconds, so the
attempts delivering to it stay running that long); the sink keeps only (receive time,
X-Raftcron-Job, X-Raftcron-Slot, X-Raftcron-Attempt) in memory and writes them
as JSON to ``--out`` when it gets SIGTERM (and their count, every 250 ms, to ``--out``.count). Several sink processes can share one
port (``--reuse-port``, SO_REUSEPORT: the kernel spreads connections), so the
sink is not the bottleneck; bench/lateness.py measures its capacity first.

It uses aiohttp's low-level server (no application, router or middleware).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time

from aiohttp import web

Record = tuple[float, str | None, str | None, str | None]


async def _serve(host: str, port: int, out: str, reuse_port: bool) -> None:
    records: list[Record] = []
    now = time.time

    async def handle(request: web.BaseRequest) -> web.Response:
        h = request.headers
        records.append((now(), h.get("X-Raftcron-Job"), h.get("X-Raftcron-Slot"), h.get("X-Raftcron-Attempt")))
        if request.path == "/slow":
            await asyncio.sleep(float(request.query.get("s", "1")))
        return web.Response(text="ok")

    loop = asyncio.get_running_loop()
    server = web.Server(handle, access_log=None)
    srv = await loop.create_server(server, host, port, reuse_port=reuse_port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    counter = asyncio.create_task(_write_count(records, out + ".count"))
    await stop.wait()
    counter.cancel()
    srv.close()
    await server.shutdown(1.0)
    with open(out, "w") as f:
        json.dump(records, f)


async def _write_count(records: list[Record], path: str) -> None:
    """How many requests arrived so far, in a file beside ``--out`` (a bench waits on it)."""
    written = -1
    while True:
        if len(records) != written:
            written = len(records)
            with open(path + ".tmp", "w") as f:
                f.write(str(written))
            os.replace(path + ".tmp", path)
        await asyncio.sleep(0.25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True, help="JSON file written at SIGTERM: [[t, job, slot, attempt], ...]")
    p.add_argument("--reuse-port", action="store_true")
    a = p.parse_args()
    asyncio.run(_serve(a.host, a.port, a.out, a.reuse_port))


if __name__ == "__main__":
    main()

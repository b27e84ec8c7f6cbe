"""The HTTP stack's floor: a minimal aiohttp server that answers every request 200.

Run as its own process (``python -m bench.floor --port N``) so the reference
measurement uses the same client, the same loopback and the same kind of
process boundary as the agents' API, with none of their work behind it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web


async def _ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True})


async def _serve(host: str, port: int) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    asyncio.run(_serve(a.host, a.port))


if __name__ == "__main__":
    main()

"""A real headless browser for the dashboard tests: Debian's ``chromium``.

``dump(url)`` and ``screenshot(url, path)`` run one short-lived headless chromium
with a virtual-time budget (the page's timers run ahead, its fetches are real).
``Page`` drives a live page over the DevTools protocol (a websocket, through aiohttp)
for the tests that click: evaluate an expression, wait until one holds.

Without chromium the tests skip, saying how to install it; under CI (``CI`` set)
they fail instead, so a missing install step cannot pass as green.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.required import missing_tool

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--hide-scrollbars", "--mute-audio"]
RUN_BOUND = 90.0  # seconds one headless run may take


def find_chromium() -> str | None:
    for name in (os.environ.get("RAFTCRON_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        missing_tool("chromium is not installed (Debian: apt-get install chromium fonts-dejavu-core)")
    return path


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RAFTCRON_SCREENSHOT_DIR if set (kept for people to look at), else a temporary directory."""
    given = os.environ.get("RAFTCRON_SCREENSHOT_DIR")
    path = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Chromium:
    def __init__(self, binary: str, profile: Path) -> None:
        self.binary = binary
        self.profile = profile

    def _run(self, url: str, *extra: str, budget_ms: int) -> str:
        cmd = [self.binary, *FLAGS, f"--user-data-dir={self.profile}", f"--virtual-time-budget={budget_ms}", *extra, url]
        done = subprocess.run(cmd, capture_output=True, timeout=RUN_BOUND, check=False)
        assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"
        return done.stdout.decode(errors="replace")

    def dump(self, url: str, budget_ms: int = 8000) -> str:
        """The DOM once the page has run ``budget_ms`` of virtual time."""
        return self._run(url, "--dump-dom", budget_ms=budget_ms)

    def screenshot(self, url: str, path: Path, size: str = "1280,900", budget_ms: int = 1500) -> Path:
        # A short budget: virtual time runs the page's clock ahead too, and "in 1s" would read "6s ago".
        self._run(url, f"--screenshot={path}", f"--window-size={size}", budget_ms=budget_ms)
        assert path.exists() and path.stat().st_size > 10_000, f"no screenshot written to {path}"
        return path


@pytest.fixture(scope="session")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Chromium:
    return Chromium(chromium, tmp_path_factory.mktemp("chromium-profile"))


class Page:
    """One live tab, driven over the DevTools protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        deadline = time.monotonic() + 20
        while True:  # events arrive between answers: skip them
            try:
                msg = await asyncio.wait_for(self.ws.receive_json(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"chromium did not answer {method} within 20s") from None
            if msg.get("id") == msg_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return dict(msg.get("result", {}))

    async def js(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, what: str, expression: str, bound: float = 20.0) -> Any:
        deadline = time.monotonic() + bound
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = await self.js(expression)
            except AssertionError as exc:  # the document may be between two pages
                value = exc
            if value and not isinstance(value, AssertionError):
                return value
            await asyncio.sleep(0.1)
        text = await self.js("document.body.innerText")
        raise AssertionError(f"waited {bound}s for the page to show {what}; last value {value!r}; page:\n{text[:1500]}")

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.until(f"{url} loaded", f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    async def screenshot(self, path: Path, width: int = 1280, height: int = 900) -> Path:
        """What the live page shows at this viewport size, as PNG. (A page that keeps a long poll
        open never lets a virtual-time budget run out, so ``Chromium.screenshot`` cannot take it.)"""
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=width < 600)
        await asyncio.sleep(0.3)  # a layout pass at the new size
        shot = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        assert path.stat().st_size > 10_000, f"a blank screenshot at {path}"
        return path

    async def click(self, selector: str, text: str) -> None:
        """Click the first ``selector`` element whose text is ``text`` (waiting for it to appear)."""
        find = (f"[...document.querySelectorAll({json.dumps(selector)})]"
                f".find((e) => e.textContent.trim() === {json.dumps(text)})")
        await self.until(f"a {selector} reading {text!r}", f"!!({find})")
        await self.js(f"({find}).click()")


@pytest_asyncio.fixture
async def page(chromium: str, tmp_path: Path) -> AsyncIterator[Page]:
    profile, log_path = tmp_path / "profile", tmp_path / "chromium.log"
    proc = _launch([chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                    "--window-size=1280,900", "about:blank"], log_path)
    try:
        port = await _devtools_port(proc, profile / "DevToolsActivePort", log_path)
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 20
            targets: list[dict[str, Any]] = []
            while not targets:
                assert time.monotonic() < deadline, "chromium opened no page target"
                async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    targets = [t for t in await resp.json() if t.get("type") == "page"]
                if not targets:
                    await asyncio.sleep(0.1)
            async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                p = Page(ws)
                await p.send("Page.enable")
                yield p
    finally:
        _end(proc)


def _launch(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def _devtools_port(proc: subprocess.Popen[bytes], port_file: Path, log_path: Path) -> int:
    """chromium writes the port it chose into DevToolsActivePort once it serves the protocol."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        text = port_file.read_text() if port_file.exists() else ""
        if text.strip() and text.splitlines()[0].isdigit():
            return int(text.splitlines()[0])
        await asyncio.sleep(0.05)
    raise AssertionError("chromium did not open its DevTools port:\n" + log_path.read_text(errors="replace")[-2000:])


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End the chromium we started and its helpers: the process group it leads (start_new_session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(10)
            break
        except subprocess.TimeoutExpired:
            continue

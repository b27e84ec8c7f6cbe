"""Fixtures for the docker-compose e2e tests: the prerequisites (or a skip naming what is
missing), the image (built once per session by tests/e2e/build_image.sh), and a timing
summary printed at the end of the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
E2E = Path(__file__).resolve().parent
IMAGE = os.environ.get("RAFTCRON_E2E_IMAGE", "raftcron:dev")
BASE_IMAGE = os.environ.get("RAFTCRON_BASE_IMAGE", "raftcron-base:bookworm-py311")
BUILD_TIMEOUT = 1500.0  # a cold build is ~2-3 min here; debootstrap alone may take 20 min on a slow mirror

# name -> seconds (or a short text); filled by the fixtures and the test, printed at the end.
TIMINGS: dict[str, Any] = {}


def run(cmd: list[str], timeout: float, what: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A subprocess with a bound; the error names what it was doing."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out after {timeout}s: {what} ({' '.join(cmd)})") from exc
    if check and proc.returncode != 0:
        raise AssertionError(f"{what} failed ({' '.join(cmd)}), exit {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) when it works, else `docker-compose` (v1), else None."""
    if shutil.which("docker"):
        try:
            if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20).returncode == 0:
                return ["docker", "compose"]
        except subprocess.TimeoutExpired:
            pass
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _missing_prerequisite() -> str | None:
    if not shutil.which("docker"):
        return "no docker CLI on PATH"
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no Docker engine answers `docker info` (timed out after 30s)"
    if info.returncode != 0 or not info.stdout.strip():
        return f"no Docker engine answers `docker info`: {(info.stderr or info.stdout).strip()[:300]}"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    base_present = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True,
                                  timeout=30).returncode == 0
    if not base_present and not shutil.which("debootstrap") and not os.path.exists("/usr/sbin/debootstrap"):
        return f"debootstrap is not installed and the base image {BASE_IMAGE} is not present"
    return None


@pytest.fixture(scope="session")
def e2e_prerequisites() -> None:
    reason = _missing_prerequisite()
    if reason:
        if os.environ.get("RAFTCRON_E2E_REQUIRE") == "1":
            pytest.fail(f"RAFTCRON_E2E_REQUIRE=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def e2e_image(e2e_prerequisites: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The project image, built (or found up to date) by tests/e2e/build_image.sh."""
    env = dict(os.environ)
    if "PYTHON" not in env and sys.version_info[:2] == (3, 11):
        env["PYTHON"] = sys.executable  # the wheels are built by the interpreter running the tests
    log = tmp_path_factory.mktemp("e2e-build") / "build_image.log"
    had_image = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=30).returncode == 0
    t0 = time.monotonic()
    try:
        with open(log, "w") as out:
            proc = subprocess.run(["bash", str(E2E / "build_image.sh"), IMAGE], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {BUILD_TIMEOUT}s waiting for tests/e2e/build_image.sh; log: {log}")
    took = time.monotonic() - t0
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        pytest.fail(f"tests/e2e/build_image.sh {IMAGE} exited {proc.returncode}:\n{text[-4000:]}")
    size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    TIMINGS["image build (build_image.sh)"] = f"{took:.1f}s ({'image was present' if had_image else 'no image before'})"
    TIMINGS["image size"] = f"{int(size) / 1e6:.0f} MB" if size.isdigit() else size
    return IMAGE


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome: Any = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "e2e timings")
        for name, value in TIMINGS.items():
            terminalreporter.write_line(f"{name}: {value:.1f}s" if isinstance(value, float) else f"{name}: {value}")

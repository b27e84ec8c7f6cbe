"""crashfs itself: what was synced survives a crash, what was not is lost but for a torn prefix
of each file's last write, and nothing written after the crash is accepted."""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.crashfs import SECTOR, CrashFs, fuse_available

pytestmark = pytest.mark.faults


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[CrashFs]:
    reason = fuse_available()
    if reason is not None:
        if os.environ.get("CI") == "1":
            pytest.fail(f"crashfs needs FUSE and CI=1 is set: {reason}")
        pytest.skip(f"no FUSE here: {reason}")
    mount = CrashFs(tmp_path / "backing", tmp_path / "mnt", tmp_path / "ctl.sock", tmp_path / "crashfs.log", seed=7)
    mount.mount()
    try:
        yield mount
    finally:
        mount.unmount()


def test_synced_bytes_survive_and_unsynced_ones_are_lost(fs: CrashFs) -> None:
    path = fs.mountpoint / "file"
    with open(path, "wb") as f:
        f.write(b"A" * 100)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"B" * 100)
        f.flush()
        assert path.read_bytes() == b"A" * 100 + b"B" * 100  # readers see unsynced writes
    (fs.mountpoint / "never-synced").write_bytes(b"C" * 50)
    dropped, _ = fs.crash()
    assert dropped == 150
    with pytest.raises(OSError) as exc:
        (fs.mountpoint / "file").write_bytes(b"after")
    assert exc.value.errno == errno.EIO  # the machine is off
    fs.unmount()
    fs.mount()
    kept = path.read_bytes()
    assert kept.startswith(b"A" * 100) and set(kept[100:]) <= {ord("B")} and len(kept) < 200
    assert len((fs.mountpoint / "never-synced").read_bytes()) < 50


def test_a_mapped_file_keeps_what_fdatasync_wrote_and_tears_by_sector(fs: CrashFs) -> None:
    path = fs.mountpoint / "mapped"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        mm.resize(4 * 4096)
        mm[0:10] = b"synced...."
        os.fdatasync(f.fileno())
        mm[3 * 4096 : 4 * 4096] = b"U" * 4096
        mm.close()
    dropped, torn = fs.crash()
    assert dropped >= 4096 and torn == 1
    fs.unmount()
    fs.mount()
    data = path.read_bytes()
    assert data[:10] == b"synced...."
    tail = data[3 * 4096 :]
    kept = tail.count(b"U")
    assert 0 < kept < 4096 and kept % SECTOR == 0 and tail.startswith(b"U" * kept)

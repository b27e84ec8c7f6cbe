"""The free-space check a node makes before each write: a reading well above the floor is
reused for a second, any other is taken afresh (raftlog.space)."""

from __future__ import annotations

from pathlib import Path

from raftlog.space import MIN_FREE, REUSE_HEADROOM, Space

MiB = 1 << 20


class Disk:
    def __init__(self, free: int) -> None:
        self.free = free
        self.reads = 0
        self.broken = False

    def __call__(self, path: Path) -> int:
        self.reads += 1
        if self.broken:
            raise PermissionError(13, "denied", str(path))
        return self.free


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _space(disk: Disk, clock: Clock) -> Space:
    return Space(Path("/data"), clock=clock, read=disk)


def test_a_reading_far_above_the_floor_is_reused_for_a_second_and_then_taken_again() -> None:
    disk, clock = Disk(10_000 * MiB), Clock()
    space = _space(disk, clock)
    for _ in range(50):  # a burst of writes within the second: one statvfs
        assert space.short() is None
        clock.now += 0.01
    assert disk.reads == 1
    disk.free = MIN_FREE - 1  # filled meanwhile: seen at the first check after the second
    clock.now = 101.0
    assert space.short() == MIN_FREE - 1
    assert disk.reads == 2


def test_near_the_floor_every_check_reads_the_disk() -> None:
    disk, clock = Disk(MIN_FREE + REUSE_HEADROOM - 1), Clock()
    space = _space(disk, clock)
    assert space.short() is None and space.short() is None
    assert disk.reads == 2
    disk.free = MIN_FREE - 1
    assert space.short() == MIN_FREE - 1
    assert space.short() == MIN_FREE - 1  # under the floor: never reused either
    assert disk.reads == 4


def test_an_unreadable_directory_reads_as_full_every_time_and_a_clock_going_back_reads_again() -> None:
    disk, clock = Disk(10_000 * MiB), Clock()
    space = _space(disk, clock)
    assert space.short() is None
    clock.now -= 5.0  # a reading from the future is not trusted
    assert space.short() is None
    assert disk.reads == 2
    clock.now += 2.0
    disk.broken = True
    assert space.short() == 0
    disk.broken = False
    assert space.short() is None  # the error is not kept: read again
    assert disk.reads == 4


def test_the_default_reads_the_real_filesystem(tmp_path: Path) -> None:
    space = Space(tmp_path, min_free=1 << 62)  # more than any disk has free
    assert space.short() is not None
    assert Space(tmp_path, min_free=0).short() is None

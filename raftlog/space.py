"""Free space in a node's data directory, and the floor kept for the journal.

A journal append that meets a full disk must fail before a record is half written (the
journal reserves its space first, see ``journal``), and the API refuses writes while the
data directory is under the floor, so a full disk shows as a clear answer rather than as
commits that time out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MIN_FREE", "REUSE_HEADROOM", "REUSE_SECONDS", "Space", "free_bytes"]

# Above the journal's growth step (1 MiB, ``journal._GROW_STEP``) with room for a snapshot's
# header and the meta file: under it, a write the API accepts could meet ENOSPC in raft.
MIN_FREE = 2 << 20

# A reading at least this far above the floor is reused for this long. The API checked on
# every write: a statvfs, ~2 us alone. It lets go of the GIL, and in a profile (cProfile, wall
# time) of a leader taking 64 writes at once a call took 67 us, the difference being the wait
# to take the GIL back from the raft thread. A reused reading is wrong only if 1 GiB is
# filled within the second (a snapshot of 1,000,000 run records is ~120 MB); a write let
# through then fails in the journal, which reserves its space before it writes (no record
# torn), and its client gets the answer of a write whose commit was not confirmed instead
# of the 507.
REUSE_SECONDS = 1.0
REUSE_HEADROOM = 1 << 30


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    sv = os.statvfs(path)
    return sv.f_bavail * sv.f_frsize


@dataclass(slots=True)
class Space:
    path: Path
    min_free: int = MIN_FREE
    reuse: float = REUSE_SECONDS
    headroom: int = REUSE_HEADROOM
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    read: Callable[[Path], int] = field(default=free_bytes, compare=False)
    _last: tuple[float, int] | None = field(default=None, init=False, repr=False, compare=False)

    def short(self) -> int | None:
        """The free bytes when under the floor, else None (an unreadable directory reads as
        full: 0). A reading ``headroom`` or more above the floor is reused for ``reuse``
        seconds; any other is taken afresh every time."""
        now = self.clock()
        last = self._last
        if last is not None and 0.0 <= now - last[0] < self.reuse and last[1] >= self.min_free + self.headroom:
            return None
        try:
            free = self.read(self.path)
        except OSError:
            self._last = None
            return 0
        self._last = (now, free)
        return free if free < self.min_free else None

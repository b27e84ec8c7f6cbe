"""Free space in a node's data directory, and the floor kept for the journal.

A journal append that meets a full disk must fail before a record is half written (the
journal reserves its space first, see ``journal``), and the API refuses writes while the
data directory is under the floor, so a full disk shows as a clear answer rather than as
commits that time out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MIN_FREE", "Space", "free_bytes"]

# Above the journal's growth step (1 MiB, ``journal._GROW_STEP``) with room for a snapshot's
# header and the meta file: under it, a write the API accepts could meet ENOSPC in raft.
MIN_FREE = 2 << 20


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    sv = os.statvfs(path)
    return sv.f_bavail * sv.f_frsize


@dataclass(frozen=True, slots=True)
class Space:
    path: Path
    min_free: int = MIN_FREE

    def short(self) -> int | None:
        """The free bytes when under the floor, else None (an unreadable directory reads as
        full: 0)."""
        try:
            free = free_bytes(self.path)
        except OSError:
            return 0
        return free if free < self.min_free else None

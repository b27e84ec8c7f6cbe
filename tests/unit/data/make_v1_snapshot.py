"""Write ``state-snapshot-v1.bin`` (or OUT): the state snapshot of ``upgrade_log()`` (tests/unit/
test_snapshot_format.py) as a release packs it by default.

Run in a checkout of such a release (commit 2b494c7 wrote the committed version-1 file, commit
a2dc95a ``state-snapshot-v2.bin``, commit ec87d1b ``state-snapshot-v3.bin``) with this file
and ``test_snapshot_format.py`` copied into it at the same paths, from its top directory:
``PYTHONPATH=. python tests/unit/data/make_v1_snapshot.py [OUT]``. Its ``State`` then packs
the log, which is built by the same commands as in this tree."""

from __future__ import annotations

import sys
from pathlib import Path

import msgpack

from raftlog.fsm import ApplyContext
from scheduler.commands import encode_command
from scheduler.state import State
from tests.unit.test_snapshot_format import V1_FIXTURE, upgrade_log


def main() -> None:
    state = State()
    for i, cmd in enumerate(upgrade_log(), start=1):
        state.apply(cmd if isinstance(cmd, bytes) else encode_command(cmd), ApplyContext(index=i))
    data = state.snapshot_bytes()
    Path(sys.argv[1] if len(sys.argv) > 1 else V1_FIXTURE).write_bytes(data)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    print(f"{len(data)} bytes, snapshot version {next(unpacker)[1][0]['v']}")


if __name__ == "__main__":
    main()

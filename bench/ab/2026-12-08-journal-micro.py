"""Ad hoc: the durable journal of 8c2c09e against this tree's, alternated in one process.

Run from the repository's root: python bench/ab/2026-12-08-journal-micro.py > bench/ab/2026-12-08-journal-micro.json
The older journal.py is taken from git (8c2c09e) into a scratch directory and imported beside the new one.
"""

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
from raftlog import journal as new_journal  # noqa: E402

scratch = tempfile.mkdtemp()
source = subprocess.run(["git", "show", "8c2c09e:raftlog/journal.py"], capture_output=True, text=True, check=True).stdout
source = source.replace("from .heap import", "from raftlog.heap import").replace(
    "from .recovery import", "from raftlog.recovery import").replace("from .trace import", "from raftlog.trace import")
with open(os.path.join(scratch, "old_journal.py"), "w") as f:
    f.write(source)
spec = importlib.util.spec_from_file_location("old_journal", os.path.join(scratch, "old_journal.py"))
old_journal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_journal)


def run(mod, n=20000, size=200):
    d = tempfile.mkdtemp()
    j = mod._DurableJournal(os.path.join(d, "j"))
    cmd = b"x" * size
    t = time.perf_counter()
    for i in range(1, n + 1):
        j.defer = True
        j.add(cmd, i, 1)
        j.defer = False
    add = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(n):
        j[-1][1]
        j[0][1]
    ends = time.perf_counter() - t
    t = time.perf_counter()
    for k in range(n):
        j[k]
    each = time.perf_counter() - t
    t = time.perf_counter()
    j.deleteEntriesTo(n // 2)
    compaction = time.perf_counter() - t
    j._destroy()
    return {"add_us": add / n * 1e6, "first_and_last_us": ends / n * 1e6, "read_each_us": each / n * 1e6,
            "compaction_ms": compaction * 1e3}


runs = {"before": [], "after": []}
for _ in range(5):
    for name, mod in (("before", old_journal), ("after", new_journal)):
        runs[name].append(run(mod))
medians = {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]} for name, rs in runs.items()}
print(json.dumps({"entries": 20000, "command_bytes": 200, "repeat": 5, "median": medians, "runs": runs}, indent=1))

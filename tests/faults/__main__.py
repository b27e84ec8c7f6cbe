"""``python -m tests.faults --seed N --minutes M``: the randomised soak (tests/faults/soak.py).

Prints the seed first and the checker's counts last; exits 1 on a violation, 2 when the
machine cannot run it (root, ip, nft and iptables are needed).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from .rig import require_tools
from .soak import Soak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=None, help="the draw of faults (default: a random one, printed)")
    p.add_argument("--minutes", type=float, default=1.0, help="how long faults are injected")
    p.add_argument("--dir", type=Path, default=None, help="where the agents keep data and logs (default: a temp dir)")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"seed {seed}", flush=True)
    why = require_tools()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rcf-soak-") as tmp:
        soak = Soak(seed, args.minutes, args.dir or Path(tmp), say=lambda line: print(line, flush=True))
        verdict = soak.run()
    print(verdict.report())
    print(f"seed {seed}: {verdict.line()}", flush=True)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())

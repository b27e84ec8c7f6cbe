"""``http.expect_body`` patterns, compiled by RE2: matching takes time linear in the text.

Python's ``re`` backtracks: ``(a+)+$`` against 25 ``a`` and a ``b`` ran for seconds on
the event loop, and a slightly longer body for days. RE2 guarantees linear time by
refusing what needs backtracking (backreferences, look-around), so such a pattern is
refused when the job is written, naming the field, instead of failing at run time.

Linear is not cheap: when a pattern's automaton outgrows RE2's DFA cache, RE2 falls back to
a search costing about (text length x program size). ``(?:(a|b|c|d|e|f|g|h|i|j)*.{999}Q)``
six times over (a 203-character pattern, 47,986 instructions) took 12 s to 113 s over 64 KiB
of lowercase text. So a pattern is also refused past ``MAX_PROGRAM`` instructions (everyday
health-check patterns compile to 9-60; the slowest searches measured under the cap took
0.1-0.4 s per 64 KiB), and the executor searches off the event loop.
"""

from __future__ import annotations

from typing import Protocol

import re2

__all__ = ["BodyPattern", "compile_pattern", "MAX_PROGRAM"]

MAX_PROGRAM = 1000


class BodyPattern(Protocol):
    @property
    def pattern(self) -> str: ...

    def search(self, text: str) -> object | None: ...


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the message is returned to the caller, not printed to stderr
    return options


_OPTIONS = _options()


def compile_pattern(text: str) -> BodyPattern:
    """The compiled pattern; ``ValueError`` with RE2's reason when RE2 cannot run it."""
    try:
        compiled: BodyPattern = re2.compile(text, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        raise ValueError(str(reason)) from exc
    size = int(getattr(compiled, "programsize", 0))
    if size > MAX_PROGRAM:
        raise ValueError(f"it compiles to {size} instructions, over the limit of {MAX_PROGRAM}: "
                         "search time grows with the program's size")
    return compiled

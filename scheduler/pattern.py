"""``http.expect_body`` patterns, compiled by RE2: matching takes time linear in the text.

Python's ``re`` backtracks: ``(a+)+$`` against 25 ``a`` and a ``b`` ran for seconds on
the event loop, and a slightly longer body for days. RE2 guarantees linear time by
refusing what needs backtracking (backreferences, look-around), so such a pattern is
refused when the job is written, naming the field, instead of failing at run time.
"""

from __future__ import annotations

from typing import Protocol

import re2

__all__ = ["BodyPattern", "compile_pattern"]


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
    return compiled

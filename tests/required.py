"""Tools some suites need from the machine (a browser, libfaketime, strace).

Where one is missing a developer's run skips the tests that need it; with ``CI`` set they fail
instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing_tool(why: str) -> NoReturn:
    """Skip the test for ``why`` (what is missing and how to install it), or fail it under CI."""
    if os.environ.get("CI"):
        pytest.fail(why + "; CI must install it")
    pytest.skip(why)

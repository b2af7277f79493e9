"""Which runtime this process runs on: plain threads, or gevent's greenlets.

The other modules of :mod:`actors.runtime` ask here; this module imports none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["getcurrent", "runtime_name"]

getcurrent: Callable[[], Any] | None
"""greenlet's ``getcurrent`` (the running greenlet) when greenlet is installed, else None."""
try:
    from greenlet import getcurrent
except ImportError:  # no gevent: workers are threads
    getcurrent = None


def runtime_name() -> str:
    """``"gevent"`` when gevent has monkey-patched threading, else ``"threads"``."""
    monkey = sys.modules.get("gevent.monkey")
    return "gevent" if monkey and monkey.is_module_patched("threading") else "threads"

"""Ctrl-C and SIGTERM during ``tooldispatch run``.

The first SIGINT or SIGTERM (what ``timeout``, systemd, Docker, Kubernetes and CI send)
sets ``stop``: no new row starts, rows in flight finish and are stored, the report is
printed, exit 130. A second one aborts: the dispatch system is stopped (its
:meth:`~actors.system.DispatchSystem.stop` refuses calls not yet sent and releases
their receipts; requests already sent finish), the output is flushed, and the process
exits 130 at once, within :data:`ABORT_S` seconds whatever is still running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from actors.runtime.actor import runtime_name

__all__ = ["ABORT_S", "ABORT_STOP_S", "Interrupts"]

ABORT_S = 10.0
"""After a second interrupt: seconds given to stopping the system before exiting."""

ABORT_STOP_S = ABORT_S - 2.0
"""The stop's own bound within :data:`ABORT_S`: what it has not stored by then (writes
waiting on a locked or unreachable store) it salvages, with time left before the exit."""


class Interrupts:
    """Installs the handlers (:meth:`install`) and restores the previous ones (:meth:`restore`).

    Args:
        stop: set on the first signal.
        say: prints one line for the user (the console's ``print``).
        out: the output file, flushed before an abort exits (or None).

    Handlers run on the main thread (Python runs signal handlers there; under gevent
    possibly inside the hub); the abort runs on a thread of its own (a greenlet under
    gevent), so a handler never blocks.
    """

    def __init__(self, stop: threading.Event, say: Callable[[str], None], out: IO[bytes] | None) -> None:
        self.stop, self.say, self.out = stop, say, out
        self.signals: list[int] = []
        self.system: Any = None
        """The dispatch system, once started (what an abort stops)."""
        self.aborting: Any = None
        """The abort under way (a thread, or a greenlet under gevent), or None."""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def wait_for_abort(self) -> None:
        """If an abort is under way, wait for it: it ends the process (nothing else may
        close the store under it)."""
        if self.aborting is not None:
            self.aborting.join()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if len(self.signals) == 1:
            self.stop.set()
            self.say(
                f"interrupted ({signal.Signals(signum).name}): finishing the rows in flight "
                "(interrupt again to abort: receipts not yet sent are released)"
            )
        elif self.aborting is None:
            if runtime_name() == "gevent":
                # the handler may run in the hub's loop callback, where starting a (patched)
                # thread blocks: BlockingSwitchOutError. A greenlet is only scheduled
                import gevent

                self.aborting = gevent.spawn(self._abort)
            else:
                self.aborting = threading.Thread(target=self._abort, name="tooldispatch-abort")
                self.aborting.start()

    def _abort(self) -> None:
        done = threading.Event()

        def stop_system() -> None:
            try:
                if self.system is not None:
                    self.system.stop(timeout_s=ABORT_STOP_S)
            finally:
                done.set()

        threading.Thread(target=stop_system, name="tooldispatch-abort-stop", daemon=True).start()
        done.wait(ABORT_S)
        try:
            if self.out is not None:
                self.out.flush()
        except (OSError, ValueError):
            pass
        finally:
            sys.stderr.write(
                "aborted: receipts not yet sent were released; rerun the same command to resume\n"
            )
            sys.stderr.flush()
            os._exit(130)

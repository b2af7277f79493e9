"""Ctrl-C and SIGTERM during ``tooldispatch run``.

The first SIGINT or SIGTERM (what ``timeout``, systemd, Docker, Kubernetes and CI send)
sets ``stop`` (no new row starts) and stops the dispatch system at once, on a thread of
its own: its :meth:`~actors.system.DispatchSystem.stop` refuses every call not yet sent
(waiting for its batch grace, a slot, its pacing turn or a retry's back-off) and releases
its receipt; requests already sent finish and are stored, within :data:`STOP_S`. A
row whose call was refused is cut short (not written, not counted); the others finish,
the report is printed, exit 130. However many rows are under way (every row of a small
input), nothing unsent goes out after the signal. A second one aborts: the stop's bound
becomes :data:`ABORT_STOP_S`, the output is flushed, the report is printed, and the
process exits 130 within :data:`ABORT_S` seconds whatever is still running: a row that
does not end in time gets the abort's own short report instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from actors.runtime.actor import runtime_name

__all__ = ["ABORT_S", "ABORT_STOP_S", "REPORT_S", "STOP_S", "Interrupts"]

# SAME_SIGNAL: GNU ``timeout`` sends its signal to the command and then to its process
# group, microseconds apart: the second delivery runs the handler again while the first is
# still handling it (saying so, starting the stop). A signal of the first one's kind then
# is that one, not the second interrupt that aborts (a person's second Ctrl-C comes after
# the first was said).

STOP_S = 60.0
"""After a first interrupt: the bound of the system's stop (the requests already sent
finish and are stored within it; what is still held then is salvaged)."""

ABORT_S = 10.0
"""After a second interrupt: seconds given to stopping the system before exiting."""

ABORT_STOP_S = ABORT_S - 2.0
"""The stop's own bound within :data:`ABORT_S`: what it has not stored by then (writes
waiting on a locked or unreachable store) it salvages, with time left before the exit."""

REPORT_S = 1.0
"""What is left of :data:`ABORT_S` when the abort stops waiting for the CLI to print the
report, and prints its own short report instead."""


class Interrupts:
    """Installs the handlers (:meth:`install`) and restores the previous ones (:meth:`restore`).

    Args:
        stop: set on the first signal.
        say: prints one line for the user (the console's ``print``).
        out: the output file, flushed before an abort exits (or None).

    Handlers run on the main thread (Python runs signal handlers there; under gevent
    possibly inside the hub); the abort runs on a thread of its own (a greenlet under
    gevent), so a handler never blocks.

    After an abort the CLI's thread prints the report once the rows have ended
    (:meth:`may_report`, then :meth:`reported`) and exits 130 itself; the abort is the
    watchdog: if that has not happened :data:`REPORT_S` before :data:`ABORT_S`, it flushes
    the output, prints ``short_report()`` and the last line, and ends the process.
    """

    def __init__(self, stop: threading.Event, say: Callable[[str], None], out: IO[bytes] | None) -> None:
        self.stop, self.say, self.out = stop, say, out
        self.signals: list[int] = []
        self._handling_first = False
        """The first signal's handler is running (see SAME_SIGNAL)."""
        self.system: Any = None
        """The dispatch system, once started (what a signal stops): set it with :meth:`attach`."""
        self.halting: Any = None
        """The stop a first signal began (a thread, or a greenlet under gevent), or None."""
        self.aborting: Any = None
        """The abort under way (a thread, or a greenlet under gevent), or None."""
        self.short_report: Callable[[], None] | None = None
        """Prints the report from what the run knows so far (the abort's own, when the
        rows do not end in time); set by the CLI."""
        self.write_out: Callable[[], None] | None = None
        """Writes what the output still holds back (the rows finished behind one that did
        not end), before the abort's own report; set by the CLI."""
        self.last_line: Callable[[], str] = lambda: (
            "aborted: receipts not yet sent were released; rerun the same command to resume"
        )
        """The abort's last line (what the output holds, how to resume); set by the CLI."""
        self._previous: dict[int, Any] = {}
        self._reporter = threading.Lock()
        """Held by whoever prints the report after an abort: the CLI's thread or the abort."""
        self._reported = threading.Event()
        """The CLI's thread printed the report: the abort has nothing left to say."""

    def attach(self, system: Any) -> None:
        """The dispatch system has started: a signal stops it (one that came already, now)."""
        self.system = system
        if self.stop.is_set() and self.signals:
            self._halt_soon()

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def aborted(self) -> bool:
        """A second signal came: the run is being aborted."""
        return self.aborting is not None

    def may_report(self) -> bool:
        """After an abort, whether the CLI's thread prints the report: False once the
        abort printed its own (then :meth:`wait_for_abort`: it ends the process)."""
        return self._reporter.acquire(blocking=False)

    def reported(self) -> None:
        """The CLI's thread printed the report and its last line: the abort exits no one."""
        self._reported.set()

    def wait_for_abort(self) -> None:
        """If an abort is under way, wait for it (it may end the process)."""
        if self.aborting is not None:
            self.aborting.join()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._handling_first and signum == self.signals[0]:
            return  # the first one delivered again while it is handled (GNU timeout: see SAME_SIGNAL)
        self.signals.append(signum)
        if len(self.signals) == 1:
            self._handling_first = True
            try:
                self.stop.set()
                self._halt_soon()  # before saying so: every call not yet sent is refused from now on
                self.say(
                    f"interrupted ({signal.Signals(signum).name}): calls not yet sent are refused and "
                    "their receipts released; finishing the requests already sent "
                    "(interrupt again to abort within 10 s)"
                )
            finally:
                self._handling_first = False
        elif self.aborting is None:
            self.aborting = _spawn(self._abort, "tooldispatch-abort", daemon=False)

    def _halt_soon(self) -> None:
        """Stop the system (if started) on a thread of its own: a handler never blocks."""
        if self.system is not None and self.halting is None:
            self.halting = _spawn(self._halt, "tooldispatch-stop", daemon=True)

    def _halt(self) -> None:
        with contextlib.suppress(Exception):  # the CLI's own exit stops it again, and says what failed
            self.system.stop(timeout_s=STOP_S)

    def _abort(self) -> None:
        deadline = time.monotonic() + ABORT_S
        done = threading.Event()

        def stop_system() -> None:
            try:
                if self.system is not None:
                    self.system.stop(timeout_s=ABORT_STOP_S)
            finally:
                done.set()

        threading.Thread(target=stop_system, name="tooldispatch-abort-stop", daemon=True).start()
        done.wait(ABORT_S - REPORT_S)
        # the CLI's thread reports once the rows have ended; this waits for it, up to a point
        if self._reported.wait(max(0.0, deadline - REPORT_S - time.monotonic())):
            return
        if not self.may_report():  # it is printing the report: until the last moment
            if not self._reported.wait(max(0.0, deadline - time.monotonic())):
                self._exit(None)
            return
        try:
            if self.write_out is not None:
                self.write_out()
            if self.out is not None:
                self.out.flush()
        except Exception:  # the output is best effort: the exit is not
            pass
        self._exit(self.short_report)

    def _exit(self, report: Callable[[], None] | None) -> None:
        """Print ``report`` (if any) and the last line; end the process with 130."""
        line = "aborted: receipts not yet sent were released; rerun the same command to resume"
        try:
            if report is not None:
                report()
            line = self.last_line()
        except Exception:  # the report is best effort: the exit is not
            pass
        finally:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            os._exit(130)


def _spawn(target: Callable[[], None], name: str, *, daemon: bool) -> Any:
    """Run ``target`` on a thread of its own (a greenlet under gevent), started now."""
    if runtime_name() == "gevent":
        # the handler may run in the hub's loop callback, where starting a (patched) thread
        # blocks: BlockingSwitchOutError. A greenlet is only scheduled
        import gevent

        return gevent.spawn(target)
    thread = threading.Thread(target=target, name=name, daemon=daemon)
    thread.start()
    return thread

"""While a system runs, the host's signal handlers raise on the host's own thread, to the host.

A signal's Python handler runs on the main thread, at the next bytecode, inside whatever
runs there. What it raises (Ctrl-C's default raises ``KeyboardInterrupt``; a host's
``sys.exit`` in a SIGTERM handler raises ``SystemExit``) is the host's, and must reach the
host's code. Two things stood in the way:

* under gevent the main thread runs every greenlet: the handler ran inside an actor or a
  tool, and pykka answers such an error in an actor by stopping every actor in the
  process (results already paid for were dropped unstored, and the host never saw it);
* on either runtime, the front door runs the caller's input and credentials code on the
  caller's thread, and makes what that code raises (``SystemExit`` included) the call's
  error: a handler's ``SystemExit`` landing there became an ``InvalidInputError``.

So while a system runs, each Python-level handler of :data:`SIGNALS` installed before it
started is wrapped (:func:`hold`). What the handler raises is noted
(:func:`actors.errors.note_signalled`): no catch-all of this library swallows it or makes
it a call's error (:func:`actors.errors.hosts_own`). Under gevent, a handler raised off
the main greenlet runs instead from the hub's loop, and what it raises is thrown into the
main greenlet, where the host waits: gevent's own rule for errors that end a program
(``Hub.SYSTEM_ERROR``), applied to every handler. The wrappers are removed when the last
system stops (:func:`release`), unless the host replaced them.

A handler the host installs while a system runs is its own: install handlers before
starting a system (under gevent, or use ``gevent.signal_handler``). Should one raise
``KeyboardInterrupt`` or ``SystemExit`` inside an actor, :func:`hand_to_host` passes it
on to the main greenlet rather than let pykka stop every actor.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from actors.errors import note_signalled
from actors.runtime.nesting import _getcurrent

__all__ = ["SIGNALS", "hand_to_host", "hold", "release"]

SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)
"""The signals whose Python handlers are run on the main greenlet (those a host hooks
to end or steer its run; never SIGCHLD, which gevent watches itself)."""

_lock = threading.Lock()
_holders = 0
_wrapped: dict[int, tuple[Any, Callable[[int, Any], Any]]] = {}
"""signal -> (the host's handler, the wrapper installed in its place)."""


def _main_greenlet() -> Any:
    assert _getcurrent is not None
    g = _getcurrent()
    while g.parent is not None:
        g = g.parent
    return g


def _gevent_running() -> bool:
    from actors.runtime.actor import runtime_name

    return runtime_name() == "gevent" and _getcurrent is not None


def _wrap(handler: Callable[[int, Any], Any], main: Any) -> Callable[[int, Any], Any]:
    """``handler`` wrapped: what it raises is noted as the host's; under gevent (``main``:
    the main greenlet) it runs on the main greenlet or from the hub's loop."""

    def noted(signum: int, frame: Any) -> Any:
        try:
            return handler(signum, frame)
        except BaseException as exc:
            note_signalled(exc)
            raise

    def on_main_greenlet(signum: int, frame: Any) -> Any:
        if _getcurrent() is main:  # type: ignore[misc]
            return noted(signum, frame)
        import gevent

        gevent.get_hub().loop.run_callback(_run_for_host, handler, signum, main)
        return None

    wrapper = noted if main is None else on_main_greenlet
    wrapper.__wrapped__ = handler  # type: ignore[attr-defined]
    return wrapper


def _run_for_host(handler: Callable[[int, Any], Any], signum: int, main: Any) -> None:
    try:
        handler(signum, None)
    except BaseException as exc:  # what the handler raises is the host's: thrown where it waits
        note_signalled(exc)
        if not main.dead:
            main.throw(exc)


def hold() -> None:
    """A system started: wrap the handlers of :data:`SIGNALS` (from the main thread;
    elsewhere nothing is done)."""
    global _holders
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        main = _main_greenlet() if _gevent_running() else None
        for sig in SIGNALS:
            try:
                handler = signal.getsignal(sig)
                if not callable(handler):  # SIG_DFL, SIG_IGN or not set from Python
                    continue
                wrapper = _wrap(handler, main)
                signal.signal(sig, wrapper)
            except (ValueError, OSError):  # not the main thread, or a signal it cannot take
                continue
            _wrapped[sig] = (handler, wrapper)


def release() -> None:
    """A system stopped: once none runs, put back each handler still wrapped."""
    global _holders
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders:
            return
        for sig, (handler, wrapper) in list(_wrapped.items()):
            try:
                if signal.getsignal(sig) is wrapper:  # the host may have replaced it
                    signal.signal(sig, handler)
            except (ValueError, OSError):
                continue
            del _wrapped[sig]


def hand_to_host(exc: BaseException) -> bool:
    """Under gevent, pass ``exc`` (``KeyboardInterrupt`` or ``SystemExit``, raised by a
    signal handler inside an actor or a tool's greenlet) on to the main greenlet. True
    when it was passed on (the caller carries on), False when the caller is the main
    greenlet or runs on plain threads (the caller re-raises)."""
    if not _gevent_running() or not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    main = _main_greenlet()
    if _getcurrent() is main:  # type: ignore[misc]
        return False
    import gevent

    gevent.get_hub().loop.run_callback(_throw, main, exc)
    return True


def _throw(main: Any, exc: BaseException) -> None:
    if not main.dead:
        main.throw(exc)

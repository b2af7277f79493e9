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

So while a system runs, every Python-level handler of :data:`SIGNALS` is wrapped
(:func:`hold`): those installed before a system started, at each start (and, should a
start run off the main thread, at the host's next call on it: :func:`cover`), and those
installed while one runs, as they are installed (``signal.signal`` is intercepted while
held; ``signal.getsignal`` and ``signal.signal``'s return value still give the host's
own handler, never the wrapper). What a wrapped handler raises is noted
(:func:`actors.errors.note_signalled`): no catch-all of this library swallows it or makes
it a call's error (:func:`actors.errors.hosts_own`).

Under gevent a handler set off outside the main greenlet runs on the main greenlet all
the same, as on plain threads, where the main thread runs it wherever it is: when the
main greenlet waits on a future of this library (or in ``stop``), the handler is thrown
into it as an :class:`~actors.runtime.futures.Interjection` and runs there (it may
block: call ``stop``, sleep), and the wait goes on after it unless it raised. Waiting
anywhere else, the main greenlet goes on meanwhile: the handler runs in a greenlet of
its own (it may block there too), and what it raises is thrown into the main greenlet
(gevent's rule for errors that end a program, ``Hub.SYSTEM_ERROR``). Never in the hub's
loop callback, where blocking raises ``BlockingSwitchOutError``.

The wrappers are removed, and ``signal.signal`` and ``signal.getsignal`` put back, when
the last system stops (:func:`release`). A handler installed through a reference to
``signal.signal`` taken before the first start is not seen until the next start; should
it raise ``KeyboardInterrupt`` or ``SystemExit`` inside an actor, :func:`hand_to_host`
passes it on to the main greenlet rather than let pykka stop every actor.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from actors.errors import note_signalled
from actors.runtime import futures as _futures
from actors.runtime.flavor import getcurrent, runtime_name
from actors.runtime.futures import Interjection, waits_here

__all__ = ["SIGNALS", "cover", "hand_to_host", "hold", "release", "settle", "stopping"]

SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)
"""The signals whose Python handlers are run on the main greenlet (those a host hooks
to end or steer its run; never SIGCHLD, which gevent watches itself)."""

_lock = threading.RLock()
"""Guards the count and the interception (re-entrant: a handler may install a handler)."""
_holders = 0
_owed = False
"""A start ran off the main thread: the handlers installed before it are still to wrap."""
_base: tuple[Any, Any] | None = None
"""``(signal.signal, signal.getsignal)`` as they were before the interception (kept after
the last stop only when another patch made over it since still calls it)."""


class _Held:
    """The host's ``handler`` as installed while a system runs: what it raises is noted as
    the host's, and under gevent it runs on the main greenlet (see the module doc)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[int, Any], Any]) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> Any:
        if not _gevent_running():
            return _noted(self.handler, signum, frame)
        main = _main_greenlet()  # (a signal's handler runs on the main thread: its root greenlet)
        if getcurrent() is main:  # type: ignore[misc]
            return _noted(self.handler, signum, frame)
        import gevent

        gevent.get_hub().loop.run_callback(_to_main, self.handler, signum, main)
        return None


def _noted(handler: Callable[[int, Any], Any], signum: int, frame: Any) -> Any:
    try:
        return handler(signum, frame)
    except BaseException as exc:
        note_signalled(exc)
        raise


def _main_greenlet() -> Any:
    assert getcurrent is not None
    g = getcurrent()
    while g.parent is not None:
        g = g.parent
    return g


def _gevent_running() -> bool:
    return runtime_name() == "gevent" and getcurrent is not None


def _to_main(handler: Callable[[int, Any], Any], signum: int, main: Any) -> None:
    """From the hub's loop: run ``handler`` on the main greenlet if it waits where it can
    take it, else in a greenlet of its own."""
    if main.dead:
        return
    if waits_here(main.gr_frame):
        main.throw(Interjection(lambda: _noted(handler, signum, None)))
        return
    import gevent
    from gevent.event import Event

    run = _Run(Event())
    _runs.append(run)
    _futures.settle = settle
    gevent.spawn_raw(_run_for_host, run, handler, signum, main)


class _Run:
    """A handler running in a greenlet of its own: until the host has had what it raised,
    the main greenlet's next way back into the host's code through this library waits
    for it (:func:`settle`)."""

    __slots__ = ("done", "error", "taken")

    def __init__(self, done: Any) -> None:
        self.done = done
        self.error: BaseException | None = None
        self.taken = False


_runs: list[_Run] = []
_stopping: set[int] = set()
"""Threads (greenlets) inside a system's stop: :func:`settle` waits for none there (the
handler may be waiting on that very stop)."""


def _run_for_host(run: _Run, handler: Callable[[int, Any], Any], signum: int, main: Any) -> None:
    try:
        handler(signum, None)
    except BaseException as exc:  # what the handler raises is the host's: thrown where it waits
        note_signalled(exc)
        run.error = exc
        import gevent

        gevent.get_hub().loop.run_callback(_hand_over, run, main)
    else:
        _forget(run)
    finally:
        run.done.set()


def _hand_over(run: _Run, main: Any) -> None:
    if run.taken:  # the main greenlet had it already (settle)
        return
    _forget(run)
    if not main.dead:
        main.throw(run.error)


def _forget(run: _Run) -> None:
    run.taken = True
    if run in _runs:
        _runs.remove(run)
    if not _runs:
        _futures.settle = None


def settle() -> None:
    """On the main greenlet, before a result of this library reaches the host's code (a
    future's ``get``, ``stop``): wait for the handlers running in greenlets of their own,
    and raise what one raised. Their effects (a ``stop`` that cancelled the very call the
    host waited on) never come to the host before their exit, as on plain threads, where
    the main thread runs the handler before anything else. Nothing elsewhere."""
    if not _runs or threading.get_ident() in _stopping or getcurrent is None:
        return
    if getcurrent().parent is not None:  # not the main greenlet
        return
    for run in list(_runs):
        run.done.wait()
        if run.error is not None and not run.taken:
            _forget(run)
            raise run.error


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """Around a system's stop on the calling thread (greenlet): :func:`settle` waits there
    for nothing, then once at its end."""
    me = threading.get_ident()
    _stopping.add(me)
    try:
        yield
    finally:
        _stopping.discard(me)
    settle()


def _shown(installed: Any) -> Any:
    """What the host installed: its own handler for one of the wrappers."""
    return installed.handler if isinstance(installed, _Held) else installed


def _intercepted_signal(signalnum: int, handler: Any) -> Any:
    """``signal.signal`` while a system runs: a Python handler of :data:`SIGNALS` is
    installed wrapped; returns the previous handler as the host installed it."""
    with _lock:
        assert _base is not None
        if _holders and signalnum in SIGNALS and callable(handler):
            handler = _Held(_shown(handler))
        return _shown(_base[0](signalnum, handler))


def _intercepted_getsignal(signalnum: int) -> Any:
    """``signal.getsignal`` while a system runs: the handler as the host installed it."""
    assert _base is not None
    return _shown(_base[1](signalnum))


def _wrap_installed(base_signal: Any, base_getsignal: Any) -> bool:
    """Wrap each Python handler of :data:`SIGNALS` not wrapped yet; False off the main
    thread (where none can be installed)."""
    for sig in SIGNALS:
        try:
            handler = base_getsignal(sig)
            if callable(handler) and not isinstance(handler, _Held):  # (not SIG_DFL, SIG_IGN, None)
                base_signal(sig, _Held(handler))
        except ValueError:  # not the main thread
            return False
        except OSError:  # a signal it cannot take
            continue
    return True


def hold() -> None:
    """A system started: wrap the handlers of :data:`SIGNALS` not wrapped yet (from the
    main thread; from another, they are wrapped at the next :func:`cover` on the main
    thread), and intercept ``signal.signal`` so those installed later are wrapped too."""
    global _holders, _base, _owed
    with _lock:
        _holders += 1
        if _base is None:
            _base = (signal.signal, signal.getsignal)
            signal.signal = _intercepted_signal
            signal.getsignal = _intercepted_getsignal
        _owed = not _wrap_installed(*_base)


def cover() -> None:
    """Called by the front door on the caller's thread: should a start have run off the
    main thread, wrap the handlers installed before it, once a call comes from the main
    thread. Nothing otherwise (a read of one flag)."""
    global _owed
    if not _owed:
        return
    with _lock:
        if _owed and _base is not None:
            _owed = not _wrap_installed(*_base)


def release() -> None:
    """A system stopped: once none runs, put back each handler as the host installed it,
    and ``signal.signal`` and ``signal.getsignal`` as they were."""
    global _holders, _base, _owed
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders or _base is None:
            return
        base_signal, base_getsignal = _base
        for sig in SIGNALS:
            try:
                installed = base_getsignal(sig)
                if isinstance(installed, _Held):
                    base_signal(sig, installed.handler)
            except (ValueError, OSError):  # not the main thread: they stay wrapped (still noted)
                continue
        _owed = False
        if signal.signal is _intercepted_signal and signal.getsignal is _intercepted_getsignal:
            signal.signal, signal.getsignal = base_signal, base_getsignal
            _base = None
        # else another patch made over them since calls them still: they pass through


def hand_to_host(exc: BaseException) -> bool:
    """Under gevent, pass ``exc`` (``KeyboardInterrupt`` or ``SystemExit``, raised by a
    signal handler inside an actor or a tool's greenlet) on to the main greenlet. True
    when it was passed on (the caller carries on), False when the caller is the main
    greenlet or runs on plain threads (the caller re-raises)."""
    if not _gevent_running() or not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    main = _main_greenlet()
    if getcurrent() is main:  # type: ignore[misc]
        return False
    import gevent

    gevent.get_hub().loop.run_callback(_throw, main, exc)
    return True


def _throw(main: Any, exc: BaseException) -> None:
    if not main.dead:
        main.throw(exc)

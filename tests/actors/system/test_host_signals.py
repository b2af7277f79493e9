"""A signal a busy host receives is the host's: its handler's ``KeyboardInterrupt`` or
``SystemExit`` reaches the host's own code, the system keeps serving, and every result
paid for is stored. Under gevent a handler ran in whichever greenlet ran at that moment
(an actor's, a tool's): pykka answered the error by stopping every actor, results paid
for were dropped, and the host never saw its interrupt. Real child processes in this
run's runtime, real signals, real SQLite files.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import Tool
from actors.errors import signalled

from .test_exit_without_stop import child_env

pytestmark = pytest.mark.scenario

INTERRUPTS = 8

_HOST = textwrap.dedent(
    """
    import signal, sys
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    db, how = sys.argv[1], sys.argv[2]

    def fast(i, c):
        with open(db + ".paid", "a") as out:  # what the provider was paid for
            out.write("%d\\n" % i["i"])
        return {"i": i["i"]}

    def leave(signum, frame):
        sys.exit(5)

    if how == "sigterm-exits":  # the host's own handler, installed before the system starts
        signal.signal(signal.SIGTERM, leave)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="fast", fn=fast)], store=SqliteReceiptStore(db),
        run=RunInfo(run_id="r", org_id="o", scope="s"),
    )
    proxy = system.proxy()
    print("running", flush=True)
    n = seen = 0
    while seen < INTERRUPTS:  # (goes round only after a signal: the next comes 0.3 s later)
        try:
            while True:  # a signal is handled at a loop's jump back: this one is inside the try
                for f in proxy.execute_many("fast", [{"i": n + k} for k in range(100)]):
                    f.get(timeout=30)
                n += 100
        except (KeyboardInterrupt, SystemExit) as exc:
            seen += 1
            n += 100
            print("got " + type(exc).__name__, flush=True)
    system.stop(timeout_s=30)
    print("stopped", flush=True)
    """
).replace("INTERRUPTS", str(INTERRUPTS))


@pytest.mark.parametrize(
    ("how", "sig", "seen"),
    [
        pytest.param("ctrl-c", signal.SIGINT, "KeyboardInterrupt", id="ctrl-c"),
        pytest.param("sigterm-exits", signal.SIGTERM, "SystemExit", id="sigterm-handler-exits"),
    ],
)
def test_a_signal_to_a_busy_host_reaches_the_host_and_every_paid_result_is_stored(
    runtime: Any, tmp_path: Path, how: str, sig: int, seen: str
) -> None:
    script, db = tmp_path / "host.py", tmp_path / "r.db"
    script.write_text(_HOST)
    env, prefix = child_env(runtime)
    proc = subprocess.Popen(
        [*prefix, str(script), str(db), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running", proc.stderr.read() if proc.stderr else ""
        for _ in range(INTERRUPTS):  # each while calls are under way (100 a batch, back to back)
            time.sleep(0.3)
            proc.send_signal(sig)
            line = proc.stdout.readline().strip()
            if line != f"got {seen}":
                pytest.fail(f"the host said {line!r}, not 'got {seen}':\n{proc.stderr.read()[-4000:]}")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert out.strip() == "stopped" and proc.returncode == 0, err[-3000:]
    paid = set((tmp_path / "r.db.paid").read_text().split())
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT status, count(*) FROM receipts GROUP BY status").fetchall())
    assert stored.pop("completed") == len(paid), err[-3000:]  # nothing paid for is lost
    assert set(stored) <= {"pending"}, (stored, err[-3000:])  # calls not yet sent: released


def test_an_interrupt_raised_inside_an_actor_goes_to_the_host_and_the_actor_lives_on(runtime: Any) -> None:
    """A handler the host installs after the system started is not wrapped: should it raise
    inside an actor's handler, the error is thrown into the host's greenlet and the actor
    (and every other) goes on, where pykka would stop them all."""
    if runtime != "gevent":
        pytest.skip("on plain threads a signal handler runs on the main thread only (the host's)")
    import gevent

    from actors.runtime import InboxActor, guarded

    class Struck(InboxActor):
        @guarded
        def on_receive(self, message: Any) -> Any:
            if message == "struck":
                raise KeyboardInterrupt  # as a handler raising while this actor runs
            return "alive"

    ref = Struck.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ref.tell("struck")
            gevent.sleep(2.0)  # thrown into this (the main) greenlet meanwhile
        assert ref.ask("ping", timeout=5) == "alive"
    finally:
        ref.stop()


class _Signals(list[Any]):
    """An input whose own code, read while it is keyed on the caller's thread, is where
    the host's signal handler runs (the signal arrives meanwhile)."""

    def __iter__(self) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the handler runs at one of these bytecodes
            pass
        return super().__iter__()


@pytest.fixture
def exits_on_sigterm() -> Any:
    """Installs the host's SIGTERM handler, ``sys.exit(5)`` (``install()``: before or after
    the system starts); the one before it is put back at teardown."""
    before = signal.getsignal(signal.SIGTERM)

    def leave(signum: int, frame: Any) -> None:
        sys.exit(5)

    yield lambda: signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("installed", ["before-start", "after-start"])
@pytest.mark.parametrize("where", ["input", "credentials"])
def test_a_signal_handlers_exit_on_the_callers_thread_is_the_hosts_not_the_calls(
    make_system: Any, exits_on_sigterm: Any, where: str, installed: str
) -> None:
    """The front door runs the input's and the credentials function's code on the caller's
    thread, and what that code raises, SystemExit included, is the call's error. What the
    host's signal handler raises there is the host's: it leaves ``execute`` as it came,
    and the system goes on (before: an ``InvalidInputError`` or ``DispatchError`` of that
    call, and the host never exited; so it still was for a handler installed after the
    system started, which was not wrapped)."""
    asked = {"n": 0}

    def credentials() -> str:
        asked["n"] += 1
        if asked["n"] == 1 and where == "credentials":
            _Signals([1]).__iter__()
        return "key"

    if installed == "before-start":
        exits_on_sigterm()
    system = make_system(
        [
            Tool(tool_id="t", fn=lambda i, c: {"v": 1}),
            Tool(tool_id="c", fn=lambda i, c: {"v": 2}, credentials=credentials),
        ]
    )
    if installed == "after-start":
        exits_on_sigterm()
    with pytest.raises(SystemExit) as raised:
        if where == "input":
            system.proxy().execute_many("t", [{"n": 1}, {"rows": _Signals([1])}])
        else:
            system.proxy().execute("c", {"n": 1})
    assert raised.value.code == 5
    assert system.proxy().execute("t", {"n": 2}).get(timeout=10).value == {"v": 1}
    assert system.proxy().execute("c", {"n": 2}).get(timeout=10).value == {"v": 2}


class _Raised(Exception):
    """What the test's own signal handler raises."""


def _raise_on_usr1(signum: int, frame: Any) -> None:
    raise _Raised


def _raised_by_usr1() -> BaseException:
    """Sends SIGUSR1 to this process and returns what its handler raised (the handler runs
    on the main thread before ``raise_signal`` returns)."""
    try:
        signal.raise_signal(signal.SIGUSR1)
    except _Raised as exc:
        return exc
    pytest.fail("the SIGUSR1 handler did not run")


@pytest.fixture
def usr1_restored() -> Any:
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


def test_a_handler_installed_while_a_system_runs_is_wrapped_yet_shown_as_the_hosts_own(
    make_system: Any, usr1_restored: Any
) -> None:
    """Installed after the start, the handler raises as the host's (noted, so no catch-all
    of this library makes it a call's error); ``signal.getsignal`` and ``signal.signal``'s
    return value give the host's own function, never the wrapper, before and after the
    stop (before: it was not wrapped at all)."""
    system = make_system([Tool(tool_id="t", fn=lambda i, c: {"v": 1})])
    signal.signal(signal.SIGUSR1, _raise_on_usr1)
    assert signal.getsignal(signal.SIGUSR1) is _raise_on_usr1
    assert signalled(_raised_by_usr1())
    assert signal.signal(signal.SIGUSR1, _raise_on_usr1) is _raise_on_usr1  # (installed again: once wrapped)
    assert signalled(_raised_by_usr1())
    system.stop()
    assert signal.getsignal(signal.SIGUSR1) is _raise_on_usr1


@pytest.mark.parametrize("then", ["a-start-on-the-main-thread", "a-call-from-the-main-thread"])
def test_handlers_installed_before_a_first_start_off_the_main_thread_are_wrapped_later(
    runtime: Any, make_system: Any, usr1_restored: Any, then: str
) -> None:
    """A start off the main thread cannot wrap the handlers (only the main thread installs
    them): they are wrapped at the next start on the main thread, or at the host's next
    call from it (before: the first start counted as the holder and no later start
    wrapped anything)."""
    if runtime == "gevent":
        pytest.skip("under gevent every system runs on the main thread's hub")
    signal.signal(signal.SIGUSR1, _raise_on_usr1)
    tools = [Tool(tool_id="t", fn=lambda i, c: {"v": 1})]
    started: list[Any] = []
    starter = threading.Thread(target=lambda: started.append(make_system(tools)))
    starter.start()
    starter.join(timeout=30)
    assert started, "the system did not start off the main thread"
    if then == "a-start-on-the-main-thread":
        make_system(tools, run_id="second")
    else:
        assert started[0].proxy().execute("t", {"n": 1}).get(timeout=10).value == {"v": 1}
    assert signalled(_raised_by_usr1())


_BLOCKING_HOST = textwrap.dedent(
    """
    import signal, sys, threading, time
    from greenlet import getcurrent
    from actors import DispatchSystem, RunInfo, Tool
    from stores import SqliteReceiptStore

    db, how, waits = sys.argv[1], sys.argv[2], sys.argv[3]

    def fast(i, c):
        if waits == "elsewhere":  # still running when the handler's stop waits for them
            time.sleep(0.3)
        with open(db + ".paid", "a") as out:  # what the provider was paid for
            out.write("%d\\n" % i["i"])
        return {"i": i["i"]}

    def leave(signum, frame):  # the host's own handler, which blocks, then exits
        on_main = threading.current_thread() is threading.main_thread() and getcurrent().parent is None
        print("handler on main: %s" % on_main, flush=True)
        if how == "stops":
            system.stop(timeout_s=30)
        else:
            time.sleep(0.5)
        sys.exit(5)

    signal.signal(signal.SIGTERM, leave)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="fast", fn=fast)], store=SqliteReceiptStore(db),
        run=RunInfo(run_id="r", org_id="o", scope="s"),
    )
    proxy = system.proxy()
    print("running", flush=True)
    n = 0
    try:
        while True:
            if waits == "futures":
                for f in proxy.execute_many("fast", [{"i": n + k} for k in range(100)]):
                    f.get(timeout=30)
            else:  # the host waits elsewhere (its own sleep) while calls run, then on them
                futures = proxy.execute_many("fast", [{"i": n + k} for k in range(100)])
                time.sleep(0.2)
                for f in futures:
                    f.get(timeout=30)
            n += 100
    except SystemExit as exc:
        print("got SystemExit %s" % exc.code, flush=True)
        system.stop(timeout_s=30)
        raise
    """
)


@pytest.mark.parametrize("waits", ["futures", "elsewhere"])
@pytest.mark.parametrize("how", ["stops", "sleeps"])
def test_a_handler_that_blocks_runs_and_its_exit_reaches_the_host(
    runtime: Any, tmp_path: Path, how: str, waits: str
) -> None:
    """The host's SIGTERM handler blocks (it stops the system, or sleeps), then exits.
    Under gevent it ran in the hub's loop callback, where blocking raised
    ``BlockingSwitchOutError`` (and run in a greenlet of its own, its ``stop`` cancelled
    the calls the host waited on, so the host ended on their ``CallCancelledError`` before
    the handler's exit came). Now it runs on the host's main greenlet when that waits on a
    future, as on plain threads, else in a greenlet of its own whose exit is thrown into
    the host's, and the host's next ``get`` waits for it first; every result paid for is
    stored."""
    script, db = tmp_path / "host.py", tmp_path / "r.db"
    script.write_text(_BLOCKING_HOST)
    env, prefix = child_env(runtime)
    proc = subprocess.Popen(
        [*prefix, str(script), str(db), how, waits], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running", proc.stderr.read() if proc.stderr else ""
        time.sleep(0.5)  # calls under way
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = out.split("\n")
    assert "got SystemExit 5" in lines and proc.returncode == 5, (out, err[-3000:])
    if waits == "futures":  # where the main thread would have run it
        assert "handler on main: True" in lines, out
    assert "Error" not in err, err[-3000:]
    paid = set((tmp_path / "r.db.paid").read_text().split())
    with sqlite3.connect(db) as conn:
        stored = dict(conn.execute("SELECT status, count(*) FROM receipts GROUP BY status").fetchall())
    assert stored.pop("completed") == len(paid), err[-3000:]  # nothing paid for is lost
    assert set(stored) <= {"pending"}, (stored, err[-3000:])

"""Whether a lease's holder process is gone: real child processes (alive, exited, zombie).

A step of the wall clock (NTP, a VM resumed, ``date -s``) moves the boot time the kernel
reports, and with it psutil's ``create_time()`` of every process: a live holder's
recorded start time then no longer matched, the holder was judged gone and its lease
taken over (the call ran twice). A step is simulated by moving psutil's boot time (the
system clock itself is the machine's). Start times are still recorded as psutil's epoch
seconds, so processes of an older version judge this version's leases as before."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from stores.process import current_process_identity, process_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

_RECORD = (
    "from stores.process import current_process_identity as c; print(c().started_at, flush=True); input()"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A child process that recorded its own identity (as a lease holder does) and waits."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECORD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _recorded(proc: subprocess.Popen[str]) -> float:
    assert proc.stdout is not None
    return float(proc.stdout.readline())


@pytest.fixture
def clock_step(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``clock_step(seconds)``: psutil now reports the boot time moved by ``seconds``."""
    from psutil import _pslinux

    real = _pslinux.boot_time

    def step(seconds: float) -> None:
        monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + seconds)

    return step


@pytest.mark.parametrize("seconds", [2.0, -1.0, 3600.0])
def test_a_live_holder_is_not_gone_after_a_clock_step(child: Any, clock_step: Any, seconds: float) -> None:
    here = current_process_identity()
    recorded = _recorded(child)
    clock_step(seconds)
    assert not process_gone(here.host, child.pid, recorded)
    assert not process_gone(here.host, here.pid, here.started_at)


def test_a_holder_records_psutils_epoch_start_time(child: Any) -> None:
    """What every version records and an older version compares."""
    assert abs(_recorded(child) - psutil.Process(child.pid).create_time()) < 0.05


def test_a_holder_that_exited_or_is_a_zombie_is_gone(child: Any) -> None:
    here = current_process_identity()
    recorded = _recorded(child)
    child.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:  # reaped already (gevent reaps its children itself)
            break
        time.sleep(0.01)
    assert process_gone(here.host, child.pid, recorded)  # not yet reaped: a zombie (or reaped)
    child.wait()
    assert process_gone(here.host, child.pid, recorded)  # reaped: no such process


@pytest.mark.parametrize("earlier_s", [0.37, 29.5, 3600.01])
def test_a_pid_reused_by_a_later_process_is_gone(child: Any, earlier_s: float) -> None:
    """The lease was recorded by an earlier process that had this pid (its start differs,
    not by whole seconds); another host's pids are never judged."""
    here = current_process_identity()
    recorded = _recorded(child) - earlier_s
    assert process_gone(here.host, child.pid, recorded)
    assert not process_gone("elsewhere#1", child.pid, recorded)
    assert not process_gone(here.host, child.pid, None)


def test_a_holder_hidden_from_proc_is_never_judged_gone(child: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With /proc mounted ``hidepid=2`` another user's live process has no /proc entry
    here: it was judged gone and its lease taken over. Hidden and alive (signal 0 says
    EPERM) is unknown, never gone; a pid signal 0 does not find is gone. (Simulated: the
    child is reaped, so /proc has no entry, and signal 0 answers as for a hidden one.)"""
    import os

    here = current_process_identity()
    recorded = _recorded(child)
    child.kill()
    child.wait()

    def hidden(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", hidden)
    assert not process_gone(here.host, child.pid, recorded)
    monkeypatch.undo()
    assert process_gone(here.host, child.pid, recorded)

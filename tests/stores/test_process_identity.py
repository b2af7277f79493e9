"""Whether a lease's holder process is gone: real child processes (alive, exited, zombie).

A step of the wall clock (NTP, a VM resumed, ``date -s``) moves the boot time the kernel
reports, and with it psutil's ``create_time()`` of every process: a live holder's
recorded start time then no longer matched, the holder was judged gone and its lease
taken over (the call ran twice). A step is simulated by moving psutil's boot time (the
system clock itself is the machine's)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from stores._process import current_process_identity, process_gone, process_started_at

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


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
    recorded = process_started_at(child.pid)
    clock_step(seconds)
    assert not process_gone(here.host, child.pid, recorded)
    assert not process_gone(here.host, here.pid, here.started_at)


def test_a_holder_that_exited_or_is_a_zombie_is_gone(child: Any) -> None:
    here = current_process_identity()
    recorded = process_started_at(child.pid)
    child.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_gone(here.host, child.pid, recorded)  # not yet reaped: a zombie
    child.wait()
    assert process_gone(here.host, child.pid, recorded)  # reaped: no such process


def test_a_pid_reused_by_a_later_process_is_gone_and_other_hosts_are_never_judged(child: Any) -> None:
    here = current_process_identity()
    recorded = process_started_at(child.pid)
    assert process_gone(here.host, child.pid, recorded - 30.0)  # its pid, another start: reused
    assert not process_gone("elsewhere#1", child.pid, recorded - 30.0)
    assert not process_gone(here.host, child.pid, None)


def test_an_epoch_start_time_written_by_an_older_version_is_still_judged(child: Any) -> None:
    here = current_process_identity()
    epoch = psutil.Process(child.pid).create_time()
    assert not process_gone(here.host, child.pid, epoch)
    assert process_gone(here.host, child.pid, epoch - 30.0)

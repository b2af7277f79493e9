"""Which process holds a lease, and whether it still exists.

A lease records its holder's host, process id and process start time
(:class:`~stores.types.Owner`). Process ids only compare within one pid namespace of
one boot of one kernel, so the host part is the host name plus a digest of the boot id
(``/proc/sys/kernel/random/boot_id``) and the pid namespace (``/proc/self/ns/pid``);
where those are unreadable (not Linux) the host name alone is used. The start time tells
a pid the OS gave to a new process after the holder died from the holder. On Linux it is
seconds since boot (``starttime`` of ``/proc/PID/stat``), which no clock step changes:
psutil's ``create_time()`` adds the boot time the kernel derives from the wall clock, so
after the clock was stepped (NTP, a VM resumed, ``date -s``) another process computes a
different start time for a live holder and would judge it gone, and take over its lease
(the call paid twice). Elsewhere it is psutil's epoch seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket

import attrs
import psutil

__all__ = ["ProcessIdentity", "current_process_identity", "process_gone", "process_started_at"]

_START_TOLERANCE_S = 0.05
"""Start times are whole clock ticks (1/100 s on Linux)."""
_LEGACY_TOLERANCE_S = 1.5
"""An epoch start time recorded by an older version, judged against psutil's (its boot
time is a whole second, read at different times by different processes)."""
_EPOCH_FLOOR = 1e9
"""Start times above this are epoch seconds (2001 on); seconds since boot are far below."""
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _since_boot(pid: int) -> float | None:
    """Seconds from boot to the start of ``pid`` (Linux), None where /proc cannot say.

    Raises:
        ProcessLookupError: no process ``pid`` exists (Linux).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise ProcessLookupError(pid) from None
        return None
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    if fields[0] == b"Z":
        raise ProcessLookupError(pid)  # a zombie is gone
    return int(fields[19]) / _TICKS


def _started_at(pid: int) -> float:
    """``pid``'s start time as leases record it (see the module docstring).

    Raises:
        ProcessLookupError / psutil.NoSuchProcess: no such process; psutil.Error: the OS refused.
    """
    since_boot = _since_boot(pid)
    return since_boot if since_boot is not None else psutil.Process(pid).create_time()


@attrs.frozen
class ProcessIdentity:
    """One process: where it runs, its pid and its start time (epoch seconds)."""

    host: str
    pid: int
    started_at: float


def _host() -> str:
    parts = []
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as fh:
        parts.append(fh.read().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    name = socket.gethostname()
    if not parts:
        return name
    return f"{name}#{hashlib.sha256(':'.join(parts).encode()).hexdigest()[:12]}"


_cached: ProcessIdentity | None = None


def current_process_identity() -> ProcessIdentity:
    """This process's identity (recomputed after a fork).

    Raises:
        psutil.Error: the OS does not report this process's start time.
    """
    global _cached
    pid = os.getpid()
    if _cached is None or _cached.pid != pid:
        _cached = ProcessIdentity(_host(), pid, _started_at(pid))
    return _cached


def process_gone(host: str | None, pid: int | None, started_at: float | None) -> bool:
    """True only when the process is known to be gone: it ran on this host and no
    process with that pid and start time exists now (a zombie counts as gone).

    Anything unknown (another host, fields missing, the OS refusing to say) is False:
    a lease is never taken over on a guess.
    """
    if host is None or pid is None or started_at is None:
        return False
    here = current_process_identity()
    if host != here.host:
        return False
    legacy = started_at > _EPOCH_FLOOR and here.started_at < _EPOCH_FLOOR  # recorded by an older version
    try:
        if legacy:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started_at) > _LEGACY_TOLERANCE_S:
                return True
            return bool(proc.status() == psutil.STATUS_ZOMBIE)
        now = here.started_at if pid == here.pid else _started_at(pid)
        return abs(now - started_at) > _START_TOLERANCE_S
    except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.Error:
        return False


def process_started_at(pid: int) -> float:
    """``pid``'s start time as a lease records it (tests make owners of other processes).

    Raises:
        ProcessLookupError / psutil.NoSuchProcess: no such process.
    """
    return _started_at(pid)

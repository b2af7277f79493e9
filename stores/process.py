"""Which process holds a lease, and whether it still exists.

A lease records its holder's host, process id and process start time
(:class:`~stores.types.Owner`). Process ids only compare within one pid namespace of
one boot of one kernel, so the host part is the host name plus a digest of the boot id
(``/proc/sys/kernel/random/boot_id``) and the pid namespace (``/proc/self/ns/pid``);
where those are unreadable (not Linux) the host name alone is used. The start time tells
a pid the OS gave to a new process after the holder died from the holder.

Start times are psutil's ``create_time()``, epoch seconds, as every version records them:
on Linux the kernel's boot time in whole seconds (``btime``) plus the start in clock ticks
since boot. ``btime`` moves when the wall clock is stepped (NTP, a VM resumed,
``date -s``), so comparing two ``create_time()`` readings judged a live holder gone after
a step, and its lease was taken over (the call paid twice). On Linux a holder is judged
by its ticks instead, which no step moves: the recorded time less the pid's start since
boot is a whole number of seconds (the ``btime`` it was recorded with) for the holder
itself; for a later process given the same pid it is a whole number only when the two
starts differ by whole seconds (about one chance in a hundred), and then the lease is
simply waited out, never taken on a guess.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket

import attrs
import psutil

__all__ = ["ProcessIdentity", "current_process_identity", "process_gone"]

_START_TOLERANCE_S = 0.05
"""psutil derives start times from clock ticks (1/100 s on Linux)."""
_WHOLE_S = 1e-3
"""How far from a whole number of seconds a recorded start less its ticks may be (float
rounding: ticks are 1/100 s)."""
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Hidden(Exception):
    """The process exists but this process may not see it (``/proc`` mounted with
    ``hidepid``, another user's process): nothing is known of its start."""


def _exists(pid: int) -> bool:
    """Whether any process ``pid`` exists (signal 0 checks without sending anything).

    Raises:
        _Hidden: it exists, but is not this user's to look at.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        raise _Hidden(pid) from None
    return True


def _since_boot(pid: int) -> float | None:
    """Seconds from boot to the start of ``pid`` (Linux), None where /proc cannot say.

    Raises:
        ProcessLookupError: no process ``pid`` exists, or it is a zombie (Linux).
        _Hidden: ``pid`` exists but ``/proc`` hides it from this process.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            return None
        if _exists(pid):  # hidden from /proc (hidepid) though it runs: unknown, never "gone"
            raise _Hidden(pid) from None
        raise ProcessLookupError(pid) from None
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    if fields[0] == b"Z":
        raise ProcessLookupError(pid)
    return int(fields[19]) / _TICKS


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
        _cached = ProcessIdentity(_host(), pid, psutil.Process(pid).create_time())
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
    if pid == here.pid:  # this process records its one cached start time: equal, or another process
        return abs(started_at - here.started_at) > _START_TOLERANCE_S
    try:
        since_boot = _since_boot(pid)
        if since_boot is not None:  # Linux: judged by ticks since boot, whatever the clock did
            btime = started_at - since_boot
            return abs(btime - round(btime)) > _WHOLE_S
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started_at) > _START_TOLERANCE_S:
            return True
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except _Hidden:
        return False  # a lease is never taken over on a guess
    except (ProcessLookupError, psutil.NoSuchProcess):
        return True
    except psutil.Error:
        return False

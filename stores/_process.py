"""Which process holds a lease, and whether it still exists.

A lease records its holder's host, process id and process start time
(:class:`~stores.types.Owner`). Process ids only compare within one pid namespace of
one boot of one kernel, so the host part is the host name plus a digest of the boot id
(``/proc/sys/kernel/random/boot_id``) and the pid namespace (``/proc/self/ns/pid``);
where those are unreadable (not Linux) the host name alone is used. Start times come
from psutil (``Process.create_time()``, epoch seconds), so a pid the OS gave to a new
process after the holder died is not mistaken for the holder.
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
    if pid == here.pid:
        return abs(started_at - here.started_at) > _START_TOLERANCE_S
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started_at) > _START_TOLERANCE_S:
            return True
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False

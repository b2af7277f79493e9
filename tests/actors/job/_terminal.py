"""Run a command on a pseudo-terminal, as a user's terminal would (the CLI's live view and
its rich output only show on one)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_on_a_terminal(
    argv: Sequence[Any], *, cwd: Path | str, env: dict[str, str], timeout_s: float,
    size: tuple[int, int] | None = None,
) -> tuple[int, str]:  # fmt: skip
    """Run ``argv`` with a new pseudo-terminal as its stdin, stdout and stderr (``size``:
    (columns, lines), else the pty's default); its exit code and everything it wrote
    (escape sequences left in) within ``timeout_s`` seconds (then it is killed)."""
    master, slave = pty.openpty()
    try:
        if size is not None:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        proc = subprocess.Popen(
            [str(a) for a in argv], cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the slave side
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")

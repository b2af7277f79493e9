"""A provider on 127.0.0.1 whose next answers a test scripts: answer, reset, hold, refuse.

``ScriptedProvider`` serves ``POST`` on a free port of 127.0.0.1, one request per
connection (every answer says ``Connection: close``). Each request is read whole (the
provider got it), then met as :attr:`ScriptedProvider.mode` says:

* ``answer``: 200 with ``{"input": <the JSON body>, "answer": N}`` (N counts the answers);
* ``reset``: the connection is closed with a TCP reset (``SO_LINGER`` 0) and no answer,
  as a provider whose connection broke after it got the request;
* ``hold``: no answer while the mode stays ``hold`` (a provider that does not answer);
  once the test sets another mode, the held requests are met as it says;
* ``refuse``: 422 with an error body (a permanent refusal).

Plain sockets and threads: under gevent monkey-patching they are cooperative, so the
server runs in either runtime. Used by the ``scripted_provider`` fixture (tests/conftest.py).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from typing import Any

__all__ = ["ScriptedProvider"]

WAIT_S = 30.0
"""Longest a connection is read, and a held request waits, before the server gives up."""


class ScriptedProvider:
    """The server (start with :meth:`start`, end with :meth:`stop`).

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started (any path serves).
        mode: how the next requests are met (``answer``, ``reset``, ``hold``, ``refuse``;
            change it with :meth:`set_mode`).
        requests: the bodies received, in order (each decoded JSON, or the raw bytes).
        received: set each time a request has been read whole.
    """

    def __init__(self) -> None:
        self.mode = "answer"
        self.requests: list[Any] = []
        self.received = threading.Event()
        self.url = ""
        self._answers = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ScriptedProvider:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0.05)  # so the loop sees the stop
        self._server = server
        self.url = f"http://127.0.0.1:{server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, name="scripted-provider", daemon=True)
        self._thread.start()
        return self

    def set_mode(self, mode: str) -> None:
        """Meet the next requests (and those held) as ``mode`` says."""
        with self._changed:
            self.mode = mode
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stop.set()
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(WAIT_S)
        if self._server is not None:
            self._server.close()

    def count(self) -> int:
        """Requests received so far."""
        with self._lock:
            return len(self.requests)

    def _serve(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(WAIT_S)
        try:
            body = _read_request(conn)
        except OSError:
            conn.close()
            return
        try:
            value: Any = json.loads(body)
        except ValueError:
            value = body
        with self._changed:
            self.requests.append(value)
            self.received.set()
            while self.mode == "hold" and not self._stop.is_set():
                self._changed.wait(WAIT_S)
            mode = self.mode
            if mode == "answer":
                self._answers += 1
                answer = self._answers
        try:
            if mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif mode == "refuse":
                _reply(conn, 422, {"error": "refused: this input is not accepted"})
            elif mode == "answer":
                _reply(conn, 200, {"input": value, "answer": answer})
        except OSError:  # the client went away meanwhile (killed)
            pass
        finally:
            conn.close()  # after SO_LINGER 0: a TCP reset, no answer


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed before the request's head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("closed before the request's body")
        body += chunk
    return body


def _reply(conn: socket.socket, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 422: "Unprocessable Content"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    conn.sendall(head.encode() + body)

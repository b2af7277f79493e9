"""Store commands ridden through an outage of the receipt store.

A command whose store call fails because the store is away
(:class:`~stores.errors.StoreUnavailableError`: no connection, or it was lost; or its
:class:`~stores.errors.StoreBusyError`: another connection held a lock past the
command's wait, except for writes of paid outcomes, :data:`_PAID_OUTCOMES`) is tried
again after a bounded back-off (:data:`BACKOFF_S`, doubling, jittered) until the
``retry_until`` its sender gave it (from its calls' own ``timeout_s``: see
:mod:`actors.lifecycle.effects`); only then does its caller hear back: the answer, or a
StoreUnavailableError naming the outage (how long, since when, how many attempts). A
command sent without one (a completion: the flusher has its own ladder) is answered at
once, as before. While the dispatcher stops, nothing is tried again.

Trying again is safe for every command sent with a deadline, even when the attempt whose
connection dropped had committed: a claim names its lease ids, so the same claim again is
answered ``claimed`` as it stands (:func:`stores.claims.already_taken`; with the batch
request it took over, if it took one, so that request goes again whole); a fenced write
that already landed counts as applied for its holder (:func:`stores.fenced.refusal`; mark
running applies again); a read writes nothing. Nothing is sent to a provider before its
claim or mark-running is answered, so nothing is sent on a write that did not land.

Each failure counts in the system's :class:`~actors.stats.Outages` (service
:data:`SERVICE`); the store's next answer ends the outage. Thread-safe: a Postgres store's
lanes fail and answer on threads of their own.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from actors.errors import error_text, type_name
from actors.messages import ClaimHeld, ClaimReceipts, CompleteReceipts, RecordFailures, RecordUncertain
from actors.stats import Outages
from stores.errors import StoreBusyError, StoreUnavailableError

__all__ = ["BACKOFF_S", "SERVICE", "StoreRetries"]

SERVICE = "receipt store"
"""The service name outages of the store are counted under."""

_PAID_OUTCOMES = (CompleteReceipts, RecordFailures, RecordUncertain)
"""Writes of what a provider answered: a lock held past their busy timeout is not ridden
out (their ladder, salvage and the latch take over: :mod:`actors.flusher`)."""

BACKOFF_S = (0.05, 2.0)
"""The first back-off between attempts and the largest, seconds (each is doubled, then
jittered down by up to half so that commands held together do not return together)."""


class StoreRetries:
    """Which failed store commands are tried again, and when (see the module doc).

    Args:
        where: the store, as the outage names it (its address, no password).
        outages: where outages are counted.
        resend: ``resend(command)`` hands a command to the store actor again (a ``tell``).
        timers: runs ``fn(*args)`` after a delay (``call_later``); None: nothing is
            tried again.
        stopping: set once the dispatcher stops (nothing is tried again from then on).
        clock: monotonic seconds (``retry_until`` is on this clock).
    """

    def __init__(
        self,
        where: str,
        outages: Outages,
        resend: Callable[[Any], None],
        timers: Any,
        stopping: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.outages = outages
        self.resend = resend
        self.timers = timers
        self.stopping = stopping if stopping is not None else threading.Event()
        self.clock = clock
        self._lock = threading.Lock()
        self._tries: dict[int, tuple[int, BaseException, float, float]] = {}
        """id(command) -> (attempts failed so far, the last error, when the outage began on
        ``clock`` and in epoch seconds), while it is retried."""
        self._waiting: dict[int, Any] = {}
        """id(command) -> command, while its next attempt waits on a timer."""

    def retrying(self, command: Any) -> bool:
        """Whether ``command`` is an attempt after the first (no budget is charged again)."""
        return id(command) in self._tries

    def answered(self, command: Any = None) -> None:
        """The store answered (``command``, if given, is done with): an outage ends."""
        if command is not None and self._tries:
            with self._lock:
                self._tries.pop(id(command), None)
        self.outages.answered(SERVICE, self.where)

    def failed(self, command: Any, error: BaseException, since: float | None = None) -> BaseException | None:
        """``command``'s store call, begun at ``since`` (``clock`` seconds), raised ``error``.
        Returns None when it is held for another attempt (its caller is not answered now),
        else the error to answer with."""
        if not isinstance(error, StoreUnavailableError) or (
            isinstance(error, StoreBusyError) and isinstance(command, _PAID_OUTCOMES)
        ):
            self.answered(command)  # the store answered (with an error of its own)
            return error
        text = f"{type_name(error)}: {error_text(error)}"
        began, began_at = self.outages.failed(SERVICE, self.where, text, since)
        until = float(getattr(command, "retry_until", 0.0) or 0.0)
        now = self.clock()
        key = id(command)
        with self._lock:
            attempts = self._tries[key][0] + 1 if key in self._tries else 1
            first, most = BACKOFF_S
            delay = min(most, first * 2 ** (attempts - 1)) * random.uniform(0.5, 1.0)
            if until and self.timers is not None and not self.stopping.is_set() and now + delay < until:
                self._tries[key] = (attempts, error, began, began_at)
                self._waiting[key] = command
                held = True
            else:
                self._tries.pop(key, None)
                held = False
        if held:
            self.timers.call_later(delay, self._again, key)
            if attempts == 1 and type(command) is ClaimReceipts:
                _tell_held(command, error)
            return None
        if not until:
            return error  # sent to be answered at once: the error as it came
        return self._named(error, attempts, now - began, began_at)

    def _named(self, error: BaseException, attempts: int, for_s: float, began_at: float) -> BaseException:
        since = datetime.datetime.fromtimestamp(began_at, datetime.timezone.utc).strftime("%H:%M:%S UTC")
        kind = StoreBusyError if isinstance(error, StoreBusyError) else StoreUnavailableError
        named = kind(
            f"the receipt store {self.where} has been unavailable for {for_s:.1f} s (since {since}); "
            f"gave up after {attempts} {'attempt' if attempts == 1 else 'attempts'} within this call's "
            f"timeout: {error_text(error)}"
        )
        named.__cause__ = error
        return named

    def _again(self, key: int) -> None:
        """Timer: hand the command back to the store actor (or answer it: stopping, or gone)."""
        with self._lock:
            command = self._waiting.pop(key, None)
        if command is None:
            return
        if not self.stopping.is_set():
            try:
                self.resend(command)
                return
            except pykka.ActorDeadError:
                pass
        with self._lock:
            tried = self._tries.pop(key, None)
        if tried is not None:
            attempts, error, began, began_at = tried
            self._answer(command, self._named(error, attempts, self.clock() - began, began_at))

    def give_up(self) -> None:
        """Answer every command waiting for its next attempt with its last error (the store
        actor stops)."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            tries = {key: self._tries.pop(key, None) for key in waiting}
        now = self.clock()
        for key, command in waiting.items():
            tried = tries[key]
            if tried is None:
                self._answer(command, StoreUnavailableError(f"{self.where}: the receipt store stopped"))
            else:
                attempts, error, began, began_at = tried
                self._answer(command, self._named(error, attempts, now - began, began_at))

    @staticmethod
    def _answer(command: Any, error: BaseException) -> None:
        with contextlib.suppress(Exception):  # a reply already answered (a race with a stop)
            command.reply.set_exception((type(error), error, error.__traceback__))


def _tell_held(claim: ClaimReceipts, error: BaseException) -> None:
    """Tell a claim's sender (a reply that is an actor's message) its claim is held, and
    why (``error``)."""
    reply = claim.reply
    ref, fields = getattr(reply, "ref", None), getattr(reply, "fields", None)
    if ref is not None and isinstance(fields, dict) and "batch" in fields:
        with contextlib.suppress(pykka.ActorDeadError):
            ref.tell(ClaimHeld(batch=fields["batch"], cause=error))

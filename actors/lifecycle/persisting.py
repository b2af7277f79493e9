"""Persistence of a call's outcome: outputs through the completion flusher, errors as
failure records in bulk (or the receipt released when the error says it was never the
call's fault), and what callers hear once the store answered. Part of
:class:`actors.lifecycle.machine.Lifecycle`.
"""

from __future__ import annotations

from typing import Any

from actors.errors import (
    InvalidOutputError,
    LeaseLostError,
    OutputNotStorableError,
    ReceiptPersistenceError,
    ResultSalvagedError,
    attr_of,
    error_text,
    is_a,
)
from actors.lifecycle.calls import Group, GroupState, patience_s
from actors.lifecycle.exits import FLUSHER_FAILED, MISSING, RELEASE_ON, Done, TooLarge
from actors.lifecycle.failure_record import failure_record, may_have_acted
from actors.lifecycle.shared import Parts, Shared
from stores.codec import EncodedOutput, decode_output, encode_output
from stores.types import Failure

__all__ = ["Persister"]

_UNSTORABLE = (InvalidOutputError, OutputNotStorableError)
"""The errors that carry a paid output the store cannot take (``raw_output``, set on the worker)."""


class Persister:
    """Outputs and failures written, and their callers answered (a part of
    :class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    def persist(self, values: list[tuple[Group, str]]) -> None:
        """Queue outputs for the flusher; sent by ``Lifecycle.flush`` (many units' outputs in
        one request when many finish together: larger transactions under load)."""
        for group, text in values:
            group.state = GroupState.PERSISTING
            group.written = Done(text, "live")
            if not group.calls and not group.live_given and not group.owed:
                # no caller to answer live (riding along, or its callers left): the first
                # call of the key answered anywhere is, once the output is stored
                group.owed = True
                self.fx.owe(group.key)
        self.s.persisting.extend(values)

    def on_persisted(
        self, batch: int, outcomes: dict[str, Any] | None, error: BaseException | None, now: float
    ) -> None:
        """The flusher settled outputs: answer callers; the slot is free once all are written."""
        values: list[tuple[Group, str]] = self.s.batches.pop(batch, [])
        asked = self.s.asked_at.pop(batch, None)
        if asked is not None:
            self.fx.waited("store", (now - asked) * len(values))
        refused: list[tuple[Group, BaseException]] = []
        for group, text in values:
            outcome = None if outcomes is None else outcomes.get(group.key)
            kind = "salvaged" if outcome is None else outcome.kind
            if outcome is None:
                if not is_a(error, ResultSalvagedError):  # else a stop salvaged it already
                    self.fx.salvage(group, decode_output(text), f"the completion flusher failed: {error}")
                outcome = FLUSHER_FAILED
            if kind in ("persisted", "salvaged"):
                # completed: a receipt this system stored completed (a salvaged output's
                # receipt is not: a rerun replays it)
                self.fx.count("completed" if kind == "persisted" else "salvaged")
                self.p.exits.settle(group, Done(text, "live"))
            elif kind == "completed_by_other":
                if group.cost is not None:  # paid, and another run's output stands instead
                    self.fx.waste([group.cost], "refused")
                try:
                    self.p.exits.settle(group, Done(encode_output(outcome.output), "cached"))
                except Exception as exc:  # the other run's output cannot be read back: ours is
                    # what the caller gets, and it is kept in the salvage file (not lost)
                    self.fx.salvage(group, EncodedOutput(text), f"the stored output is unreadable: {exc}")
                    self.fx.count("salvaged")
                    self.p.exits.settle(group, Done(text, "live"))
            elif kind == "lease_lost":
                self.fx.count("lease_lost")
                self.fx.count("salvaged")
                self.p.exits.settle(group, LeaseLostError(f"lease on {group.key} was lost; output salvaged"))
            else:  # refused by the store: the caller still gets what was paid for; salvaged
                self.fx.salvage(group, EncodedOutput(text), outcome.error)
                self.fx.count("salvaged")
                self.p.exits.answer_early(group, Done(text, "live"))
                if outcome.reason == "output_too_large":
                    refused.append((group, TooLarge(len(text.encode("utf-8")))))
                else:
                    refused.append(
                        (
                            group,
                            OutputNotStorableError(
                                f"receipt {group.key} refused the output: {outcome.error}"
                            ),
                        )
                    )
                continue
            self._persisted_one(group)
        if refused:
            self.fail(refused, counted=False)

    def fail(
        self, failed: list[tuple[Group, BaseException]], counted: bool = True, uncertain: bool = False
    ) -> None:
        """Record ``failed`` (group, error): uncertain when the tool may have acted
        (``failure_record.may_have_acted``) or ``uncertain`` says so, else failed; errors
        that release (not sent, suspended) give the receipt back instead."""
        records: list[Failure] = []
        unsure: list[Failure] = []
        released: list[Group] = []
        outcome: dict[str, BaseException] = {}
        for group, exc in failed:
            # only ours carry a paid output: a tool's own error may answer any name (``__getattr__``)
            raw = attr_of(exc, "raw_output", MISSING) if is_a(exc, _UNSTORABLE) else MISSING
            if raw is not MISSING:  # paid for but not storable: kept in a described form
                self.fx.salvage(group, raw, error_text(exc))  # kept described, never replayed
                self.fx.count("salvaged")
            relayed = group.unit is not None and group.unit.relayed_error(exc)
            if (is_a(exc, (*RELEASE_ON, LeaseLostError)) and not relayed) or group.receipt is None:
                released.append(group)
                outcome[group.key] = exc
                continue
            if counted:
                self.fx.count("failures")
            outcome[group.key] = exc
            record = Failure(
                group.key, group.receipt.lease_id or "", *failure_record(exc, relayed, self.fx.salvage_path())
            )
            if uncertain or may_have_acted(self.tool, exc, relayed):
                unsure.append(record)
                stated = self.tool.stated_price
                if stated is not None:  # sent, and the provider may have billed it
                    self.fx.waste([stated], "uncertain")
            else:
                records.append(record)
            group.state = GroupState.PERSISTING
            group.written = exc
        for group in released:
            exc = outcome[group.key]
            self.p.exits.release_group(group, exc, lease_lost=is_a(exc, LeaseLostError))
        for chosen, is_uncertain in ((records, False), (unsure, True)):
            if chosen:
                batch = next(self.s.ids)
                keys = {r.key for r in chosen}
                self.s.batches[batch] = [
                    (g, outcome[g.key], is_uncertain) for g, _ in failed if g.key in keys
                ]
                # rides out an outage of the store within the callers' timeout (before: the
                # latch tripped at the first failure of the write)
                patience = patience_s(g for g, _ in failed if g.key in keys)
                self.fx.record_failures(batch, chosen, uncertain=is_uncertain, patience_s=patience)

    def on_failures_recorded(self, batch: int, report: Any, error: BaseException | None, now: float) -> None:
        """Failures written (or the write failed: the latch trips, callers hear both causes)."""
        failed: list[tuple[Group, BaseException, bool]] = self.s.batches.pop(batch, [])
        if error is not None:  # callers hear back once the latch is tripped (no new call starts)
            failed = [
                (
                    g,
                    ReceiptPersistenceError(f"recording the failure of {g.key} failed: {error}", cause=exc),
                    False,
                )
                for g, exc, _ in failed
            ]
            self.s.batches[batch] = failed
            self.fx.trip_latch(f"recording failures failed: {error}", batch)
            return
        self._settle_failed(failed, recorded=True)

    def on_latch_tripped(self, batch: int, now: float) -> None:
        """The flusher tripped the latch: answer the callers of the failed write."""
        self._settle_failed(self.s.batches.pop(batch, []))

    def _settle_failed(self, failed: list[tuple[Group, BaseException, bool]], recorded: bool = False) -> None:
        for group, exc, uncertain in failed:
            if recorded:  # a refresh that failed: its previous output stands for ordinary callers
                self.p.exits.answer_last_good(
                    group, group.receipt, "refresh_uncertain" if uncertain else None
                )
            self.p.exits.settle(group, exc)
            self._persisted_one(group)

    def _persisted_one(self, group: Group) -> None:
        unit = group.unit
        if unit is None:
            return
        unit.persisting -= 1
        if unit.persisting <= 0:
            self.p.exits.leave(unit)

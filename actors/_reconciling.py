"""Uncertain receipts, asked about: a tool's ``reconcile`` hook runs on the pool and asks
the provider whether the uncertain attempt acted; its answer is stored (the output, or the
receipt made claimable again).

The hook is held to its callers' timeouts as a provider call is: each caller is answered
``UncertainOutcomeError`` at its own ``timeout_s`` (from the hook's start, or from when it
joined), while a late answer is still stored for the next caller; a late ``NOT_DONE`` with
no caller left runs nothing. Rules: docs/how-it-works.md, the disposition table (uncertain).
"""

from __future__ import annotations

import abc
import math
from typing import Any

from stores._codec import EncodedOutput, encode_output
from stores.errors import InvalidOutputError, OutputNotStorableError
from stores.types import ClaimMode, Receipt

from ._calls import Call, Group, GroupState
from ._execute import error_text
from ._lifecycle_base import Done, LifecycleBase
from .errors import UncertainOutcomeError
from .messages import ReconcileDue
from .tool import NOT_DONE

__all__ = ["Reconciling"]


class Reconciling(LifecycleBase):
    """The reconcile hook's part of the lifecycle (:class:`actors.lifecycle.Lifecycle`)."""

    @abc.abstractmethod
    def _claim(self, groups: list[Group], force: ClaimMode | None) -> None:
        """Claim the groups' receipts (``actors._claiming.Claiming``)."""

    def _reconcile(self, group: Group, receipt: Receipt, now: float) -> None:
        """Ask the provider about ``group``'s uncertain receipt; time its callers out."""
        group.receipt = receipt
        group.state = GroupState.CLAIMING
        group.reconciling_since = now
        batch = next(self._ids)
        self._batches[batch] = group
        self.fx.reconcile(batch, group)
        for timeout_s in {c.timeout_s for c in group.calls}:
            self._reconcile_timer(group, timeout_s)

    def _reconcile_joined(self, group: Group, call: Call, now: float) -> None:
        """A caller joined while the hook is out: its own timeout, from now."""
        assert group.reconciling_since is not None
        self._reconcile_timer(group, max(group.reconciling_since, call.submitted_at) + call.timeout_s - now)

    def _reconcile_timer(self, group: Group, delay_s: float) -> None:
        if not math.isinf(delay_s):
            self.fx.later(max(0.0, delay_s), ReconcileDue(key=group.key))

    def on_reconcile_due(self, key: str, now: float) -> None:
        """Callers whose timeout passed while the hook is out are answered now."""
        group = self.groups.get(key)
        since = group.reconciling_since if group is not None else None
        if group is None or since is None:
            return
        late = [c for c in group.calls if max(since, c.submitted_at) + c.timeout_s <= now + 1e-3]
        if not late:
            return
        group.calls = [c for c in group.calls if c not in late]
        for call in late:
            self.fx.answer(call, UncertainOutcomeError(
                f"the outcome of {key} is uncertain and the tool's reconcile hook did not answer within "
                f"{call.timeout_s} s (its answer is stored when it comes)",
                failure_kind=None,
            ))  # fmt: skip

    def on_reconciled(self, batch: int, value: Any, error: BaseException | None, now: float) -> None:
        """The reconcile hook answered: store what the provider did, or run it again."""
        group: Group | None = self._batches.pop(batch, None)
        if group is None:
            return
        group.reconciling_since = None
        if error is not None or group.receipt is None:
            self._settle(group, UncertainOutcomeError(
                f"the outcome of {group.key} is uncertain and reconciling it failed: "
                + (error_text(error) if error is not None else "its receipt is gone"),
                failure_kind=None,
            ))  # fmt: skip
            return
        try:
            text = None if value is NOT_DONE else encode_output(value)
        except BaseException as exc:  # whatever the hook's value raises: this call's error alone
            if not isinstance(exc, (InvalidOutputError, OutputNotStorableError)):
                exc = InvalidOutputError(
                    f"the reconcile hook's value cannot be stored: {type(exc).__name__}: {error_text(exc)}"
                )
            self._settle(group, exc)
            return
        batch = next(self._ids)
        self._batches[batch] = (group, text)
        if text is None:
            self.fx.resolve(batch, group.key, "rerun")
        else:
            self.fx.resolve(batch, group.key, "complete", EncodedOutput(text))

    def on_resolved(self, batch: int, error: BaseException | None, now: float) -> None:
        """The store took the reconcile hook's answer: reuse the output, or claim again
        (only for a caller still waiting: no caller, no provider call)."""
        found = self._batches.pop(batch, None)
        if found is None:
            return
        group, text = found
        if error is not None:
            self._settle(group, error)
        elif text is None:
            if group.calls and not self.stopping:
                self._claim([group], None)
            else:
                self._settle(group, None)  # claimable again: the next caller runs it
        else:
            self._settle(group, Done(text, "cached"))

    @staticmethod
    def _uncertain(group: Group, receipt: Receipt) -> BaseException:
        return UncertainOutcomeError(
            f"the outcome of {group.key} is uncertain (its request may have reached the provider); "
            "resolve it with `tooldispatch receipts resolve KEY --rerun | --fail`",
            failure_kind=receipt.failure_kind,
        )

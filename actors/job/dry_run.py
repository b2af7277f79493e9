"""``tooldispatch run --dry-run``: what a run would pay, from the input and the receipts,
sending nothing.

Each row's play runs with a stand-in for the dispatch system (:class:`DryProxy`): a call
of a durable tool is looked up in the store by the key a run would give it (org, scope,
tool, version, credentials' digest, input); a completed receipt answers it and the play
goes on with that output, as the run would. The first call a receipt does not answer is
counted as one the run would pay for, at the tool's stated price, and the row stops
there: what the play does with an answer not yet bought cannot be known. A call whose
receipt records a failure is answered with it (nothing paid, unless ``--retry-failed``);
an uncertain receipt waits for an operator. A local tool (``durable=False``) is run: it
is free and sends nothing (it gets no context: one that needs it stops the row).

Nothing is written: the store is only read, no lease is taken, no receipt is created.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import attrs

from actors.errors import DispatchError
from actors.results import ToolResult
from actors.runtime.futures import fail, new_future, resolved_future
from actors.tool import RunInfo, Tool
from stores.codec import decode_output
from stores.keys import key_maker
from stores.money import Money, total
from stores.types import ReceiptStatus

__all__ = [
    "CANNOT_KNOW",
    "DryProxy",
    "DryRunStop",
    "DryTally",
    "dry_run_json",
    "dry_run_rows",
    "dry_run_table",
]


class DryRunStop(DispatchError):
    """A dry run's call a receipt does not answer: the run would pay for it; its row stops."""


@attrs.define
class DryTally:
    """What a dry run found.

    Attributes:
        rows: rows read.
        answered_rows: rows whose every call a receipt answered (free on a real run).
        paying_rows: rows that stopped at a call the run would pay for.
        failed_rows: rows that would fail or wait without paying: a recorded failure, an
            uncertain receipt, the play's own error.
        answered: tool id -> calls answered by receipts.
        would_pay: tool id -> distinct calls (receipt keys) the run would pay for.
        unpriced: tool id -> of those, calls whose price cannot be known before the
            answer (a price function with no ``price_estimate``).
        recorded_failures: tool id -> calls answered by a recorded failure (not paid).
        uncertain: tool id -> calls waiting for an operator (not paid).
    """

    rows: int = 0
    answered_rows: int = 0
    paying_rows: int = 0
    failed_rows: int = 0
    answered: dict[str, int] = attrs.field(factory=dict)
    would_pay: dict[str, set[str]] = attrs.field(factory=dict)
    unpriced: dict[str, int] = attrs.field(factory=dict)
    recorded_failures: dict[str, int] = attrs.field(factory=dict)
    uncertain: dict[str, int] = attrs.field(factory=dict)

    def cost(self, tools: Iterable[Tool]) -> dict[str, dict[str, Money]]:
        """Tool id -> currency -> what its calls the run would pay for would cost at its
        stated price (``Tool.price`` when a Money, else its ``price_estimate``), with its
        batch strategy's ``request_price`` once per full or partial request."""
        out: dict[str, dict[str, Money]] = {}
        for tool in tools:
            keys = self.would_pay.get(tool.tool_id)
            if not keys:
                continue
            price = tool.stated_price
            amounts = [price * len(keys)] if price is not None else []
            batch = tool.batch
            if batch is not None and batch.request_price is not None:
                amounts.append(batch.request_price * math.ceil(len(keys) / batch.max_batch_size))
            if amounts:
                out[tool.tool_id] = total(amounts)
        return out


class DryProxy:
    """Stands in for a dispatch system's proxy (``execute``) in a dry run: answers calls
    from the store's receipts, counts the rest in ``tally`` and refuses them with
    :class:`DryRunStop`. Used on one thread."""

    def __init__(self, tools: Iterable[Tool], store: Any, run: RunInfo, tally: DryTally) -> None:
        self.tools = {tool.tool_id: tool for tool in tools}
        self.store = store
        self.run = run
        self.tally = tally
        self._makers: dict[tuple[str, float | None], Any] = {}
        self.row_pays = False
        """The current row made a call the run would pay for."""
        self.row_ended = False
        """The current row met a recorded failure or an uncertain receipt."""

    def execute(
        self, tool_id: str, input: Any, *, force_refresh: bool = False, retry_failed: bool = False,
        stale_after_s: float | None = None, timeout_s: float | None = None,
    ) -> Any:  # fmt: skip
        """A resolved future of the call's answer, or of its error (see the module)."""
        try:
            return resolved_future(self._answer(tool_id, input, force_refresh, retry_failed, stale_after_s))
        except Exception as exc:
            future = new_future()
            fail(future, exc)
            return future

    def _answer(
        self, tool_id: str, input: Any, force_refresh: bool, retry_failed: bool, stale_after_s: float | None
    ) -> ToolResult:
        tool = self.tools.get(tool_id)
        if tool is None:
            raise DispatchError(f"unknown tool {tool_id!r}; known: {', '.join(sorted(self.tools))}")
        if not tool.durable:  # local and free: run it (it sends nothing)
            return ToolResult.of(tool.fn(input, None), "live", "", tool_id)
        if self.row_pays:  # the row stopped at a call it would pay for: what follows is not known
            raise DryRunStop(f"{tool_id}: after a call the run would pay for (not counted)")
        key, input_hash, _ = self._maker(tool, stale_after_s)(input)
        tally, org = self.tally, self.run.org_id
        if not force_refresh:
            found = self.store.read_reusable(org, [key], stale_after_s=stale_after_s).get(key)
            if found is not None and found[0] == input_hash:
                tally.answered[tool_id] = tally.answered.get(tool_id, 0) + 1
                return ToolResult.of(decode_output(found[1]), "cached", key, tool_id)
            (receipt,) = self.store.get_many(org, [key])
            status = receipt.status if receipt is not None and receipt.input_hash == input_hash else None
            if status is ReceiptStatus.FAILED and not retry_failed:
                tally.recorded_failures[tool_id] = tally.recorded_failures.get(tool_id, 0) + 1
                self.row_ended = True
                raise DryRunStop(f"{tool_id}: its receipt records a failure")
            if status is ReceiptStatus.UNCERTAIN:
                tally.uncertain[tool_id] = tally.uncertain.get(tool_id, 0) + 1
                self.row_ended = True
                raise DryRunStop(f"{tool_id}: its receipt is uncertain (tooldispatch receipts resolve)")
        keys = tally.would_pay.setdefault(tool_id, set())
        if key not in keys:
            keys.add(key)
            if tool.stated_price is None and tool.price is not None:
                tally.unpriced[tool_id] = tally.unpriced.get(tool_id, 0) + 1
        self.row_pays = True
        raise DryRunStop(f"{tool_id}: the run would pay for this call")

    def _maker(self, tool: Tool, stale_after_s: float | None) -> Any:
        make = self._makers.get((tool.tool_id, stale_after_s))
        if make is None:
            digest = str(tool.credentials()) if tool.credentials is not None else ""
            make = key_maker(
                org_id=self.run.org_id, scope=self.run.scope, tool_id=tool.tool_id,
                credential_scope_digest=digest, version=tool.version, stale_after_s=stale_after_s,
                ignore_fields=tool.non_semantic_fields,
            )  # fmt: skip
            self._makers[(tool.tool_id, stale_after_s)] = make
        return make


def dry_run_rows(play: Any, rows: Iterable[Any], ctx: Any, proxy: DryProxy) -> DryTally:
    """Run ``play`` over ``rows`` with ``ctx`` (a PlayContext on ``proxy``), one row at a
    time, filling and returning ``proxy.tally``."""
    tally = proxy.tally
    for row in rows:
        tally.rows += 1
        proxy.row_pays = proxy.row_ended = False
        ctx.start_row()
        failed = False
        try:
            play.run(row, ctx)
        except DryRunStop:
            pass
        except Exception:  # its own error, or a recorded failure it did not catch
            failed = True
        if proxy.row_pays:
            tally.paying_rows += 1
        elif failed or proxy.row_ended:
            tally.failed_rows += 1
        else:
            tally.answered_rows += 1
    return tally


CANNOT_KNOW = "the calls after a row's first call no receipt answers (they depend on its answer)"
"""What a dry run cannot know, said with its figures."""


def dry_run_table(tally: DryTally, tools: Iterable[Tool]) -> Any:
    """The dry run's report (a rich Table): rows, then per tool the calls receipts answer,
    the calls the run would pay for and what they would cost at the stated prices."""
    from rich.table import Table

    tools = list(tools)
    table = Table(title="tooldispatch dry run (nothing sent)", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "rows",
        f"{tally.rows} ({tally.answered_rows} answered by receipts, {tally.paying_rows} would pay, "
        f"{tally.failed_rows} would fail or wait)",
    )
    costs = tally.cost(tools)
    for tool in tools:
        tool_id = tool.tool_id
        if not tool.durable:
            continue
        table.add_row(f"calls of {tool_id} answered by receipts", str(tally.answered.get(tool_id, 0)))
        paying = len(tally.would_pay.get(tool_id, ()))
        table.add_row(f"calls of {tool_id} the run would pay for", str(paying))
        if tool_id in costs:
            table.add_row(f"would cost at {tool.provider_name} ({tool_id})", _money(costs[tool_id]))
        if tally.unpriced.get(tool_id):
            table.add_row(f"calls of {tool_id} priced only by their answer", str(tally.unpriced[tool_id]))
        for name, counts in (("recorded failures", tally.recorded_failures), ("uncertain", tally.uncertain)):
            if counts.get(tool_id):
                table.add_row(f"calls of {tool_id} answered by {name} (not paid)", str(counts[tool_id]))
    every = total(m for by in costs.values() for m in by.values())
    table.add_row(
        "would cost at least (the calls counted, at the tools' stated prices)",
        _money(every) if every else "nothing",
    )
    table.add_row("not counted", CANNOT_KNOW)
    return table


def dry_run_json(tally: DryTally, tools: Iterable[Tool]) -> dict[str, Any]:
    """The dry run as a JSON-ready dict: ``{"version": 1, "dry_run": true, "rows": {...},
    "tools": {tool id: {"answered", "would_pay", "unpriced", "recorded_failures",
    "uncertain", "would_cost": {currency: amount}}}, "would_cost": {currency: amount},
    "not_counted": text}`` (amounts as decimal strings)."""
    tools = list(tools)
    costs = tally.cost(tools)
    every = total(m for by in costs.values() for m in by.values())
    return {
        "version": 1,
        "dry_run": True,
        "rows": {
            "total": tally.rows,
            "answered": tally.answered_rows,
            "would_pay": tally.paying_rows,
            "would_fail_or_wait": tally.failed_rows,
        },
        "tools": {
            tool.tool_id: {
                "answered": tally.answered.get(tool.tool_id, 0),
                "would_pay": len(tally.would_pay.get(tool.tool_id, ())),
                "unpriced": tally.unpriced.get(tool.tool_id, 0),
                "recorded_failures": tally.recorded_failures.get(tool.tool_id, 0),
                "uncertain": tally.uncertain.get(tool.tool_id, 0),
                "would_cost": {c: f"{m.amount:f}" for c, m in sorted(costs.get(tool.tool_id, {}).items())},
            }
            for tool in tools
            if tool.durable
        },
        "would_cost": {c: f"{m.amount:f}" for c, m in sorted(every.items())},
        "not_counted": CANNOT_KNOW,
    }


def _money(sums: dict[str, Money]) -> str:
    return ", ".join(str(m) for _, m in sorted(sums.items()))

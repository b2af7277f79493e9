"""Live progress and the end-of-run report (rich).

On a terminal a live line redraws in place; otherwise a plain line is printed every
``interval_s`` seconds. Both are driven by :class:`ProgressDisplay` from the CLI's
thread; nothing here touches the actors except reading ``stats()``.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from actors.job.runner import RunSummary
from actors.job.tally import CallTally
from actors.job.views.live import live_view
from actors.job.views.timeline import Timeline
from stores.money import total

__all__ = [
    "PHASE_NAMES", "ProgressDisplay", "completed_cell", "output_line", "progress_line", "report_table",
    "resume_hint", "tools_table",
]  # fmt: skip


LIVE_REFRESH_S = 0.25
"""Seconds between redraws of the live view (each reads ``stats()`` once)."""
SAMPLE_EVERY_S = 1.0
"""Seconds between samples of the run's time series (:class:`~actors.job.views.Timeline`)."""

OWNER_WAITING_KEY = "waiting_on_owner"
"""``stats()`` gauge: calls now waiting for a receipt another live owner (another run
or process) holds. Read defensively: absent, nothing is shown."""
OWNER_WAITS_KEY = "owner_waits"
"""``stats()`` counter: calls that waited for another live owner's receipt this run."""


def progress_line(
    done: int,
    total: int | None,
    stats: dict[str, Any],
    elapsed_s: float,
    tally: dict[str, int] | None = None,
) -> str:
    """One line: rows done (of the input's rows); the paid tools' calls (calls, not rows:
    a row may make several) that ran (their receipt completed), were reused, joined a
    lookup under way, or failed (and those refused for their input, when any); the
    requests sent to their providers (every attempt: a batch is one, and the requests
    sent again and those answered 429 are among them); calls waiting on another run
    (when the system reports it); rows/s; ETA. Its words are the report's."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    if total:
        eta = f"{(total - done) / rate:.0f}s" if rate > 0 else "?"
        rows = f"rows {done}/{total} ({100.0 * done / total:.1f}%)"
    else:
        eta, rows = "?", f"rows {done}"
    t = tally or {}
    waiting = stats.get(OWNER_WAITING_KEY)
    wait = f" | waiting on another run {waiting}" if waiting else ""
    refused = f", {t['input_refused']} input refused" if t.get("input_refused") else ""
    return (
        f"{rows} | calls: {t.get('ran', 0)} ran, {t.get('reused', 0) + t.get('reused_this_run', 0)} reused, "
        f"{t.get('joined', 0)} joined, {t.get('failed', 0)} failed{refused} | requests sent "
        f"{_summed(stats, 'requests')} ({_summed(stats, 'retries')} sent again, "
        f"{_summed(stats, 'backpressure')} answered 429){wait} | {rate:.0f} rows/s | ETA {eta}"
    )


def _summed(stats: dict[str, Any], name: str) -> int:
    """A counter of ``stats()`` summed over the tools it holds (``stats["tools"]``; the
    caller leaves out local tools), else the system's own."""
    tools = stats.get("tools")
    if not isinstance(tools, dict):
        return int(stats.get(name, 0))
    return sum(int(c.get(name, 0)) for c in tools.values())


class ProgressDisplay:
    """Shows progress until :meth:`close`, and samples the run's time series.

    On a terminal, the live view (:func:`actors.job.views.live_view`): the progress line and
    a table per provider, redrawn :data:`LIVE_REFRESH_S` apart; elsewhere the plain progress
    line every ``interval_s``. Either way ``stats()`` is read on the display's own thread,
    never the rows', and ``timeline`` (when given) gets a sample about every
    :data:`SAMPLE_EVERY_S`.

    Args:
        console: where to draw: live redraws when it is interactive (a terminal that is
            not ``TERM=dumb``), else plain lines (rich's ``is_interactive``).
        total: rows expected (None if unknown).
        stats: ``stats() -> dict`` of the dispatch system.
        interval_s: seconds between plain lines (non-terminal).
        tally: the run's :class:`~actors.job.tally.CallTally` (ran, reused, joined), or None.
        timeline: the run's :class:`~actors.job.views.Timeline` (its providers are the live
            view's rows), or None.
    """

    def __init__(
        self,
        console: Console,
        total: int | None,
        stats: Callable[[], dict[str, Any]],
        interval_s: float = 2.0,
        tally: CallTally | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.console, self.total, self.stats, self.interval_s = console, total, stats, interval_s
        self.tally = tally
        self.timeline = timeline
        self.done = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._live: Live | None = None
        self._thread: threading.Thread | None = None
        self._before: dict[str, Any] | None = None
        """The ``stats()`` of the previous redraw (what grew since: see :func:`holdups`)."""

    def start(self) -> ProgressDisplay:
        if self.console.is_interactive:
            self._live = Live(
                self._view(self.stats()), console=self.console, auto_refresh=False, transient=False
            )
            self._live.start(refresh=True)
        self._thread = threading.Thread(target=self._loop, name="tooldispatch-progress", daemon=True)
        self._thread.start()
        return self

    def advance(self) -> None:
        self.done += 1

    def _line(self, stats: dict[str, Any] | None = None) -> str:
        stats = self.stats() if stats is None else stats
        tally = self.tally.totals() if self.tally is not None else None
        if self.tally is not None and isinstance(stats.get("tools"), dict):  # requests: paid tools only
            stats = {**stats, "tools": {t: c for t, c in stats["tools"].items() if t not in self.tally.local}}
        return progress_line(self.done, self.total, stats, time.monotonic() - self.started, tally)

    def _view(self, stats: dict[str, Any]) -> RenderableType:
        line = self._line(stats)
        if self.timeline is None:
            return Text(line)
        view = live_view(line, stats, self.timeline.providers, self.timeline.last_rates(), self._before)
        self._before = stats
        return view

    def _loop(self) -> None:
        tick = self.interval_s if self.timeline is None else min(self.interval_s, SAMPLE_EVERY_S)
        if self._live is not None:
            tick = LIVE_REFRESH_S
        next_line = next_sample = time.monotonic()
        next_line += self.interval_s
        while not self._stop.wait(tick):
            now = time.monotonic()
            stats = self.stats()
            if self.timeline is not None and now >= next_sample:
                self.timeline.sample(stats, now)
                next_sample = now + SAMPLE_EVERY_S - tick / 2  # about once a second, whatever the tick
            if self._live is not None:
                self._live.update(self._view(stats), refresh=True)
            elif now >= next_line:
                next_line = now + self.interval_s - tick / 2
                self.console.print(f"progress: {self._line(stats)}", highlight=False, soft_wrap=True)

    def close(self, *, final: bool = True) -> None:
        """Stop the display; ``final`` leaves a last progress line (False erases the live
        line and prints none, so a configuration error stays the only line)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._live is not None:
            if final:
                self._live.update(self._view(self.stats()), refresh=True)
            else:
                self._live.transient = True
            self._live.stop()
        elif final:
            self.console.print(f"progress: {self._line()}", highlight=False, soft_wrap=True)


PHASE_NAMES = {
    "group": "grouping calls for a batch",
    "receipt_prepare": "receipt lookup and claim",
    "provider": "provider request",
    "local_run": "local tool run",
    "receipt_complete": "storing results",
    "recovery": "recovering a failed store write",
}
"""The system's phase names (``stats()["phases"]``) in the user's words, in the order
a call meets them (the report's order)."""


def pacing_cell(view: dict[str, Any]) -> str:
    """One provider's pacing, from ``stats()["pacing"]`` (see
    :func:`actors.pacing.bucket.pacing_report`): how the rate was set, the rate and the limit
    (requests/s), the cuts this run's 429s made, the last Retry-After, the wall time its
    calls were held back by pacing, the circuit when not closed."""
    limit = view.get("limit_rps")
    text = f"{view.get('learnt')}: {view['rate_rps']:.1f}/s"
    if limit is not None:
        how = view.get("learnt")
        said = "stated" if how in ("stated", "aimd") else "announced" if how == "announced" else "learnt"
        text += f" (limit {said} {limit:.1f}/s)"
    cuts = int(view.get("cuts") or 0)
    if cuts:
        text += f", cut {cuts} {_plural(cuts, 'time')} by this run's 429s"
    pauses = view.get("pauses") or []
    if pauses:
        text += f", last Retry-After {pauses[-1].get('retry_after')}"
    text += f", calls held back {view.get('held_s', 0.0):.1f} s"
    if view.get("circuit", "closed") != "closed":
        text += f", circuit {view['circuit']}"
    return text


def report_table(
    stats: dict[str, Any],
    summary: RunSummary,
    tally: CallTally | None = None,
    tools: Iterable[Any] = (),
    output: str | None = None,
    *,
    force_refresh: bool = False,
    retry_failed: bool = False,
) -> Table:
    """The end-of-run report, headline first: what the run cost and what it reused.

    Args:
        stats: the dispatch system's ``stats()``.
        summary: the rows' summary.
        tally: how each call was answered (ran, reused, joined); None shows the system's counters.
        tools: the play's tools (their providers name the requests rows).
        output: the ``--output`` path, or None.
        force_refresh / retry_failed: the run's ``--force-refresh`` / ``--retry-failed``
            (named in the report when set).
    """
    table = Table(title="tooldispatch run report", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("rows", f"{summary.rows} ({summary.ok} ok, {summary.failed} failed)")
    if force_refresh:
        table.add_row("--force-refresh", "calls ran again even where a receipt was completed (paid again)")
    if retry_failed:
        table.add_row("--retry-failed", "calls whose receipt failed ran again")
    local = tally.local if tally is not None else set()
    per_tool = stats.get("tools", {}) if isinstance(stats.get("tools"), dict) else {}
    providers: dict[str, list[str]] = {}
    for tool in tools:
        if tool.tool_id not in local:
            providers.setdefault(tool.provider_name, []).append(tool.tool_id)

    def summed(ids: list[str], name: str) -> int:
        return sum(int(per_tool.get(t, {}).get(name, 0)) for t in ids)

    paid_ids = [t for ids in providers.values() for t in ids]
    if paid_ids and not summed(paid_ids, "answered"):  # nothing billable: say so, plainly
        table.add_row("paid this run", _nothing_paid(summed(paid_ids, "requests"), tally))
    spent = (stats.get("spent") or {}).get("tools", {})
    saved = (stats.get("saved") or {}).get("tools", {})
    wasted = (stats.get("wasted") or {}).get("tools", {})
    for provider, ids in sorted(providers.items()):
        sums = total(money for t in ids for money in spent.get(t, {}).values())
        if sums:
            table.add_row(f"spent at {provider} (by the tools' prices)", ", ".join(map(str, sums.values())))
        sums = total(money for t in ids for money in saved.get(t, {}).values())
        if sums:
            table.add_row(
                f"saved at {provider} (answered from receipts, at what they cost when paid)",
                ", ".join(map(str, sums.values())),
            )
        sums = total(money for t in ids for money in wasted.get(t, {}).values())
        if sums:
            table.add_row(f"wasted at {provider} (paid, answer not used)", ", ".join(map(str, sums.values())))
    reasons = (stats.get("wasted") or {}).get("reasons", {})
    if reasons:
        table.add_row(
            "wasted, by reason",
            "; ".join(f"{why}: {', '.join(map(str, by.values()))}" for why, by in sorted(reasons.items())),
        )
    for provider, ids in sorted(providers.items()):
        sent, limited = summed(ids, "requests"), summed(ids, "backpressure")
        table.add_row(f"requests sent to {provider}", f"{sent} ({limited} answered 429)")
        answered, replayed = summed(ids, "answered"), summed(ids, "replayed")
        table.add_row(
            f"lookups {provider} answered (billable)",
            f"{answered}"
            + (f" (and {replayed} replayed for a repeated Idempotency-Key, not billed)" if replayed else ""),
        )
        for name, view in sorted((stats.get("pacing") or {}).items()):
            if name.rpartition("/")[2] == provider and view.get("rate_rps") is not None:
                table.add_row(f"pacing of {provider}", pacing_cell(view))
        waited = ((stats.get("waits") or {}).get("providers") or {}).get(provider)
        if waited:
            table.add_row(f"time at {provider} (call-seconds, by reason)", waits_cell(waited))
    if tally is not None:
        paid = tally.totals()
        paid_ids = [t for ids in providers.values() for t in ids]
        # the store's count when the system gives one (not the calls answered live: an
        # output the store did not take, salvaged by an abort, completed no receipt)
        completed = summed(paid_ids, "completed") if "completed" in stats else paid["ran"]
        table.add_row("receipts completed this run (calls that ran)", completed_cell(completed, paid["ran"]))
        if "receipts_created" in stats:
            table.add_row("receipts created this run (new keys)", str(stats["receipts_created"]))
        table.add_row(
            "reused from earlier runs", f"{paid['reused_receipts']} receipts ({paid['reused']} calls)"
        )
        table.add_row("reused within this run (calls)", str(paid["reused_this_run"]))
        if stats.get("refresh_uncertain"):
            table.add_row("reused while a refresh is uncertain (calls)", str(stats["refresh_uncertain"]))
        if stats.get("refresh_running"):
            table.add_row("reused while a refresh runs (calls)", str(stats["refresh_running"]))
        table.add_row("joined a lookup in flight (calls)", str(paid["joined"]))
        table.add_row("calls failed", str(paid["failed"]))
        if paid["input_refused"]:
            table.add_row("calls refused for their input (nothing sent)", str(paid["input_refused"]))
        if paid["cancelled"]:
            table.add_row(f"calls cancelled by the {_stop_of(summary)}", str(paid["cancelled"]))
        if paid["salvaged"]:
            table.add_row(
                f"calls paid, result salvaged by the {_stop_of(summary)}",
                f"{paid['salvaged']} (a rerun stores them from the salvage file, not paid again)",
            )
        for tool, counts in sorted(tally.snapshot().items()):
            if tool in local:
                runs = int(per_tool.get(tool, {}).get("provider_calls", 0))
                table.add_row(f"local tool {tool} (free)", f"{counts['calls']} calls, {runs} runs")
    table.add_row("retries (requests sent again)", str(stats.get("retries", 0)))
    table.add_row("calls refused, provider down (circuit open)", str(stats.get("unavailable", 0)))
    table.add_row("results salvaged (paid, kept in the salvage file)", str(stats.get("salvaged", 0)))
    if OWNER_WAITS_KEY in stats:
        table.add_row("waited on another run (calls)", str(stats[OWNER_WAITS_KEY]))
    phases = stats.get("phases", {})
    for phase in [*[p for p in PHASE_NAMES if p in phases], *sorted(set(phases) - set(PHASE_NAMES))]:
        figures, name = phases[phase], PHASE_NAMES.get(phase, phase)
        table.add_row(f"{name} p50 / p95", f"{figures['p50_ms']:.2f} / {figures['p95_ms']:.2f} ms")
    table.add_row("wall time", f"{summary.wall_s:.2f} s")
    table.add_row("rows/s", f"{summary.rows_per_s:.1f}")
    for metric, value in outage_rows(stats.get("outages") or ()):
        table.add_row(metric, value)
    if stats.get("latch_tripped"):
        table.add_row("latch", f"TRIPPED ({stats.get('latch_refused', 0)} calls refused)")
    shown = 0
    for label, count, example in summary.errors.most_common(5):
        table.add_row(f"error: {label} ({count} {_plural(count, 'row')})", f"e.g. {example}")
        shown += count
    if summary.errors.total() > shown:
        rest = summary.errors.total() - shown
        table.add_row(f"error: {len(summary.errors) - 5} other kinds", f"{rest} {_plural(rest, 'row')}")
    if summary.spilled_bytes:
        table.add_row(
            "rows waiting for an earlier row",
            f"{_mib(summary.buffer_peak_bytes)} in memory at most, {_mib(summary.spilled_bytes)} on disk",
        )
    if summary.cut_short:
        salvaged = tally.totals()["salvaged"] if tally is not None else 0
        table.add_row(
            f"rows cut short by the {_stop_of(summary)} (not written)",
            f"{summary.cut_short} ({_cut_why(salvaged, _stop_of(summary))})",
        )
    if output is not None:
        held = f"{summary.written} {_plural(summary.written, 'row')}"
        table.add_row(
            "output",
            f"{output}: only the {held} finished (see the last line)"
            if summary.interrupted
            else output_line(summary, output, force_refresh=force_refresh),
        )
    if summary.aborted or summary.interrupted:
        stop = "aborted" if summary.aborted else "interrupted"
        table.add_row("status", f"{stop}: {resume_hint(force_refresh)}")
    return table


def waits_cell(waited: dict[str, float]) -> str:
    """``{"running": 12.0, "slot": 6.0}`` -> ``"running 12.0 s (67%), slot 6.0 s (33%)"``:
    where the time of a provider's calls went (``stats()["waits"]``), longest first."""
    whole = sum(waited.values())
    if whole <= 0:
        return "-"
    ranked = sorted(waited.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{reason} {s:.1f} s ({100.0 * s / whole:.0f}%)" for reason, s in ranked if s > 0)


def _nothing_paid(requests: int, tally: CallTally | None) -> str:
    """The report's line for a run whose providers answered no lookup (billed nothing)."""
    if requests:
        return (
            f"nothing billable: {requests} {_plural(requests, 'request')} sent, "
            "no lookup answered (429s, errors or no answer)"
        )
    paid = tally.totals() if tally is not None else None
    if paid is None or not paid["calls"]:
        return "nothing: no request sent"
    reused = paid["reused"] + paid["reused_this_run"]
    if reused == paid["calls"]:
        return "nothing: no request sent, every call answered from receipts"
    return f"nothing: no request sent ({reused} of {paid['calls']} calls answered from receipts)"


def resume_hint(force_refresh: bool = False, salvaged: int = 0) -> str:
    """How to finish a run that stopped: run it again (finished calls are reused, and the
    ``salvaged`` results this run wrote to the salvage file are stored from it), but a
    rerun with ``--force-refresh`` pays for every call again."""
    if salvaged and not force_refresh:
        return (
            "run the same command again to resume (finished calls are reused, and the "
            f"{salvaged} {_plural(salvaged, 'result')} in the salvage file are stored from it: "
            "none is paid again)"
        )
    if force_refresh:
        return (
            "run the command again to resume: with --force-refresh every call runs again, those "
            "finished here too (paid again); without it, every call with a receipt is answered from it"
        )
    return "run the same command again to resume (finished calls are reused, not paid again)"


def outage_rows(outages: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """One report row per outage of ``stats()["outages"]`` (the receipt store, a shared
    pacer; see :class:`actors.stats.Outages`): ``("outage: receipt store", "12.3 s from
    10:04:05 UTC, 17 calls met it: <the first error>")``; a service that went away more
    than once numbers its rows, one still away says so."""
    outages = list(outages)
    seen: dict[str, int] = {}
    counts = collections.Counter(str(o.get("service", "?")) for o in outages)
    rows = []
    for outage in outages:
        service = str(outage.get("service", "?"))
        seen[service] = seen.get(service, 0) + 1
        metric = f"outage: {service}" + (f" #{seen[service]}" if counts[service] > 1 else "")
        if outage.get("ongoing"):
            metric += " (still away)"
        began = datetime.datetime.fromtimestamp(float(outage.get("began_at", 0.0)), datetime.timezone.utc)
        failures = int(outage.get("failures", 0))
        cause = " ".join(str(outage.get("cause", "")).split())
        value = (
            f"{float(outage.get('duration_s', 0.0)):.1f} s from {began:%H:%M:%S} UTC, {failures} "
            f"{_plural(failures, 'call')} met it" + (f": {cause[:160]}" if cause else "")
        )
        rows.append((metric, value))
    return rows


def completed_cell(completed: int, ran: int) -> str:
    """The receipts this run stored completed, and the calls that ran when the two differ
    (an output the store did not take: salvaged, or refused)."""
    if ran <= completed:
        return str(completed)
    return f"{completed} ({ran} calls ran; {ran - completed} of their results were not stored)"


def _cut_why(salvaged: int, stop: str) -> str:
    if not salvaged:
        return f"a call of theirs was cancelled by the {stop}; a rerun runs them"
    return (
        "a call of theirs was cancelled, or its paid result salvaged: a rerun stores "
        "those from the salvage file, and runs the rest"
    )


def output_line(summary: RunSummary, output: str, *, force_refresh: bool = False, salvaged: int = 0) -> str:
    """What the output file holds (a complete run: every row; else which rows, and how to
    write it whole: :func:`resume_hint`; ``salvaged``: entries this run wrote to the
    salvage file)."""
    if not summary.interrupted:
        return f"{output}: {summary.written} {_plural(summary.written, 'row')}, in input order"
    missing = "rows not started or cut short are missing"
    return (
        f"{output} holds only the {summary.written} {_plural(summary.written, 'row')} finished before the "
        f"{_stop_of(summary)} (each with its input index; {missing}): "
        + resume_hint(force_refresh, salvaged).replace("to resume", "to write it whole", 1)
    )


def _stop_of(summary: RunSummary) -> str:
    """What stopped the run: ``"abort"`` (a second signal) or ``"interrupt"`` (the first)."""
    return "abort" if summary.aborted else "interrupt"


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


_TOOL_ROWS = (
    ("calls", "calls"), ("ran", "ran (receipt completed; local: runs)"), ("joined", "joined in flight"),
    ("reused_this_run", "reused this run"), ("reused", "reused, earlier runs"), ("failed", "failed"),
)  # fmt: skip
_TOOL_STATS = (
    ("answered", "lookups answered (billable)"), ("replayed", "answers replayed (not billed)"),
    ("requests", "requests sent"), ("backpressure", "429s"), ("unavailable", "refused, provider down"),
)  # fmt: skip


def tools_table(stats: dict[str, Any], tally: CallTally | None = None, *, stopped_by: str = "abort") -> Table:
    """Per tool: its calls and how they were answered (from ``tally``) and what its
    provider answered, its requests and 429s (``stats["tools"]``); local tools are marked
    local and free, and have no provider rows. ``stopped_by`` names what cancelled calls
    (``"abort"`` or ``"interrupt"``), in the row that counts them."""
    per_tool = stats.get("tools", {}) if isinstance(stats.get("tools"), dict) else {}
    counts = tally.snapshot() if tally is not None else {}
    local = tally.local if tally is not None else set()
    tools = sorted(set(per_tool) | set(counts))
    table = Table(title="per tool", show_header=True, header_style="bold")
    table.add_column("metric")
    for tool in tools:  # a column per tool: a few tools fit a terminal's width
        table.add_column(f"{tool} (local, free)" if tool in local else tool, justify="right")
    if tally is not None:
        for t in local & set(counts):  # no receipts: a local tool's runs are its executions
            mine = dict(counts[t])
            mine["ran"] = int(per_tool.get(t, {}).get("provider_calls", 0))
            others = (
                mine["ran"] + mine["reused"] + mine["reused_this_run"] + mine["failed"] + mine["cancelled"]
                + mine["input_refused"] + mine["salvaged"]
            )  # fmt: skip
            mine["joined"] = max(0, mine["calls"] - others)
            counts[t] = mine
        for t in set(counts) - local:  # a paid tool's receipts completed: what the store took
            if "completed" in stats:
                mine = dict(counts[t])
                mine["not_stored"] = max(0, mine["ran"] - int(per_tool.get(t, {}).get("completed", 0)))
                mine["ran"] -= mine["not_stored"]
                counts[t] = mine
        for key, label in _TOOL_ROWS:
            table.add_row(label, *(str(counts.get(t, {}).get(key, 0)) for t in tools))
        if any(c.get("input_refused") for c in counts.values()):  # not plain JSON, over the cap
            table.add_row(
                "input refused (nothing sent)",
                *(str(counts.get(t, {}).get("input_refused", 0)) for t in tools),
            )
        for key, label in (
            ("not_stored", "ran, result not stored"),
            ("cancelled", f"cancelled by the {stopped_by}"),  # a signal: calls refused unsent
            ("salvaged", f"paid, salvaged by the {stopped_by}"),
        ):
            if any(c.get(key) for c in counts.values()):
                table.add_row(label, *(str(counts.get(t, {}).get(key, 0)) for t in tools))
    for key, label in _TOOL_STATS:  # a local tool sends no requests: no provider rows
        table.add_row(label, *("-" if t in local else str(per_tool.get(t, {}).get(key, 0)) for t in tools))
    return table

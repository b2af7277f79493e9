"""Host-facing configuration: tools, batch strategies, pacing, policy, run identity."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from actors.checks import check_count, check_number, check_weight
from stores.inputs import MAX_INPUT_BYTES
from stores.money import Money

__all__ = ["NOT_DONE", "BatchStrategy", "Limit", "Pacing", "Policy", "RunInfo", "Tool"]


class _NotDone:
    def __repr__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Any = _NotDone()
"""What a tool's ``reconcile`` hook returns when the provider did not act on the call."""


def _split_list(result: Any, n: int) -> list[Any]:
    if not isinstance(result, (list, tuple)):
        raise TypeError(f"batch result must be a list of {n} results, got {type(result).__name__}")
    return list(result)


PERIODS_S = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
"""The named windows of a :class:`Limit`, seconds."""

RATE_WINDOW_S = 1.0
"""A :class:`Limit` over a window this long or shorter is a rate; a longer one a quota."""


def _per_s(value: Any) -> float:
    if isinstance(value, str):
        if value not in PERIODS_S:
            raise ValueError(f"Limit.per must be one of {sorted(PERIODS_S)} or seconds > 0, got {value!r}")
        return PERIODS_S[value]
    check_number("Limit.per", value, positive=True)
    if math.isinf(value):
        raise ValueError("Limit.per must be finite")
    return float(value)


@attrs.frozen
class Limit:
    """One limit of a provider: at most ``amount`` units of ``unit`` per window ``per``.

    A limit over a window of one second or less is a **rate**: units flow at
    ``amount / per`` a second, paced by GCRA (ITU-T I.371) with a tolerance of ``burst``
    units. A longer one is a **quota**: never more than ``amount`` units in any window of
    that length (a sliding window, counted conservatively in sub-buckets of 1/60 of the
    window, so it also holds against a provider counting fixed windows), until the
    provider announces its own count (:mod:`actors.pacing.announced`). A
    ``Limit(n, "second")`` in requests, on a :class:`Pacing` without ``rps``, is ``rps=n``
    (the request rate's AIMD and learner keep it).

    Attributes:
        amount: units allowed per window (> 0).
        per: ``"second"``, ``"minute"``, ``"hour"``, ``"day"``, or the window in seconds
            (a float > 0).
        unit: what is counted: ``"requests"`` (each request is 1), or a unit a tool
            states per call (``Tool.units``), such as ``"tokens"``.
        burst: a rate's tolerance, units that may go at once (default: a tenth of the
            window's amount, at least one request's units); ignored by a quota.

    Raises:
        ValueError: an amount or burst that is not a number > 0, an unknown ``per``, an
            empty unit.
    """

    amount: float
    per: str | float = "second"
    unit: str = "requests"
    burst: float | None = None

    def __attrs_post_init__(self) -> None:
        check_number("Limit.amount", self.amount, positive=True)
        if math.isinf(self.amount):
            raise ValueError("Limit.amount must be finite (leave the limit out: unlimited)")
        _per_s(self.per)
        if not isinstance(self.unit, str) or not self.unit:
            raise ValueError(f"Limit.unit must be a non-empty str, got {self.unit!r}")
        check_number("Limit.burst", self.burst, positive=True, optional=True)

    @property
    def window_s(self) -> float:
        """The window's length, seconds."""
        return _per_s(self.per)

    @property
    def is_rate(self) -> bool:
        """A rate (window of at most :data:`RATE_WINDOW_S`), not a quota."""
        return self.window_s <= RATE_WINDOW_S

    @property
    def name(self) -> str:
        """How errors and reports name it, e.g. ``"1000 requests/minute"``."""
        per = self.per if isinstance(self.per, str) else f"{self.window_s:g}s"
        return f"{self.amount:g} {self.unit}/{per}"


@attrs.frozen(kw_only=True)
class Pacing:
    """A provider's limits, as far as they are known (see :mod:`actors.pacing.bucket`).

    With ``rps`` stated, calls are paced just under it and a 429 still cuts the rate
    for a while (AIMD). Without it the rate is learnt from 429s: with ``start_rps``,
    calls start at that rate and it doubles every 0.5 s until the first 429 (slow start,
    for remote APIs whose limit is unknown); without either, calls are unpaced until
    the first 429 (only the concurrency limits hold them; for local tools).

    Attributes:
        rps: the provider's rate limit, requests per second.
        burst: token bucket size, in calls; default 1 + rate/100 (smooth pacing).
        max_concurrency: provider calls in flight at once.
        start_rps: where slow start begins when ``rps`` is unknown, requests per second.
        limits: the provider's other limits (:class:`Limit`: rates and quotas, in requests
            or in units such as tokens), each enforced beside ``rps``; a list or tuple.

    Raises:
        ValueError: a rate or limit that is not positive, or ``limits`` holding anything
            but :class:`Limit` values.
    """

    rps: float | None = None
    burst: float | None = None
    max_concurrency: int | None = None
    start_rps: float | None = None
    limits: tuple[Limit, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        for name in ("rps", "start_rps"):
            value = getattr(self, name)
            check_number(f"Pacing.{name}", value, positive=True, optional=True)
            if value is not None and math.isinf(value):
                raise ValueError(f"Pacing.{name} must be finite (leave it None: unpaced)")
        check_number("Pacing.burst", self.burst, minimum=1.0, optional=True)
        check_count("Pacing.max_concurrency", self.max_concurrency, optional=True)
        for limit in self.limits:
            if not isinstance(limit, Limit):
                raise ValueError(f"Pacing.limits must hold Limit values, got {limit!r}")
        if self.rps is None:  # a requests-per-second limit is the request rate the AIMD keeps
            for limit in self.limits:
                if limit.unit == "requests" and limit.window_s == 1.0:
                    object.__setattr__(self, "rps", float(limit.amount))
                    if self.burst is None and limit.burst is not None:
                        object.__setattr__(self, "burst", max(1.0, float(limit.burst)))
                    break

    @property
    def unit_limits(self) -> tuple[Limit, ...]:
        """The limits kept by the quota state (every one but the requests-per-second
        limit that became ``rps``)."""
        return tuple(
            lim for lim in self.limits
            if not (lim.unit == "requests" and lim.window_s == 1.0 and lim.amount == self.rps)
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class BatchStrategy:
    """How single calls of a tool become one provider batch call.

    Attributes:
        batch_fn: the provider's batch operation, ``batch_fn(payload, ctx) -> result``;
            runs on the execution pool (a worker thread, or a greenlet under gevent).
        max_batch_size: most unique calls in one batch.
        max_batch_bytes: most input bytes in one batch: the sum of its members' canonical
            JSON inputs (RFC 8785, UTF-8), default 32 MiB (``stores.MAX_INPUT_BYTES``, the
            cap of one call's input). Members past it go in the next batch; a member
            larger than it goes alone.
        build: ``build(inputs) -> payload``; default the list of inputs.
        split: ``split(result, n) -> list of n results`` in member order; default
            expects the result to be that list. A member result that is an Exception
            fails that member alone; None gives status ``no_result``.
        batch_operation: the provider's name for the batch operation (for logs).
        input_id / result_id: optional ``input_id(input)`` and ``result_id(item)``;
            when both are given, split results are matched to members by id instead
            of by position (for providers that answer in another order); a member
            with no matching item gets ``no_result``.
        request_price: what one batch request costs whatever its size (a
            :class:`~stores.money.Money`), split over its members
            (:meth:`~stores.money.Money.split`: shares that add up exactly) and added to
            each member's own ``Tool.price``; None: nothing per request.
    """

    batch_fn: Callable[[Any, Any], Any]
    max_batch_size: int
    max_batch_bytes: int = MAX_INPUT_BYTES
    build: Callable[[list[Any]], Any] = list
    split: Callable[[Any, int], Sequence[Any]] = _split_list
    batch_operation: str = ""
    input_id: Callable[[Any], Any] | None = None
    result_id: Callable[[Any], Any] | None = None
    request_price: Money | None = None

    def __attrs_post_init__(self) -> None:
        check_count("BatchStrategy.max_batch_size", self.max_batch_size)
        check_count("BatchStrategy.max_batch_bytes", self.max_batch_bytes)
        if self.request_price is not None and not isinstance(self.request_price, Money):
            raise ValueError(
                f"BatchStrategy.request_price must be a stores.Money, not {self.request_price!r}"
            )


@attrs.frozen(kw_only=True)
class Tool:
    """A named operation on an external provider.

    Attributes:
        tool_id: the tool's name, as ``execute`` gives it.
        fn: ``fn(input, ctx) -> JSON value``, the single call (the batch's source
            operation). Runs on the execution pool.
        provider: whose limits it shares (default ``tool_id``).
        version: the provider action version (part of the receipt key).
        pacing: the provider's limits.
        batch: batch strategy, or None.
        durable: False skips receipts (no cache, no idempotency).
        retry_safe: transient failures are retried in-call (charging the retry budget).
        timeout_s: per-call timeout, seconds (None: the policy's default).
        lease_ttl_s: receipt lease TTL, seconds (None: the policy's default).
        non_semantic_fields: top-level input fields left out of the receipt key (sent all
            the same: plain JSON, counted in the input cap, InvalidInputError otherwise).
        reconcile: ``reconcile(input, ctx) -> output or NOT_DONE``: asks the provider
            (by ``ctx.idempotency_key``, the key the uncertain attempt sent) whether a call
            whose outcome is uncertain did act. An output is stored as the receipt's
            result (``cached``); :data:`NOT_DONE` runs the call again; an exception
            leaves it uncertain (UncertainOutcomeError). Runs on the worker pool.
            For a batched tool, ``ctx.idempotency_key`` is the member's own key: the
            batch key an uncertain batch sent is not recorded (a process killed with the
            batch in flight never wrote it), so the hook must ask the provider by the
            input itself, or leave it uncertain for an operator.
        credentials: ``credentials() -> str`` giving the credential-scope digest;
            cached, and asked again after an :class:`AuthScopeChangedError`. The rule
            for custom tools: a tool that authenticates must set it, and the digest
            must change whenever the account or key changes (two accounts must never
            share receipts, which they would with the default ""). Return a hash
            (sha256 hex) of what authenticates the calls (keys, tokens, account ids,
            for instance via :func:`actors.http.credential_scope_digest`), never the
            secret itself: the digest is stored in no table but is hashed into every
            receipt key and handed to the tool in ``ToolContext``. ``http_tool`` sets
            it from its headers, query strings, client and ``credentials=``.
        keep_input: what its receipts keep of each call's input, so an operator can tell
            what a receipt was for (``tooldispatch receipts ls`` and ``show``): True
            (default), the canonical input (RFC 8785 JSON, at most
            ``stores.rows.INPUT_TEXT_MAX_CHARS`` characters); for inputs that must not be
            stored, a function ``keep_input(input) -> str`` giving a readable digest of
            its choosing (a masked e-mail address, an account id) that is kept instead;
            False, nothing. The function runs on the caller's thread, when the call's
            key is made; an error it raises (or a value that is not a str) fails that
            call alone with InvalidInputError. The input hash is kept in every case.
        price: what one answered call costs, kept on its receipt when it is paid: a
            :class:`~stores.money.Money` (per request; for a batched tool, per member,
            beside ``BatchStrategy.request_price``), or a function
            ``price(input, output) -> Money`` for a price known from the answer (the
            tokens in an LLM's usage, say), run on the worker after the call returns;
            None: unpriced. A function that raises or returns anything but a Money
            leaves that call's cost unknown (None) and logs a warning: the answer is
            kept all the same. It runs before the answer is handed back, so its time
            counts in the call's ``timeout_s``: keep it quick. Not for a tool with
            ``durable=False`` (local and free: ValueError).
        price_estimate: for a ``price`` function, what one answered call is counted at
            under a money budget (``Policy.max_spend``) from when it is granted its slot
            until its answer says what it really cost (a :class:`~stores.money.Money`);
            None: no estimate, and such a tool under a money budget is refused when the
            system starts (ValueError naming the tool). Ignored with a fixed price.
        units: for limits counted in units (``Limit(unit="tokens")``): ``units(input) ->
            {unit: estimate}``, what one call is expected to use, run on the tool queue's
            thread before it asks for a slot (a batch request counts its members' units,
            summed); None: 0 of every unit. An error it raises, or a value that is not a
            mapping of finite numbers >= 0, counts that call at 0 and logs a warning.
        units_used: ``units_used(input, output) -> {unit: used}``, what the answered call
            really used (on the worker, after the call returns); the limits are corrected
            by the difference from the estimate. A tool function can instead call
            :func:`actors.pacing.reports.report_usage` (which wins for the units it names).

    Raises:
        ValueError: a duration that is not a number (NaN, text, an int past a float's
            range) or is out of its range, or a count that is not a whole number in its
            range (a concurrency of 0, say), a ``keep_input`` that is neither a bool
            nor a function, or a ``price`` that is neither a Money nor a function (or
            is given to a tool with ``durable=False``), or a ``price_estimate`` that is
            not a Money: refused here, not on an actor's thread.
    """

    tool_id: str
    fn: Callable[[Any, Any], Any]
    provider: str = ""
    version: str = "1"
    pacing: Pacing = Pacing()
    batch: BatchStrategy | None = None
    durable: bool = True
    retry_safe: bool = False
    timeout_s: float | None = None
    lease_ttl_s: float | None = None
    non_semantic_fields: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    credentials: Callable[[], str] | None = None
    reconcile: Callable[[Any, Any], Any] | None = None
    keep_input: bool | Callable[[Any], str] = True
    price: Money | Callable[[Any, Any], Money] | None = None
    price_estimate: Money | None = None
    units: Callable[[Any], Mapping[str, float]] | None = None
    units_used: Callable[[Any, Any], Mapping[str, float]] | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("units", "units_used"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"Tool.{name} must be a function or None, not {getattr(self, name)!r}")
        check_number("Tool.timeout_s", self.timeout_s, positive=True, optional=True)
        check_number("Tool.lease_ttl_s", self.lease_ttl_s, positive=True, optional=True)
        if not (isinstance(self.keep_input, bool) or callable(self.keep_input)):
            raise ValueError(
                f"Tool.keep_input must be True, False or a function input -> str, not {self.keep_input!r}"
            )
        if self.price is not None and not self.durable:
            raise ValueError(
                f"Tool {self.tool_id!r}: a price on a tool with durable=False (local and free, no "
                "receipt to keep its cost): make it durable, or leave the price out"
            )
        if not (self.price is None or isinstance(self.price, Money) or callable(self.price)):
            raise ValueError(
                f"Tool.price must be a stores.Money or a function (input, output) -> Money, "
                f"not {self.price!r}"
            )
        if self.price_estimate is not None and not isinstance(self.price_estimate, Money):
            raise ValueError(f"Tool.price_estimate must be a stores.Money, not {self.price_estimate!r}")
        if self.price_estimate is not None and not self.durable:
            raise ValueError(f"Tool {self.tool_id!r}: a price_estimate on a tool with durable=False")

    @property
    def provider_name(self) -> str:
        """The provider whose pacing this tool shares."""
        return self.provider or self.tool_id

    @property
    def stated_price(self) -> Money | None:
        """What one call costs before its answer is known: ``price`` when it is a Money,
        else ``price_estimate`` (None: unknown until the answer, or unpriced)."""
        return self.price if isinstance(self.price, Money) else self.price_estimate

    @property
    def priced(self) -> bool:
        """Whether an answered call of it may cost anything (a price or a request price)."""
        return self.price is not None or (self.batch is not None and self.batch.request_price is not None)

    def known_cost(self, members: int, batched: bool) -> Money | None:
        """What one request of ``members`` calls is known to cost before it is sent: the
        price per member (``price`` when a Money, else ``price_estimate``) plus, when
        ``batched`` (sent through ``BatchStrategy.batch_fn``), ``request_price``; None
        when nothing is known. Currencies are the caller's to check (a sum of two raises
        ValueError)."""
        own = self.price if isinstance(self.price, Money) else self.price_estimate
        cost = own * members if own is not None else None
        shared = self.batch.request_price if batched and self.batch is not None else None
        if shared is None:
            return cost
        return shared if cost is None else cost + shared


def _weight(value: Any) -> float:
    return check_weight("fairness_weight", value)


@attrs.frozen(kw_only=True)
class RunInfo:
    """One execution of a play.

    Attributes:
        run_id: the run's id (lease owner).
        org_id: the org; receipts never cross orgs.
        scope: the play's name; namespaces receipts.
        run_attempt: retries of the same run (lease owner attempt).
        deadline_s: seconds from start after which completion retries give up early.
        fairness_key: who the run's calls count for among the runs sharing a pacer (a
            customer id, a play; None: the run itself, ``run_id``): while several keys
            want more than a provider's rate allows, each gets its weighted share
            (docs/pacing.md, Fair shares).
        fairness_weight: the key's weight (a number from 1e-6 to 1e6:
            :func:`~actors.checks.check_weight`).

    Raises:
        ValueError: a ``fairness_weight`` out of that range.
    """

    run_id: str
    org_id: str
    scope: str
    run_attempt: int = 1
    deadline_s: float | None = None
    fairness_key: str | None = None
    fairness_weight: float = attrs.field(default=1.0, converter=_weight)


def _frozen(value: Mapping[str, Money]) -> Mapping[str, Money]:
    """A read-only copy of a mapping (a policy is frozen)."""
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class Policy:
    """Dispatcher settings; defaults from docs/host-api.md (Configuration). Times in seconds.

    Attributes:
        batch_grace_s: how long a batchable tool's queue waits for more calls.
        lease_ttl_s: receipt lease lifetime.
        heartbeat_interval_s: lease renewal period (None: a third of the lease TTL).
        heartbeats: False turns lease renewal off (leases then expire after their TTL
            even while a call runs; for tests and for stores that cannot renew).
        timeout_s: default per-call timeout.
        max_concurrency: global ceiling of provider calls in flight.
        max_provider_calls / max_retries / max_receipt_ops: budgets (None: unlimited).
        max_spend: a budget in money for the run (every provider of this system
            together; None: unlimited): a call (or a batch request) is charged what it is
            known to cost (``Tool.known_cost``) when it is granted its slot, before it is
            sent, and one that would pass the budget is refused with
            BudgetExceededError, its receipt left pending (docs/host-api.md, Budgets
            in money).
        max_spend_by_provider: provider name -> its own budget in money for the run,
            beside ``max_spend``.
        retry_attempts: in-call attempts of retry-safe tools on transient errors.
        retry_backoff_s: first back-off between those attempts (doubles, jittered).
        receipt_poll_initial_s / receipt_poll_max_s / receipt_wait_max_attempts:
            how a call waits for another owner's receipt (bounded, backing off).
        completion_ladder_s: back-offs between completion write attempts.
        completion_deadline_headroom_s: give up early when the run deadline leaves
            less than the back-off plus this.
        completion_max_members / completion_max_bytes: caps of one bulk write.
        recovery_max_reads: receipts read back at once after a failed bulk write.
        retry_after_default_s / retry_after_max_s / retry_after_min_s: backpressure
            pause for an unparseable, an excessive, and a past Retry-After.
        circuit_failures: consecutive unavailable outcomes (connection errors, 5xx,
            timeouts, after in-call retries) that open a provider's circuit: its calls are
            then refused at once with ProviderUnavailableError (None: never).
        circuit_open_s / circuit_open_max_s: how long the circuit stays open before one
            probe call may go; doubles after each failed probe, up to the max.
        salvage_path: JSONL file for salvaged outputs (None: next to the store, or
            ``tooldispatch-salvage.jsonl`` in the working directory).
        memo_max_bytes: bytes of completed outputs each durable tool keeps in memory
            to answer repeated calls without the store (oldest dropped first; 0: none).
        perf_hook: ``hook(phase, ms, extra)``; called on a thread of its own, in order,
            never on an actor or a tool's worker (a slow hook delays no call).

    Raises:
        ValueError: a duration that is not a number (NaN, text, an int past a float's
            range) or is out of its range, or a count that is not a whole number in its
            range (a concurrency of 0, say), or a money budget that is not a
            :class:`~stores.money.Money`: refused here, not on an actor's thread.
    """

    batch_grace_s: float = 0.25
    lease_ttl_s: float = 60.0
    heartbeat_interval_s: float | None = None
    heartbeats: bool = True
    timeout_s: float = 120.0
    max_concurrency: int = 64
    max_provider_calls: int | None = None
    max_retries: int | None = None
    max_receipt_ops: int | None = None
    max_spend: Money | None = None
    max_spend_by_provider: Mapping[str, Money] = attrs.field(factory=dict, converter=_frozen, hash=False)
    retry_attempts: int = 3
    retry_backoff_s: float = 0.5
    receipt_poll_initial_s: float = 0.01
    receipt_poll_max_s: float = 1.0
    receipt_wait_max_attempts: int = 200
    completion_ladder_s: tuple[float, ...] = (1.0, 3.0, 9.0)
    completion_deadline_headroom_s: float = 10.0
    completion_max_members: int = 500
    completion_max_bytes: int = 32 * 1024 * 1024
    recovery_max_reads: int = 25
    retry_after_default_s: float = 5.0
    retry_after_max_s: float = 300.0
    retry_after_min_s: float = 0.05
    circuit_failures: int | None = 5
    circuit_open_s: float = 5.0
    circuit_open_max_s: float = 60.0
    salvage_path: str | None = None
    memo_max_bytes: int = 64 * 1024 * 1024
    perf_hook: Callable[[str, float, dict[str, Any]], None] | None = None

    def __attrs_post_init__(self) -> None:
        for name in _POLICY_POSITIVE:
            check_number(f"Policy.{name}", getattr(self, name), positive=True, optional=name in _OPTIONAL)
        for name in _POLICY_SECONDS:
            check_number(f"Policy.{name}", getattr(self, name))
        for name, least in _POLICY_COUNTS.items():
            check_count(f"Policy.{name}", getattr(self, name), minimum=least, optional=name in _OPTIONAL)
        for step in self.completion_ladder_s:
            check_number("Policy.completion_ladder_s", step)
        if self.max_spend is not None and not isinstance(self.max_spend, Money):
            raise ValueError(
                f"Policy.max_spend must be a stores.Money (Money.parse('25USD')), not {self.max_spend!r}"
            )
        for provider, budget in self.max_spend_by_provider.items():
            if not isinstance(provider, str) or not provider:
                raise ValueError(f"Policy.max_spend_by_provider: a provider name, not {provider!r}")
            if not isinstance(budget, Money):
                raise ValueError(
                    f"Policy.max_spend_by_provider[{provider!r}] must be a stores.Money, not {budget!r}"
                )

    def spend_currency(self, provider: str) -> str | None:
        """The currency of the money budgets that apply to ``provider`` (``max_spend``,
        else its own), or None when none does."""
        budget = self.max_spend or self.max_spend_by_provider.get(provider)
        return budget.currency if budget is not None else None

    def heartbeat_for(self, lease_ttl_s: float) -> float:
        """Seconds between lease renewals for a lease of ``lease_ttl_s``."""
        return self.heartbeat_interval_s or lease_ttl_s / 3.0


_POLICY_POSITIVE = (
    "lease_ttl_s", "heartbeat_interval_s", "timeout_s", "receipt_poll_initial_s", "receipt_poll_max_s",
)  # fmt: skip
"""Policy durations that must be above 0, seconds."""
_POLICY_SECONDS = (
    "batch_grace_s", "retry_backoff_s", "completion_deadline_headroom_s", "retry_after_default_s",
    "retry_after_max_s", "retry_after_min_s", "circuit_open_s", "circuit_open_max_s",
)  # fmt: skip
"""Policy durations that may be 0, seconds."""
_POLICY_COUNTS = {
    "max_concurrency": 1, "max_provider_calls": 0, "max_retries": 0, "max_receipt_ops": 0,
    "retry_attempts": 0, "receipt_wait_max_attempts": 1, "completion_max_members": 1,
    "completion_max_bytes": 0, "recovery_max_reads": 0, "circuit_failures": 1, "memo_max_bytes": 0,
}  # fmt: skip
"""Policy counts and their least value."""
_OPTIONAL = frozenset({"heartbeat_interval_s", "max_provider_calls", "max_retries", "max_receipt_ops",
                       "circuit_failures"})  # fmt: skip
"""Policy fields that may be None."""

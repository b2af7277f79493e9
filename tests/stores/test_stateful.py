"""Stateful model test of the receipt stores (issue 2, section 5; Postgres: issue 11).

A hypothesis ``RuleBasedStateMachine`` drives a real :class:`stores.SqliteReceiptStore`
on a real file in a temp dir (with a fake clock), and the same machine drives a
:class:`stores.PostgresReceiptStore` in a schema of its own (skipped without Postgres,
failing in CI), and, side by side, a plain model
written here from SEMANTICS.md (Claims, Leases) and the store contract
(``stores/base.py`` docstrings) without any store code: the dispositions table is
re-derived below, not taken from ``stores.decide_disposition``. After every step the
receipts of every pool key in every org are read back and compared field by field
with the model, and every answer (dispositions, the receipt a claim returns, applied
keys in request order, refused keys, refusal reasons and the receipts they carry) is
compared with what the model predicted.

Choices the model makes where SEMANTICS.md is silent (the contract's docstrings say
the same):

- Any live lease counts as ``running`` for a claim, even the claimer's own: a run never
  runs one key twice at once.
- A lease is live while ``lease_expires_at > now``; at ``now == lease_expires_at`` it
  has expired. A completion is stale when ``now - completed_at > stale_after_s``.
- Fencing compares lease id, owner run id and owner attempt, and the receipt must be
  queued or running; expiry alone does not fence (only "expired and taken" does).
- Completed and failed receipts keep their last lease id and owner (expiry cleared),
  so a retried complete (or fail) by that same holder is answered "applied" and changes
  nothing. A new claim clears error and failure kind, and counts an attempt; it keeps
  output and completed_at of a completed receipt (force refresh, stale re-run) until a
  new output is stored: failing or releasing that lease restores ``completed``, and a
  claim that finds its lease expired treats it as the completed receipt it was (a
  reuse restores ``completed``, with error ``REFRESH_LOST``, its generation kept). A
  restored receipt holds no lease id or owner, so the lost refresh's late writes are
  refused. A release clears the lease.
- The execution generation starts at 1 and grows when a completed or failed receipt is
  claimed again, but for a failure of kind ``timeout`` (no answer came: the next attempt
  asks under the same idempotency key) and a lost refresh restored ``completed``. Every
  lease records this process's identity (all owners live here).
- Error text is stored with NUL and lone surrogates written as backslash escapes.
- ``purge(older_than_s=x)`` deletes receipts with ``now - updated_at >= x`` whose
  status is listed and which are not under a live lease.

Run ``pytest tests/stores/test_stateful.py --hypothesis-show-statistics`` to see how
often each disposition-table row and each refusal reason came up.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from stores import (
    REFRESH_LOST,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    RefusalReason,
    SqliteReceiptStore,
    current_process_identity,
)

pytestmark = pytest.mark.scenario

S = ReceiptStatus
D = ClaimDisposition

ORGS = ("org-a", "org-b")
KEYS = tuple(hashlib.sha256(f"key-{i}".encode()).hexdigest() for i in range(5))
OWNERS = (Owner("run-1", 1), Owner("run-1", 2), Owner("run-2", 1))  # two attempts of one run
T0 = 1_700_000_000.0
LEASE_TTLS_S = (1.0, 2.5, 5.0, 10.0, 30.0)
STALE_AFTERS_S = (0.0, 5.0, 15.0, 30.0)
PURGE_AGES_S = (0.0, 1.0, 5.0, 30.0, 60.0)
DEFAULT_PURGE = frozenset({S.COMPLETED, S.FAILED, S.PENDING, S.SKIPPED})

# SEMANTICS.md, Claims: store state (row) x claim mode (column) -> disposition.
DISPOSITIONS: dict[str, dict[ClaimMode, ClaimDisposition]] = {
    "absent_or_pending": {m: D.CLAIMED for m in ClaimMode},
    "completed_fresh": {
        ClaimMode.NORMAL: D.REUSED,
        ClaimMode.RETRY_FAILED: D.REUSED,
        ClaimMode.FORCE_REFRESH: D.CLAIMED,
    },
    "completed_stale": {m: D.CLAIMED for m in ClaimMode},
    "in_flight_live": {
        ClaimMode.NORMAL: D.RUNNING,
        ClaimMode.RETRY_FAILED: D.RUNNING,
        ClaimMode.FORCE_REFRESH: D.BLOCKED_ACTIVE_LEASE,
    },
    "in_flight_expired": {m: D.CLAIMED for m in ClaimMode},
    # a live refresh of an output the receipt still holds, fresh for the claim: ordinary
    # claims take that last good output and never wait on the refresh (issue 26, fault 7)
    "refresh_live": {
        ClaimMode.NORMAL: D.REUSED,
        ClaimMode.RETRY_FAILED: D.REUSED,
        ClaimMode.FORCE_REFRESH: D.BLOCKED_ACTIVE_LEASE,
    },
    "failed": {
        ClaimMode.NORMAL: D.FAILED,
        ClaimMode.RETRY_FAILED: D.CLAIMED,
        ClaimMode.FORCE_REFRESH: D.CLAIMED,
    },
}

HERE = current_process_identity()
APPLY = "apply"
ALREADY = "already"  # a retried complete/fail that already landed: applied, nothing changes


class FakeClock:
    """The store's clock, moved only by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class NotJson:
    """An output with no JSON form: the store must refuse it for its key alone."""

    def __repr__(self) -> str:
        return "NotJson()"


@attrs.define
class ModelReceipt:
    """What the model believes one receipt row holds."""

    status: ReceiptStatus
    lease_id: str | None
    owner: Owner | None
    lease_expires_at: float | None
    attempts: int
    created_at: float
    updated_at: float
    output: Any = None
    error: str | None = None
    failure_kind: FailureKind | None = None
    completed_at: float | None = None
    generation: int = 1


def request_for(key: str) -> ClaimRequest:
    """The claim request a dispatcher would send: its fields follow from the key."""
    return ClaimRequest(key=key, scope="play", tool_id=f"tool-{key[:4]}", input_hash=f"in-{key[:16]}")


def expected_receipt(org: str, key: str, m: ModelReceipt) -> Receipt:
    request = request_for(key)
    return Receipt(
        key=key,
        org_id=org,
        scope=request.scope,
        tool_id=request.tool_id,
        status=m.status,
        input_hash=request.input_hash,
        output=m.output,
        error=m.error,
        failure_kind=m.failure_kind,
        lease_id=m.lease_id,
        lease_owner_run_id=m.owner.run_id if m.owner else None,
        lease_owner_attempt=m.owner.run_attempt if m.owner else None,
        lease_expires_at=m.lease_expires_at,
        attempts=m.attempts,
        created_at=m.created_at,
        updated_at=m.updated_at,
        completed_at=m.completed_at,
        generation=m.generation,
        lease_owner_host=HERE.host if m.owner else None,
        lease_owner_pid=HERE.pid if m.owner else None,
        lease_owner_started_at=HERE.started_at if m.owner else None,
    )


def table_row(m: ModelReceipt | None, now: float, stale_after_s: float | None) -> str:
    """Which row of the dispositions table a receipt is in."""
    if m is None or m.status in (S.PENDING, S.SKIPPED):
        return "absent_or_pending"
    if m.status is S.COMPLETED:
        assert m.completed_at is not None
        stale = stale_after_s is not None and now - m.completed_at > stale_after_s
        return "completed_stale" if stale else "completed_fresh"
    if m.status in (S.QUEUED, S.RUNNING):
        assert m.lease_expires_at is not None
        if m.lease_expires_at > now:
            fresh = m.completed_at is not None and (
                stale_after_s is None or now - m.completed_at <= stale_after_s
            )
            return "refresh_live" if fresh else "in_flight_live"
        if m.completed_at is not None:  # a lost refresh: the completed receipt it was
            stale = stale_after_s is not None and now - m.completed_at > stale_after_s
            return "completed_stale" if stale else "completed_fresh"
        return "in_flight_expired"
    assert m.status is S.FAILED
    return "failed"


def stored_error(text: str) -> str:
    """The error text the store keeps: NUL and lone surrogates as backslash escapes."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


# -- strategies -----------------------------------------------------------------------

no_surrogates = st.characters(codec="utf-8")
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53), 2**53),
        st.integers(2**64, 2**70),  # beyond 64 bits: the exact form
        st.floats(allow_nan=False),  # Infinity: the exact form (NaN != NaN)
        st.text(no_surrogates, max_size=8),  # NUL included
        # lone surrogates (never a high one right before a low one): the exact form
        st.lists(st.sampled_from(["a", "\ud83d", "b\udc00"]), max_size=3).map("".join),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(no_surrogates, max_size=5), inner, max_size=3),
    ),
    max_leaves=6,
)
outputs = st.integers(0, 15).flatmap(lambda i: st.just(NotJson()) if i == 15 else json_values)
error_texts = st.text(
    st.one_of(st.characters(), st.sampled_from("\x00\ud800\udcff")), max_size=20
)  # NUL, surrogates
clock_steps = st.one_of(st.integers(0, 20).map(float), st.sampled_from([0.25, 0.5, 2.5]))
orgs = st.sampled_from((ORGS[0], ORGS[0], ORGS[1]))  # one busy org, one to check isolation
CLAIM_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "org": orgs,
    "keys": st.lists(st.sampled_from(KEYS), min_size=1, max_size=5),  # duplicates allowed
    "owner": st.sampled_from(OWNERS),
    "mode": st.sampled_from(ClaimMode),
    "stale_after_s": st.one_of(st.none(), st.sampled_from(STALE_AFTERS_S)),
    "lease_ttl_s": st.sampled_from(LEASE_TTLS_S),
}
ACTIONS = (
    "claim", "claim", "claim", "mark_running", "renew", "complete", "complete", "fail", "release",
    "advance_clock", "advance_clock", "purge",
)  # fmt: skip
OWNER_CHOICES: tuple[Owner | str, ...] = ("holder", "holder", "holder", *OWNERS)  # "holder": of keys[0]
LEASE_SOURCES = ("current", "current", "current", "mine", "any", "bogus")
CLOCK_MOVES = ("by", "to_lease_edge", "to_stale_edge", "to_purge_edge")


def _conftest() -> Any:
    """tests/stores/conftest.py as a module (pytest loads it, but not under an importable name)."""
    name = "_td_stores_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("conftest.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class ReceiptStoreMachine(RuleBasedStateMachine):
    """SqliteReceiptStore on a temp file against the in-test model."""

    def make_store(self) -> Any:
        return SqliteReceiptStore(f"{self.dir}/receipts.db", clock=self.clock)

    def drop_store(self) -> None:
        pass

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="td-stateful-")
        self.clock = FakeClock(T0)
        self.store = self.make_store()
        self.model: dict[tuple[str, str], ModelReceipt] = {}
        self.leases: list[tuple[str, str, str, Owner]] = []  # every lease granted: (org, key, id, owner)
        self.bogus = 0

    def teardown(self) -> None:
        self.store.close()
        self.drop_store()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ------------------------------------------------------------------------
    # One rule picks the action. With one @rule per action, hypothesis's swarm testing
    # switches about half of the rules off in each example, so most examples lost every
    # claim or every fenced call, and boundary bugs went unseen for many runs.

    @initialize(**CLAIM_ARGS)  # type: ignore[call-overload, untyped-decorator]
    def first_claim(self, **kwargs: Any) -> None:
        self.claim(**kwargs)

    @rule(action=st.sampled_from(ACTIONS), data=st.data())
    def step(self, action: str, data: st.DataObject) -> None:
        """claim; mark_running, renew, complete, fail or release (fenced); advance_clock; purge."""
        getattr(self, f"do_{action}")(data)

    def do_claim(self, data: st.DataObject) -> None:
        self.claim(**{name: data.draw(strategy, label=name) for name, strategy in CLAIM_ARGS.items()})

    def claim(
        self,
        org: str,
        keys: list[str],
        owner: Owner,
        mode: ClaimMode,
        stale_after_s: float | None,
        lease_ttl_s: float,
    ) -> None:
        now = self.clock.now
        before = {k: attrs.evolve(m) for (o, k), m in self.model.items() if o == org}
        expected = {}
        for key in keys:
            row = table_row(before.get(key), now, stale_after_s)
            expected[key] = DISPOSITIONS[row][mode]
            event(f"claim row: {row}, {mode.value} -> {expected[key].value}")
        claims = self.store.claim_many(
            org,
            [request_for(k) for k in keys],
            owner,
            lease_ttl_s=lease_ttl_s,
            mode=mode,
            stale_after_s=stale_after_s,
        )
        assert len(claims) == len(keys)
        first: dict[str, Any] = {}
        for key, claim in zip(keys, claims, strict=True):
            assert claim.disposition is expected[key], (key[:6], claim.disposition, expected[key])
            if key in first:  # duplicate keys are claimed once and answered alike
                assert claim == first[key]
            first[key] = claim
        granted = {lease_id for (_, _, lease_id, _) in self.leases}
        for key, claim in first.items():
            old = before.get(key)
            if claim.disposition is not D.CLAIMED:
                assert old is not None
                lapsed = old.lease_expires_at is not None and old.lease_expires_at <= now
                if claim.disposition is D.REUSED and old.status in (S.QUEUED, S.RUNNING) and lapsed:
                    m = self.model[(org, key)]  # a lost refresh goes back to completed, no lease
                    m.status, m.lease_expires_at, m.updated_at = S.COMPLETED, None, now
                    m.error = REFRESH_LOST
                    m.lease_id = m.owner = None
                    old = attrs.evolve(m)
                assert claim.receipt == expected_receipt(org, key, old)
                continue
            lease_id = claim.receipt.lease_id
            assert isinstance(lease_id, str) and lease_id not in granted, "a claim grants a new lease id"
            self.leases.append((org, key, lease_id, owner))
            keeps = (
                old is not None
                and old.completed_at is not None
                and old.status in (S.COMPLETED, S.QUEUED, S.RUNNING)
            )
            bumps = old is not None and (
                (old.status is S.COMPLETED and old.error != REFRESH_LOST)
                or (old.status is S.FAILED and old.failure_kind is not FailureKind.TIMEOUT)
            )
            self.model[(org, key)] = ModelReceipt(
                status=S.QUEUED,
                lease_id=lease_id,
                owner=owner,
                lease_expires_at=now + lease_ttl_s,
                attempts=(old.attempts if old else 0) + 1,
                created_at=old.created_at if old else now,
                updated_at=now,
                output=old.output if keeps and old else None,
                completed_at=old.completed_at if keeps and old else None,
                generation=(old.generation + bumps) if old else 1,
            )
            assert claim.receipt == expected_receipt(org, key, self.model[(org, key)])

    def do_mark_running(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.mark_running_many(org, refs, owner)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.status = S.RUNNING
                m.updated_at = self.clock.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    def do_renew(self, data: st.DataObject) -> None:
        lease_ttl_s = data.draw(st.sampled_from(LEASE_TTLS_S), label="lease_ttl_s")
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.renew_leases(org, refs, owner, lease_ttl_s=lease_ttl_s)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.lease_expires_at = self.clock.now + lease_ttl_s
                m.updated_at = self.clock.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    def do_complete(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        completions = [
            Completion(r.key, r.lease_id, data.draw(outputs, label=f"output {r.key[:6]}")) for r in refs
        ]
        verdicts: dict[str, Any] = {}
        for c in completions:
            if isinstance(c.output, NotJson):
                verdicts[c.key] = RefusalReason.INVALID_OUTPUT
            else:
                verdicts[c.key] = self.fence(org, c.key, c.lease_id, owner, S.COMPLETED)
        report = self.store.complete_many(org, completions, owner)
        for c in completions:
            if verdicts[c.key] == APPLY:
                m = self.model[(org, c.key)]
                m.status = S.COMPLETED
                m.output = c.output
                m.lease_expires_at = None
                m.updated_at = m.completed_at = self.clock.now
        self.check_report(org, report, [c.key for c in completions], verdicts)

    def do_fail(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        failures = [
            Failure(
                r.key,
                r.lease_id,
                data.draw(error_texts, label=f"error {r.key[:6]}"),
                data.draw(st.sampled_from(FailureKind), label=f"kind {r.key[:6]}"),
            )
            for r in refs
        ]
        verdicts = {f.key: self.fence(org, f.key, f.lease_id, owner, S.FAILED) for f in failures}
        report = self.store.fail_many(org, failures, owner)
        for f in failures:
            if verdicts[f.key] == APPLY:
                m = self.model[(org, f.key)]
                if m.completed_at is None:
                    m.status = S.FAILED
                    m.error = stored_error(f.error)
                    m.failure_kind = f.failure_kind
                else:  # a failed refresh: the previous output stands, the lease is dropped
                    m.status = S.COMPLETED
                    m.lease_id = m.owner = None
                m.lease_expires_at = None
                m.updated_at = self.clock.now
        self.check_report(org, report, [f.key for f in failures], verdicts)

    def do_release(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.release(org, refs, owner)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.status = S.PENDING if m.completed_at is None else S.COMPLETED
                m.lease_id = m.owner = m.lease_expires_at = None
                m.updated_at = self.clock.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    def do_advance_clock(self, data: st.DataObject) -> None:
        """Move the clock on by 0-20 s, or exactly onto a lease expiry, staleness or purge-age edge."""
        how = data.draw(st.sampled_from(CLOCK_MOVES), label="how")
        if how == "by":
            self.clock.now += data.draw(clock_steps, label="seconds")
            return
        edges: set[float] = set()
        for m in self.model.values():
            if how == "to_lease_edge" and m.lease_expires_at is not None:
                edges.add(m.lease_expires_at)
            elif how == "to_stale_edge" and m.completed_at is not None:
                edges.update(m.completed_at + s for s in STALE_AFTERS_S)
            elif how == "to_purge_edge":
                edges.update(m.updated_at + s for s in PURGE_AGES_S)
        future = sorted(t for t in edges if t > self.clock.now)
        if future:
            self.clock.now = data.draw(st.sampled_from(future), label="clock edge")

    def do_purge(self, data: st.DataObject) -> None:
        older_than_s = data.draw(st.sampled_from(PURGE_AGES_S), label="older_than_s")
        statuses = data.draw(
            st.one_of(st.none(), st.lists(st.sampled_from(ReceiptStatus), unique=True, max_size=6)),
            label="statuses",
        )
        org = data.draw(st.one_of(st.none(), st.sampled_from(ORGS)), label="org_id")
        wanted = DEFAULT_PURGE if statuses is None else set(statuses)
        now = self.clock.now
        doomed = [
            (o, k)
            for (o, k), m in self.model.items()
            if (org is None or o == org)
            and m.status in wanted
            and now - m.updated_at >= older_than_s
            and not (m.lease_expires_at is not None and m.lease_expires_at > now)
        ]
        deleted = self.store.purge(older_than_s=older_than_s, statuses=statuses, org_id=org)
        for org_key in doomed:
            del self.model[org_key]
        assert deleted == len(doomed), (deleted, len(doomed))
        event(f"purge: deleted {min(deleted, 3)}{'+' if deleted >= 3 else ''}")

    # -- the model's fencing, and drawing fenced calls ---------------------------------

    def fence(self, org: str, key: str, lease_id: str, owner: Owner, done: ReceiptStatus | None) -> Any:
        """The model's verdict on one fenced item: APPLY, ALREADY, or a RefusalReason.

        ``done`` is the status a retry of this same call would have left (completed for
        complete, failed for fail): the same holder finding it gets "applied".
        """
        m = self.model.get((org, key))
        if m is None:
            return RefusalReason.MISSING
        holder = m.lease_id == lease_id and m.owner == owner
        if holder and m.status in (S.QUEUED, S.RUNNING):
            return APPLY
        if holder and done is not None and m.status is done:
            return ALREADY
        if m.status is S.COMPLETED:
            return RefusalReason.COMPLETED_BY_OTHER
        return RefusalReason.LEASE_LOST

    def draw_fenced(self, data: st.DataObject) -> tuple[str, Owner, list[LeaseRef]]:
        """An org, an owner and a few distinct keys with leases: held, stale, another's, or bogus."""
        org = data.draw(orgs, label="org")
        known = [k for k in KEYS if (org, k) in self.model]
        pick = st.integers(0, 3).flatmap(
            lambda i: st.sampled_from(known) if known and i else st.sampled_from(KEYS)
        )  # mostly keys the store holds, sometimes any pool key (maybe missing)
        keys = data.draw(st.lists(pick, min_size=1, max_size=4, unique=True), label="keys")
        who = data.draw(st.sampled_from(OWNER_CHOICES), label="owner")
        first = self.model.get((org, keys[0]))
        if isinstance(who, Owner):
            owner = who
        elif first is not None and first.owner is not None:
            owner = first.owner
        else:
            owner = OWNERS[0]
        refs = []
        for key in keys:
            source = data.draw(st.sampled_from(LEASE_SOURCES), label=f"lease source {key[:6]}")
            m = self.model.get((org, key))
            candidates = {
                "current": [m.lease_id] if m is not None and m.lease_id is not None else [],
                "mine": [lid for (o, k, lid, w) in self.leases if (o, k, w) == (org, key, owner)],
                "any": [lid for (o, k, lid, _) in self.leases if (o, k) == (org, key)],
                "bogus": [],
            }[source]
            if candidates:
                lease_id = data.draw(st.sampled_from(candidates), label=f"lease id {key[:6]}")
            else:
                self.bogus += 1
                lease_id = f"bogus-{self.bogus}"
            refs.append(LeaseRef(key, lease_id))
        return org, owner, refs

    def check_report(
        self, org: str, report: FenceReport, requested: list[str], verdicts: dict[str, Any]
    ) -> None:
        for verdict in verdicts.values():
            event(f"fence: {getattr(verdict, 'value', verdict)}")
        applied = tuple(k for k in requested if verdicts[k] in (APPLY, ALREADY))
        assert report.applied == applied, (report.applied, verdicts)
        refused = {k: v for k, v in verdicts.items() if v not in (APPLY, ALREADY)}
        assert {k: r.reason for k, r in report.refused.items()} == refused, (report.refused, refused)
        assert report.ok == (not refused)
        for key, refusal in report.refused.items():
            assert refusal.message
            if refusal.reason in (RefusalReason.LEASE_LOST, RefusalReason.COMPLETED_BY_OTHER):
                # The receipt as stored; nothing changed, so the model still describes it.
                assert refusal.receipt == expected_receipt(org, key, self.model[(org, key)]), key
            else:
                assert refusal.receipt is None, key

    # -- the comparison after every step -----------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        for org in ORGS:
            for key, got in zip(KEYS, self.store.get_many(org, list(KEYS)), strict=True):
                m = self.model.get((org, key))
                if m is None:
                    assert got is None, (org, key[:6], got)
                else:
                    assert got == expected_receipt(org, key, m), (org, key[:6], got, m)


class PostgresStoreMachine(ReceiptStoreMachine):
    """The same machine on a PostgresReceiptStore, one schema per example (dropped after)."""

    def make_store(self) -> Any:
        conftest = _conftest()
        conftest.require_backend(next(b for b in conftest.BACKENDS if b.id == "postgres"))
        from stores import PostgresReceiptStore

        self.schema = conftest.new_pg_schema()
        return PostgresReceiptStore(conftest.PG_URL, schema=self.schema, clock=self.clock, max_size=2)

    def drop_store(self) -> None:
        _conftest().drop_pg_schema(self.schema)


_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ReceiptStoreMachine.TestCase.settings = _SETTINGS
PostgresStoreMachine.TestCase.settings = _SETTINGS
TestReceiptStoreMatchesModel = ReceiptStoreMachine.TestCase
TestPostgresStoreMatchesModel = PostgresStoreMachine.TestCase

"""Stateful model test of the SQLite receipt store.

A hypothesis ``RuleBasedStateMachine`` drives a real :class:`stores.SqliteReceiptStore`
on a real file (with a fake clock) and, side by side, a plain model written here from
SEMANTICS.md (Claims, Leases) and the store contract (``stores/base.py``) without using
any store code: the dispositions table is re-derived below, not imported. After every
step the receipts of every pool key in every org are read back and compared field by
field with the model, and every operation's answer (dispositions, applied keys, refused
keys and refusal reasons) is compared with what the model predicted.

Choices the model makes where SEMANTICS.md is silent (they match the contract's
docstrings):

- Any live lease counts as ``running`` for a claim, even the claimer's own: a run never
  runs one key twice at once.
- A lease is live while ``lease_expires_at > now``; at ``now == lease_expires_at`` it
  has expired. A completion is stale when ``now - completed_at > stale_after_s``.
- Fencing compares lease id, owner run id and owner attempt, and the status must be
  queued or running; expiry alone does not fence (only "expired and taken" does).
- Completed and failed receipts keep the last lease id and owner (expiry cleared), so
  a retried complete (or fail) by that same holder is answered "applied" and changes
  nothing; a new claim clears output, error, failure kind and completed_at; a release
  clears the lease.
- ``purge(older_than_s=x)`` deletes receipts with ``now - updated_at >= x`` whose
  status is listed and which are not under a live lease.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from typing import Any

import attrs
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from stores import (
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
)

ORGS = ("org-a", "org-b")
KEYS = tuple(hashlib.sha256(f"key-{i}".encode()).hexdigest() for i in range(5))
OWNERS = (Owner("run-1", 1), Owner("run-1", 2), Owner("run-2", 1))
T0 = 1_700_000_000.0
LEASE_TTLS_S = (1.0, 2.5, 5.0, 10.0, 30.0)

S = ReceiptStatus
D = ClaimDisposition

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
    "failed": {
        ClaimMode.NORMAL: D.FAILED,
        ClaimMode.RETRY_FAILED: D.CLAIMED,
        ClaimMode.FORCE_REFRESH: D.CLAIMED,
    },
}


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


def request_for(key: str) -> ClaimRequest:
    """The claim request a dispatcher would send: fields follow from the key."""
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
    )


def model_disposition(
    m: ModelReceipt | None, mode: ClaimMode, now: float, stale_after_s: float | None
) -> ClaimDisposition:
    if m is None or m.status in (S.PENDING, S.SKIPPED):
        row = "absent_or_pending"
    elif m.status is S.COMPLETED:
        assert m.completed_at is not None
        stale = stale_after_s is not None and now - m.completed_at > stale_after_s
        row = "completed_stale" if stale else "completed_fresh"
    elif m.status in (S.QUEUED, S.RUNNING):
        assert m.lease_expires_at is not None
        row = "in_flight_live" if m.lease_expires_at > now else "in_flight_expired"
    else:
        assert m.status is S.FAILED
        row = "failed"
    return DISPOSITIONS[row][mode]


APPLY = "apply"
ALREADY = "already"  # a retried complete/fail that already landed: applied, no change

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), max_size=5), inner, max_size=3),
    ),
    max_leaves=6,
)
outputs = st.integers(0, 15).flatmap(lambda i: st.just(NotJson()) if i == 15 else json_values)
error_texts = st.text(max_size=20)  # NUL and lone surrogates included


def stored_error(text: str) -> str:
    """The store's policy for error text: NUL and lone surrogates kept as backslash escapes."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
clock_steps = st.one_of(st.integers(0, 20).map(float), st.sampled_from([0.25, 0.5, 2.5]))
LEASE_SOURCES = ("current", "current", "current", "mine", "any", "bogus")


class ReceiptStoreMachine(RuleBasedStateMachine):
    """SqliteReceiptStore on a temp file against the in-test model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="td-stateful-")
        self.clock = FakeClock(T0)
        self.store = SqliteReceiptStore(f"{self.dir}/receipts.db", clock=self.clock)
        self.model: dict[tuple[str, str], ModelReceipt] = {}
        self.leases: list[tuple[str, str, str, Owner]] = []  # (org, key, lease id, owner)
        self.seen_lease_ids: set[str] = set()
        self.steps = 0
        self.bogus = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now

    def stored(self, org: str, key: str) -> Receipt | None:
        return self.store.get_many(org, [key])[0]

    def fence(self, org: str, key: str, lease_id: str, owner: Owner, done: ReceiptStatus | None) -> str:
        """The model's verdict on one fenced item: APPLY, ALREADY, or a RefusalReason."""
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
        """An org, an owner and a few leases: held, stale, someone else's, or bogus."""
        org = data.draw(st.sampled_from(ORGS), label="org")
        known = [k for k in KEYS if (org, k) in self.model]
        pick = st.integers(0, 3).flatmap(
            lambda i: st.sampled_from(known) if known and i else st.sampled_from(KEYS)
        )  # mostly keys the store holds, sometimes any pool key (maybe missing)
        keys = data.draw(st.lists(pick, min_size=1, max_size=4, unique=True), label="keys")
        who = data.draw(st.sampled_from(("holder", "holder", "holder", *OWNERS)), label="owner")
        if who == "holder":
            first = self.model.get((org, keys[0]))
            owner = first.owner if first is not None and first.owner is not None else OWNERS[0]
        else:
            owner = who
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
                lease_id = data.draw(st.sampled_from(candidates), label="lease id")
            else:
                self.bogus += 1
                lease_id = f"bogus-{self.bogus}"
            refs.append(LeaseRef(key, lease_id))
        return org, owner, refs

    def check_report(
        self, org: str, report: FenceReport, requested: list[str], verdicts: dict[str, Any]
    ) -> None:
        for verdict in verdicts.values():
            event(f"fence: {verdict}")
        applied = tuple(k for k in requested if verdicts[k] in (APPLY, ALREADY))
        assert report.applied == applied, (report.applied, verdicts)
        refused = {k: v for k, v in verdicts.items() if v not in (APPLY, ALREADY)}
        got = {k: r.reason for k, r in report.refused.items()}
        assert got == refused, (got, refused)
        assert report.ok == (not refused)
        for key, refusal in report.refused.items():
            if refusal.reason in (RefusalReason.LEASE_LOST, RefusalReason.COMPLETED_BY_OTHER):
                assert refusal.receipt == self.stored(org, key), key
            elif refusal.reason is RefusalReason.MISSING:
                assert refusal.receipt is None
            assert refusal.message

    # -- rules ------------------------------------------------------------------------

    @rule(
        org=st.sampled_from(ORGS),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=5),
        owner=st.sampled_from(OWNERS),
        mode=st.sampled_from(ClaimMode),
        stale_after_s=st.one_of(st.none(), st.sampled_from([0.0, 5.0, 15.0, 30.0])),
        lease_ttl_s=st.sampled_from(LEASE_TTLS_S),
    )
    def claim(
        self,
        org: str,
        keys: list[str],
        owner: Owner,
        mode: ClaimMode,
        stale_after_s: float | None,
        lease_ttl_s: float,
    ) -> None:
        now = self.now
        before = {k: attrs.evolve(m) for (o, k), m in self.model.items() if o == org}
        expected = {k: model_disposition(before.get(k), mode, now, stale_after_s) for k in keys}
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
        for key, claim in zip(keys, claims):
            assert claim.disposition is expected[key], (key[:6], claim.disposition, expected[key])
            event(f"claim: {mode.value} -> {claim.disposition.value}")
            assert claim.receipt.key == key and claim.receipt.org_id == org
            if key in first:  # duplicate keys are claimed once and answered alike
                assert claim == first[key]
            first[key] = claim
        for key, claim in first.items():
            old = before.get(key)
            if claim.disposition is not D.CLAIMED:
                assert old is not None
                assert claim.receipt == expected_receipt(org, key, old)
                continue
            lease_id = claim.receipt.lease_id
            assert isinstance(lease_id, str) and lease_id
            assert lease_id not in self.seen_lease_ids, "lease ids must be new"
            self.seen_lease_ids.add(lease_id)
            self.leases.append((org, key, lease_id, owner))
            self.model[(org, key)] = ModelReceipt(
                status=S.QUEUED,
                lease_id=lease_id,
                owner=owner,
                lease_expires_at=now + lease_ttl_s,
                attempts=(old.attempts if old else 0) + 1,
                created_at=old.created_at if old else now,
                updated_at=now,
            )
            assert claim.receipt == expected_receipt(org, key, self.model[(org, key)])
            assert claim.receipt == self.stored(org, key)

    @rule(data=st.data())
    def mark_running(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.mark_running_many(org, refs, owner)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.status = S.RUNNING
                m.updated_at = self.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    @rule(data=st.data(), lease_ttl_s=st.sampled_from(LEASE_TTLS_S))
    def renew(self, data: st.DataObject, lease_ttl_s: float) -> None:
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.renew_leases(org, refs, owner, lease_ttl_s=lease_ttl_s)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.lease_expires_at = self.now + lease_ttl_s
                m.updated_at = self.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
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
                m.updated_at = m.completed_at = self.now
        self.check_report(org, report, [c.key for c in completions], verdicts)
        for c in completions:
            if verdicts[c.key] == RefusalReason.INVALID_OUTPUT:
                assert report.refused[c.key].receipt is None

    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        failures = [
            Failure(
                r.key,
                r.lease_id,
                data.draw(error_texts, label="error"),
                data.draw(st.sampled_from(FailureKind), label="kind"),
            )
            for r in refs
        ]
        verdicts = {f.key: self.fence(org, f.key, f.lease_id, owner, S.FAILED) for f in failures}
        report = self.store.fail_many(org, failures, owner)
        for f in failures:
            if verdicts[f.key] == APPLY:
                m = self.model[(org, f.key)]
                m.status = S.FAILED
                m.error = stored_error(f.error)
                m.failure_kind = f.failure_kind
                m.lease_expires_at = None
                m.updated_at = self.now
        self.check_report(org, report, [f.key for f in failures], verdicts)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        org, owner, refs = self.draw_fenced(data)
        verdicts = {r.key: self.fence(org, r.key, r.lease_id, owner, None) for r in refs}
        report = self.store.release(org, refs, owner)
        for key, verdict in verdicts.items():
            if verdict == APPLY:
                m = self.model[(org, key)]
                m.status = S.PENDING
                m.lease_id = m.owner = m.lease_expires_at = None
                m.updated_at = self.now
        self.check_report(org, report, [r.key for r in refs], verdicts)

    @rule(seconds=clock_steps)
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(
        older_than_s=st.sampled_from([0.0, 1.0, 5.0, 30.0, 60.0]),
        statuses=st.one_of(st.none(), st.lists(st.sampled_from(ReceiptStatus), unique=True, max_size=6)),
        org=st.one_of(st.none(), st.sampled_from(ORGS)),
    )
    def purge(self, older_than_s: float, statuses: list[ReceiptStatus] | None, org: str | None) -> None:
        wanted = set(statuses) if statuses is not None else {S.COMPLETED, S.FAILED, S.PENDING, S.SKIPPED}
        now = self.now
        doomed = [
            (o, k)
            for (o, k), m in self.model.items()
            if (org is None or o == org)
            and m.status in wanted
            and now - m.updated_at >= older_than_s
            and not (m.lease_expires_at is not None and m.lease_expires_at > now)
        ]
        deleted = self.store.purge(older_than_s=older_than_s, statuses=statuses, org_id=org)
        for ok in doomed:
            del self.model[ok]
        assert deleted == len(doomed), (deleted, len(doomed))
        event(f"purge: deleted {min(deleted, 2)}{'+' if deleted > 2 else ''}")

    # -- the comparison after every step -----------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        self.steps += 1
        for org in ORGS:
            for key, got in zip(KEYS, self.store.get_many(org, list(KEYS))):
                m = self.model.get((org, key))
                if m is None:
                    assert got is None, (org, key[:6], got)
                else:
                    assert got == expected_receipt(org, key, m), (org, key[:6], got, m)


ReceiptStoreMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReceiptStoreStateful = ReceiptStoreMachine.TestCase

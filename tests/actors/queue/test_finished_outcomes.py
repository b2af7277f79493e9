"""Attempts' outcomes reach the tool queue actor through its ``Finished`` buffer: one
doorbell message for many, and none lost when the actor stops around them.

A result that comes back as the actor stops is paid for: it must be salvaged, whether it
arrives after the buffer closed, or while its doorbell goes to an actor already gone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pykka
import pytest

from actors.messages import UnitFinished
from actors.queue.local_effects import FINISHED_READY, Finished, FinishReport


class _Effects:
    def __init__(self) -> None:
        self.kept: list[tuple[list[str], Any]] = []

    def keep_late_of(self, groups: list[Any], message: Any) -> None:
        self.kept.append((groups, message))


def _finished(unit: int) -> UnitFinished:
    return UnitFinished(unit=unit, attempt=1, members=[('{"ok":1}', None)], error=None, sent_at=1.0)


def test_finished_only_the_first_outcome_rings_and_all_are_taken_together() -> None:
    rings: list[Any] = []
    buffer, effects = Finished(), _Effects()
    reports = [FinishReport(buffer, rings.append, effects, [f"g{i}"]) for i in range(3)]  # type: ignore[arg-type]
    for i, report in enumerate(reports):
        report(_finished(i))
    assert rings == [FINISHED_READY]
    assert [m.unit for m, _ in buffer.take()] == [0, 1, 2]
    reports[0](_finished(9))  # empty again: the next one rings
    assert rings == [FINISHED_READY, FINISHED_READY]


def test_finished_an_outcome_after_the_actor_stopped_is_salvaged_by_its_worker() -> None:
    buffer, effects = Finished(), _Effects()
    assert buffer.close() == []  # the actor's on_stop
    FinishReport(buffer, lambda m: None, effects, ["g1"])(_finished(1))  # type: ignore[arg-type]
    assert [(groups, m.unit) for groups, m in effects.kept] == [(["g1"], 1)]


def test_finished_a_doorbell_to_a_dead_actor_salvages_everything_waiting() -> None:
    buffer, effects = Finished(), _Effects()
    other = FinishReport(buffer, lambda m: None, effects, ["g2"])  # type: ignore[arg-type]

    def dead(message: Any) -> None:
        assert buffer.put(_finished(2), other) is False  # another worker, between put and ring
        raise pykka.ActorDeadError("gone")

    FinishReport(buffer, dead, effects, ["g1"])(_finished(1))  # type: ignore[arg-type]
    assert [(groups, m.unit) for groups, m in effects.kept] == [(["g1"], 1), (["g2"], 2)]
    assert buffer.put(_finished(3), other) is None  # closed: later ones salvage themselves


def test_finished_many_workers_lose_nothing() -> None:
    buffer, effects = Finished(), _Effects()
    taken: list[int] = []
    lock = threading.Lock()
    ring = threading.Event()

    def tell(message: Any) -> None:
        ring.set()

    def worker(base: int) -> None:
        for i in range(2000):
            FinishReport(buffer, tell, effects, None)(_finished(base + i))  # type: ignore[arg-type]

    threads = [threading.Thread(target=worker, args=(n * 10_000,)) for n in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or ring.is_set():
        ring.clear()
        with lock:
            taken += [m.unit for m, _ in buffer.take()]
    for t in threads:
        t.join()
    taken += [m.unit for m, _ in buffer.take()]
    assert sorted(taken) == sorted(n * 10_000 + i for n in range(4) for i in range(2000))


@pytest.mark.waits
def test_finished_one_outcome_that_fails_to_be_handled_never_drops_the_others(
    make_system: Any, monkeypatch: Any
) -> None:
    from actors import Tool
    from actors.lifecycle.finishing import Finisher

    n = 20
    original_take, original_on_finished = Finished.take, Finisher.on_finished

    def take_all(self: Finished) -> Any:  # every outcome arrives before the actor reads them
        deadline = time.monotonic() + 10.0
        while len(self) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return original_take(self)

    failed: list[int] = []

    def on_finished(self: Finisher, msg: Any, now: float) -> None:
        if not failed:  # the first outcome handled: a bug while handling it
            failed.append(msg.unit)
            raise RuntimeError("handling this outcome failed")
        original_on_finished(self, msg, now)

    monkeypatch.setattr(Finished, "take", take_all)
    monkeypatch.setattr(Finisher, "on_finished", on_finished)
    system = make_system([Tool(tool_id="t", fn=lambda i, c: {"n": i["n"]})])
    futures = system.proxy().execute_many("t", [{"n": k} for k in range(n)])
    answered = []
    deadline = time.monotonic() + 3.0
    for future in futures:
        with contextlib.suppress(Exception):  # the one whose handling failed
            answered.append(future.get(timeout=max(0.01, deadline - time.monotonic())).value["n"])
    assert failed and len(answered) == n - 1  # only the outcome whose handling failed is missing
    system.stop(timeout_s=0.5)  # that unit never reports back: stop's bound answers its caller

"""An observer or one bad message never takes the dispatcher down."""

from __future__ import annotations

import pykka

from actors import DispatchSystem, Policy, RunInfo, Tool
from actors.runtime.actor import guarded
from actors.runtime.futures import new_future
from stores import SqliteReceiptStore


def test_perf_hook_that_raises_never_fails_a_call(tmp_path) -> None:
    def hook(phase: str, ms: float, extra: dict) -> None:
        raise RuntimeError("observer bug")

    tools = [Tool(tool_id="t", fn=lambda inp, ctx: {"v": inp["x"]})]
    with DispatchSystem.start(
        tools=tools,
        store=SqliteReceiptStore(tmp_path / "r.db"),
        run=RunInfo(run_id="r1", org_id="acme", scope="s"),
        policy=Policy(perf_hook=hook),
    ) as system:
        results = [system.proxy().execute("t", {"x": i}).get(timeout=30) for i in range(3)]
    assert [r.value for r in results] == [{"v": 0}, {"v": 1}, {"v": 2}]


class _Fragile(pykka.ThreadingActor):
    @guarded
    def on_receive(self, message: dict) -> None:
        if message["boom"]:
            raise ValueError("bad message")
        message["reply"].set("ok")


def test_guarded_actor_survives_a_failing_message_and_fails_its_reply() -> None:
    ref = _Fragile.start()
    try:
        bad = new_future()

        class Msg(dict):
            @property
            def reply(self):  # the guard reads message.reply
                return self["reply"]

        ref.tell(Msg(boom=True, reply=bad))
        try:
            bad.get(timeout=5)
            raise AssertionError("the failing message's reply must fail")
        except ValueError as exc:
            assert "bad message" in str(exc)
        good = new_future()
        ref.tell(Msg(boom=False, reply=good))
        assert good.get(timeout=5) == "ok"
        assert ref.is_alive()
    finally:
        ref.stop()

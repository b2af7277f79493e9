"""No actor ever waits on itself, nor on an actor that may be waiting on it: a scan of the
actor classes' source (STYLE.md, Messages)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import actors

_ACTOR_BASES = {"ThreadingActor", "Actor", "GeventActor", "InboxActor"}  # InboxActor: actors.runtime.actor
_WAIT_METHODS = {"ask", "result", "get_all"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _is_actor_class(node: ast.ClassDef) -> bool:
    return any(_dotted(base).rsplit(".", 1)[-1] in _ACTOR_BASES for base in node.bases)


def _is_future_wait(call: ast.Call) -> bool:
    """``x.get()`` / ``x.get(timeout=...)`` / ``x.get(<number>)``, or ``ask``/``result``/``get_all``.

    A ``.get`` with a non-numeric positional argument is a mapping lookup (``d.get(key)``).
    """
    func = call.func
    if not isinstance(func, ast.Attribute):
        return isinstance(func, ast.Name) and func.id in _WAIT_METHODS
    if func.attr in _WAIT_METHODS:
        return True
    if func.attr != "get":
        return False
    if not call.args:
        return True
    first = call.args[0]
    return isinstance(first, ast.Constant) and isinstance(first.value, (int, float))


def _on_store_future(call: ast.Call) -> bool:
    """``self.store.<method>(...).get()``: waiting on the receipt store actor's future."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Call)):
        return False
    method = func.value.func
    return isinstance(method, ast.Attribute) and _dotted(method.value) == "self.store"


def actor_waits(source: str) -> tuple[list[str], list[str]]:
    """Scan ``source``: (actor class names, waits inside them not on a ``self.store`` future)."""
    tree = ast.parse(source)
    classes: list[str] = []
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and _is_actor_class(node):
            classes.append(node.name)
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and _is_future_wait(inner) and not _on_store_future(inner):
                    bad.append(f"{node.name}:{inner.lineno}: {ast.unparse(inner)}")
    return classes, bad


def test_actors_never_wait_except_on_receipt_store_futures() -> None:
    """No actor ever waits on itself, nor on an actor that may be waiting on it.

    The rule (STYLE.md, Messages): inside a pykka actor class, the only blocking wait
    allowed is ``.get()`` on a future returned by ``self.store``, the receipt store
    actor's client (:class:`actors.store.client.StoreClient`). That actor owns the store
    and never waits on any actor, so waiting on it cannot deadlock. Any other reply an
    actor needs arrives as a message, or as a future it resolves for someone else (it
    never ``.get()``s it). ``ask``, ``result`` and ``get_all`` are forbidden inside
    actors too. A ``.get(key)`` with a non-numeric argument is a mapping lookup and is
    not a wait.
    """
    package = Path(actors.__file__).parent
    classes: list[str] = []
    bad: list[str] = []
    for path in sorted(package.rglob("*.py")):
        found, waits = actor_waits(path.read_text())
        classes += found
        bad += [f"{path.relative_to(package)}:{w}" for w in waits]

    assert {
        "ToolQueueActor",
        "GovernorActor",
        "HeartbeatActor",
        "CompletionFlusherActor",
        "ReceiptStoreActor",
    } <= set(classes)
    assert bad == []

    store_actor = (package / "store" / "actor.py").read_text()
    tree = ast.parse(store_actor)
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ReceiptStoreActor"]
    talks = [
        ast.unparse(n)
        for n in ast.walk(cls)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in {"tell", "ask", "get"}
    ]
    assert talks == [], "the receipt store actor must never talk to (or wait on) another actor"


def test_actor_wait_scan_flags_waits_outside_the_store() -> None:
    source = textwrap.dedent(
        """
        import pykka

        class Sneaky(pykka.ThreadingActor):
            def on_receive(self, message):
                self.store.get_many("org", ["k"]).get()          # allowed
                self.actor_ref.proxy().ping().get()              # waits on itself
                message.reply.get(timeout=1)                     # waits on a reply
                self.other.ask("hi")                             # ask blocks
                return {"a": 1}.get("a")                          # a mapping lookup

        class NotAnActor:
            def run(self, future):
                return future.get()
        """
    )
    classes, bad = actor_waits(source)
    assert classes == ["Sneaky"]
    assert [line.split(": ", 1)[1] for line in bad] == [
        "self.actor_ref.proxy().ping().get()",
        "message.reply.get(timeout=1)",
        "self.other.ask('hi')",
    ]

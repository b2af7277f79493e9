"""The circuit breaker of a provider: fail fast while it is down (a plain state machine,
time passed in as a value)."""

from __future__ import annotations

import attrs

__all__ = ["Circuit"]


@attrs.define
class Circuit:
    """Circuit breaker of one (org, provider) (M. Nygard, *Release It!*, "Circuit Breaker").

    *closed*: calls go. After ``threshold`` consecutive unavailable outcomes (connection
    errors, 5xx, timeouts; a provider that answers anything else is up) it *opens*:
    calls are refused at once for ``open_s``. Then *half-open*: one probe call may go;
    the others wait for it. The probe answered: closed again. The probe unavailable:
    open again for twice as long, up to ``open_max_s``.

    Attributes:
        threshold: consecutive unavailable outcomes that open it (None: never opens).
        open_s / open_max_s: first and longest open period, seconds.
        opened: how many times it opened (for stats).
    """

    threshold: int | None
    open_s: float
    open_max_s: float
    state: str = "closed"
    failures: int = 0
    open_until: float = 0.0
    period_s: float = 0.0
    probing: bool = False
    probe_exempt: bool = False
    """Whether the probe out is a nested call's (granted outside the concurrency ceiling)."""
    opened: int = 0

    def admits(self, now: float) -> str:
        """``"go"``, ``"probe"`` (grant one call, the probe), ``"wait"`` (a probe is out),
        or ``"refuse"`` (open)."""
        if self.state == "open":
            if now < self.open_until:
                return "refuse"
            self.state, self.probing = "half_open", False
        if self.state == "half_open":
            return "wait" if self.probing else "probe"
        return "go"

    def probe_sent(self, exempt: bool = False) -> None:
        """The half-open probe was granted (``exempt``: to a nested call)."""
        self.probing, self.probe_exempt = True, exempt

    def record(self, answered: int, unavailable: int, now: float) -> bool:
        """Outcomes of calls that ended: ``answered`` by the provider (successes, 4xx,
        429s), ``unavailable``. Returns True when this opened the circuit."""
        if answered:
            self.state, self.failures, self.probing, self.period_s = "closed", 0, False, 0.0
            return False
        if not unavailable:
            self.probing = False  # nothing was learnt (the probe was not sent): probe again
            return False
        self.failures += unavailable
        if self.state == "half_open":
            self.period_s = min(self.open_max_s, max(self.open_s, 2 * self.period_s))
        elif self.state == "closed" and self.threshold is not None and self.failures >= self.threshold:
            self.period_s = self.open_s
        else:
            return False
        self.state, self.open_until, self.probing = "open", now + self.period_s, False
        self.opened += 1
        return True

"""Pacing: token bucket, limit learner, circuit, send gates and the pacers shared through Redis.

The in-process rules are :mod:`actors.pacing.bucket` (with :mod:`~actors.pacing.learner`
and :mod:`~actors.pacing.circuit`) for a governor pacing alone, and
:class:`~actors.pacing.pacer_state.BucketState` for a :class:`Pacer`; the Redis script
``pacer.lua`` is held to :class:`BucketState` by a conformance test.
"""

from actors.pacing.bucket import (
    AIMD_CUT_COOLDOWN_S,
    AIMD_DECREASE,
    AIMD_INCREASE_FRACTION,
    AIMD_MIN_RPS,
    INITIAL_WINDOW,
    PACE_MARGIN,
    SLOW_START_DOUBLING_S,
    SLOW_START_EXIT_DECREASE,
    SLOW_START_RPS,
    ProviderBucket,
    pacing_report,
    parse_retry_after,
    plain_retry_after,
)
from actors.pacing.circuit import Circuit
from actors.pacing.learner import LimitLearner
from actors.pacing.pacer_state import BucketState
from actors.pacing.pacer_url import InvalidPacerURLError, open_pacer
from actors.pacing.pacers import LocalPacer, Pacer
from actors.pacing.providers import provider_pacings
from actors.pacing.redis_pacer import RedisPacer
from actors.pacing.send_gate import SendGate, SendGates
from actors.pacing.shared_learner import SharedLearner
from actors.pacing.values import (
    PHASES,
    CircuitRecorded,
    Grant,
    Grow,
    Grown,
    Learn,
    Learnt,
    PacerOp,
    PacerSettings,
    PacerState,
    Pause,
    Paused,
    ProviderLimits,
    ReadState,
    Record,
    Rejoin,
    SetRate,
    Take,
)

__all__ = [
    "AIMD_CUT_COOLDOWN_S",
    "AIMD_DECREASE",
    "AIMD_INCREASE_FRACTION",
    "AIMD_MIN_RPS",
    "INITIAL_WINDOW",
    "PACE_MARGIN",
    "PHASES",
    "SLOW_START_DOUBLING_S",
    "SLOW_START_EXIT_DECREASE",
    "SLOW_START_RPS",
    "BucketState",
    "Circuit",
    "CircuitRecorded",
    "Grant",
    "Grow",
    "Grown",
    "InvalidPacerURLError",
    "Learn",
    "Learnt",
    "LimitLearner",
    "LocalPacer",
    "Pacer",
    "PacerOp",
    "PacerSettings",
    "PacerState",
    "Pause",
    "Paused",
    "ProviderBucket",
    "ProviderLimits",
    "ReadState",
    "Record",
    "RedisPacer",
    "Rejoin",
    "SendGate",
    "SendGates",
    "SetRate",
    "SharedLearner",
    "Take",
    "open_pacer",
    "pacing_report",
    "parse_retry_after",
    "plain_retry_after",
    "provider_pacings",
]

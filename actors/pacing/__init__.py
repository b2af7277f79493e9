"""Pacing: token bucket, limit learner, circuit, send gates and the pacers shared through Redis.

The rules (GCRA take, pause with one cut per congestion event, AIMD growth, circuit,
learner lease) exist once, in :class:`~actors.pacing.pacer_state.BucketState`: the engine
of :class:`LocalPacer` (a governor's own, or one process's shared pacer); the Redis script
``pacer.lua`` is held to it by a conformance test. An unknown limit is learnt by
:class:`LimitLearner`, fed through the pacer's learner lease.
"""

from actors.pacing.announced import Announcement, parse_rate_limit_headers
from actors.pacing.bucket import (
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
from actors.pacing.learner import LimitLearner
from actors.pacing.pacer_state import BucketState, growth
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
    "AIMD_DECREASE",
    "AIMD_INCREASE_FRACTION",
    "AIMD_MIN_RPS",
    "INITIAL_WINDOW",
    "PACE_MARGIN",
    "PHASES",
    "SLOW_START_DOUBLING_S",
    "SLOW_START_EXIT_DECREASE",
    "SLOW_START_RPS",
    "Announcement",
    "BucketState",
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
    "growth",
    "open_pacer",
    "pacing_report",
    "parse_rate_limit_headers",
    "parse_retry_after",
    "plain_retry_after",
    "provider_pacings",
]

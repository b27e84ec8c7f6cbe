"""A replicated state-machine host on pysyncobj; knows nothing of jobs."""

from .bridge import Bridge, NotCommitted, SubmitError, UnknownOutcome
from .clock import ClockEstimate
from .codec import CodecError, Envelope, decode, encode
from .fsm import ApplyContext, StateMachine
from .node import MissingSecret, NodeConfig, NodeStatus, RaftNode

__all__ = [
    "ApplyContext", "Bridge", "ClockEstimate", "CodecError", "Envelope", "MissingSecret", "NodeConfig", "NodeStatus",
    "NotCommitted", "RaftNode", "StateMachine", "SubmitError", "UnknownOutcome", "decode", "encode",
]

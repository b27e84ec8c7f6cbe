"""A replicated state-machine host on pysyncobj; knows nothing of jobs."""

from .bridge import Bridge, NotCommitted, SubmitError, UnknownOutcome
from .clock import ClockEstimate
from .codec import CodecError, Envelope, decode, encode
from .fsm import ApplyContext, StateMachine
from .node import MemberStatus, MissingSecret, NodeConfig, NodeStatus, RaftNode, RoleChange
from .pysyncobj_names import PysyncobjMismatch, check_pysyncobj
from .space import Space

__all__ = [
    "ApplyContext", "Bridge", "ClockEstimate", "CodecError", "Envelope", "MemberStatus", "MissingSecret",
    "NodeConfig", "NodeStatus", "NotCommitted", "PysyncobjMismatch", "RaftNode", "RoleChange", "Space",
    "StateMachine", "SubmitError", "UnknownOutcome", "check_pysyncobj", "decode", "encode",
]

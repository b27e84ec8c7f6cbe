"""The SyncObj subclass: one replicated entry point, and the overrides that make its
journal durable and its forwarded commands batched. Every pysyncobj private name used
here is listed in ``pysyncobj_names``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pysyncobj import SyncObj, SyncObjConf, replicated

from .listener import GuardedTransport
from .transport import _BatchingSends

if TYPE_CHECKING:
    from .node import RaftNode

__all__ = ["_Host"]


class _Host(_BatchingSends, SyncObj):  # type: ignore[misc]
    """The SyncObj subclass: its only replicated method is ``_rc_apply``."""

    def __init__(self, owner: RaftNode, self_addr: str, peers: list[str], conf: SyncObjConf) -> None:
        self._rc_owner = owner
        self._rc_batch = None  # see _rc_send
        self._rc_batch_peers = set()
        # Our listener and connections in place of pysyncobj's: see raftlog.listener.
        super().__init__(self_addr, peers, conf, transportClass=GuardedTransport)
        self._rc_take_send(self._SyncObj__transport)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803 - pysyncobj's names
        # A journal that failed to sync may have lost what it was told to keep: this node must
        # acknowledge nothing more, neither as leader (a commit counts its own copy) nor as
        # follower. It stops taking part in raft; its peers elect without it.
        journal = self._rc_owner._journal
        if journal is not None and journal.failed is not None:
            self._rc_owner._journal_failed(journal.failed)
            time.sleep(max(timeToWait, 0.05))
            return
        # Behind pre-vote's gate: pysyncobj's election check is at the top of its tick.
        prevote = self._rc_owner._prevote
        if prevote is None:
            super()._onTick(timeToWait)
        else:
            prevote.around_tick(lambda: super(_Host, self)._onTick(timeToWait))

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - pysyncobj's name
        owner = self._rc_owner
        # Only once RaftNode._on_tick runs (it creates the pacer), since it does the sync.
        journal = owner._journal if owner._pacer is not None else None
        if journal is not None:
            journal.defer = True  # synced by RaftNode._on_tick, later in this same tick
        self._rc_batch = {}
        try:
            super()._checkCommandsToApply()
        finally:
            if journal is not None:
                journal.defer = False
            self._rc_flush()

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,  # noqa: N802, N803
                                  success: bool = False) -> None:
        # A follower's answer to AppendEntries: the entries it acknowledges must be on disk
        # before it leaves (appends inside one message are synced once, see _Pacer.inbound).
        journal = self._rc_owner._journal
        if journal is not None:
            journal.sync()
        super()._SyncObj__sendNextNodeIdx(node, reset, nextNodeIdx, success)

    @replicated  # type: ignore[untyped-decorator]
    def _rc_apply(self, payload: bytes) -> Any:
        # pysyncobj bumps raftLastApplied right after this returns.
        return self._rc_owner._apply(payload, self.raftLastApplied + 1)

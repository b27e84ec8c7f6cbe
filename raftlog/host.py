"""The SyncObj subclass: one replicated entry point, and the overrides that make its
journal durable and its forwarded commands batched. Every pysyncobj private name used
here is listed in ``pysyncobj_names``."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.syncobj import _RAFT_STATE

from .listener import GuardedTransport
from .trace import mark
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
        # Nor may a node whose snapshot its state machine refused (see RaftNode._deserialize).
        if self._rc_owner._restore_failed is not None:
            self._rc_owner._restore_refused()
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

    def _SyncObj__setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        """Term and vote on disk first, then in memory.

        pysyncobj sets both in memory and then stores them. On a full disk the store raised
        after the change: a leader asked for its vote in a newer term kept leading, in a term
        it never won, and its AppendEntries in that term made the new leader's followers drop
        entries that leader had committed (acknowledged writes lost, 1 run in 10 of the
        disk-full fault test). Here a failed store changes neither, and a node that has heard
        of a newer term it cannot record stops leading (or standing) in the old one: stepping
        down needs no disk. The message that carried the term is dropped with the raise; its
        sender tries again.
        """
        try:
            self._SyncObj__raftLog.setCurrentTerm(term, votedForNodeId)
        except OSError:
            current: int = self._SyncObj__raftCurrentTerm  # type: ignore[has-type]
            if term > current and self._SyncObj__raftState != _RAFT_STATE.FOLLOWER:
                self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
                self._SyncObj__raftLeader = None
            raise
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__votedForNodeId = votedForNodeId

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802, N803 - pysyncobj's names
        super()._SyncObj__loadDumpFile(clearJournal)
        if self._rc_owner._restore_failed is not None:
            # The rest of this tick still runs (the election check comes after the load at
            # start): no election from this node, then _onTick sits out every tick after.
            self._SyncObj__raftElectionDeadline = math.inf

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,  # noqa: N802, N803
                                  success: bool = False) -> None:
        if self._rc_owner._restore_failed is not None:
            # Nothing more is acknowledged, the snapshot it failed to install least of all
            # (pysyncobj answers success after a load it logged as failed).
            return
        # A follower's answer to AppendEntries: the entries it acknowledges must be on disk
        # before it leaves (appends inside one message are synced once, see _Pacer.inbound).
        journal = self._rc_owner._journal
        mark("sync")
        if journal is not None:
            journal.sync()
        mark("synced")
        super()._SyncObj__sendNextNodeIdx(node, reset, nextNodeIdx, success)

    @replicated  # type: ignore[untyped-decorator]
    def _rc_apply(self, payload: bytes) -> Any:
        # pysyncobj bumps raftLastApplied right after this returns.
        mark("apply")
        result = self._rc_owner._apply(payload, self.raftLastApplied + 1)
        mark("applied")
        return result

"""Every private pysyncobj name raftlog relies on, in one table, and the start-up check.

pysyncobj has no public hooks for what raftlog needs (a durable journal, eager
AppendEntries, batched forwarding, the follower-side trim, a guarded raft port, pre-vote), so
``journal``, ``pacing``, ``prevote``, ``host``, ``transport``, ``listener``, ``connection`` and
``node`` read its name-mangled attributes, override and call its private methods and
swap its module globals. A release that
renamed one would not fail at import: an override would silently never be called,
a swap would silently change nothing. So the version is pinned exactly, and
``check_pysyncobj`` (called by ``RaftNode.start``) verifies each name below on the
installed pysyncobj and refuses to start, naming what is missing.

How each kind is verified:

- ``method`` / ``property``: an attribute of the class (callable / a property);
- ``attribute``: an instance attribute that pysyncobj only assigns inside its
  methods, so the class has no trace of it; verified by finding the assignment
  (``self.__name =``) in the class's source, which needs no instance (building a
  SyncObj binds ports and starts threads);
- ``global``: a module-level name.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

__all__ = ["PINNED", "PRIVATE_NAMES", "PrivateName", "PysyncobjMismatch", "check_pysyncobj"]

PINNED = "0.3.17"  # the pysyncobj release the table was read from (pyproject pins it too)

Kind = Literal["method", "property", "attribute", "global"]


@dataclass(frozen=True, slots=True)
class PrivateName:
    owner: str  # a key of OWNERS
    name: str  # as our code spells it (mangled: ``_SyncObj__raftLog``)
    kind: Kind
    use: str  # where and why we use it


_SYNCOBJ = "SyncObj"
_TRANSPORT = "TCPTransport"
PRIVATE_NAMES: tuple[PrivateName, ...] = (
    # pacing._Pacer, prevote.PreVote, node.RaftNode, pacing._contact_at: read and written on the raft thread
    PrivateName(_SYNCOBJ, "_SyncObj__transport", "attribute", "wrap its send and its receive callback"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftLog", "attribute", "trim re-sent entries; the replay boundary; pre-vote's log check"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftCommitIndex", "attribute", "eager sends of a commit index"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftNextIndex", "attribute", "eager sends to idle followers"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftMatchIndex", "attribute", "eager sends to idle followers"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftElectionDeadline", "attribute", "excuse a follower's own stall; pre-vote's gate"),
    PrivateName(_SYNCOBJ, "_SyncObj__transferInProgress", "attribute", "a leadership transfer skips pre-vote"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftLeader", "attribute", "contact with the leader"),
    PrivateName(_SYNCOBJ, "_SyncObj__lastResponseTime", "attribute", "a leader's contact with its quorum"),
    PrivateName(_SYNCOBJ, "_poller", "attribute", "the wake-up pipe subscribes to it"),
    PrivateName(_SYNCOBJ, "_SyncObj__onMessageReceived", "method", "inbound messages pass through _Pacer"),
    PrivateName(_SYNCOBJ, "_SyncObj__getCurrentLogIndex", "method", "eager sends"),
    PrivateName(_SYNCOBJ, "_SyncObj__sendAppendEntries", "method", "eager sends"),
    PrivateName(_SYNCOBJ, "_SyncObj__getEntries", "method", "tests: the slices it asks of the journal, read lazily"),
    PrivateName(_SYNCOBJ, "_SyncObj__sendNextNodeIdx", "method", "overridden: sync before a follower answers; none after a refused snapshot"),
    PrivateName(_SYNCOBJ, "_SyncObj__loadDumpFile", "method", "overridden: no election after a refused snapshot"),
    PrivateName(_SYNCOBJ, "_SyncObj__setCurrentTerm", "method", "overridden: term and vote stored before adopted"),
    PrivateName(_SYNCOBJ, "_SyncObj__setState", "method", "a node that cannot store a newer term steps down"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftCurrentTerm", "attribute", "set once the term is stored"),
    PrivateName(_SYNCOBJ, "_SyncObj__votedForNodeId", "attribute", "set once the vote is stored"),
    PrivateName(_SYNCOBJ, "_SyncObj__raftState", "attribute", "a node that cannot store a newer term steps down"),
    PrivateName("pysyncobj.syncobj", "_RAFT_STATE", "global", "the follower state to step down to"),
    PrivateName(_SYNCOBJ, "_onTick", "method", "overridden: a node whose journal failed to sync stops"),
    PrivateName(_SYNCOBJ, "_checkCommandsToApply", "method", "overridden: deferred sync, batched forwarding"),
    PrivateName(_SYNCOBJ, "_onTick", "method", "overridden: pre-vote before its election check"),
    PrivateName(_SYNCOBJ, "_isLeader", "method", "role on the raft thread"),
    PrivateName(_SYNCOBJ, "_getLeader", "method", "RaftNode.leader"),
    PrivateName(_SYNCOBJ, "raftLastApplied", "property", "the index of the entry being applied"),
    # journal: the durable journal
    PrivateName("FileJournal", "_FileJournal__journalFile", "attribute", "the file to fdatasync"),
    PrivateName("FileJournal", "_FileJournal__currentOffset", "attribute", "where the next record goes: reserve it"),
    PrivateName("FileJournal", "_FileJournal__journal", "attribute",
                "the entries FileJournal read at its start, then replaced by ours (commands read back)"),
    PrivateName("FileJournal", "add", "method", "overridden: its record written as FileJournal writes it, synced unless deferred"),
    PrivateName("FileJournal", "deleteEntriesTo", "method", "overridden: one sync per compaction"),
    PrivateName("FileJournal", "deleteEntriesFrom", "method", "overridden: a suffix cut at its known place; its pages mapped in again"),
    PrivateName("FileJournal", "clear", "method", "overridden: a cleared journal's pages mapped in again"),
    PrivateName("FileJournal", "setCurrentTerm", "method", "overridden: the meta left as it was when its store fails"),
    PrivateName("FileJournal", "onOneSecondTimer", "method", "overridden: a failed commit-index store skips no tick"),
    PrivateName("FileJournal", "_FileJournal__meta", "attribute", "restored when a term's store fails"),
    PrivateName("FileJournal", "_FileJournal__metaStorer", "attribute", "tests: a full disk under the meta file"),
    PrivateName(_SYNCOBJ, "_SyncObj__onBecomeLeader", "method", "tests: a leader made without ticks"),
    PrivateName("ResizableFile", "_ResizableFile__mm", "attribute", "write without an fstat per entry"),
    PrivateName("ResizableFile", "_ResizableFile__f", "attribute", "the descriptor to fdatasync"),
    PrivateName("ResizableFile", "write", "method", "overridden: the size kept, not asked for"),
    PrivateName("MetaStorer", "getMeta", "method", "overridden: closes the file it reads"),
    PrivateName("MetaStorer", "storeMeta", "method", "overridden: synced before and after the rename"),
    PrivateName("MetaStorer", "getPath", "method", "where the meta file lives"),
    PrivateName("pysyncobj.journal", "MetaStorer", "global", "swapped while a journal is constructed"),
    PrivateName("pysyncobj.journal", "ResizableFile", "global", "swapped while a journal is constructed"),
    PrivateName("pysyncobj.journal", "loads", "global", "the meta file's encoding"),
    PrivateName("pysyncobj.journal", "dumps", "global", "the meta file's encoding"),
    PrivateName("pysyncobj.journal", "to_bytes", "global", "a record's command, as FileJournal.add writes it"),
    PrivateName("pysyncobj.journal", "FIRST_RECORD_OFFSET", "global", "where the journal's first record lies"),
    PrivateName("pysyncobj.journal", "LAST_RECORD_OFFSET_OFFSET", "global", "where the header names the records' end"),
    PrivateName("pysyncobj.syncobj", "createJournal", "global", "swapped while the SyncObj is constructed"),
    PrivateName("pysyncobj.pipe_notifier", "PipeNotifier", "global", "wakes the raft thread on a submit"),
    # listener.GuardedTransport: pysyncobj's TCPTransport with our listener and connections
    PrivateName(_TRANSPORT, "_createServer", "method", "overridden: our listener"),
    PrivateName(_TRANSPORT, "_onTick", "method", "overridden: the listener's sweep each tick"),
    PrivateName(_TRANSPORT, "_shouldConnect", "method", "whether addNode made an outgoing connection"),
    PrivateName(_TRANSPORT, "_onNewIncomingConnection", "method", "the listener hands it accepted connections"),
    PrivateName(_TRANSPORT, "_onOutgoingConnected", "method", "wired into our outgoing connections"),
    PrivateName(_TRANSPORT, "_onMessageReceived", "method", "wired into our outgoing connections"),
    PrivateName(_TRANSPORT, "_onDisconnected", "method", "wired into our outgoing connections"),
    PrivateName(_TRANSPORT, "_server", "attribute", "our listener in place of its TcpServer"),
    PrivateName(_TRANSPORT, "_connections", "attribute", "our outgoing connection in place of its own"),
    PrivateName(_TRANSPORT, "_syncObj", "attribute", "the conf, the poller and the encryptor"),
    PrivateName(_TRANSPORT, "_selfNode", "attribute", "the address to bind without a bindAddress"),
    PrivateName("pysyncobj.dns_resolver", "globalDnsResolver", "global", "resolves the bind address"),
    # connection.GuardedConnection: pysyncobj's TcpConnection, same interface and wire format
    PrivateName("pysyncobj.tcp_connection", "CONNECTION_STATE", "global", "the states its transport reads"),
    PrivateName("pysyncobj.tcp_connection", "set_keepalive", "global", "TCP keepalive on our connections"),
    PrivateName("pysyncobj.pickle", "dumps", "global", "the wire encoding of a message"),
    PrivateName("pysyncobj.pickle", "loads", "global", "the wire decoding of a message"),
)


_verified = False


class PysyncobjMismatch(RuntimeError):
    """The installed pysyncobj lacks a private name raftlog relies on."""


def _real_owners() -> dict[str, Any]:
    journal = importlib.import_module("pysyncobj.journal")
    syncobj = importlib.import_module("pysyncobj.syncobj")
    return {
        "SyncObj": syncobj.SyncObj,
        "FileJournal": journal.FileJournal,
        "ResizableFile": journal.ResizableFile,
        "MetaStorer": journal.MetaStorer,
        "pysyncobj.journal": journal,
        "pysyncobj.syncobj": syncobj,
        "pysyncobj.pipe_notifier": importlib.import_module("pysyncobj.pipe_notifier"),
        "TCPTransport": importlib.import_module("pysyncobj.transport").TCPTransport,
        "pysyncobj.tcp_connection": importlib.import_module("pysyncobj.tcp_connection"),
        "pysyncobj.dns_resolver": importlib.import_module("pysyncobj.dns_resolver"),
        "pysyncobj.pickle": importlib.import_module("pysyncobj.pickle"),
    }


def _installed() -> str:
    try:
        return version("pysyncobj")
    except PackageNotFoundError:
        return "unknown"


def _source(owner: Any) -> str:
    try:
        return inspect.getsource(owner)
    except (OSError, TypeError):
        return ""


def _assigned_in_source(source: str, name: str) -> bool:
    # ``_SyncObj__raftLog`` is written ``self.__raftLog`` in SyncObj's own source.
    spelled = re.sub(r"^_[A-Za-z0-9]+(__)", r"\1", name) if "__" in name[1:] else name
    return re.search(r"\bself\." + re.escape(spelled) + r"\s*=(?!=)", source) is not None


def _present(owner: Any, entry: PrivateName, sources: dict[str, str]) -> bool:
    if entry.kind == "global":
        return hasattr(owner, entry.name)
    if entry.kind == "attribute":
        if entry.owner not in sources:
            sources[entry.owner] = _source(owner)
        return _assigned_in_source(sources[entry.owner], entry.name)
    found = inspect.getattr_static(owner, entry.name, None)
    if entry.kind == "property":
        return isinstance(found, property)
    return callable(found)


def check_pysyncobj(owners: Mapping[str, Any] | None = None) -> None:
    """Raise ``PysyncobjMismatch`` naming every entry of ``PRIVATE_NAMES`` the installed
    pysyncobj lacks (``owners`` replaces the real classes and modules, for tests)."""
    global _verified
    if owners is None and _verified:
        return
    table = _real_owners() if owners is None else owners
    sources: dict[str, str] = {}
    missing = [e for e in PRIVATE_NAMES if not _present(table[e.owner], e, sources)]
    if missing:
        names = "; ".join(f"{e.owner}.{e.name} ({e.kind}: {e.use})" for e in missing)
        raise PysyncobjMismatch(
            f"the installed pysyncobj {_installed()} lacks what raftlog relies on: {names}. "
            f"raftlog is written against pysyncobj=={PINNED}; install that version"
        )
    if owners is None:
        _verified = True  # the installed pysyncobj does not change under a running process

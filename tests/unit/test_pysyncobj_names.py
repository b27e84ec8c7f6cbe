"""The table of pysyncobj private names raftlog relies on: complete, true of the pinned
release, and a clear refusal when one is missing."""

from __future__ import annotations

import re
import types
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj

import raftlog
from raftlog.pysyncobj_names import PINNED, PRIVATE_NAMES, PysyncobjMismatch, _real_owners, check_pysyncobj

RAFTLOG = Path(raftlog.__file__).parent


def test_the_installed_pysyncobj_is_the_pinned_one_and_has_every_name() -> None:
    assert version("pysyncobj") == PINNED
    check_pysyncobj()


def test_every_mangled_name_in_raftlog_and_its_test_doubles_is_in_the_table() -> None:
    """So the check covers all raftlog relies on, and a double cannot stand in for a name the
    check does not verify (the doubles copy pysyncobj's private names)."""
    doubles = Path(__file__).parent.glob("test_raft_*.py")
    used = set()
    for source in [*RAFTLOG.glob("*.py"), *doubles]:
        used |= set(re.findall(r"\b_(?:SyncObj|FileJournal|ResizableFile)__[A-Za-z]+\b", source.read_text()))
    listed = {e.name for e in PRIVATE_NAMES}
    assert used and used <= listed, sorted(used - listed)


def test_a_missing_private_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(SyncObj, "_SyncObj__sendAppendEntries")
    with pytest.raises(PysyncobjMismatch, match=r"SyncObj\._SyncObj__sendAppendEntries \(method") as caught:
        check_pysyncobj(_real_owners())  # the real classes, checked afresh (a passed check is remembered)
    assert f"pysyncobj=={PINNED}" in str(caught.value)


class ResizableFile:
    """A stand-in for a release that renamed the mapping (``__mm``) and kept the file."""

    def __init__(self, name: str) -> None:
        self.__f = open(name, "rb")  # noqa: SIM115 - never run: the check reads the source
        self.__mapping = None

    def write(self, offset: int, values: bytes) -> None:
        pass


def test_a_missing_instance_attribute_is_named_from_the_source() -> None:
    owners: dict[str, Any] = {**_real_owners(), "ResizableFile": ResizableFile}
    with pytest.raises(PysyncobjMismatch) as caught:
        check_pysyncobj(owners)
    message = str(caught.value)
    assert "ResizableFile._ResizableFile__mm (attribute" in message
    assert "_ResizableFile__f" not in message  # the stand-in still assigns that one


def test_a_missing_module_global_and_a_property_turned_method_are_named() -> None:
    journal = types.ModuleType("pysyncobj.journal")
    journal.__dict__.update({k: v for k, v in vars(_real_owners()["pysyncobj.journal"]).items() if k != "dumps"})

    class Renamed(SyncObj):  # type: ignore[misc]
        def raftLastApplied(self) -> int:  # noqa: N802 - pysyncobj's name
            return 0

    with pytest.raises(PysyncobjMismatch) as caught:
        check_pysyncobj({**_real_owners(), "pysyncobj.journal": journal, "SyncObj": Renamed})
    message = str(caught.value)
    assert "pysyncobj.journal.dumps (global" in message and "SyncObj.raftLastApplied (property" in message


def test_a_node_refuses_to_start_on_a_pysyncobj_without_a_name(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from raftlog import pysyncobj_names
    from raftlog.node import NodeConfig, RaftNode

    monkeypatch.setattr(pysyncobj_names, "_verified", False)  # as in a fresh process
    monkeypatch.delattr(SyncObj, "_SyncObj__sendNextNodeIdx")
    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s"),
                    fsm=None)  # type: ignore[arg-type]
    with pytest.raises(PysyncobjMismatch, match="_SyncObj__sendNextNodeIdx"):
        node.start(timeout=5)
    assert node._thread is None  # refused before any thread or socket

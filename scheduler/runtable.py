"""The run ledger's records (``Store.runs``), kept per job and packed once an attempt is over.

A run record as a dict costs ~1,130 bytes; a million of them (100,000 jobs keeping ten runs)
would hold a gigabyte of an agent's memory. Here a record that no transition will touch often
(any status but ``claimed`` and ``running``) is kept as one ``bytes`` value of ~90 bytes:
its values in a fixed order, without keys, its id and job implied by where it is kept, its
instants as offsets from its slot, its status, trigger and outcome as codes. Reading one
gives back a dict equal to the one stored, with its keys in the same order, so snapshots are
byte for byte what the dicts would give. A record that does not have the layout below (keys
missing or in another order, a value of another type) is kept as the dict it is.

Layout. Records of one job are one dict, token -> record, in token order (tokens grow with
the log, so a job's insertion order is its claim order). Where each token's job is kept is a
sorted array of tokens beside a list of job names (``_Index``); a removed record leaves a
hole (``None``) until holes are half of it. Readers on the event loop's thread see the raft
thread's changes one step at a time: every change below is one step under the GIL on a
single dict, list, array or attribute, ordered so that a reader at worst misses a record
being added or removed, never sees one under another token.
"""

from __future__ import annotations

import bisect
import re
import sys
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, cast, get_args

import msgpack

from .runs import HELD, RUN_STATUSES, RunRecord, TriggerName

__all__ = ["Captured", "JobRuns", "RunTable", "Slices", "run_id_of", "token_of_id"]

FIELDS = (
    "id", "job", "slot_us", "attempt", "trigger", "status", "node", "claimed_us", "started_us", "finished_us",
    "lease_us", "exit_code", "http_status", "output", "error", "token", "term", "leader", "retry_of", "next",
    "cause", "retry_at_us", "outcome", "not_before_us",
)
"""A record's keys in the order the ledger makes them; later keys (``late_result``,
``dead_deleted``) follow in the order they were added."""
_N = len(FIELDS)
_INSTANTS = ("claimed_us", "started_us", "finished_us", "lease_us", "retry_at_us", "not_before_us")
_TRIGGERS: tuple[TriggerName, ...] = get_args(TriggerName)
_STATUS_CODE = {s: i for i, s in enumerate(RUN_STATUSES)}
_TRIGGER_CODE = {t: i for i, t in enumerate(_TRIGGERS)}
_UNPACKED: frozenset[str] = frozenset(HELD)
"""Statuses whose records change often (starts, lease renewals, results): kept as dicts."""
_ID = re.compile(r"r[1-9a-f][0-9a-f]*")


def run_id_of(token: int) -> str:
    return f"r{token:x}"


def token_of_id(rid: str) -> int | None:
    """The token a run id names, or None for a string no token gives (``run_id_of``)."""
    if type(rid) is not str or _ID.fullmatch(rid) is None:
        return None
    return int(rid[1:], 16)


def _ref(rid: Any) -> Any:
    """A run id another record names (``retry_of``, ``next``) as its token, which packs smaller."""
    if rid is None:
        return None
    token = token_of_id(rid)
    return rid if token is None or token >= _TOKEN_END else token


_TOKEN_END = 1 << 63
_CAUSE = 0x80
"""Set in a packed record's second byte when its ``cause`` is not None."""
_NO_CODE = 0x7F
"""A packed record's second byte (less ``_CAUSE``) for a trigger without a code."""


def pack(run: RunRecord) -> bytes | None:
    """``run`` packed, or None when it is kept as a dict: a status that changes often, or a
    record whose keys or values are not the ledger's layout (so unpacking would not give it back)."""
    status = run.get("status")
    if status in _UNPACKED or status not in _STATUS_CODE:
        return None
    keys = tuple(run)
    if keys[:_N] != FIELDS:
        return None
    slot = run["slot_us"]
    if type(slot) is not int or run["id"] != run_id_of(run["token"]):
        return None
    rec = cast(dict[str, Any], run)
    offsets: list[int | None] = []
    for k in _INSTANTS:
        v = rec[k]
        if v is None:
            offsets.append(None)
        elif type(v) is int:
            offsets.append(v - slot)
        else:
            return None
    trigger, outcome, retry_of, nxt = run["trigger"], run["outcome"], run["retry_of"], run["next"]
    if type(trigger) is not str or type(outcome) is int or type(retry_of) is int or type(nxt) is int:
        return None  # an int here would read back as a code or a token
    body = [
        slot, run["attempt"], _TRIGGER_CODE.get(trigger, trigger), run["node"], offsets[0], offsets[1],
        offsets[2], offsets[3], run["exit_code"], run["http_status"], run["output"], run["error"], run["term"],
        run["leader"], _ref(retry_of), _ref(nxt), run["cause"], offsets[4],
        _STATUS_CODE.get(outcome, outcome) if type(outcome) is str else outcome, offsets[5],
    ]
    if len(keys) > _N:
        body.append({k: rec[k] for k in keys[_N:]})
    try:
        packed = msgpack.packb(body, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return None  # a value msgpack cannot hold (an int past 64 bits): kept as it is
    # Two bytes ahead of the values, read without unpacking: the status, and the trigger
    # with whether the record names a cause (what the readers that filter runs ask first).
    second = _TRIGGER_CODE.get(trigger, _NO_CODE) | (_CAUSE if run["cause"] is not None else 0)
    return bytes((_STATUS_CODE[status], second)) + packed


def unpack(job: str, token: int, data: bytes) -> RunRecord:
    v = msgpack.unpackb(data[2:], raw=False, use_list=True, strict_map_key=False)
    slot = v[0]
    trigger, retry_of, nxt, outcome = v[2], v[14], v[15], v[18]
    rec: dict[str, Any] = {
        "id": run_id_of(token), "job": job, "slot_us": slot, "attempt": v[1],
        "trigger": _TRIGGERS[trigger] if type(trigger) is int else trigger,
        "status": RUN_STATUSES[data[0]], "node": v[3],
        "claimed_us": None if v[4] is None else slot + v[4],
        "started_us": None if v[5] is None else slot + v[5],
        "finished_us": None if v[6] is None else slot + v[6],
        "lease_us": None if v[7] is None else slot + v[7],
        "exit_code": v[8], "http_status": v[9], "output": v[10], "error": v[11], "token": token, "term": v[12],
        "leader": v[13],
        "retry_of": run_id_of(retry_of) if type(retry_of) is int else retry_of,
        "next": run_id_of(nxt) if type(nxt) is int else nxt,
        "cause": v[16],
        "retry_at_us": None if v[17] is None else slot + v[17],
        "outcome": RUN_STATUSES[outcome] if type(outcome) is int else outcome,
        "not_before_us": None if v[19] is None else slot + v[19],
    }
    if len(v) > 20:
        rec.update(v[20])
    return cast(RunRecord, rec)


def _status_of(value: RunRecord | bytes) -> str:
    return RUN_STATUSES[value[0]] if type(value) is bytes else cast(RunRecord, value)["status"]


def _wanted(value: RunRecord | bytes, statuses: frozenset[str] | None, caused: bool) -> bool:
    """Whether a record may be one a reader filters for, read from a packed record's first
    two bytes (``statuses``: its status is one of them; ``caused``: it names a cause)."""
    if type(value) is bytes:
        return (statuses is None or RUN_STATUSES[value[0]] in statuses) and (not caused or value[1] & _CAUSE != 0)
    run = cast(RunRecord, value)
    return (statuses is None or run["status"] in statuses) and (not caused or run["cause"] is not None)


class _Index:
    """token -> job, as a sorted array of tokens and a list of job names (None: removed)."""

    def __init__(self, tokens: array[int] | None = None, owners: list[str | None] | None = None) -> None:
        self.tokens: array[int] = tokens if tokens is not None else array("q")
        self.owners: list[str | None] = owners if owners is not None else []

    def find(self, token: int) -> int:
        """The position of ``token``, or -1."""
        tokens = self.tokens
        i = bisect.bisect_left(tokens, token)
        return i if i < len(tokens) and tokens[i] == token else -1

    def owner(self, token: int) -> str | None:
        i = self.find(token)
        if i < 0:
            return None
        owners = self.owners
        return owners[i] if i < len(owners) else None


Pair = tuple["array[int]", list[Any]]
"""One job's records: its tokens in order, and beside each its value (packed bytes or a dict)."""


def _empty() -> Pair:
    return (array("q"), [])


_NONE: Pair = _empty()
"""What a job with no runs holds: one pair for all of them (~180 bytes a job otherwise),
never extended (``__setitem__`` and ``load_jobs`` give the job a pair of its own first)."""


def _crc(job: str, raw: bytes, values: list[Any]) -> int:
    """CRC-32 of a job's name, tokens and values as a version-3 snapshot lists them (a record
    kept as a dict, by its msgpack form: one node packs it, another unpacks and packs it again)."""
    crc = zlib.crc32(raw, zlib.crc32(job.encode("utf-8", "surrogatepass")))
    crc = zlib.crc32(b"".join(v for v in values if type(v) is bytes), crc)
    for v in values:
        if type(v) is not bytes:
            crc = zlib.crc32(msgpack.packb(v, use_bin_type=True), crc)
    return crc


_SECOND = frozenset({*range(len(_TRIGGERS)), _NO_CODE})
"""What a packed record's second byte may hold, less ``_CAUSE``."""


def _wire(values: array[int]) -> bytes:
    """An array as a snapshot holds it: little-endian whatever this machine's order."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _unwire(typecode: str, raw: bytes) -> array[int]:
    values = array(typecode)
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values


class RunTable:
    """``Store.runs``: run id -> record, as a mapping (``get``, ``[]``, ``in``, ``len``, iteration
    in token order), with the per-job views the ledger and the API read (``ids_of``,
    ``records_of``, ``count_of``) and counts by status kept in step (``status_counts``).

    Each job's records are a pair (tokens array, values list), 16 bytes a record beside its
    value. Appending extends both, values first (a reader that finds a token finds its value);
    replacing a record sets one list item; removing one makes a new pair and sets it whole."""

    def __init__(self) -> None:
        self._jobs: dict[str, Pair] = {}
        # The records kept as dicts (attempts in flight, mostly), by id as well: the leader and
        # the workers read them at every tick, without the token index.
        self._live: dict[str, RunRecord] = {}
        self._index = _Index()
        self._holes = 0
        self._len = 0
        self._statuses: dict[str, int] = {}

    # ---- reading ---------------------------------------------------------------

    def _value(self, job: str, token: int) -> Any:
        pair = self._jobs.get(job)
        if pair is None:
            return None
        tokens, values = pair
        i = bisect.bisect_left(tokens, token)
        if i < len(tokens) and tokens[i] == token and i < len(values):
            return values[i]
        return None

    def get(self, rid: str) -> RunRecord | None:
        live = self._live.get(rid)
        if live is not None:
            return live
        token = token_of_id(rid)
        if token is None:
            return None
        job = self._index.owner(token)
        if job is None:
            return None
        value = self._value(job, token)
        if value is None:
            return None
        return unpack(job, token, value) if type(value) is bytes else cast(RunRecord, value)

    def __getitem__(self, rid: str) -> RunRecord:
        run = self.get(rid)
        if run is None:
            raise KeyError(rid)
        return run

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self.get(rid) is not None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        index = self._index
        tokens, owners = array("q", index.tokens), list(index.owners)  # owners may have grown between
        return (run_id_of(t) for t, job in zip(tokens, owners, strict=False) if job is not None)

    def newest(self, before: int | None = None) -> Iterator[str]:
        """Run ids, newest first, of tokens below ``before`` (every one when None)."""
        index = self._index
        tokens = index.tokens
        end = len(tokens) if before is None else bisect.bisect_left(tokens, before)
        owners = index.owners
        for i in range(min(end, len(owners)) - 1, -1, -1):
            if owners[i] is not None:
                yield run_id_of(tokens[i])

    def items(self) -> list[tuple[str, RunRecord]]:
        return list(self.capture())

    def values(self) -> list[RunRecord]:
        return [run for _, run in self.capture()]

    def _copy(self, job: str) -> Pair | None:
        pair = self._jobs.get(job)
        if pair is None:
            return None
        tokens = array("q", pair[0])  # first: an append extends the values first
        return tokens, pair[1][: len(tokens)]

    def tokens_of(self, job: str) -> array[int]:
        """The job's tokens in order (a copy)."""
        pair = self._jobs.get(job)
        return array("q") if pair is None else array("q", pair[0])

    def ids_of(self, job: str) -> list[str] | None:
        """The job's run ids in claim order; None for a job the table does not hold."""
        pair = self._copy(job)
        return None if pair is None else [run_id_of(t) for t in pair[0]]

    def count_of(self, job: str) -> int:
        """How many records the job holds."""
        pair = self._jobs.get(job)
        return 0 if pair is None else len(pair[0])

    def records_of(self, job: str) -> list[RunRecord]:
        """The job's records in claim order."""
        pair = self._copy(job)
        if pair is None:
            return []
        return [unpack(job, t, v) if type(v) is bytes else cast(RunRecord, v)
                for t, v in zip(pair[0], pair[1], strict=False)]

    def newest_of(self, job: str, statuses: frozenset[str] | None = None, caused: bool = False) -> Iterator[RunRecord]:
        """The job's records newest first, each unpacked only when asked for; only those whose
        status is one of ``statuses`` (None: any), and with ``caused`` only those naming a cause
        (both told from a packed record's first bytes, without unpacking it)."""
        pair = self._copy(job)
        if pair is None:
            return
        tokens, values = pair
        for i in range(len(tokens) - 1, -1, -1):
            value = values[i]
            if _wanted(value, statuses, caused):
                yield unpack(job, tokens[i], value) if type(value) is bytes else cast(RunRecord, value)

    def status_counts(self) -> dict[str, int]:
        return dict(self._statuses)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return dict(self.items()) == other
        if not isinstance(other, RunTable):
            return NotImplemented
        return self.items() == other.items() and [(j, list(p[0])) for j, p in self._jobs.items()] == [
            (j, list(p[0])) for j, p in other._jobs.items()]

    __hash__ = None  # type: ignore[assignment]

    # ---- changing (the raft thread) --------------------------------------------

    def add_job(self, job: str) -> None:
        """A job the table lists (empty) from its creation, in the order jobs are created."""
        job = sys.intern(job)
        if job not in self._jobs:
            self._jobs[job] = _NONE

    def __setitem__(self, rid: str, run: RunRecord) -> None:
        token = run["token"]
        if rid != run_id_of(token) or run["id"] != rid:
            raise ValueError(f"run {rid!r} holds token {token!r}, whose id is {run_id_of(token)!r}")
        # Interned: the token index lists the job of every record, and each claim decodes its
        # own copy of the name (58 bytes a record at 100,000 jobs, a third of what one costs).
        job = sys.intern(run["job"])
        packed = pack(run)
        value: Any = run if packed is None else packed
        pair = self._jobs.get(job)
        if pair is None or pair is _NONE:
            pair = self._jobs[job] = _empty()
        tokens, values = pair
        if tokens and tokens[-1] >= token:
            i = bisect.bisect_left(tokens, token)
            if tokens[i] == token:  # a record replaced
                self._count(_status_of(values[i]), -1)
                values[i] = value
            else:  # out of token order (not the ledger's way): a new pair, set whole
                self._insert(token, job)
                self._jobs[job] = (array("q", [*tokens[:i], token, *tokens[i:]]), [*values[:i], value, *values[i:]])
                self._len += 1
        else:
            self._insert(token, job)
            values.append(value)  # before its token: a reader that finds the token finds its value
            tokens.append(token)
            self._len += 1
        if packed is None:
            self._live[rid] = run
        else:
            self._live.pop(rid, None)
        self._count(run["status"], 1)

    def discard(self, rid: str) -> bool:
        """Remove the record ``rid`` if it is held; whether it was."""
        token = token_of_id(rid)
        job = None if token is None else self._index.owner(token)
        return job is not None and token is not None and self.remove(job, [token]) == 1

    def remove(self, job: str, doomed: Iterable[int]) -> int:
        """Remove these records of ``job`` (by token) in one step: the job's pair is made again
        once, not once a record (history trimmed by 1,000 runs of a job keeping 10,000).
        Returns how many it held."""
        pair = self._jobs.get(job)
        gone = set(doomed)
        if pair is None or not gone:
            return 0
        tokens, values = pair
        at = []
        for t in gone:
            i = bisect.bisect_left(tokens, t)
            if i < len(tokens) and tokens[i] == t:
                at.append(i)
        if not at:
            return 0
        at.sort()
        dropped = [(tokens[i], values[i]) for i in at]
        if at[-1] == len(at) - 1:  # the oldest went (trims): two slices
            self._jobs[job] = (tokens[len(at):], values[len(at):])
        else:
            new_tokens, new_values, prev = array("q"), [], 0
            for i in [*at, len(tokens)]:
                new_tokens.extend(tokens[prev:i])
                new_values.extend(values[prev:i])
                prev = i + 1
            self._jobs[job] = (new_tokens, new_values)
        for token, value in dropped:
            if type(value) is not bytes:
                self._live.pop(run_id_of(token), None)
            self._count(_status_of(value), -1)
            self._forget(token)
        self._len -= len(dropped)
        return len(dropped)

    def drop_job(self, job: str) -> list[str]:
        """Remove the job and all its records; their ids."""
        pair = self._jobs.pop(job, None)
        if pair is None:
            return []
        for token, value in zip(*pair, strict=True):
            if type(value) is not bytes:
                self._live.pop(run_id_of(token), None)
            self._count(_status_of(value), -1)
            self._forget(token)
        self._len -= len(pair[0])
        return [run_id_of(t) for t in pair[0]]

    def _count(self, status: str, n: int) -> None:
        left = self._statuses.get(status, 0) + n
        if left:
            self._statuses[status] = left
        else:
            self._statuses.pop(status, None)

    def _insert(self, token: int, job: str) -> None:
        index = self._index
        tokens, owners = index.tokens, index.owners
        if not tokens or tokens[-1] < token:
            owners.append(job)  # before its token: a reader that finds the token finds its job
            tokens.append(token)
            return
        if index.owner(token) is not None:
            raise ValueError(f"run {run_id_of(token)} is kept already")
        # Out of token order (not the ledger's way): a new index, swapped in whole.
        i = bisect.bisect_left(tokens, token)
        new_tokens = array("q", tokens)
        new_tokens.insert(i, token)
        self._index = _Index(new_tokens, [*owners[:i], job, *owners[i:]])

    def _forget(self, token: int) -> None:
        index = self._index
        i = index.find(token)
        if i < 0:
            return
        index.owners[i] = None
        self._holes += 1
        if self._holes > 1024 and self._holes * 2 > len(index.owners):
            kept = [(t, j) for t, j in zip(index.tokens, index.owners, strict=True) if j is not None]
            self._index = _Index(array("q", (t for t, _ in kept)), [j for _, j in kept])
            self._holes = 0

    # ---- snapshots -------------------------------------------------------------

    def capture(self) -> Captured:
        """The records as they are now, to read (and unpack) later, in token order."""
        index = self._index
        owners = list(index.owners)
        tokens = array("q", index.tokens[: len(owners)])
        # A job without runs holds the one shared empty pair, which never changes: kept, not
        # copied (two objects a job, ~60 ms of the raft thread at 100,000 jobs).
        jobs = {job: pair if pair is _NONE else (array("q", pair[0]), list(pair[1]))
                for job, pair in self._jobs.copy().items()}
        return Captured(tokens, owners, jobs)

    def load(self, items: Iterable[tuple[str, RunRecord]]) -> None:
        """Records as a version 1 or 2 snapshot lists them."""
        for rid, run in items:
            self[rid] = run

    def load_jobs(self, items: Iterable[Any]) -> None:
        """Version 3: each job's records as ``(job, tokens, values, crc)`` (``Captured.by_job``),
        tokens as the bytes of a signed 64-bit little-endian array, ``crc`` the CRC-32 of the
        name, those bytes and the values (``_crc``: a flipped bit in a packed value would
        otherwise show only when it is read, and one in a name would move runs to another job). A packed value is checked for its two leading bytes, and unpacked when read;
        ``load_index`` then lists the jobs of the tokens."""
        for item in items:
            if len(item) != 4:
                raise ValueError("a job's runs are not listed as job, tokens, values and checksum")
            job, raw, values, crc = item
            if type(job) is not str or type(raw) is not bytes or type(values) is not list or type(crc) is not int:
                raise ValueError(f"a job's runs are listed as {type(job).__name__}, {type(raw).__name__}, "
                                 f"{type(values).__name__}, {type(crc).__name__}")
            if len(raw) % 8 or len(raw) // 8 != len(values):
                raise ValueError(f"job {job!r} lists {len(raw) // 8} tokens for {len(values)} runs")
            if _crc(job, raw, values) != crc:
                raise ValueError(f"the runs of job {job!r} fail their checksum")
            job = sys.intern(job)
            if not values:
                self.add_job(job)
                continue
            tokens = _unwire("q", raw)
            pair = self._jobs.get(job)
            if pair is None or pair is _NONE:
                pair = self._jobs[job] = _empty()
            last = pair[0][-1] if pair[0] else -1
            # In C where it can be: a loop a record took half of a restore's time.
            if tokens[0] <= last or len(set(tokens)) != len(tokens) or list(tokens) != sorted(tokens):
                raise ValueError(f"job {job!r} lists its runs out of order")
            heads = Counter([v[:2] if type(v) is bytes else None for v in values])
            for head, n in heads.items():
                if head is None:
                    continue
                if len(head) < 2 or head[0] >= len(RUN_STATUSES) or RUN_STATUSES[head[0]] in _UNPACKED \
                        or (head[1] & ~_CAUSE) not in _SECOND:
                    raise ValueError(f"job {job!r} holds a run packed with an unknown status or trigger")
                self._count(RUN_STATUSES[head[0]], n)
            if min(len(v) if type(v) is bytes else 3 for v in values) < 3:
                raise ValueError(f"job {job!r} holds a run packed short")
            if None in heads:
                self._load_dicts(job, tokens, values)
            pair[1].extend(values)
            pair[0].extend(tokens)
            self._len += len(values)

    def _load_dicts(self, job: str, tokens: array[int], values: list[Any]) -> None:
        """The values of ``load_jobs`` that are not packed: records kept as dicts."""
        for k, (token, value) in enumerate(zip(tokens, values, strict=True)):
            if type(value) is bytes:
                continue
            rid = run_id_of(token)
            if not isinstance(value, dict) or value.get("token") != token or value.get("job") != job \
                    or value.get("id") != rid or value.get("status") not in _STATUS_CODE:
                raise ValueError(f"run {rid} of job {job!r} is neither packed nor its record")
            run = cast(RunRecord, value)
            packed = pack(run)
            if packed is not None:  # kept as a dict by the node that wrote it, packable here
                values[k] = packed
            else:
                self._live[rid] = run
            self._count(run["status"], 1)

    def load_index(self, items: Iterable[Any], jobs: list[str]) -> None:
        """Version 3: the token index, as ``(tokens, ordinals)`` chunks: each token's job by its
        place in the order the jobs were listed (``jobs``). Checked whole by ``check``."""
        index = self._index
        for item in items:
            raw, ords = item
            if type(raw) is not bytes or type(ords) is not bytes or len(raw) % 8 or len(ords) % 4 \
                    or len(raw) // 8 != len(ords) // 4:
                raise ValueError("the run index is not pairs of tokens and job numbers")
            tokens, at = _unwire("q", raw), _unwire("I", ords)
            if at and max(at) >= len(jobs):
                raise ValueError("the run index names a job the snapshot does not list")
            index.owners.extend([jobs[k] for k in at])
            index.tokens.extend(tokens)

    def check(self) -> None:
        """After ``load_jobs`` and ``load_index``: the index lists every record once, in order,
        under its job (in strict order and as long as the records, with every record found
        under its own job, it is one-to-one)."""
        index = self._index
        tokens, owners = index.tokens, index.owners
        if len(tokens) != self._len:
            raise ValueError(f"the run index lists {len(tokens)} runs for {self._len} records")
        if any(a >= b for a, b in zip(tokens, tokens[1:], strict=False)):
            raise ValueError("the run index is out of order")
        listed: dict[str, list[int]] = {job: [] for job in self._jobs}
        try:
            for token, job in zip(tokens, owners, strict=True):
                listed[job].append(token)  # type: ignore[index]
        except KeyError as exc:
            raise ValueError(f"the run index lists runs of job {exc.args[0]!r}, which the snapshot does not hold") from None
        for job, (held, _) in self._jobs.items():
            if array("q", listed[job]) != held:
                raise ValueError(f"the run index does not list the runs of job {job!r} as the job holds them")


class Captured:
    """A table's records at one instant, to pack later: ``len`` and slices of (id, record) pairs
    in token order (versions 1 and 2), each job's ids (``job_lists``), and version 3's chunks
    (``by_job``, ``index``)."""

    def __init__(self, tokens: array[int], owners: list[str | None], jobs: dict[str, Pair]) -> None:
        self._tokens = array("q", (t for t, j in zip(tokens, owners, strict=True) if j is not None))
        self._owners = [j for j in owners if j is not None]
        self._jobs = jobs
        self._pairs: list[tuple[int, str]] | None = None

    def _pair_list(self) -> list[tuple[int, str]]:
        if self._pairs is None:
            self._pairs = list(zip(self._tokens, self._owners, strict=True))
        return self._pairs

    def __len__(self) -> int:
        return len(self._tokens)

    def __iter__(self) -> Iterator[tuple[str, RunRecord]]:
        for start in range(0, len(self), 2000):
            yield from self[start : start + 2000]

    def __getitem__(self, part: slice) -> list[tuple[str, RunRecord]]:
        out = []
        for token, job in self._pair_list()[part]:
            tokens, values = self._jobs[job]
            value = values[bisect.bisect_left(tokens, token)]
            out.append((run_id_of(token), unpack(job, token, value) if type(value) is bytes else value))
        return out

    def job_lists(self) -> _Lazy:
        jobs = list(self._jobs.items())
        return _Lazy(len(jobs), lambda part: [(job, [run_id_of(t) for t in pair[0]]) for job, pair in jobs[part]])

    def by_job(self, per_chunk: int) -> Iterator[list[Any]]:
        """Chunks of ``(job, tokens, values)``, every job in table order (none left out: the
        index refers to them by place), about ``per_chunk`` records a chunk, a job with none
        counting as one; a job with more is split over chunks. (Jobs without runs once all
        went in one chunk: 100,000 of them, 2.1 MB packed in one call that held the GIL for
        32 ms, and longer on a busy machine, while the API waited.)"""
        chunk: list[Any] = []
        held = 0
        for job, (tokens, values) in self._jobs.items():
            for start in range(0, max(len(values), 1), per_chunk):  # a job without runs: one empty part
                part = values[start:start + per_chunk]
                raw = _wire(tokens[start:start + per_chunk])
                chunk.append((job, raw, part, _crc(job, raw, part)))
                held += max(len(part), 1)
                if held >= per_chunk:
                    yield chunk
                    chunk, held = [], 0
        if chunk:
            yield chunk

    def index(self, per_chunk: int) -> Iterator[list[Any]]:
        """Chunks of ``(tokens, ordinals)``: the token index, each job by its place in ``by_job``."""
        place = {job: k for k, job in enumerate(self._jobs)}
        for start in range(0, len(self._tokens), per_chunk):
            ords = array("I", [place[j] for j in self._owners[start:start + per_chunk]])
            yield [(_wire(self._tokens[start:start + per_chunk]), _wire(ords))]


class Slices(Protocol):
    """What a snapshot section is read from: its length, and its items a slice at a time."""

    def __len__(self) -> int: ...

    def __getitem__(self, part: slice, /) -> list[Any]: ...


class _Lazy:
    def __init__(self, n: int, read: Callable[[slice], list[Any]]) -> None:
        self._n, self._read = n, read

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, part: slice) -> list[Any]:
        return self._read(part)


class JobRuns:
    """``Store.job_runs``: job -> its run ids in claim order, read from the table (a job is
    listed from its creation to its deletion, with no runs or many)."""

    def __init__(self, table: RunTable) -> None:
        self._table = table

    def get(self, job: str, default: Any = None) -> Any:
        ids = self._table.ids_of(job)
        return default if ids is None else ids

    def __getitem__(self, job: str) -> list[str]:
        ids = self._table.ids_of(job)
        if ids is None:
            raise KeyError(job)
        return ids

    def __contains__(self, job: object) -> bool:
        return job in self._table._jobs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._table._jobs))

    def __len__(self) -> int:
        return len(self._table._jobs)

    def keys(self) -> list[str]:
        return list(self._table._jobs)

    def items(self) -> list[tuple[str, list[str]]]:
        return [(job, self._table.ids_of(job) or []) for job in list(self._table._jobs)]

    def values(self) -> list[list[str]]:
        return [ids for _, ids in self.items()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JobRuns):
            return self.items() == other.items()
        if isinstance(other, dict):
            return dict(self.items()) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

"""The run ledger's records (``Store.runs``), kept per job and packed once an attempt is over.

A run record as a dict costs ~1,130 bytes; a million of them (100,000 jobs keeping ten runs)
would hold a gigabyte of an agent's memory. Here a record that no transition will touch often
(any status but ``claimed`` and ``running``) is packed in ~50 bytes (a plain success):
its values in a fixed order, without keys, its id and job implied by where it is kept, its
instants as offsets from its slot, its status, trigger and outcome as codes. Reading one
gives back a dict equal to the one stored, with its keys in the same order, so snapshots are
byte for byte what the dicts would give. A record that does not have the layout below (keys
missing or in another order, a value of another type) is kept as the dict it is.

Layout. Each job's records are one immutable ``bytes`` value (``_open`` reads it): their
tokens in order (tokens grow with the log, so a job's order is its claim order), the length of
each packed record, and the packed records; a record kept as a dict is held by id beside them
(``RunTable._live``). Where each token's job is kept is a sorted array of tokens beside a list
of job names (``_Index``); a removed record leaves a hole (``None``) until holes are half of it.
Readers on the event loop's thread see the raft thread's changes one step at a time: a job's
value is made anew and set whole, and every other change is one step under the GIL on a single
dict, list or array, ordered so that a reader at worst misses a record being added or removed,
never sees one under another token.
"""

from __future__ import annotations

import bisect
import re
import sys
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import Any, Protocol, cast, get_args

import msgpack

from .runs import HELD, RUN_STATUSES, RunRecord, TriggerName
from .spill import Spilled, Spiller

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


SWEEP_EVERY = 0.1
"""Seconds between two slices of the sweep that moves cold values out of memory (``RunTable.tick``)."""
SWEEP_JOBS = 2500
"""Jobs a slice of that sweep looks at: 100,000 jobs are met once every ~4 s."""
COLD_AFTER = 5.0
"""Seconds a job's value stays in memory after it was last made: the claim, start and result of
one slot come within them, and a job firing every few seconds is never moved out at all."""
SPILL_MIN = 256
"""A value smaller than this stays in memory: what its place in the file costs (a ``Spilled``) would take most of what it frees."""

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


# ---- one job's records: one bytes value ------------------------------------------------------
#
# A job's records are one immutable ``bytes``: a count n (8 bytes), its n tokens (signed 64-bit,
# this machine's order, ascending), the n lengths of their packed forms (unsigned 32-bit; 0 for
# a record kept as a dict, which ``RunTable._live`` holds by id), then the packed forms one
# after another. Record i ends where the lengths after it begin: ``len(blob) - sum(lens[i+1:])``,
# so reading newest first walks back from the end. A change makes the job's value again, in
# one ``bytes.join`` of slices of the old one, and sets it whole: a reader holding a value holds
# one consistent job. (As a list of ``bytes`` beside an array of tokens, each record cost ~170
# bytes of an agent's memory, a third of it the Python object and its slot; here ~70.)

_HEAD = 8
_EMPTY = bytes(_HEAD)
"""What a job with no runs holds (one value shared by all of them)."""
_ORDER: Any = sys.byteorder


def _bytes(value: bytes | Spilled) -> bytes:
    """A job's value as ``RunTable._jobs`` holds it (in memory, or where ``scheduler.spill`` keeps it), as bytes."""
    return value if type(value) is bytes else cast(Spilled, value).read()


def _count_in(value: bytes | Spilled) -> int:
    return int.from_bytes(value[:_HEAD], _ORDER) if type(value) is bytes else cast(Spilled, value).count


def _open(blob: bytes) -> tuple[int, memoryview, memoryview, memoryview]:
    """``blob``'s count, tokens, lengths and the whole of it, as views (no copies)."""
    n = int.from_bytes(blob[:_HEAD], _ORDER)
    raw = memoryview(blob)
    lens_at = _HEAD + 8 * n
    return n, raw[_HEAD:lens_at].cast("q"), raw[lens_at:lens_at + 4 * n].cast("I"), raw


def _made(n: int, parts: Iterable[Any]) -> bytes:
    """A job's value from its count and the byte runs that follow it: tokens, lengths, data."""
    return b"".join((n.to_bytes(_HEAD, _ORDER), *parts)) if n else _EMPTY


def _span(lens: memoryview, i: int, size: int) -> tuple[int, int]:
    """Where record i's packed bytes lie in a value of ``size`` bytes."""
    end = size - sum(lens[i + 1:])
    return end - lens[i], end


def _data_at(n: int) -> int:
    return _HEAD + 12 * n


def _layout(tokens: Any, values: list[Any]) -> bytes:
    """A job's value from its tokens (an array or view) and values (packed bytes, or a dict)."""
    lens = array("I", [len(v) if type(v) is bytes else 0 for v in values])
    return _made(len(values), (memoryview(tokens).cast("B"), memoryview(lens).cast("B"),
                                *(v for v in values if type(v) is bytes)))


def _values(blob: bytes, live: dict[str, RunRecord]) -> tuple[memoryview, list[Any]]:
    """A job's tokens, and beside each its value: packed bytes, or the dict ``live`` holds (None
    for one that is gone from there: a record being replaced or removed on another thread)."""
    n, tokens, lens, raw = _open(blob)
    out: list[Any] = []
    at = _data_at(n)
    for i in range(n):
        size = lens[i]
        out.append(raw[at:at + size].tobytes() if size else live.get(run_id_of(tokens[i])))
        at += size
    return tokens, out


def _record(job: str, blob: bytes, token: int, live: dict[str, RunRecord]) -> RunRecord | None:
    """Record ``token`` of ``job`` (whose value is ``blob``): unpacked, or the dict ``live``
    holds for it; None when the job does not hold it."""
    n, tokens, lens, _ = _open(blob)
    i = bisect.bisect_left(tokens, token)
    if i == n or tokens[i] != token:
        return None
    if not lens[i]:
        return live.get(run_id_of(token))
    start, end = _span(lens, i, len(blob))
    return unpack(job, token, blob[start:end])


def _without(n: int, tokens: memoryview, lens: memoryview, raw: memoryview,
             at: list[int]) -> tuple[list[memoryview], list[memoryview], list[memoryview], list[tuple[int, str | None]]]:
    """A job's value (``_open``) less its records at positions ``at`` (ascending): the slices of
    tokens, lengths and data kept, and each record left out as (token, status when packed, else
    None)."""
    lens_at = _HEAD + 8 * n
    keep_tokens, keep_lens, keep_data = [], [], []
    dropped: list[tuple[int, str | None]] = []
    prev, pos = 0, _data_at(n)
    for i in [*at, n]:
        # Records prev..i-1 are kept whole: three slices; record i goes.
        span = sum(lens[prev:i])
        keep_tokens.append(raw[_HEAD + 8 * prev:_HEAD + 8 * i])
        keep_lens.append(raw[lens_at + 4 * prev:lens_at + 4 * i])
        keep_data.append(raw[pos:pos + span])
        pos += span
        if i < n:
            dropped.append((tokens[i], RUN_STATUSES[raw[pos]] if lens[i] else None))
            pos += lens[i]
        prev = i + 1
    return keep_tokens, keep_lens, keep_data, dropped


def _crc(job: str, raw: bytes, values: list[Any]) -> int:
    """CRC-32 of a job's name, tokens and values as a version-3 snapshot lists them (a record
    kept as a dict, by its msgpack form: one node packs it, another unpacks and packs it again)."""
    crc = _crc_packed(job, raw, b"".join(v for v in values if type(v) is bytes))
    for v in values:
        if type(v) is not bytes:
            crc = zlib.crc32(msgpack.packb(v, use_bin_type=True), crc)
    return crc


def _crc_packed(job: str, raw: bytes, data: Any) -> int:
    """``_crc`` of values that are all packed, given as ``data``, their bytes one after another."""
    return zlib.crc32(data, zlib.crc32(raw, zlib.crc32(job.encode("utf-8", "surrogatepass"))))


_SECOND = frozenset({*range(len(_TRIGGERS)), _NO_CODE})
"""What a packed record's second byte may hold, less ``_CAUSE``."""


def _wire(values: array[int] | memoryview) -> bytes:
    """An array (or a typed view) as a snapshot holds it: little-endian whatever this machine's order."""
    if sys.byteorder == "big":
        values = array(values.format if isinstance(values, memoryview) else values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _unwire(typecode: str, raw: bytes) -> array[int]:
    values = array(typecode)
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _value_wire(blob: bytes) -> bytes:
    """A job's value as a version-4 snapshot holds it: count, tokens and lengths little-endian."""
    if sys.byteorder == "little" or blob is _EMPTY:
        return blob
    n, tokens, lens, raw = _open(blob)
    return b"".join((n.to_bytes(_HEAD, "little"), _wire(tokens), _wire(lens), raw[_data_at(n):]))


def _crc_value(job: str, value: bytes, whole: list[Any]) -> int:
    """CRC-32 of a job's name, its value as a version-4 snapshot lists it and the records its
    value holds no bytes of (kept as dicts), each by its msgpack form."""
    crc = _crc_packed(job, value, b"")
    for run in whole:
        crc = zlib.crc32(msgpack.packb(run, use_bin_type=True), crc)
    return crc


def _job_item(item: Any, form: str) -> tuple[str, bytes, list[Any], int]:
    """A job's entry of a ``runs`` chunk (versions 3 and 4), checked for its shape: a name,
    bytes, a list and a checksum; ``form`` names the four in the refusal."""
    if len(item) != 4:
        raise ValueError(f"a job's runs are not listed as {form}")
    job, data, values, crc = item
    if type(job) is not str or type(data) is not bytes or type(values) is not list or type(crc) is not int:
        raise ValueError(f"a job's runs are listed as {type(job).__name__}, {type(data).__name__}, "
                         f"{type(values).__name__}, {type(crc).__name__}")
    return job, data, values, crc


class RunTable:
    """``Store.runs``: run id -> record, as a mapping (``get``, ``[]``, ``in``, ``len``, iteration
    in token order), with the per-job views the ledger and the API read (``ids_of``,
    ``records_of``, ``count_of``) and counts by status kept in step (``status_counts``).

    Each job's records are one ``bytes`` value (see ``_open``), made again on each change and
    set whole. A record kept as a dict is in ``_live`` by id and takes no bytes in its job's
    value: it goes into ``_live`` before its job's value names it, and leaves after."""

    def __init__(self) -> None:
        # Each job's value: in memory, or (with a spiller) where ``scheduler.spill`` keeps it.
        self._jobs: dict[str, bytes | Spilled] = {}
        # The records kept as dicts (attempts in flight, mostly), by id: the leader and the
        # workers read them at every tick, without the token index.
        self._live: dict[str, RunRecord] = {}
        self._index = _Index()
        self._holes = 0
        self._len = 0
        self._statuses: dict[str, int] = {}
        self._spiller: Spiller | None = None
        self._recent: dict[str, float] = {}  # job -> when its value was last made (``_now``), until moved out
        self._now = 0.0  # ``time.monotonic()`` as of the last tick
        self._sweep_names: list[str] = []
        self._sweep_at = 0
        self._swept = 0.0
        self.moved_out = 0  # bytes of values moved out of memory since the owner last cleared it (``State.idle``)

    # ---- values kept out of memory (scheduler.spill) ---------------------------

    def spill_to(self, spiller: Spiller | None) -> None:
        """Keep cold values with ``spiller`` from now on (None: all in memory). Set before the
        table holds any record (an agent sets it on a table just made)."""
        self._spiller = spiller

    @property
    def spiller(self) -> Spiller | None:
        return self._spiller

    def spilled(self) -> tuple[int, int]:
        """How many jobs' values are kept out of memory, and their bytes."""
        spiller = self._spiller
        return (0, 0) if spiller is None else (spiller.values, spiller.bytes)

    def tick(self) -> None:
        """Called on the raft thread at each of its ticks, between applies (``State.idle``): a
        slice of the sweep at most every ``SWEEP_EVERY`` seconds."""
        if self._spiller is not None:
            now = self._now = time.monotonic()
            if now - self._swept >= SWEEP_EVERY:
                self._swept = now
                self.sweep(SWEEP_JOBS)  # a value it cannot read back to move raises LocalStateLost

    def sweep(self, jobs: int, everything: bool = False, now: float | None = None) -> int:
        """Go on with the sweep over the jobs by up to ``jobs`` of them: a value in memory that
        was last made ``COLD_AFTER`` seconds ago or more (every one, with ``everything``) and
        weighs at least ``SPILL_MIN`` bytes goes to the spill file, and a value kept in a file
        that was left (``Spiller.rotate``) moves to the current one. How many values moved.
        ``now``: the instant to judge by (``time.monotonic()``), else the last tick's."""
        if now is not None:
            self._now = now
        spiller = self._spiller
        if spiller is None or spiller.failed:
            return 0
        spiller.current.forget()  # ~5-7 us, the GIL kept: what reads touched is page cache again
        if self._sweep_at >= len(self._sweep_names):  # a new round over every job
            self._sweep_names = list(self._jobs.copy())
            self._sweep_at = 0
            spiller.rotate()
        names = self._sweep_names[self._sweep_at:self._sweep_at + jobs]
        self._sweep_at += len(names)
        recent, held, current = self._recent, self._jobs, spiller.current
        cold = self._now - COLD_AFTER
        moving: list[tuple[str, bytes | Spilled, bytes]] = []
        for job in names:
            value = held.get(job)
            if value is None or value is _EMPTY:
                recent.pop(job, None)
                continue
            if type(value) is bytes:
                made = recent.get(job)
                if made is not None:
                    if made > cold and not everything:
                        continue  # made lately: kept in memory
                    del recent[job]
                if len(value) >= SPILL_MIN:
                    moving.append((job, value, value))
            elif cast(Spilled, value).file is not current:
                moving.append((job, value, cast(Spilled, value).read()))
        refs = spiller.store([(data, int.from_bytes(data[:_HEAD], _ORDER)) for _, _, data in moving])
        if refs is None:
            return 0
        for (job, was, _), ref in zip(moving, refs, strict=True):
            if held.get(job) is was:
                held[job] = ref
                if type(was) is Spilled:
                    spiller.released(was)
                else:
                    self.moved_out += ref.size
            else:
                spiller.released(ref)
        return len(refs)

    def _held(self, job: str) -> bytes | None:
        """The job's value as bytes (read back when it is kept out of memory), None for a job not held."""
        value = self._jobs.get(job)
        return None if value is None else _bytes(value)

    def _set(self, job: str, blob: bytes) -> None:
        """The job's value made anew (the raft thread)."""
        jobs = self._jobs
        spiller = self._spiller
        if spiller is None:
            jobs[job] = blob
            return
        old = jobs.get(job)
        jobs[job] = blob
        if type(old) is Spilled:
            spiller.released(old)
        self._recent[job] = self._now

    # ---- reading ---------------------------------------------------------------

    def get(self, rid: str) -> RunRecord | None:
        live = self._live.get(rid)
        if live is not None:
            return live
        token = token_of_id(rid)
        job = None if token is None else self._index.owner(token)
        blob = None if job is None else self._held(job)
        if job is None or blob is None or token is None:
            return None
        return _record(job, blob, token, self._live)  # from _live: gone if it was removed meanwhile

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

    def tokens_of(self, job: str) -> array[int]:
        """The job's tokens in order (a copy)."""
        blob = self._held(job)
        return array("q") if blob is None else array("q", _open(blob)[1])

    def ids_of(self, job: str) -> list[str] | None:
        """The job's run ids in claim order; None for a job the table does not hold."""
        blob = self._held(job)
        return None if blob is None else [run_id_of(t) for t in _open(blob)[1]]

    def count_of(self, job: str) -> int:
        """How many records the job holds."""
        blob = self._jobs.get(job)
        return 0 if blob is None else _count_in(blob)

    def records_of(self, job: str) -> list[RunRecord]:
        """The job's records in claim order."""
        return list(reversed(list(self.newest_of(job))))

    def newest_of(self, job: str, statuses: frozenset[str] | None = None, caused: bool = False) -> Iterator[RunRecord]:
        """The job's records newest first, each unpacked only when asked for; only those whose
        status is one of ``statuses`` (None: any), and with ``caused`` only those naming a cause
        (both told from a packed record's first bytes, without unpacking it)."""
        blob = self._held(job)
        if blob is None:
            return
        n, tokens, lens, raw = _open(blob)
        end = len(blob)
        live = self._live
        for i in range(n - 1, -1, -1):
            size = lens[i]
            if size:
                start = end - size
                if (statuses is None or RUN_STATUSES[raw[start]] in statuses) and (
                        not caused or raw[start + 1] & _CAUSE):
                    yield unpack(job, tokens[i], blob[start:end])
                end = start
            else:
                run = live.get(run_id_of(tokens[i]))
                if run is not None and (statuses is None or run["status"] in statuses) and (
                        not caused or run["cause"] is not None):
                    yield run

    def status_counts(self) -> dict[str, int]:
        return dict(self._statuses)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return dict(self.items()) == other
        if not isinstance(other, RunTable):
            return NotImplemented
        return self.items() == other.items() and [(j, _open(_bytes(b))[1].tolist()) for j, b in self._jobs.items()] == [
            (j, _open(_bytes(b))[1].tolist()) for j, b in other._jobs.items()]

    __hash__ = None  # type: ignore[assignment]

    # ---- changing (the raft thread) --------------------------------------------

    def add_job(self, job: str) -> None:
        """A job the table lists (empty) from its creation, in the order jobs are created."""
        job = sys.intern(job)
        if job not in self._jobs:
            self._jobs[job] = _EMPTY

    def __setitem__(self, rid: str, run: RunRecord) -> None:
        token = run["token"]
        if rid != run_id_of(token) or run["id"] != rid:
            raise ValueError(f"run {rid!r} holds token {token!r}, whose id is {run_id_of(token)!r}")
        # Interned: the token index lists the job of every record, and each claim decodes its
        # own copy of the name (58 bytes a record at 100,000 jobs, a third of what one costs).
        job = sys.intern(run["job"])
        packed = pack(run)
        if packed is None and (old_live := self._live.get(rid)) is not None and old_live["job"] == job \
                and self._index.owner(token) == job:
            # A dict for a dict (a start, a lease renewed): the job's value names the record as
            # kept in ``_live`` already (its token is indexed under the job) and stays as it is.
            self._live[rid] = run
            self._count(old_live["status"], -1)
            self._count(run["status"], 1)
            return
        data = b"" if packed is None else packed
        blob = self._held(job) or _EMPTY
        n, tokens, lens, raw = _open(blob)
        i = n if not n or tokens[n - 1] < token else bisect.bisect_left(tokens, token)
        replaced = i < n and tokens[i] == token
        was: str | None = None
        if replaced:
            start, end = _span(lens, i, len(blob))
            old = None if lens[i] else self._live.get(rid)
            was = RUN_STATUSES[raw[start]] if lens[i] else None if old is None else old["status"]
        if packed is None:
            self._live[rid] = run  # first: the job's value may name it as kept here
        size = len(data).to_bytes(4, _ORDER)
        lens_at = _HEAD + 8 * n
        if replaced:
            if packed is not None or lens[i]:  # a dict for a dict leaves the job's value as it is
                self._set(job, _made(n, (raw[_HEAD:lens_at + 4 * i], size, raw[lens_at + 4 * i + 4:start],
                                         data, raw[end:])))
        else:  # a new record; out of token order is not the ledger's way, but it is kept in order
            self._insert(token, job)
            at = len(blob) if i == n else _data_at(n) + sum(lens[:i])
            self._set(job, _made(n + 1, (raw[_HEAD:_HEAD + 8 * i], token.to_bytes(8, _ORDER, signed=True),
                                         raw[_HEAD + 8 * i:lens_at + 4 * i], size, raw[lens_at + 4 * i:at],
                                         data, raw[at:])))
            self._len += 1
        if packed is not None:
            self._live.pop(rid, None)  # last: the job's value holds it packed now
        if was is not None:
            self._count(was, -1)
        self._count(run["status"], 1)

    def append(self, rid: str, run: RunRecord, drop: list[int]) -> bool:
        """``self[rid] = run`` for a new record above every token its job holds, and the job's
        records ``drop`` (tokens it holds, ascending, each once) removed, in one making of the
        job's value instead of two: a claim that trims its job's history. False, having changed
        nothing, when the record is not of that kind; the caller then does the two steps."""
        token = run["token"]
        if type(token) is not int or rid != run_id_of(token) or run["id"] != rid:
            return False
        job = sys.intern(run["job"])
        blob = self._held(job) or _EMPTY
        n, tokens, lens, raw = _open(blob)
        if (n and tokens[n - 1] >= token) or self._index.owner(token) is not None:
            return False
        at: list[int] = []
        for t in drop:
            i = bisect.bisect_left(tokens, t)
            if i == n or tokens[i] != t or (at and i <= at[-1]):
                return False
            at.append(i)
        packed = pack(run)
        data = b"" if packed is None else packed
        if packed is None:
            self._live[rid] = run  # first: the job's value names it as kept here
        self._insert(token, job)
        keep_tokens, keep_lens, keep_data, dropped = _without(n, tokens, lens, raw, at)
        self._set(job, _made(n + 1 - len(at), (*keep_tokens, token.to_bytes(8, _ORDER, signed=True),
                                                *keep_lens, len(data).to_bytes(4, _ORDER), *keep_data, data)))
        self._len += 1
        self._count(run["status"], 1)
        self._dropped(dropped)
        return True

    def discard(self, rid: str) -> bool:
        """Remove the record ``rid`` if it is held; whether it was."""
        token = token_of_id(rid)
        job = None if token is None else self._index.owner(token)
        return job is not None and token is not None and self.remove(job, [token]) == 1

    def remove(self, job: str, doomed: Iterable[int]) -> int:
        """Remove these records of ``job`` (by token) in one step: the job's value is made again
        once, not once a record (history trimmed by 1,000 runs of a job keeping 10,000).
        Returns how many it held."""
        blob = self._held(job)
        gone = set(doomed)
        if blob is None or not gone:
            return 0
        n, tokens, lens, raw = _open(blob)
        at = sorted(i for t in gone if (i := bisect.bisect_left(tokens, t)) < n and tokens[i] == t)
        if not at:
            return 0
        keep_tokens, keep_lens, keep_data, dropped = _without(n, tokens, lens, raw, at)
        self._set(job, _made(n - len(at), (*keep_tokens, *keep_lens, *keep_data)))
        self._dropped(dropped)
        return len(dropped)

    def drop_job(self, job: str) -> list[str]:
        """Remove the job and all its records; their ids."""
        value = self._jobs.get(job)
        if value is None:
            return []
        blob = _bytes(value)  # read before anything changes: a read that fails leaves the table whole
        del self._jobs[job]
        self._recent.pop(job, None)
        if type(value) is Spilled and self._spiller is not None:
            self._spiller.released(value)
        n, tokens, lens, raw = _open(blob)
        at = _data_at(n)
        dropped: list[tuple[int, str | None]] = []
        for i in range(n):
            dropped.append((tokens[i], RUN_STATUSES[raw[at]] if lens[i] else None))
            at += lens[i]
        self._dropped(dropped)
        return [run_id_of(t) for t, _ in dropped]

    def _dropped(self, dropped: list[tuple[int, str | None]]) -> None:
        """Records gone from their job's value: counted out, out of ``_live`` (those kept as dicts,
        whose status is None here) and out of the index."""
        for token, status in dropped:
            if status is None:
                live = self._live.pop(run_id_of(token), None)
                status = None if live is None else live["status"]
            if status is not None:
                self._count(status, -1)
            self._forget(token)
        self._len -= len(dropped)

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
        """The records as they are now, to read (and unpack) later, in token order: each job's
        value is never changed in place, so the capture holds the values, not copies of them."""
        index = self._index
        owners = list(index.owners)
        tokens = array("q", index.tokens[: len(owners)])
        return Captured(tokens, owners, self._jobs.copy(), self._live.copy())

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
            job, raw, values, crc = _job_item(item, "job, tokens, values and checksum")
            if len(raw) % 8 or len(raw) // 8 != len(values):
                raise ValueError(f"job {job!r} lists {len(raw) // 8} tokens for {len(values)} runs")
            # Every value packed (nearly every job, as a snapshot lists them): joined once, and that
            # join is both the checksum's input and the data of the job's value. A record kept as a
            # dict (msgpack gives no other bytes-like value than ``bytes``) fails the join.
            try:
                data: bytes | None = b"".join(values)
            except TypeError:
                data = None
            if data is None:
                if _crc(job, raw, values) != crc:
                    raise ValueError(f"the runs of job {job!r} fail their checksum")
            elif _crc_packed(job, raw, data) != crc:
                raise ValueError(f"the runs of job {job!r} fail their checksum")
            job = sys.intern(job)
            if not values:
                self.add_job(job)
                continue
            tokens = _unwire("q", raw)
            blob = self._held(job) or _EMPTY
            n = 0 if blob is _EMPTY else int.from_bytes(blob[:_HEAD], _ORDER)
            listed = tokens.tolist()
            # In C where it can be: a loop a record took half of a restore's time.
            if listed[0] <= (_open(blob)[1][n - 1] if n else -1) or sorted(set(listed)) != listed:
                raise ValueError(f"job {job!r} lists its runs out of order")
            self._count_heads(job, [v[:2] if type(v) is bytes else None for v in values])
            lens = array("I", [len(v) if type(v) is bytes else 3 for v in values])
            if min(lens) < 3:
                raise ValueError(f"job {job!r} holds a run packed short")
            if data is not None and not n and sys.byteorder == "little":
                # The tokens as listed are this machine's array already, the lengths are those
                # of the data, and the data is the join: the job's value without a copy between.
                self._jobs[job] = _made(len(values), (raw, lens, data))
                self._len += len(values)
                continue
            if data is None:
                self._load_dicts(job, tokens, values)
            if n:  # a job split over chunks: joined to what the chunks before gave it
                before, kept = _values(blob, self._live)
                tokens, values = array("q", before) + tokens, kept + values
            self._jobs[job] = _layout(tokens, values)
            self._len += len(values) - n

    def _count_heads(self, job: str, heads: list[bytes | None]) -> None:
        """Count the packed records whose two leading bytes are ``heads`` (None: a record kept
        as a dict, counted when it is loaded), each checked for a status and trigger it may hold."""
        distinct = set(heads)
        for head, k in (((distinct.pop(), len(heads)),) if len(distinct) == 1 else Counter(heads).items()):
            if head is None:
                continue
            if len(head) < 2 or head[0] >= len(RUN_STATUSES) or RUN_STATUSES[head[0]] in _UNPACKED \
                    or (head[1] & ~_CAUSE) not in _SECOND:
                raise ValueError(f"job {job!r} holds a run packed with an unknown status or trigger")
            self._count(RUN_STATUSES[head[0]], k)

    def load_values(self, items: Iterable[Any]) -> None:
        """Version 4: each job's records as ``(job, value, whole, crc)`` (``Captured.values``):
        ``value`` the job's value as the table holds it (see ``_open``; count, tokens and
        lengths little-endian), ``whole`` the records it holds no bytes of (kept as dicts) in
        token order, ``crc`` their CRC-32 with the name (``_crc_value``). On a little-endian
        machine the value is kept as it comes: a job costs a handful of steps, not several a
        record. A packed record is checked for its two leading bytes and its length, and
        unpacked when read; ``load_index`` then lists the jobs of the tokens."""
        little = sys.byteorder == "little"
        for item in items:
            job, value, whole, crc = _job_item(item, "job, value, records kept whole and checksum")
            if _crc_value(job, value, whole) != crc:
                raise ValueError(f"the runs of job {job!r} fail their checksum")
            job = sys.intern(job)
            n = int.from_bytes(value[:_HEAD], "little")
            at = _HEAD + 12 * n
            if len(value) < at or (not n and (len(value) != _HEAD or whole)):
                raise ValueError(f"job {job!r} lists {n} runs in a value of {len(value)} bytes")
            if self._jobs.get(job, _EMPTY) is not _EMPTY:
                raise ValueError(f"job {job!r} is listed twice")
            if not n:
                self.add_job(job)
                continue
            if little:  # views of the value itself, no copies
                view = memoryview(value)
                tokens: Any = view[_HEAD:_HEAD + 8 * n].cast("q")
                lens: Any = view[_HEAD + 8 * n:at].cast("I")
            else:
                tokens = _unwire("q", value[_HEAD:_HEAD + 8 * n])
                lens = _unwire("I", value[_HEAD + 8 * n:at])
            listed = tokens.tolist()
            if listed[0] < 0 or sorted(set(listed)) != listed:
                raise ValueError(f"job {job!r} lists its runs out of order")
            if sum(lens) != len(value) - at:
                raise ValueError(f"job {job!r} holds {len(value) - at} bytes of runs where its lengths say {sum(lens)}")
            places = [i for i, size in enumerate(lens) if not size] if 0 in lens else []
            if len(places) != len(whole):
                raise ValueError(f"job {job!r} lists {len(whole)} records kept whole for {len(places)} places")
            starts = accumulate(lens, initial=at)
            self._count_heads(job, [value[o:o + 2] if size else None for o, size in zip(starts, lens, strict=False)])
            if (min(size or 3 for size in lens) if places else min(lens)) < 3:
                raise ValueError(f"job {job!r} holds a run packed short")
            if whole or not little:
                values: list[Any] = [value[o:o + size] if size else None
                                     for o, size in zip(accumulate(lens, initial=at), lens, strict=False)]
                for i, run in zip(places, whole, strict=True):
                    if type(run) is not dict:  # bytes here would be taken as packed, and never checked
                        raise ValueError(f"run {run_id_of(tokens[i])} of job {job!r} is neither packed nor its record")
                    values[i] = run
                self._load_dicts(job, tokens, values)
                self._jobs[job] = _layout(array("q", tokens), values)
            else:
                self._jobs[job] = value
            self._len += n

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
        # Every token a job holds, found in the index under that job: with the index as long as
        # the records and its tokens distinct, each lists the other's. Gathered, then looked up
        # in C (a walk in Python over every record was a fifth of a restore).
        owner_of = dict(zip(tokens, owners, strict=True)).get
        held = array("q")
        expected: list[str] = []
        for job, value in self._jobs.items():
            if value is not _EMPTY:
                blob = _bytes(value)
                n = int.from_bytes(blob[:_HEAD], _ORDER)
                held.frombytes(blob[_HEAD:_HEAD + 8 * n])
                expected += [job] * n
        if list(map(owner_of, held)) != expected:
            job = next(job for job, v in self._jobs.items() if [owner_of(t) for t in _open(_bytes(v))[1]] != [job] * _count_in(v))
            raise ValueError(f"the run index does not list the runs of job {job!r} as the job holds them")


class Captured:
    """A table's records at one instant, to pack later: ``len`` and slices of (id, record) pairs
    in token order (versions 1 and 2), each job's ids (``job_lists``), and version 3's chunks
    (``by_job``, ``index``)."""

    def __init__(self, tokens: array[int], owners: list[str | None], jobs: dict[str, bytes | Spilled],
                 live: dict[str, RunRecord]) -> None:
        # The index as captured, holes (removed records) and all: dropping them is a walk in
        # Python over every record (~0.15 s at 400,000), left to whoever packs (``_held``)
        # rather than done by the capture, on the raft thread.
        self._raw = (tokens, owners)
        self._held_index: tuple[array[int], list[str]] | None = None
        self._jobs = jobs
        self._live = live
        self._pairs: list[tuple[int, str]] | None = None

    def _held(self) -> tuple[array[int], list[str]]:
        if self._held_index is None:
            tokens, owners = self._raw
            if None in owners:
                tokens = array("q", (t for t, j in zip(tokens, owners, strict=True) if j is not None))
                owners = [j for j in owners if j is not None]
            self._held_index = (tokens, cast(list[str], owners))
        return self._held_index

    @property
    def _tokens(self) -> array[int]:
        return self._held()[0]

    @property
    def _owners(self) -> list[str]:
        return self._held()[1]

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
            run = _record(job, _bytes(self._jobs[job]), token, self._live)
            if run is None:
                raise KeyError(run_id_of(token))  # a capture lists only what its jobs hold
            out.append((run_id_of(token), run))
        return out

    def job_lists(self) -> _Lazy:
        jobs = list(self._jobs.items())
        return _Lazy(len(jobs), lambda part: [(job, [run_id_of(t) for t in _open(_bytes(v))[1]]) for job, v in jobs[part]])

    def by_job(self, per_chunk: int) -> Iterator[list[Any]]:
        """Chunks of ``(job, tokens, values)``, every job in table order (none left out: the
        index refers to them by place), about ``per_chunk`` records a chunk, a job with none
        counting as one; a job with more is split over chunks. (Jobs without runs once all
        went in one chunk: 100,000 of them, 2.1 MB packed in one call that held the GIL for
        32 ms, and longer on a busy machine, while the API waited.)"""
        chunk: list[Any] = []
        held = 0
        for job, value in self._jobs.items():
            blob = _bytes(value)
            tokens, values = _values(blob, self._live) if blob is not _EMPTY else (memoryview(b"").cast("q"), [])
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

    def values(self, per_chunk: int) -> Iterator[list[Any]]:
        """Version 4's chunks of ``(job, value, whole, crc)`` (``RunTable.load_values``), every job
        in table order, whole, about ``per_chunk`` records a chunk (a job with none counting as
        one): each job's value goes as it is held, one ``bytes`` to pack, where version 3 made
        and packed each record's bytes apart."""
        chunk: list[Any] = []
        held = 0
        kept_whole = {run["job"] for run in self._live.values()}  # the jobs whose values hold a record by id
        for job, kept in self._jobs.items():
            blob = _bytes(kept)  # read back here, on the packing thread, when kept out of memory
            n = int.from_bytes(blob[:_HEAD], _ORDER)
            whole: list[Any] = []
            if n and job in kept_whole:
                _, tokens, lens, _ = _open(blob)
                if 0 in lens:
                    for i in range(n):
                        if not lens[i]:
                            run = self._live.get(run_id_of(tokens[i]))
                            if run is None:
                                raise KeyError(run_id_of(tokens[i]))  # a capture holds what its jobs name
                            whole.append(run)
            value = _value_wire(blob)
            chunk.append((job, value, whole, _crc_value(job, value, whole)))
            held += max(n, 1)
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

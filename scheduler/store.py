"""The replicated records themselves, apart from the transitions that change them.

``State`` (``scheduler.state``) is this plus ``apply``, snapshots and restore; the
ledger and the alert rules (``scheduler.ledger``, ``scheduler.alerts``) work on a
``Store``, so neither needs the state machine that calls them (no import circle).
Every record is replaced, never mutated in place, once stored.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import msgpack

from .duration import parse_duration
from .model import Job, Policy, parse_job, stored_policy
from .runs import RunRecord
from .runtable import JobRuns, RunTable

__all__ = ["JOB_FIELDS", "Notes", "Store"]

NOTES_KEPT = 200  # explain notes kept per job
JOB_FIELDS = frozenset(("spec", "version", "created_us", "updated_us", "last_slot_us", "consecutive_failures",
                        "missed_total"))
"""The fields every job record holds, in every snapshot version: what its readers index."""


_K = TypeVar("_K")
_V = TypeVar("_V")


def copied(d: dict[_K, _V]) -> dict[_K, _V]:
    """``d`` copied in one step, to iterate on the event loop while the raft thread applies.

    ``list(d.items())`` is not one step: each pair it makes is an allocation that can start a
    garbage collection, whose callbacks (``raftlog.heap``) are Python code, during which the
    raft thread may take the GIL and change ``d``: "dictionary changed size during iteration"
    (seen: a new leader's first scan of 100,000 jobs, while batches of them applied). A dict's
    copy allocates nothing per entry and runs no Python code."""
    return d.copy()


def _current(cache: dict[str, tuple[dict[str, Any], _V]], name: str, spec: dict[str, Any]) -> _V | None:
    """What ``cache`` derived from ``name``'s document ``spec``; None when it holds nothing, or
    what it derived from a document that is no longer the one stored."""
    hit = cache.get(name)
    return hit[1] if hit is not None and hit[0] is spec else None


_pack = msgpack.Packer(use_bin_type=True).pack
"""As ``raftlog.codec.pack`` packs, so a snapshot holds the same bytes. Used on the raft thread
alone (a note applied, a snapshot restored)."""


def array_header(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items, as ``pack`` writes it."""
    return bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


def _count(value: bytes) -> tuple[int, int]:
    """A packed array's item count, and where its items begin."""
    first = value[0]
    if first & 0xF0 == 0x90:
        return first & 0x0F, 1
    if first == 0xDC:
        return int.from_bytes(value[1:3], "big"), 3
    return int.from_bytes(value[1:5], "big"), 5


def _unpacked(value: bytes) -> tuple[dict[str, Any], ...]:
    return tuple(msgpack.unpackb(value, raw=False, strict_map_key=False))


class Notes:
    """``Store.notes``: job -> its explain notes (summaries, pauses, edits), oldest first, as a
    mapping whose values are tuples of note dicts.

    Each job's notes are kept as one value, the msgpack array a snapshot holds for them, and
    unpacked when read. As dicts, a pause note cost ~320 bytes of memory in-process (its dict,
    its instant and its reason), packed ~70; a job keeps up to ``NOTES_KEPT``, so a job paused
    and resumed every day for a hundred days, or summarising missed slots of an overloaded
    cluster, held ~60 KB as dicts (6 GB at 100,000 jobs), ~14 KB packed. A job's value is
    replaced at each note, never changed in place: a snapshot's capture holds it without a copy
    (``packed``), and a reader on another thread sees a job's notes whole."""

    __slots__ = ("_packed",)

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}

    def get(self, job: str, default: Any = None) -> Any:
        value = self._packed.get(job)
        return default if value is None else _unpacked(value)

    def __getitem__(self, job: str) -> tuple[dict[str, Any], ...]:
        return _unpacked(self._packed[job])

    def __contains__(self, job: object) -> bool:
        return job in self._packed

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._packed))

    def __len__(self) -> int:
        return len(self._packed)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Notes):
            return self._packed == other._packed
        if isinstance(other, dict):
            return {job: self[job] for job in self} == {job: tuple(v) for job, v in other.items()}
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def add(self, job: str, note: dict[str, Any]) -> None:
        old = self._packed.get(job)
        n, at = (0, 0) if old is None else _count(old)
        items = (b"" if old is None else old[at:]) + _pack(note)
        n += 1
        if n > NOTES_KEPT:  # the oldest go: found by skipping them, none unpacked
            reader = msgpack.Unpacker(raw=False, strict_map_key=False)
            reader.feed(items)
            for _ in range(n - NOTES_KEPT):
                reader.skip()
            items, n = items[reader.tell():], NOTES_KEPT
        self._packed[job] = array_header(n) + items

    def pop(self, job: str, default: Any = None) -> Any:
        value = self._packed.pop(job, None)
        return default if value is None else _unpacked(value)

    def packed(self) -> dict[str, bytes]:
        """Job -> its notes as packed, copied in one step (as ``copied`` copies): what a snapshot captures."""
        return self._packed.copy()

    def load(self, items: Iterable[tuple[str, Any]]) -> None:
        """A snapshot's notes (job, list of note maps), as every version wrote them."""
        for job, notes in items:
            if type(job) is not str or type(notes) is not list or any(type(n) is not dict for n in notes):
                raise ValueError(f"the notes of job {job!r} are not a list of maps")
            self._packed[job] = _pack(notes)


class Store:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.runs = RunTable()  # run id -> record; per job, packed once over (scheduler.runtable)
        self.active: dict[str, None] = {}  # claimed, running, retrying, lost awaiting a retry
        self.dead: dict[str, None] = {}
        self.pending_deps: dict[str, dict[str, Any]] = {}
        self.notes = Notes()  # per job: explain notes (summaries, pauses, edits), oldest first
        self.alerts: dict[str, dict[str, Any]] = {}
        self.alert_seq = 0
        self.clocks: dict[str, dict[str, Any]] = {}  # node id -> its clock as the leader last judged it (NodeClock)
        self.applied_index = 0
        self.last_noop: dict[str, Any] = {}
        # Derived from jobs[*]["spec"], never snapshotted: (the document parsed, what it gave).
        self._parsed: dict[str, tuple[dict[str, Any], Job]] = {}
        self._policies: dict[str, tuple[dict[str, Any], Policy]] = {}  # for jobs not parsed whole (``policy``)
        self._dependents: dict[str, list[str]] | None = None  # upstream -> dependents, derived likewise
        self._aged: dict[str, int] | None = None  # job -> history.max_age in us, for jobs that set it; likewise
        # Derived likewise, exact for an empty store and kept in step from the first job;
        # ``reindex`` builds them for records filled in whole (a restore).
        self._names: list[str] = []  # every job name, sorted
        self._failing: dict[str, None] = {}  # jobs whose consecutive_failures > 0
        self._paused: dict[str, None] = {}  # jobs whose document says paused
        self.history_sweep_us = 0  # the instant from which the next applied entry sweeps aged history

    @property
    def job_runs(self) -> JobRuns:
        """Job -> its run ids in claim order (read from ``runs``, which keeps them)."""
        return JobRuns(self.runs)

    def job(self, name: str) -> Job | None:
        """The parsed job. Parsing is pure, so the cache is the same on every replica; an entry
        stands only for the document it was parsed from (by identity): the event loop may parse
        a job while the raft thread stores a new document for it, and its late write into the
        cache must not stand for the new one (the old rule, a write the ledger would then read,
        could make one replica trim or retry by a document the others had replaced)."""
        spec = self._spec(name)
        if spec is None:
            return None
        parsed = _current(self._parsed, name, spec)
        if parsed is None:
            parsed = parse_job(spec)
            self._parsed[name] = (spec, parsed)
            self._policies.pop(name, None)
        return parsed

    def policy(self, name: str) -> Policy | None:
        """What the run ledger reads of a job (``model.Policy``): the parsed job's when it is
        cached, else read from its stored document without parsing it whole; the same either way,
        and, as ``job``, only ever from the document stored now."""
        spec = self._spec(name)
        if spec is None:
            return None
        parsed = _current(self._parsed, name, spec)
        if parsed is not None:
            return parsed.policy
        policy = _current(self._policies, name, spec)
        if policy is None:
            policy = stored_policy(spec)
            self._policies[name] = (spec, policy)
        return policy

    def _spec(self, name: str) -> dict[str, Any] | None:
        rec = self.jobs.get(name)
        return None if rec is None else rec["spec"]

    def spec_changed(self, name: str, job: Job | None = None) -> None:
        """A job's document was stored anew (``job``: parsed, as it was validated) or removed:
        what was derived from the one before is dropped."""
        self._policies.pop(name, None)
        rec = self.jobs.get(name)
        if job is None or rec is None:
            self._parsed.pop(name, None)
        else:
            self._parsed[name] = (rec["spec"], job)
        if rec is not None and rec["spec"].get("paused"):
            self._paused[name] = None
        else:
            self._paused.pop(name, None)

    def active_runs(self) -> list[RunRecord]:
        """The records of the attempts in flight (claimed, running, or waiting for a retry)."""
        return [r for rid in list(self.active) if (r := self.runs.get(rid)) is not None]

    def dependents_of(self, upstream: str) -> list[str]:
        """Jobs whose ``depends_on`` names ``upstream``, in job order (the same on every replica)."""
        if self._dependents is None:
            # From the stored documents, not parsed jobs: after a restore, parsing 100,000 jobs
            # at the first finished run held the apply of that entry for 6 s.
            index: dict[str, list[str]] = {}
            for name, rec in list(self.jobs.items()):
                dep = rec["spec"].get("depends_on")
                if isinstance(dep, dict) and isinstance(dep.get("job"), str):
                    index.setdefault(dep["job"], []).append(name)
            self._dependents = index
        return self._dependents.get(upstream, [])

    def aged_jobs(self) -> dict[str, int]:
        """Jobs whose ``history.max_age`` is set, with it in microseconds: built once from every
        job (after a restore), then kept in step by ``job_stored`` and ``job_deleted``."""
        if self._aged is None:
            # Read from the stored documents, not parsed jobs: parsing 100,000 jobs to find the
            # few with a max age held the first entry applied after a restore for 7 s.
            aged: dict[str, int] = {}
            for name, rec in list(self.jobs.items()):
                history = rec["spec"].get("history")
                if isinstance(history, dict) and history.get("max_age") is not None:
                    aged[name] = int(parse_duration(history["max_age"]) * 1_000_000)
            self._aged = aged
        return self._aged

    def reindex(self) -> None:
        """Check that every record holds ``JOB_FIELDS`` (a ``ValueError`` names the first that does
        not), and build the name, failing and paused indexes from the records, filled in whole (a restore): at
        restore, not at the first request that reads them (sorting 100,000 names took ~30 ms of
        the first job list after a restart)."""
        self._names = sorted(self.jobs)
        failing: dict[str, None] = {}
        paused: dict[str, None] = {}
        for name, rec in self.jobs.items():  # one pass: ~40 ms at 100,000 restored jobs (the indexes alone ~15)
            try:
                if type(name) is not str:
                    raise TypeError("its name is not a string")
                spec, failures, _, _, _, _, _ = (rec["spec"], rec["consecutive_failures"], rec["version"],
                                                 rec["created_us"], rec["updated_us"], rec["last_slot_us"],
                                                 rec["missed_total"])  # JOB_FIELDS, each there
                if spec.get("paused"):
                    paused[name] = None
            except (KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"the record of job {name!r} is malformed ({type(exc).__name__}: {exc})") from exc
            if failures:
                failing[name] = None
        self._failing, self._paused = failing, paused

    def job_names(self) -> list[str]:
        """Every job name in sorted order, kept in step by ``job_stored`` and ``job_deleted``
        (an insertion costs a memmove, not a sort). Readers on another thread take slices or
        bisect it: each is one step under the GIL."""
        return self._names

    def job_stored(self, job: Job, had_dependency: bool = True) -> None:
        """Keep what is derived from the job documents in step with one stored job
        (``had_dependency``: its previous document, if any, had a ``depends_on``)."""
        if had_dependency or job.depends_on is not None:
            self._dependents = None
        names = self._names
        i = bisect.bisect_left(names, job.name)
        if i == len(names) or names[i] != job.name:
            names.insert(i, job.name)
        if self._aged is not None:
            if job.history.max_age is not None:
                self._aged[job.name] = int(job.history.max_age * 1_000_000)
            else:
                self._aged.pop(job.name, None)

    def failing_jobs(self) -> dict[str, None]:
        """Jobs whose last slot failed (``consecutive_failures`` above 0), in no set order, kept
        in step by ``put_record`` and ``job_deleted``. Counting them walked every job on each
        first page of the job list (9 ms at 100,000 jobs, ~90 at 1,000,000); readers on another
        thread copy it."""
        return self._failing

    def paused_jobs(self) -> dict[str, None]:
        """Jobs whose document says ``paused``, in no set order, kept in step by ``spec_changed``
        (every stored, paused, resumed or deleted document passes there) and built by ``reindex``.
        A scrape of ``/metrics`` counted them over every job: ~20 ms of the event loop at 100,000
        jobs in-process, 0.3 s in an agent while run records filled. Readers on another thread
        take its length or copy it."""
        return self._paused

    def put_record(self, name: str, rec: dict[str, Any]) -> None:
        """Store a job's record that may change ``consecutive_failures`` (the ledger's writes)."""
        self.jobs[name] = rec
        if rec["consecutive_failures"]:
            self._failing[name] = None
        else:
            self._failing.pop(name, None)

    def job_deleted(self, name: str) -> None:
        self._dependents = None
        self._failing.pop(name, None)
        self._paused.pop(name, None)
        names = self._names
        i = bisect.bisect_left(names, name)
        if i < len(names) and names[i] == name:
            del names[i]
        if self._aged is not None:
            self._aged.pop(name, None)

    def note(self, job: str, entry: dict[str, Any]) -> None:
        self.notes.add(job, entry)

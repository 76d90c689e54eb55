"""A recording read a piece at a time: bounded memory for recordings of any length (docs/scale.md).

``scan`` reads every chunk once but keeps only what is small (metadata, snapshots, guest bundles, the end chunk)
and where each sample and sched table chunk lies; ``pieces`` then decodes those chunks a group at a time into
pieces of the host clock that follow each other: every record of a piece is before every record of the next,
so a piece can be analysed on its own with the switches before it (analyse/stream.py).

Only an intact recording of samples and sched events is read this way: ``scan`` returns None for a damaged or
cut one (load reports what is wrong) and for one with records that need all of the recording at once (LBR),
and the caller loads it whole.  Call stacks (`record -g`) are read so only when asked for (``scan(stacks=True)``):
their records are cut into the pieces by time as the samples they belong to, and the stack-map chains are kept.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import arrays, bounded_json
from vmprof_tui.record import recording as fmt
from vmprof_tui.record.bpf_records import SAMPLE_DTYPE, SCHED_DTYPE, STACK_DTYPE, ustack_dtype

DTYPES = {fmt.SAMPLES: SAMPLE_DTYPE, fmt.SCHED: SCHED_DTYPE}


@dataclass
class TableChunk:
    kind: int  # fmt.SAMPLES, fmt.SCHED, or (scan(stacks=True)) fmt.STACKS or fmt.USTACKS
    offset: int  # of its payload in the file
    length: int
    rows: int


@dataclass
class Scanned:
    """A recording without its tables (rec.samples and rec.sched are empty; rec.stacks empty, not None, when it
    has call stacks), and where its tables are."""
    rec: fmt.Recording
    chunks: list[TableChunk]
    dtypes: dict[int, np.dtype] = field(default_factory=lambda: dict(DTYPES))  # of the table chunks, by kind

    @property
    def samples(self) -> int:
        return sum(c.rows for c in self.chunks if c.kind == fmt.SAMPLES)


def sample_rows(path: Path) -> int:
    """How many samples the sample chunks of a recording state, from the chunk headers alone (a quick look before
    scan: a small recording is loaded whole); 0 for what is not a readable recording."""
    rows = 0
    try:
        with open(path, "rb") as f:
            if f.read(len(fmt.MAGIC) + 2) != fmt.MAGIC + struct.pack("<H", fmt.VERSION):
                return 0
            while len(header := f.read(fmt.CHUNK_HEADER.size)) == fmt.CHUNK_HEADER.size:
                magic, kind, _res, length, _crc = fmt.CHUNK_HEADER.unpack(header)
                if magic != fmt.CHUNK_MAGIC:
                    return rows
                if kind == fmt.SAMPLES:
                    (hlen,) = struct.unpack("<I", f.read(4))
                    found = ROWS.search(f.read(min(hlen, 64)))
                    rows += int(found.group(1)) if found else 0
                    f.seek(length - 4 - min(hlen, 64), os.SEEK_CUR)
                else:
                    f.seek(length, os.SEEK_CUR)
    except (OSError, struct.error):
        return rows
    return rows


ROWS = re.compile(rb'^\{"rows": (\d{1,12})[,}]')  # pack_rows' header begins so


def scan(path: Path, stacks: bool = False) -> Scanned | None:
    """The recording at `path` without its tables; None when it cannot be read a piece at a time (see above).
    stacks: a recording with call stacks is read too (else None)."""
    rec = fmt.Recording(Path(path), {}, np.empty(0, SAMPLE_DTYPE), np.empty(0, SCHED_DTYPE))
    chunks: list[TableChunk] = []
    dtypes = dict(DTYPES)
    if stacks:
        dtypes[fmt.STACKS] = STACK_DTYPE
    bundles: dict[str, tuple[int, int]] = {}
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, on every path)
    except OSError:
        return None
    with f:
        if f.read(len(fmt.MAGIC) + 2) != fmt.MAGIC + struct.pack("<H", fmt.VERSION):
            return None
        pos = len(fmt.MAGIC) + 2
        while header := f.read(fmt.CHUNK_HEADER.size):
            if len(header) < fmt.CHUNK_HEADER.size:
                return None
            magic, kind, _res, length, crc = fmt.CHUNK_HEADER.unpack(header)
            if magic != fmt.CHUNK_MAGIC or length > fmt.MAX_CHUNK:
                return None
            payload = f.read(length)
            if len(payload) != length or zlib.crc32(payload) != crc:
                return None
            pos += fmt.CHUNK_HEADER.size
            try:
                if kind in dtypes:
                    chunks.append(TableChunk(kind, pos, length, fmt._table_rows(payload, dtypes[kind])))
                elif kind == fmt.META:
                    rec.meta = fmt._meta(bounded_json.loads(payload, "the metadata chunk"))
                    copy = rec.meta.get("stack_copy_bytes")  # the size of a user-stack copy (as load reads it)
                    if stacks and isinstance(copy, int) and 0 < copy <= fmt.MAX_STACK_COPY:
                        dtypes[fmt.USTACKS] = ustack_dtype(copy)
                elif kind == fmt.HOST_STACKS and stacks:  # stack-map chains: one per distinct chain, kept
                    rec.host_stacks.update(fmt._decode_host_stacks(payload))
                elif kind == fmt.SNAPSHOT:
                    text = zlib.decompressobj().decompress(payload, fmt.MAX_INFLATED)
                    rec.snapshot.update(fmt._snapshot(bounded_json.loads(text, "a snapshot chunk")))
                elif kind == fmt.BUNDLE:  # read when the resolver loads it (20 guests: 140 MB held otherwise)
                    (n,) = struct.unpack_from("<H", payload)
                    bundles[payload[2:2 + n].decode(errors="replace")] = (pos + 2 + n, length - 2 - n)
                elif kind == fmt.END:
                    rec.end = fmt._end(bounded_json.loads(payload, "the end chunk"))
                else:  # LBR (and call stacks unless asked for): joined to the samples of the whole recording
                    return None
            except (ValueError, KeyError, TypeError, struct.error, zlib.error, fmt.RecordingError):
                return None
            pos += length
    has_stacks = any(c.kind == fmt.STACKS for c in chunks) or bool(rec.meta.get("stacks"))
    if not rec.meta or rec.end is None or (has_stacks and not stacks):
        return None
    if has_stacks:
        rec.stacks = np.empty(0, STACK_DTYPE)
    rec.bundles = StoredBundles(rec.path, bundles)  # type: ignore[assignment]
    fmt._load_static(rec)
    return Scanned(rec, chunks, dtypes)


class WholeNeeded(Exception):
    """The recording has what a piece at a time cannot report as the whole recording does: load it whole."""


class StoredBundles(MutableMapping[str, bytes]):
    """A recording's guest bundles by VM name, each read from the file when asked for (those set, a window's of
    `vmprof agent` from its spool, are held)."""

    def __init__(self, path: Path, where: dict[str, tuple[int, int]]) -> None:
        self.path, self.where = path, where
        self.held: dict[str, bytes] = {}

    def __getitem__(self, vm: str) -> bytes:
        if vm in self.held:
            return self.held[vm]
        offset, length = self.where[vm]
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def __setitem__(self, vm: str, data: bytes) -> None:
        self.held[vm] = data
        self.where.setdefault(vm, (0, 0))

    def __delitem__(self, vm: str) -> None:
        self.held.pop(vm, None)
        del self.where[vm]

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


@dataclass
class Piece:
    """The records of [lo, hi) of the host clock (the last piece: [lo, hi]), each table in time order."""
    lo: int
    hi: int
    samples: np.ndarray
    sched: np.ndarray
    following: np.ndarray  # the sched events after it (those of the next piece, in time order)
    stacks: dict[int, np.ndarray] = field(default_factory=dict)  # scan(stacks=True): fmt.STACKS, fmt.USTACKS


def _read_tables(fd: int, group: list[TableChunk], dtypes: dict[int, np.dtype]) -> dict[int, np.ndarray]:
    pending = [(c.kind, 0, memoryview(os.pread(fd, c.length, c.offset)), c.rows) for c in group]
    problems: list[str] = []
    tables = fmt._decode_tables(pending, problems, dtypes)
    if problems:  # checksums that hold over rows that do not (or the file changed since scan): the whole read
        raise WholeNeeded(problems[0])  # skips those chunks with a note each
    return {kind: tables.get(kind, np.empty(0, dtype)) for kind, dtype in dtypes.items()}


def sample_tables(scanned: Scanned, rows: int) -> Iterator[np.ndarray]:
    """The recording's samples a group of about `rows` at a time, in file order (not cut into pieces)."""
    fd = os.open(scanned.rec.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for group in _groups([c for c in scanned.chunks if c.kind == fmt.SAMPLES], rows):
            yield _read_tables(fd, group, {fmt.SAMPLES: scanned.dtypes[fmt.SAMPLES]})[fmt.SAMPLES]
    finally:
        os.close(fd)


def read_sched(scanned: Scanned) -> np.ndarray:
    """Every sched event of the recording, in prepare's order (the chrome trace's timelines: SchedReader reads
    them a chunk at a time)."""
    fd = os.open(scanned.rec.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        kind = {fmt.SCHED: scanned.dtypes[fmt.SCHED]}
        sched = _read_tables(fd, [c for c in scanned.chunks if c.kind == fmt.SCHED], kind)[fmt.SCHED]
    finally:
        os.close(fd)
    return _ordered_sched(sched)


def _ordered(samples: np.ndarray) -> np.ndarray:
    t = samples["time_ns"]
    return samples if np.all(t[1:] >= t[:-1]) else samples[arrays.stable_argsort(t)]


def _ordered_sched(sched: np.ndarray) -> np.ndarray:
    """As prepare orders them (ties by the other fields: sched events of many CPUs share times)."""
    t = sched["time_ns"]
    return sched if np.all(t[1:] > t[:-1]) else sort_sched(sched)


def sort_sched(sched: np.ndarray) -> np.ndarray:
    """np.sort(sched, order="time_ns", kind="stable"): by time, ties by the other fields in turn.  Where the time
    and the two threads (prev, next) tell every record apart, by three packed stable sorts of integers instead of
    numpy's comparison of records field by field (the synthetic 64-CPU host switches all its CPUs at the same
    nanosecond: 97% of its events tie on time)."""
    if len(sched) < 2 or max(int(sched[f].max()) for f in ("prev_tid", "next_tid")) >= 1 << 22:
        return np.sort(sched, order="time_ns", kind="stable")
    keys = [sched["time_ns"], arrays.thread_keys(sched["prev_pid"], sched["prev_tid"]),
            arrays.thread_keys(sched["next_pid"], sched["next_tid"])]  # (pid, tid) in 44 bits, in their order
    order = np.arange(len(sched))
    for k in reversed(keys):  # the least significant first: each sort keeps the order of the ones before
        order = order[arrays.stable_argsort(k[order])]
    same = np.ones(len(sched) - 1, bool)
    for k in keys:
        ordered = k[order]
        same &= ordered[1:] == ordered[:-1]
    if same.any():  # two records that only later fields tell apart
        return np.sort(sched, order="time_ns", kind="stable")
    return sched[order]


def _read_ahead(fd: int, group: list[TableChunk], dtypes: dict[int, np.dtype]
                ) -> tuple[dict[int, np.ndarray], int | None]:
    """_read_tables of a group with each table in time order (sched events in prepare's order), and the time of its
    first record: made in the read-ahead thread, where numpy lets the main thread analyse meanwhile."""
    tables = _read_tables(fd, group, dtypes)
    tables = {kind: _ordered_sched(t) if kind == fmt.SCHED else _ordered(t) for kind, t in tables.items()}
    return tables, _first(*tables.values())


def _first(*tables: np.ndarray) -> int | None:
    times = [int(t["time_ns"].min()) for t in tables if len(t)]
    return min(times) if times else None


def _groups(chunks: list[TableChunk], rows: int) -> list[list[TableChunk]]:
    """The chunks in groups of about `rows` samples, in file order."""
    groups: list[list[TableChunk]] = [[]]
    count = 0
    for c in chunks:
        if count >= rows and c.kind == fmt.SAMPLES:
            groups.append([])
            count = 0
        groups[-1].append(c)
        count += c.rows if c.kind == fmt.SAMPLES else 0
    return groups


def pieces(scanned: Scanned, rows: int, end_of: Callable[[int, int], int],
           sched: bool = True) -> Iterator[Piece]:
    """The recording's records in pieces of about `rows` samples, in time order: a piece ends where the next one's
    first record is (records of a piece that are later go on to the next).  end_of(first, last): where the last
    piece ends, given the times of the first and the last record (prepare.recording_end).  sched: False for pieces
    of samples only (their sched events are neither inflated nor carried; the pieces end at samples).  Call-stack
    records (Piece.stacks) are cut as the samples are: a stack record has its sample's CPU and time.
    WholeNeeded: a group has records of a piece given already (written more than a piece late)."""
    groups = _groups([c for c in scanned.chunks if sched or c.kind == fmt.SAMPLES], rows)
    dtypes = scanned.dtypes
    extra = [k for k in dtypes if k not in (fmt.SAMPLES, fmt.SCHED)]  # cut by time as the samples
    fd = os.open(scanned.rec.path, os.O_RDONLY | os.O_CLOEXEC)
    # the next group is read and inflated (zlib lets other threads run) while the piece before it is analysed
    with ThreadPoolExecutor(1) as reader:
        try:
            ahead = [reader.submit(_read_ahead, fd, g, dtypes) for g in groups[:2]]
            tables, _cut = ahead.pop(0).result()  # sched events kept in order: the next group's are merged in
            ordered = set(tables)  # the tables in time order as they are (a group's, as read ahead)
            # where the recording starts and ends is of its samples and sched events (prepare's, read whole)
            lo = first = _first(tables[fmt.SAMPLES], tables[fmt.SCHED])
            given = False  # a piece yet
            for k in range(1, len(groups)):
                nxt, cut = ahead.pop(0).result()
                if k + 1 < len(groups):
                    ahead.append(reader.submit(_read_ahead, fd, groups[k + 1], dtypes))
                if lo is None or cut is None or cut <= lo:  # nothing, or out of order past a whole piece: read on
                    if given and cut is not None and cut < lo:
                        # of a piece given already (a late ring-buffer drain): the whole read sorts them in, and
                        # counts --time-range from the earliest
                        raise WholeNeeded("records written more than a piece after their time")
                    tables = {kind: np.concatenate([t, nxt[kind]]) for kind, t in tables.items()}
                    tables[fmt.SCHED] = _ordered_sched(tables[fmt.SCHED])
                    ordered = {fmt.SCHED}
                    if not given:  # the first piece starts at the earliest record read so far
                        lo = first = _first(tables[fmt.SAMPLES], tables[fmt.SCHED])
                    continue
                piece: dict[int, np.ndarray] = {}
                for kind, t in tables.items():
                    t = t if kind in ordered else _ordered(t)
                    a = int(np.searchsorted(t["time_ns"], np.uint64(cut)))
                    piece[kind] = t[:a]
                    # what is left of this group is usually nothing: then no copy of the next group
                    tables[kind] = np.concatenate([t[a:], nxt[kind]]) if a < len(t) else nxt[kind]
                ordered = {kind for kind, t in tables.items() if t is nxt[kind]}
                if fmt.SCHED not in ordered:
                    tables[fmt.SCHED] = _ordered_sched(tables[fmt.SCHED])
                    ordered.add(fmt.SCHED)
                yield Piece(lo, cut, piece[fmt.SAMPLES], piece[fmt.SCHED], tables[fmt.SCHED],
                            {kind: piece[kind] for kind in extra})
                lo, given = cut, True
            if lo is None:  # no records
                return
            last = max(int(t["time_ns"].max()) for t in (tables[fmt.SAMPLES], tables[fmt.SCHED]) if len(t))
            rest = tables[fmt.SCHED]
            yield Piece(lo, end_of(first, last), _ordered(tables[fmt.SAMPLES]), rest, rest[:0],
                        {kind: _ordered(tables[kind]) for kind in extra})
        finally:
            for job in ahead:
                job.cancel()
            reader.shutdown(wait=True)
            os.close(fd)


class SchedReader:
    """A recording's sched events a stretch of time at a time, a chunk read at a time (beside pieces of samples
    only: `vmprof steal`, analyse/stream_steal.py): ``until(t)`` gives those before t not given yet, in prepare's
    order.  Chunks are read until one begins at or after t (kept for later), as pieces cuts them."""

    def __init__(self, scanned: Scanned) -> None:
        self.path = scanned.rec.path
        self.chunks = [c for c in scanned.chunks if c.kind == fmt.SCHED]
        self.read = 0
        self.held = np.empty(0, SCHED_DTYPE)
        self.ahead: np.ndarray | None = None  # the chunk read last, which begins at or after the last t asked
        self.first: int | None = None  # the time of the first event, and of the last given
        self.last: int | None = None

    def _chunk(self) -> np.ndarray | None:
        if self.read >= len(self.chunks):
            return None
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            table = _read_tables(fd, [self.chunks[self.read]], {fmt.SCHED: SCHED_DTYPE})[fmt.SCHED]
        finally:
            os.close(fd)
        self.read += 1
        if len(table):
            t = int(table["time_ns"].min())
            self.first = t if self.first is None else min(self.first, t)
        return table

    def done(self) -> bool:
        """Every event given: none held, no chunk left to read."""
        return not len(self.held) and self.ahead is None and self.read >= len(self.chunks)

    def next_time(self) -> int | None:
        """The time of the first event not given yet, among those held and the chunk read ahead (a chunk is read
        if none is); None when every event is given."""
        while self.ahead is None or not len(self.ahead):
            if self.ahead is not None:  # an empty chunk: nothing to keep
                self.ahead = None
            if self.read >= len(self.chunks):
                break
            self.ahead = self._chunk()
        times = [int(t["time_ns"].min()) for t in (self.held, self.ahead) if t is not None and len(t)]
        return min(times) if times else None

    def until(self, t: int | None) -> np.ndarray:
        """The events before t (None: all that are left), in prepare's order."""
        while True:
            if self.ahead is None:
                self.ahead = self._chunk()
                if self.ahead is None:
                    break
            if t is not None and len(self.ahead) and int(self.ahead["time_ns"].min()) >= t:
                break
            self.held = np.concatenate([self.held, self.ahead]) if len(self.held) else self.ahead
            self.ahead = None
        if t is None:
            out, self.held = self.held, self.held[:0]
        else:
            before = self.held["time_ns"] < np.uint64(t)
            out, self.held = self.held[before], self.held[~before]
        if len(out):
            last = int(out["time_ns"].max())
            self.last = last if self.last is None else max(self.last, last)
        return _ordered_sched(out)

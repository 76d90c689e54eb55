"""The recording format (docs/recording.md): a header, then checksummed chunks.

Written by hand because no library offers what a profiler recording needs all
at once: appending while collection goes on, surviving SIGKILL with
everything flushed so far, and loading without pickle.  Each chunk is
self-describing and checksummed, so a reader keeps every complete chunk of a
cut-off file and says what was cut.

Sample and sched tables are stored column by column (numpy arrays of the
dtypes in vmprof_tui.record.bpf_records), times delta-encoded, compressed with zlib.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import struct
import tarfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import arrays, bounded_json
from vmprof_tui.record.bpf_records import OLDER_DTYPES, SAMPLE_DTYPE, SCHED_DTYPE, STACK_DTYPE, ustack_dtype
from vmprof_tui.record.rows import (  # noqa: F401 (the format's names, read through this module)
    MAX_INFLATED,
    ZSTD_RATIO,
    RecordingError,
    check_size,
    load_zstd,
    pack_rows,
    row_header,
    stated_count,
    unpack_rows,
)

MAGIC = b"VMPROFREC\0"
VERSION = 1
CHUNK_MAGIC = b"CHNK"
CHUNK_HEADER = struct.Struct("<4sHHII")  # magic, kind, reserved, payload length, crc32
MAX_CHUNK = 256 << 20
MAX_OBJECT_TABLE = 128 << 20  # one host object's symbol table in a spool, inflated (4M symbols fit)
MAX_OBJECT_TABLES = 4096  # tables one window references

META, SAMPLES, SCHED, SNAPSHOT, BUNDLE, END, LBR, STACKS, HOST_STACKS, USTACKS = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
KIND_NAMES = {META: "meta", SAMPLES: "samples", SCHED: "sched", SNAPSHOT: "snapshot", BUNDLE: "bundle", END: "end",
              LBR: "lbr", STACKS: "stacks", HOST_STACKS: "host stacks", USTACKS: "user stack copies"}
MAX_STACK_COPY = 1 << 16  # bytes of one user-stack copy a recording may hold
TABLE_DTYPES = {SAMPLES: SAMPLE_DTYPE, SCHED: SCHED_DTYPE, STACKS: STACK_DTYPE}
MAX_HOST_STACK_DEPTH = 127  # the kernel's PERF_MAX_STACK_DEPTH
MAX_FREQUENCY = 1_000_000  # samples per second per CPU a recording may state (perf's limit is far below)


# -- snapshot keys: made and read through this module only ----------------------------------------
# A snapshot chunk is a JSON object merged into Recording.snapshot (docs/recording.md).  Writers build
# it with snapshot(); readers use Recording.processes(), .vms() and .kallsyms().

VMS_KEY = "vms"  # discovered VMs (also a key of the end chunk: the VMs as they were at the end)
KALLSYMS_KEY = "kallsyms"  # the host's /proc/kallsyms text
_PROCESS_PREFIX = "process:"  # process:PID, a host process as first sampled
OBJECTS_REF_KEY = "object_refs"  # vmprof agent: build id -> the symbol table of that host object in the spool


def object_ref(build_id: str) -> str:
    """Where a window finds the spool's symbol table of host object `build_id` (relative to the window)."""
    return f"../static/elf-{build_id}.txt.gz"


def process_key(pid: int) -> str:
    """The snapshot key of host process `pid`."""
    return f"{_PROCESS_PREFIX}{pid}"


def is_process_key(key: str) -> bool:
    return key.startswith(_PROCESS_PREFIX)


def snapshot(vms: list[dict] | None = None, processes: dict[int, dict] | None = None,
             kallsyms: str | None = None) -> dict:
    """A snapshot chunk's object with the parts given (parts left out are not in it, so merging it into a
    recording's snapshot leaves them as they were)."""
    out: dict = {}
    if vms is not None:
        out[VMS_KEY] = vms
    for pid, snap in (processes or {}).items():
        out[process_key(pid)] = snap
    if kallsyms is not None:
        out[KALLSYMS_KEY] = kallsyms
    return out


_BLOCK_BYTES = 1 << 20  # of rows a table is copied to or from columns at once (encode_table, _decode_table)


def encode_table(table: np.ndarray, codec: str = "zlib") -> bytes:
    """Columns one after another; time_ns as its first value plus deltas.  Each column is copied once, straight
    into the body (user-stack copies are 8 KiB a row), a block of rows at a time as _decode_table reads them."""
    rows = len(table)
    body = np.empty(rows * table.dtype.itemsize, np.uint8)
    columns, pos = [], 0
    for name in table.dtype.names:
        col = table[name]
        if name == "time_ns" and len(col):
            signed = col.astype("<i8")  # all int64 (mod 2^64): uint64 beside int64 would make float64 of it
            col = np.concatenate((signed[:1], np.diff(signed)))
        columns.append((col, body[pos:pos + rows * table.dtype.fields[name][0].itemsize].view(col.dtype)
                        .reshape(col.shape)))
        pos += rows * table.dtype.fields[name][0].itemsize
    step = max(1, _BLOCK_BYTES // table.dtype.itemsize)
    for lo in range(0, rows, step):
        for col, out in columns:
            out[lo:lo + step] = col[lo:lo + step]
    return pack_rows({"rows": len(table), "dtype": table.dtype.descr}, body.data, codec)


def _table_rows(payload: bytes | memoryview, dtype: np.dtype) -> int:
    """The row count a table chunk's header states, checked as rows.unpack_rows checks it (rows.check_size), as
    the arrays are made before the bodies are inflated; the exact count is checked then."""
    header, body = row_header(payload, "a table chunk")
    rows = stated_count(header, "rows", "a table chunk")
    check_size(header, body, rows * _stored_dtype(header, dtype).itemsize, "a table chunk", f"{rows} rows")
    return rows


def _stored_dtype(header: dict, current: np.dtype) -> np.dtype:
    """The record layout a table chunk was written in: `current` or one of its older ones."""
    stored = np.dtype([tuple(d) if len(d) == 2 else (d[0], d[1], tuple(d[2])) for d in header["dtype"]])
    if stored != current and stored not in OLDER_DTYPES.get(current, ()):
        raise RecordingError("a table chunk has a record layout this vmprof does not know")
    return stored


def _decode_table(payload: bytes, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """The rows of a table chunk, written into `out` when given (as many rows as the header states)."""
    current, written = dtype, [dtype]

    def itemsize(header: dict) -> int:
        written[0] = stored = _stored_dtype(header, current)
        return stored.itemsize

    header, raw = unpack_rows(payload, itemsize, "a table chunk")
    dtype = written[0]
    rows = int(header["rows"])
    table = out if out is not None and dtype == current else np.empty(rows, dtype=dtype)
    columns, pos = [], 0
    for name in dtype.names:
        field_dtype = dtype.fields[name][0]
        col = np.frombuffer(raw, dtype=field_dtype if name != "time_ns" else "<i8", count=rows, offset=pos)
        if name == "time_ns":  # deltas: summed straight into the field
            np.cumsum(col, out=table[name].view("<i8"))
            if rows and table[name].view("<i8").min() < 0:  # no clock of a host reads 2^63 ns (292 years)
                raise RecordingError("it holds a time past 2^63 ns, which no host clock reads")
        else:
            columns.append((name, col.reshape(table[name].shape)))
        pos += rows * field_dtype.itemsize
    # the columns into the rows a block of rows at a time: a block's rows stay in the cache while each column is
    # written into them (column by column over all the rows is slower: docs/scale.md, the window task's 4th round)
    step = max(1, _BLOCK_BYTES // dtype.itemsize)
    for lo in range(0, rows, step):
        block = table[lo:lo + step]
        for name, col in columns:
            block[name] = col[lo:lo + step]
    if dtype != current:  # an older layout: the fields both have, the new ones zero
        converted = np.zeros(rows, dtype=current) if out is None else out
        converted[...] = np.zeros(1, current)
        for name in current.names:
            if name in dtype.names and dtype.fields[name][0] == current.fields[name][0]:
                converted[name] = table[name]
        table = converted
    return table


def _decode_lbr(payload: bytes) -> np.ndarray:
    from vmprof_tui.lbr.records import record_dtype

    header, raw = unpack_rows(payload, lambda h: record_dtype(int(h["nr"]), int(h["fields"])).itemsize,
                               "an LBR chunk")
    return np.frombuffer(raw, dtype=record_dtype(int(header["nr"]), int(header["fields"]))).copy()


def encode_host_stacks(chains: dict[int, np.ndarray]) -> bytes:
    """Stack-map entries: ids (i4), their depths (u4), then every chain's addresses (u8) one after another."""
    ids = np.fromiter(chains, dtype="<i4", count=len(chains))
    depths = np.array([len(chains[i]) for i in ids.tolist()], dtype="<u4")
    addresses = np.concatenate([np.asarray(chains[i], "<u8") for i in ids.tolist()]) if len(ids) else np.empty(0, "<u8")
    return pack_rows({"rows": len(ids), "addresses": len(addresses)},
                      ids.tobytes() + depths.tobytes() + addresses.tobytes())


def _decode_host_stacks(payload: bytes) -> dict[int, np.ndarray]:
    header, raw = unpack_rows(payload, lambda h: 8, "a host stacks chunk",
                               lambda h: 8 * stated_count(h, "addresses", "a host stacks chunk"))
    n = int(header["rows"])
    ids = np.frombuffer(raw, "<i4", n)
    depths = np.frombuffer(raw, "<u4", n, 4 * n).astype(np.int64)
    if depths.sum() != int(header["addresses"]) or (depths > MAX_HOST_STACK_DEPTH).any():
        raise RecordingError("a host stacks chunk's depths do not add up")
    addresses = np.frombuffer(raw, "<u8", offset=8 * n)
    return dict(zip(ids.tolist(), np.split(addresses, np.cumsum(depths)[:-1]), strict=True)) if n else {}


def bundle_tar(folder: Path) -> bytes:
    """A guest bundle folder as the tar a recording stores."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(folder), arcname=".")
    return buf.getvalue()


@dataclass
class Recording:
    path: Path
    meta: dict
    samples: np.ndarray
    sched: np.ndarray
    snapshot: dict = field(default_factory=dict)
    bundles: dict[str, bytes] = field(default_factory=dict)  # vm name -> tar bytes
    object_tables: dict[str, bytes] = field(default_factory=dict)  # build id -> host object's symbols (agent)
    end: dict | None = None  # None when the recorder did not finish (killed, cut)
    lbr: np.ndarray | None = None  # raw LBR records (vmprof record --lbr)
    stacks: np.ndarray | None = None  # STACK_DTYPE rows (vmprof record -g); None: recorded without stacks
    host_stacks: dict[int, np.ndarray] = field(default_factory=dict)  # host stack-map id -> addresses (-g)
    ustacks: np.ndarray | None = None  # user-stack copies (record -g --call-graph cfi), ustack_dtype rows
    problems: list[str] = field(default_factory=list)  # what was cut or skipped
    skipped_chunks: int = 0  # damaged chunks passed over (with the bytes up to the next whole chunk)
    skipped_bytes: int = 0
    # processes() of a snapshot that no longer changes, computed once: the pieces of a streamed report share one
    # snapshot of thousands of processes (analyse/stream.py)
    fixed_processes: dict[int, dict] | None = field(default=None, repr=False, compare=False)

    def damage(self) -> str | None:
        """One line naming what corruption cost this recording (None: nothing was skipped), for every screen
        and command that shows it."""
        if not self.skipped_chunks and not any("unreadable" in p for p in self.problems):
            return None
        unreadable = sum("unreadable" in p for p in self.problems)
        parts = []
        if self.skipped_chunks:
            parts.append(f"{self.skipped_chunks} damaged chunk{'s' if self.skipped_chunks != 1 else ''} "
                         f"({self.skipped_bytes:,} bytes) skipped")
        if unreadable:
            parts.append(f"{unreadable} unreadable chunk{'s' if unreadable != 1 else ''} skipped")
        return f"corrupt recording {self.path.name}: " + ", ".join(parts)

    @property
    def complete(self) -> bool:
        return self.end is not None and not self.problems

    def processes(self) -> dict[int, dict]:
        """Host pid -> its snapshot (comm, cmdline, exe, maps text, build ids; taken when first sampled)."""
        if self.fixed_processes is not None:
            return self.fixed_processes
        return {int(v["pid"]): v for k, v in self.snapshot.items() if is_process_key(k)}

    def vms(self) -> list[dict]:
        """The VMs of the recording: as the end chunk lists them (every VM seen), else the last snapshot's."""
        return (self.end or {}).get(VMS_KEY) or self.snapshot.get(VMS_KEY) or []

    def kallsyms(self) -> str | None:
        """The host's kallsyms text; None when the recording holds none (it is written at the end)."""
        return self.snapshot.get(KALLSYMS_KEY)

    @property
    def lost_samples(self) -> int:
        return int(sum((self.end or {}).get("lost", {}).get("samples", [])))

    @property
    def duration_s(self) -> float:
        if self.end and "duration_s" in self.end:
            return float(self.end["duration_s"])
        if len(self.samples):
            return float(self.samples["time_ns"].max() - self.samples["time_ns"].min()) / 1e9
        return 0.0


STATIC_REF = re.compile(r"^\.\./static/((kallsyms|bundle)-[0-9a-f]{16}\.(txt|tar)|elf-[0-9a-f]{2,128}\.txt)\.gz$")


def _read_static(rec: Recording, ref: object, what: str, limit: int = MAX_INFLATED) -> bytes | None:
    """The bytes of a spool static file a window references; None (and a problem noted) if unusable.  A spool
    may be on a shared file system: the reference must name a static file, the file must be a regular one
    (no link followed) and inflate to at most `limit` bytes."""
    if not isinstance(ref, str) or not STATIC_REF.match(ref):
        rec.problems.append(f"{what} reference {str(ref)[:80]!r} is not a spool static file: ignored")
        return None
    try:
        fd = os.open(rec.path.parent / ref, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as raw:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            with gzip.GzipFile(fileobj=raw) as f:
                data = f.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        rec.problems.append(f"the {what} this window references ({ref}) cannot be read: {e}")
        return None
    if len(data) > limit:
        rec.problems.append(f"the {what} this window references ({ref}) is over the limit of {limit} bytes: ignored")
        return None
    return data


def _load_static(rec: Recording) -> None:
    """A window of `vmprof agent` references static data in its spool (the host's kallsyms, guest bundles:
    stored once per change) instead of carrying copies: read them in, so a window reads like any recording."""
    ref = rec.snapshot.get("kallsyms_ref")
    if ref is not None and KALLSYMS_KEY not in rec.snapshot and (data := _read_static(rec, ref, "kallsyms")):
        rec.snapshot[KALLSYMS_KEY] = data.decode(errors="replace")
    refs = rec.snapshot.get("bundle_refs") or {}
    for vm, ref in refs.items() if isinstance(refs, dict) else ():
        if vm not in rec.bundles and (data := _read_static(rec, ref, f"bundle of VM {str(vm)[:80]}")):
            rec.bundles[str(vm)] = data
    refs = rec.snapshot.get(OBJECTS_REF_KEY) or {}
    for n, (build_id, ref) in enumerate(refs.items() if isinstance(refs, dict) else ()):
        if n == MAX_OBJECT_TABLES:
            rec.problems.append(f"the window references over {MAX_OBJECT_TABLES} object symbol tables: the rest "
                                "are ignored")
            break
        what = f"symbol table of build id {str(build_id)[:130]}"
        if ref != object_ref(str(build_id)):  # a table is found by its build id, nothing else
            rec.problems.append(f"{what}: reference {str(ref)[:80]!r} is not its spool static file: ignored")
        elif (data := _read_static(rec, ref, what, MAX_OBJECT_TABLE)) is not None:
            rec.object_tables[build_id] = data


def _decode_tables(pending: list[tuple[int, int, memoryview, int]], problems: list[str],
                   dtypes: dict[int, np.dtype]) -> dict[int, np.ndarray]:
    """Each kind's table chunks decoded straight into one array of that kind (no copy to join them, which at
    millions of rows costs as much as the decoding); inflating is most of a load and zlib lets other threads
    run meanwhile, so chunks are decoded one thread per CPU.  A chunk that fails is left out, and its problem
    goes where a decode in file order would have put it."""
    out: dict[int, np.ndarray] = {}
    alone: dict[int, list[np.ndarray]] = {}  # kinds whose rows did not fit one array: a table per chunk
    spans: list[tuple[int, int, int, int, Future]] = []  # (kind, problems before it, start, rows, job)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for kind in {k for k, *_ in pending}:
            try:
                out[kind] = np.empty(sum(rows for k, _at, _p, rows in pending if k == kind), dtypes[kind])
            except MemoryError:  # chunks stating more rows than memory holds (each within its bounds): the ones
                alone[kind] = []  # that lie fail on their own, the rest are joined after
        filled = dict.fromkeys(out, 0)
        for kind, at, payload, rows in pending:
            start = filled.get(kind, 0)
            into = None if kind in alone else out[kind][start:start + rows]
            if kind not in alone:
                filled[kind] += rows
            spans.append((kind, at, start, rows, pool.submit(_decode_table, payload, dtypes[kind], into)))
        failed: dict[int, list[tuple[int, int]]] = {}
        for kind, at, start, rows, job in spans:
            try:
                table = job.result()
            except (ValueError, KeyError, TypeError, struct.error, zlib.error, RecordingError) as e:
                problems.insert(at + sum(map(len, failed.values())),
                                f"unreadable {KIND_NAMES.get(kind, kind)} chunk skipped: {e}")
                failed.setdefault(kind, []).append((start, rows))
                continue
            if kind in alone:
                alone[kind].append(table)
    for kind, gaps in failed.items():
        if kind in alone:
            continue
        keep = np.ones(len(out[kind]), bool)
        for start, rows in gaps:
            keep[start:start + rows] = False
        out[kind] = out[kind][keep]
    for kind, tables in alone.items():
        try:
            out[kind] = np.concatenate(tables) if tables else np.empty(0, dtypes[kind])
        except MemoryError:
            raise RecordingError(f"the {KIND_NAMES.get(kind, kind)} rows of this recording do not fit in "
                                 "memory") from None
    return out


def _valid_chunk_at(data: bytes, view: memoryview, pos: int) -> bool:
    """Whether a whole chunk starts at `pos`: its magic, a length that fits, and its checksum all check."""
    if pos + CHUNK_HEADER.size > len(data):
        return False
    magic, _kind, _res, length, crc = CHUNK_HEADER.unpack_from(data, pos)
    body = pos + CHUNK_HEADER.size
    return magic == CHUNK_MAGIC and length <= MAX_CHUNK and body + length <= len(data) \
        and zlib.crc32(view[body:body + length]) == crc


def _resync(data: bytes, view: memoryview, pos: int) -> int | None:
    """The position of the next whole chunk after a damaged one at `pos` (None: none follows).  One bad length
    must not cost the intact chunks behind it: every later chunk magic is tried, and only a header whose
    checksum checks is taken (a payload that happens to hold the magic does not pass)."""
    at = pos
    while (at := data.find(CHUNK_MAGIC, at + 1)) >= 0:
        if _valid_chunk_at(data, view, at):
            return at
    return None


def _chunks_in(data: bytes, lo: int, hi: int) -> int:
    """How many chunks a skipped stretch held: the chunk headers in it (at least the damaged one)."""
    n, at = 0, lo - 1
    while (at := data.find(CHUNK_MAGIC, at + 1)) >= 0 and at < hi:
        if at + CHUNK_HEADER.size <= len(data) and CHUNK_HEADER.unpack_from(data, at)[1] in KIND_NAMES:
            n += 1
    return max(n, 1)


def _damage(data: bytes, pos: int, kind: int, length: int, crc_ok: bool | None) -> str:
    """What is wrong with the chunk at `pos` (for the note)."""
    magic = data[pos:pos + 4]
    if magic != CHUNK_MAGIC:
        return f"corrupt chunk header at byte {pos}"
    if length > MAX_CHUNK or pos + CHUNK_HEADER.size + length > len(data):
        return f"corrupt length ({length} bytes) in the {KIND_NAMES.get(kind, f'kind {kind}')} chunk at byte {pos}"
    return f"checksum mismatch in the {KIND_NAMES.get(kind, f'kind {kind}')} chunk at byte {pos}" if not crc_ok \
        else f"bad chunk at byte {pos}"


def _meta(value: object) -> dict:
    """The metadata chunk's object, checked where the analysis divides or counts by it."""
    meta = bounded_json.expect(value, dict, "the metadata chunk")
    if "frequency" in meta:
        bounded_json.number(meta["frequency"], "the metadata's frequency (Hz)", 1, MAX_FREQUENCY)
    for key in ("start_unix_s", "start_monotonic_ns"):
        if key in meta:
            bounded_json.number(meta[key], f"the metadata's {key}", 0)
    return meta


def _end(value: object) -> dict:
    """The end chunk's object, checked (a bad one is ignored: the recording reads as not finished)."""
    end = bounded_json.expect(value, dict, "the end chunk")
    for key in ("duration_s", "end_monotonic_ns", "samples"):
        if key in end:
            bounded_json.number(end[key], f"the end chunk's {key}", 0)
    lost = bounded_json.expect(end.get("lost", {}), dict, "the end chunk's lost counts")
    for key in ("samples", "sched"):  # per CPU: added up by readers (other keys are the LBR collector's)
        for c in bounded_json.expect(lost.get(key, []), list, f"the end chunk's lost {key}"):
            bounded_json.number(c, f"a lost {key} count", 0)
    if VMS_KEY in end:
        _vms(end[VMS_KEY], "the end chunk's VMs")
    return end


def _vms(value: object, what: str) -> list[dict]:
    for vm in bounded_json.expect(value, list, what):
        bounded_json.expect(vm, dict, f"a VM of {what}")
        bounded_json.expect(vm.get("name"), str, f"a VM name of {what}")
        bounded_json.number(vm.get("pid"), f"a VM pid of {what}", 0, 1 << 32)
    return value


def _snapshot(value: object) -> dict:
    """A snapshot chunk's object with its VMs and processes checked (they are read by key)."""
    snap = bounded_json.expect(value, dict, "a snapshot chunk")
    if VMS_KEY in snap:
        _vms(snap[VMS_KEY], "a snapshot's VMs")
    for key, proc in snap.items():
        if is_process_key(key):
            bounded_json.expect(proc, dict, f"snapshot {key[:40]}")
            bounded_json.number(proc.get("pid"), f"the pid of snapshot {key[:40]}", 0, 1 << 32)
    if KALLSYMS_KEY in snap:
        bounded_json.expect(snap[KALLSYMS_KEY], str, "a snapshot's kallsyms")
    return snap


def load(path: Path) -> Recording:
    """Read a recording; a cut or corrupt part is reported in .problems, not raised: a damaged chunk costs only
    itself (and what lies between it and the next whole chunk), never the chunks after it."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise RecordingError(f"cannot read {path}: {e.strerror}") from None
    if not data.startswith(MAGIC):
        raise RecordingError(f"{path} is not a vmprof recording (bad magic)")
    (version,) = struct.unpack_from("<H", data, len(MAGIC))
    if version != VERSION:
        raise RecordingError(f"{path} is recording format version {version}; this vmprof reads version {VERSION}")
    pos = len(MAGIC) + 2
    meta: dict | None = None
    meta_problem = ""
    rec = Recording(Path(path), {}, np.empty(0, SAMPLE_DTYPE), np.empty(0, SCHED_DTYPE))
    lbr_parts: list[np.ndarray] = []
    pending: list[tuple[int, int, memoryview, int]] = []  # table chunks: (kind, problems before it, payload, rows)
    dtypes = dict(TABLE_DTYPES)  # user-stack copies: their size is in the meta chunk
    view = memoryview(data)
    chunks = 0
    while pos < len(data):
        if pos + CHUNK_HEADER.size > len(data):
            rec.problems.append(f"recording cut inside a chunk header after {chunks} chunks "
                                f"({len(data) - pos} bytes at the end ignored)")
            break
        magic, kind, _res, length, crc = CHUNK_HEADER.unpack_from(data, pos)
        body_start = pos + CHUNK_HEADER.size
        fits = magic == CHUNK_MAGIC and length <= MAX_CHUNK and body_start + length <= len(data)
        crc_ok = fits and zlib.crc32(view[body_start:body_start + length]) == crc
        if not crc_ok:
            nxt = _resync(data, view, pos)
            if nxt is None and magic == CHUNK_MAGIC and length <= MAX_CHUNK and body_start + length > len(data):
                rec.problems.append(f"recording cut inside a {KIND_NAMES.get(kind, kind)} chunk after {chunks} "
                                    f"chunks ({len(data) - pos} bytes at the end ignored)")
                break
            end = len(data) if nxt is None else nxt
            skipped = _chunks_in(data, pos, end)
            rec.skipped_chunks += skipped
            rec.skipped_bytes += end - pos
            rec.problems.append(f"{_damage(data, pos, kind, length, crc_ok if fits else None)}: skipped "
                                f"{end - pos} bytes ({skipped} chunk{'s' if skipped != 1 else ''}) "
                                + ("to the end" if nxt is None else f"up to the next whole chunk at byte {nxt}"))
            if nxt is None:
                break
            pos = nxt
            continue
        payload = view[body_start:body_start + length]  # no copy: table chunks are most of the file
        pos = body_start + length
        chunks += 1
        what = f"{KIND_NAMES.get(kind, kind)} chunk"
        try:
            if kind == META:
                try:
                    meta = _meta(bounded_json.loads(bytes(payload), "the metadata chunk"))
                except bounded_json.JSONLimitError as e:
                    meta_problem = f": {e}"
                    raise
                copy = meta.get("stack_copy_bytes")
                if isinstance(copy, int) and 0 < copy <= MAX_STACK_COPY:
                    dtypes[USTACKS] = ustack_dtype(copy)
            elif kind in dtypes:
                pending.append((kind, len(rec.problems), payload, _table_rows(payload, dtypes[kind])))
            elif kind == SNAPSHOT:
                text = zlib.decompressobj().decompress(payload, MAX_INFLATED)
                rec.snapshot.update(_snapshot(bounded_json.loads(text, "a snapshot chunk")))
            elif kind == BUNDLE:
                (n,) = struct.unpack_from("<H", payload)
                rec.bundles[bytes(payload[2:2 + n]).decode(errors="replace")] = bytes(payload[2 + n:])
            elif kind == END:
                rec.end = _end(bounded_json.loads(bytes(payload), "the end chunk"))
            elif kind == LBR:
                lbr_parts.append(_decode_lbr(payload))
            elif kind == HOST_STACKS:
                rec.host_stacks.update(_decode_host_stacks(payload))
        except (ValueError, KeyError, TypeError, struct.error, zlib.error, RecordingError) as e:
            rec.problems.append(f"unreadable {what} skipped: {e}")
        except MemoryError:  # a size within its bounds that this host cannot hold now: the chunk only is lost
            rec.problems.append(f"unreadable {what} skipped: it does not fit in memory")
    joined = _decode_tables(pending, rec.problems, dtypes)
    payload = view = data = pending = None  # the file's bytes go
    if meta is None:
        raise RecordingError(f"{path} has no readable metadata chunk{meta_problem}: it is not a usable recording")
    rec.meta = meta
    if SAMPLES in joined:
        rec.samples = joined[SAMPLES]
        t = rec.samples["time_ns"]
        if not np.all(t[1:] >= t[:-1]):  # chunks come per flush: in time order here, not one copy per analysis
            rec.samples = rec.samples[arrays.stable_argsort(t)]
    if SCHED in joined:
        rec.sched = joined[SCHED]
    if lbr_parts:
        rec.lbr = np.concatenate(lbr_parts)
    if STACKS in joined or meta.get("stacks"):
        rec.stacks = joined.get(STACKS, np.empty(0, STACK_DTYPE))
    if USTACKS in joined:
        rec.ustacks = joined[USTACKS]
    _load_static(rec)
    if rec.end is None and not rec.problems:
        rec.problems.append("the recorder did not finish (no end chunk): this is the part flushed before it stopped")
    return rec

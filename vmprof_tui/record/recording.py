"""The recording format (docs/recording.md): a header, then checksummed chunks.

Written by hand because no library offers what a profiler recording needs all
at once: appending while collection goes on, surviving SIGKILL with
everything flushed so far, and loading without pickle.  Each chunk is
self-describing and checksummed, so a reader keeps every complete chunk of a
cut-off file and says what was cut.

Sample and sched tables are stored column by column (numpy arrays of the
dtypes in vmprof_tui.record.records), times delta-encoded, compressed with zlib.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vmprof_tui.record.records import OLDER_DTYPES, SAMPLE_DTYPE, SCHED_DTYPE

MAGIC = b"VMPROFREC\0"
VERSION = 1
CHUNK_MAGIC = b"CHNK"
CHUNK_HEADER = struct.Struct("<4sHHII")  # magic, kind, reserved, payload length, crc32
MAX_CHUNK = 256 << 20
MAX_INFLATED = 1 << 30

META, SAMPLES, SCHED, SNAPSHOT, BUNDLE, END, LBR = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {META: "meta", SAMPLES: "samples", SCHED: "sched", SNAPSHOT: "snapshot", BUNDLE: "bundle", END: "end",
              LBR: "lbr"}
TABLE_DTYPES = {SAMPLES: SAMPLE_DTYPE, SCHED: SCHED_DTYPE}


class RecordingError(RuntimeError):
    pass


# -- snapshot keys: made and read through this module only ----------------------------------------
# A snapshot chunk is a JSON object merged into Recording.snapshot (docs/recording.md).  Writers build
# it with snapshot(); readers use Recording.processes(), .vms() and .kallsyms().

VMS_KEY = "vms"  # discovered VMs (also a key of the end chunk: the VMs as they were at the end)
KALLSYMS_KEY = "kallsyms"  # the host's /proc/kallsyms text
_PROCESS_PREFIX = "process:"  # process:PID, a host process as first sampled


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


def _pack_rows(header: dict, body: bytes) -> bytes:
    """A row chunk's payload: header length, JSON header (with "rows"), zlib body."""
    h = json.dumps(header).encode()
    return struct.pack("<I", len(h)) + h + zlib.compress(body, 6)


def _unpack_rows(payload: bytes, itemsize_of: Callable[[dict], int], what: str) -> tuple[dict, bytes]:
    """(header, body) of a row chunk; the body inflated to exactly rows * itemsize bytes, never more."""
    (hlen,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4:4 + hlen])
    size = int(header["rows"]) * itemsize_of(header)
    raw = zlib.decompressobj().decompress(payload[4 + hlen:], size + 1)
    if len(raw) != size:
        raise RecordingError(f"{what} is shorter than its header says")
    return header, raw


def _encode_table(table: np.ndarray) -> bytes:
    """Columns one after another; time_ns as its first value plus deltas."""
    columns = []
    for name in table.dtype.names:
        col = np.ascontiguousarray(table[name])
        if name == "time_ns" and len(col):
            col = np.concatenate(([col[0]], np.diff(col.astype(np.int64)))).astype("<i8")
        columns.append(col.tobytes())
    return _pack_rows({"rows": len(table), "dtype": table.dtype.descr}, b"".join(columns))


def _decode_table(payload: bytes, dtype: np.dtype) -> np.ndarray:
    current, written = dtype, [dtype]

    def itemsize(header: dict) -> int:
        stored = np.dtype([tuple(d) if len(d) == 2 else (d[0], d[1], tuple(d[2])) for d in header["dtype"]])
        if stored != current and stored not in OLDER_DTYPES.get(current, ()):
            raise RecordingError("a table chunk has a record layout this vmprof does not know")
        written[0] = stored
        return stored.itemsize

    header, raw = _unpack_rows(payload, itemsize, "a table chunk")
    dtype = written[0]
    rows = int(header["rows"])
    table = np.empty(rows, dtype=dtype)
    pos = 0
    for name in dtype.names:
        field_dtype = dtype.fields[name][0]
        size = rows * field_dtype.itemsize
        col = np.frombuffer(raw, dtype=field_dtype if name != "time_ns" else "<i8", count=rows, offset=pos)
        table[name] = np.cumsum(col).astype("<u8") if name == "time_ns" else col.reshape(table[name].shape)
        pos += size
    if dtype != current:  # an older layout: the fields both have, the new ones zero
        converted = np.zeros(rows, dtype=current)
        for name in current.names:
            if name in dtype.names and dtype.fields[name][0] == current.fields[name][0]:
                converted[name] = table[name]
        table = converted
    return table


def _decode_lbr(payload: bytes) -> np.ndarray:
    from vmprof_tui.record.lbr_records import record_dtype

    header, raw = _unpack_rows(payload, lambda h: record_dtype(int(h["nr"]), int(h["fields"])).itemsize,
                               "an LBR chunk")
    return np.frombuffer(raw, dtype=record_dtype(int(header["nr"]), int(header["fields"]))).copy()


def bundle_tar(folder: Path) -> bytes:
    """A guest bundle folder as the tar a recording stores."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(folder), arcname=".")
    return buf.getvalue()


class Writer:
    """Appends chunks; every flush() is fsynced so a killed recorder loses at most the unflushed part."""

    def __init__(self, path: Path, meta: dict) -> None:
        try:
            self.file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise RecordingError(f"cannot write the recording to {path}: {e.strerror}") from None
        self.file.write(MAGIC + struct.pack("<H", VERSION))
        self._pending_samples: list[np.ndarray] = []
        self._pending_sched: list[np.ndarray] = []
        self.chunk(META, json.dumps(meta).encode())
        self.sync()

    def chunk(self, kind: int, payload: bytes) -> None:
        if len(payload) > MAX_CHUNK:
            raise RecordingError(f"chunk of {len(payload)} bytes is over the {MAX_CHUNK} limit")
        self.file.write(CHUNK_HEADER.pack(CHUNK_MAGIC, kind, 0, len(payload), zlib.crc32(payload)))
        self.file.write(payload)

    def add(self, samples: np.ndarray, sched: np.ndarray) -> None:
        if len(samples):
            self._pending_samples.append(samples)
        if len(sched):
            self._pending_sched.append(sched)

    def flush(self) -> None:
        for kind, pending in ((SAMPLES, self._pending_samples), (SCHED, self._pending_sched)):
            if pending:
                self.chunk(kind, _encode_table(np.concatenate(pending)))
                pending.clear()
        self.sync()

    def add_snapshot(self, snapshot: dict) -> None:
        self.chunk(SNAPSHOT, zlib.compress(json.dumps(snapshot).encode(), 6))

    def add_bundle(self, vm: str, folder: Path) -> None:
        """Store a guest bundle folder (as a tar) with the recording."""
        name = vm.encode()
        self.chunk(BUNDLE, struct.pack("<H", len(name)) + name + bundle_tar(folder))

    def add_lbr(self, records: np.ndarray, nr: int, fields: int) -> None:
        """Raw LBR records (bpf/lbr_record.h, LBR_NR=nr, LBR_FIELDS=fields) as they came from the ring buffer."""
        self.chunk(LBR, _pack_rows({"rows": len(records), "nr": nr, "fields": fields}, records.tobytes()))

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self, end: dict) -> None:
        self.flush()
        self.chunk(END, json.dumps(end).encode())
        self.sync()
        self.file.close()


@dataclass
class Recording:
    path: Path
    meta: dict
    samples: np.ndarray
    sched: np.ndarray
    snapshot: dict = field(default_factory=dict)
    bundles: dict[str, bytes] = field(default_factory=dict)  # vm name -> tar bytes
    end: dict | None = None  # None when the recorder did not finish (killed, cut)
    lbr: np.ndarray | None = None  # raw LBR records (vmprof record --lbr)
    problems: list[str] = field(default_factory=list)  # what was cut or skipped

    @property
    def complete(self) -> bool:
        return self.end is not None and not self.problems

    def processes(self) -> dict[int, dict]:
        """Host pid -> its snapshot (comm, cmdline, exe, maps text, build ids; taken when first sampled)."""
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


STATIC_REF = re.compile(r"^\.\./static/(kallsyms|bundle)-[0-9a-f]{16}\.(txt|tar)\.gz$")


def _read_static(rec: Recording, ref: object, what: str) -> bytes | None:
    """The bytes of a spool static file a window references; None (and a problem noted) if unusable."""
    if not isinstance(ref, str) or not STATIC_REF.match(ref):
        rec.problems.append(f"{what} reference {str(ref)[:80]!r} is not a spool static file: ignored")
        return None
    try:
        with gzip.open(rec.path.parent / ref) as f:
            return f.read(MAX_INFLATED)
    except (OSError, EOFError, zlib.error) as e:
        rec.problems.append(f"the {what} this window references ({ref}) cannot be read: {e}")
        return None


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


def load(path: Path) -> Recording:
    """Read a recording; a cut or corrupt tail is reported in .problems, not raised."""
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
    tables: dict[int, list[np.ndarray]] = {SAMPLES: [], SCHED: []}
    rec = Recording(Path(path), {}, np.empty(0, SAMPLE_DTYPE), np.empty(0, SCHED_DTYPE))
    lbr_parts: list[np.ndarray] = []
    chunks = 0
    while pos < len(data):
        if pos + CHUNK_HEADER.size > len(data):
            rec.problems.append(f"recording cut inside a chunk header after {chunks} chunks "
                                f"({len(data) - pos} bytes at the end ignored)")
            break
        magic, kind, _res, length, crc = CHUNK_HEADER.unpack_from(data, pos)
        body_start = pos + CHUNK_HEADER.size
        if magic != CHUNK_MAGIC or length > MAX_CHUNK:
            rec.problems.append(f"corrupt chunk header at byte {pos}; the rest ({len(data) - pos} bytes) is ignored")
            break
        if body_start + length > len(data):
            rec.problems.append(f"recording cut inside a {KIND_NAMES.get(kind, kind)} chunk after {chunks} chunks "
                                f"({len(data) - pos} bytes at the end ignored)")
            break
        payload = data[body_start:body_start + length]
        pos = body_start + length
        if zlib.crc32(payload) != crc:
            rec.problems.append(f"checksum mismatch in a {KIND_NAMES.get(kind, kind)} chunk; it was skipped")
            continue
        chunks += 1
        try:
            if kind == META:
                meta = json.loads(payload)
            elif kind in tables:
                tables[kind].append(_decode_table(payload, TABLE_DTYPES[kind]))
            elif kind == SNAPSHOT:
                rec.snapshot.update(json.loads(zlib.decompressobj().decompress(payload, MAX_INFLATED)))
            elif kind == BUNDLE:
                (n,) = struct.unpack_from("<H", payload)
                rec.bundles[payload[2:2 + n].decode(errors="replace")] = payload[2 + n:]
            elif kind == END:
                rec.end = json.loads(payload)
            elif kind == LBR:
                lbr_parts.append(_decode_lbr(payload))
        except (ValueError, KeyError, TypeError, struct.error, zlib.error, RecordingError) as e:
            rec.problems.append(f"unreadable {KIND_NAMES.get(kind, kind)} chunk skipped: {e}")
    if meta is None:
        raise RecordingError(f"{path} has no readable metadata chunk: it is not a usable recording")
    rec.meta = meta
    if tables[SAMPLES]:
        rec.samples = np.concatenate(tables[SAMPLES])
    if tables[SCHED]:
        rec.sched = np.concatenate(tables[SCHED])
    if lbr_parts:
        rec.lbr = np.concatenate(lbr_parts)
    _load_static(rec)
    if rec.end is None and not rec.problems:
        rec.problems.append("the recorder did not finish (no end chunk): this is the part flushed before it stopped")
    return rec

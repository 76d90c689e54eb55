"""Writing a recording (docs/recording.md): chunks appended as collection goes on and synced, so a cut-off
file keeps everything written before the cut; a failed write (a full disk) keeps what was synced and says so.
The format itself (chunk kinds, codecs) and reading are in recording.py."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vmprof_tui import files
from vmprof_tui.record.recording import (
    BUNDLE,
    CHUNK_HEADER,
    CHUNK_MAGIC,
    END,
    HOST_STACKS,
    LBR,
    MAGIC,
    MAX_CHUNK,
    META,
    SAMPLES,
    SCHED,
    SNAPSHOT,
    STACKS,
    USTACKS,
    VERSION,
    RecordingError,
    bundle_tar,
    encode_host_stacks,
    encode_table,
    load_zstd,
    pack_rows,
)


class WriteFailed(RecordingError):
    """Writing a recording failed (a full disk): the chunks synced before it are all in the file."""

    def __init__(self, path: Path, error: OSError, after: str = "") -> None:
        super().__init__(f"cannot write the recording to {path}: {error.strerror or error}{after}")
        self.error = error


# codec "auto": the tables of a recording's first 2^20 samples in zlib, the rest in zstd.  A report inflates zstd
# faster than zlib, but reads it through pyarrow, whose import costs more than that saves on a smaller recording
# (the figures: docs/scale.md).
ZSTD_AFTER_SAMPLES = 1 << 20


class Writer:
    """Appends chunks; every flush() is fsynced so a killed recorder loses at most the unflushed part.  The file
    is created 0600 and never through a planted link; one already at `path` is replaced, or with `keep_old`
    becomes PATH.old (files.py)."""

    def __init__(self, path: Path, meta: dict, keep_old: bool = False, codec: str = "zlib") -> None:
        """codec: of the sample and sched chunks, zlib or zstd (the agent's windows: much faster to write, as
        small, docs/fleet.md; readers since the user-stack copies' zstd read either, as each chunk's header says),
        or auto (`vmprof record`): zlib for the first ZSTD_AFTER_SAMPLES samples, zstd after them."""
        self.path = Path(path)
        self.codec = codec
        if codec in ("auto", "zstd"):  # imported now, before sampling starts: not in the drain loop at 2^20 samples
            load_zstd()
        self.samples_written = 0
        try:
            self.file, self.old, self.created = files.open_recording(self.path, keep_old)
        except OSError as e:
            raise WriteFailed(self.path, e) from None
        self.written = self.synced = 0  # bytes written, and in the file at the last sync (what a failure leaves)
        self.regular = stat.S_ISREG(os.fstat(self.file.fileno()).st_mode)  # not a device or pipe (-o /dev/null)
        self._pending_samples: list[np.ndarray] = []
        self._pending_sched: list[np.ndarray] = []
        self._pending_stacks: list[np.ndarray] = []
        self._pending_host_stacks: dict[int, np.ndarray] = {}
        self._pending_ustacks: list[np.ndarray] = []
        try:
            self._write(MAGIC + struct.pack("<H", VERSION))
            self.chunk(META, json.dumps(meta).encode())
            self.sync()
        except WriteFailed as e:
            self.abandon(keep=False)
            raise WriteFailed(self.path, e.error, f"; {self.nothing_kept()}") from None

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:  # an unbuffered file: a write may take part of it (a disk filling up)
                n = self.file.write(view)
                self.written += n
                view = view[n:]
        except OSError as e:
            raise WriteFailed(self.path, e) from None

    def chunk(self, kind: int, payload: bytes) -> None:
        if len(payload) > MAX_CHUNK:
            raise RecordingError(f"chunk of {len(payload)} bytes is over the {MAX_CHUNK} limit")
        self._write(CHUNK_HEADER.pack(CHUNK_MAGIC, kind, 0, len(payload), zlib.crc32(payload)))
        self._write(payload)

    def add(self, samples: np.ndarray, sched: np.ndarray, stacks: np.ndarray | None = None,
            host_stacks: dict[int, np.ndarray] | None = None, ustacks: np.ndarray | None = None) -> None:
        """Rows to write at the next flush; stacks (-g) are STACK_DTYPE rows and the stack-map entries
        (id -> addresses) their ids use that were not added before."""
        if len(samples):
            self._pending_samples.append(samples)
        if len(sched):
            self._pending_sched.append(sched)
        if stacks is not None and len(stacks):
            self._pending_stacks.append(stacks)
        self._pending_host_stacks.update(host_stacks or {})
        if ustacks is not None and len(ustacks):
            self._pending_ustacks.append(ustacks)

    def flush(self) -> None:
        if self._pending_host_stacks:  # before the stacks that use them
            self.chunk(HOST_STACKS, encode_host_stacks(self._pending_host_stacks))
            self._pending_host_stacks = {}
        samples, sched = (None if not p else p[0] if len(p) == 1 else np.concatenate(p)
                          for p in (self._pending_samples, self._pending_sched))
        self._pending_samples, self._pending_sched = [], []
        tables = [(kind, part) for pair in time_pieces(samples, sched)
                  for kind, part in zip((SAMPLES, SCHED), pair, strict=True) if part is not None and len(part)]
        codec = self.codec if self.codec != "auto" else "zstd" if self.samples_written >= ZSTD_AFTER_SAMPLES else "zlib"
        self.samples_written += len(samples) if samples is not None else 0
        if len(tables) > 2:  # a window's tables in pieces: compressed two at a time (zstd and zlib let threads run)
            with ThreadPoolExecutor(2) as pool:
                payloads = list(pool.map(lambda kt: encode_table(kt[1], codec=codec), tables))
        else:
            payloads = [encode_table(t, codec=codec) for _kind, t in tables]
        for (kind, _table), payload in zip(tables, payloads, strict=True):
            self.chunk(kind, payload)
        if self._pending_stacks:
            self.chunk(STACKS, encode_table(np.concatenate(self._pending_stacks)))
            self._pending_stacks.clear()
        if self._pending_ustacks:  # 8 KiB a sample: zstd, faster than zlib and smaller
            self.chunk(USTACKS, encode_table(np.concatenate(self._pending_ustacks), codec="zstd"))
            self._pending_ustacks.clear()
        self.sync()

    def add_snapshot(self, snapshot: dict) -> None:
        # zlib whatever the codec (readers inflate it so); at level 1 for zstd's writers (megabytes of a window's
        # processes: faster than level 6, a little larger)
        self.chunk(SNAPSHOT, zlib.compress(json.dumps(snapshot).encode(), 1 if self.codec == "zstd" else 6))

    def add_bundle(self, vm: str, folder: Path) -> None:
        """Store a guest bundle folder (as a tar) with the recording."""
        name = vm.encode()
        self.chunk(BUNDLE, struct.pack("<H", len(name)) + name + bundle_tar(folder))

    def add_lbr(self, records: np.ndarray, nr: int, fields: int) -> None:
        """Raw LBR records (bpf/lbr_record.h, LBR_NR=nr, LBR_FIELDS=fields) as they came from the ring buffer."""
        self.chunk(LBR, pack_rows({"rows": len(records), "nr": nr, "fields": fields}, records.tobytes()))

    def sync(self) -> None:
        try:
            if self.regular:  # a pipe or device has nothing to sync
                os.fsync(self.file.fileno())
            self.synced = self.written
        except OSError as e:
            raise WriteFailed(self.path, e) from None

    def close(self, end: dict) -> None:
        self.flush()
        self.chunk(END, json.dumps(end).encode())
        self.sync()
        self.file.close()

    def nothing_kept(self) -> str:
        """What is left after abandon(keep=False): the words of a one-line failure."""
        return ("nothing was recorded, " + (f"the older recording stays at {self.path}" if self.old is not None
                                           else "no file is left"))

    def abandon(self, keep: bool = True) -> None:
        """Close after a failure: the file is cut back to its last sync (no half chunk), or with `keep` False
        removed, and an older recording moved to PATH.old goes back.  A device or pipe written to (-o /dev/null)
        is only closed: the file is this Writer's to cut or remove only when it created it."""
        ours = self.created
        with contextlib.suppress(OSError):
            if ours and keep and self.synced:
                os.ftruncate(self.file.fileno(), self.synced)
        with contextlib.suppress(OSError):
            self.file.close()
        if ours and (not keep or not self.synced):
            with contextlib.suppress(OSError):
                self.path.unlink()
                if self.old is not None:
                    os.replace(self.old, self.path)


CHUNK_ROWS = 1 << 18  # samples a table chunk holds at most, when a flush has more (an agent's window)


def time_pieces(samples: np.ndarray | None, sched: np.ndarray | None,
                rows: int = CHUNK_ROWS) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
    """The samples and sched events of one flush as (samples, sched) pairs of back-to-back stretches of the host
    clock, of about `rows` samples each: a reader takes the recording a piece at a time (record/stream.py) and
    inflates pieces in parallel.  Each record's place within its stretch is kept; fewer samples: one pair."""
    if samples is None or len(samples) <= rows:
        return [(samples, sched)]
    t = samples["time_ns"]
    # the stretches' ends: where a sort would put them, found without one when the samples are out of order
    ordered = np.all(t[1:] >= t[:-1])
    cuts = np.unique(t[rows::rows] if ordered else np.partition(t, np.arange(rows, len(t), rows))[rows::rows])
    out = []
    for table in (samples, sched):
        if table is None or not len(table):
            out.append([table] * (len(cuts) + 1))
            continue
        times = table["time_ns"]
        if np.all(times[1:] >= times[:-1]):
            out.append(np.split(table, np.searchsorted(times, cuts, side="left")))
        else:
            stretch = np.searchsorted(cuts, times, side="right")
            order = np.argsort(stretch, kind="stable")
            bounds = np.searchsorted(stretch[order], np.arange(len(cuts) + 1))
            out.append(np.split(table[order], bounds[1:]))
    return list(zip(*out, strict=True))

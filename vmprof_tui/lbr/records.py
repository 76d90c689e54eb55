"""The LBR sample record as numpy sees it: the same layout as ``struct lbr_record`` in
``bpf/lbr_record.h`` (tests/test_lbr_record.py proves sizes and offsets agree), and the
conversion from raw records to :class:`~vmprof_tui.lbr.model.LbrSample` with counter
deltas."""

from __future__ import annotations

import numpy as np

from vmprof_tui.lbr.model import (
    INFO_CYCLES_MASK,
    INFO_CYCLES_SHIFT,
    BranchFilter,
    Fields,
    LbrSample,
)

HEADER_FIELDS: list[tuple[str, str]] = [
    ("time_ns", "<u8"),
    ("ip", "<u8"),
    ("cycles", "<u8"),
    ("cycles_enabled", "<u8"),
    ("cycles_running", "<u8"),
    ("instructions", "<u8"),
    ("instructions_enabled", "<u8"),
    ("instructions_running", "<u8"),
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("cpu", "<u4"),
    ("lbr_bytes", "<i4"),
    ("cycles_err", "<i4"),
    ("instructions_err", "<i4"),
    ("nr", "<u2"),
    ("fields", "u1"),
    ("filter", "u1"),
    ("reserved", "<u4"),
]
HEADER_DTYPE = np.dtype(HEADER_FIELDS, align=True)
RINGBUF_HDR_BYTES = 8  # BPF_RINGBUF_HDR_SZ: every ring-buffer record carries it, 8-byte aligned


def record_dtype(nr: int = 16, fields: Fields = Fields.FROM | Fields.TO) -> np.dtype:
    """The dtype of ``struct lbr_record`` compiled with LBR_NR=nr, LBR_FIELDS=fields."""
    if not 1 <= nr <= 256:
        raise ValueError(f"LBR depth {nr} out of range")
    parts: list[tuple[str, object]] = [("hdr", HEADER_DTYPE)]
    for flag, name in ((Fields.FROM, "from"), (Fields.TO, "to"), (Fields.INFO, "info")):
        if fields & flag:
            parts.append((name, ("<u8", (nr,))))
    return np.dtype(parts, align=True)


def record_size(nr: int = 16, fields: Fields = Fields.FROM | Fields.TO) -> int:
    return record_dtype(nr, fields).itemsize


def ring_bytes_per_sample(nr: int = 16, fields: Fields = Fields.FROM | Fields.TO) -> int:
    """Bytes one sample takes in the BPF ring buffer (record + ring-buffer header)."""
    size = record_size(nr, fields)
    return RINGBUF_HDR_BYTES + (size + 7) // 8 * 8


def decode(buf: bytes | bytearray | memoryview, nr: int = 16,
           fields: Fields = Fields.FROM | Fields.TO) -> np.ndarray:
    """Records packed back to back (one or many) -> a structured array."""
    dt = record_dtype(nr, fields)
    if len(buf) % dt.itemsize:
        raise ValueError(f"{len(buf)} bytes is not a whole number of {dt.itemsize}-byte LBR records")
    return np.frombuffer(bytes(buf), dtype=dt)


def _deltas(values: np.ndarray, errors: np.ndarray, cpus: np.ndarray) -> np.ndarray:
    """Per-CPU differences of running totals (records sorted by time); -1 where unknown."""
    out = np.full(values.shape, -1, dtype=np.int64)
    v = values.astype(np.int64)
    for cpu in np.unique(cpus):
        idx = np.nonzero(cpus == cpu)[0]
        d = np.diff(v[idx], prepend=0)
        d = np.where(d < 0, v[idx], d)  # the group was reset (re-enabled): count since then
        ok = errors[idx] == 0
        out[idx[ok]] = d[ok]
    return out


def to_samples(records: np.ndarray, comm: dict[int, str] | None = None, vm: str | None = None) -> list[LbrSample]:
    """Raw records (any order) -> samples, oldest entry first, with counter deltas."""
    if records.dtype.names is None or "hdr" not in records.dtype.names:
        raise ValueError("not an LBR record array")
    names = records.dtype.names
    order = np.argsort(records["hdr"]["time_ns"], kind="stable")
    recs = records[order]
    hdr = recs["hdr"]
    cpus = hdr["cpu"]
    d_cyc = _deltas(hdr["cycles"], hdr["cycles_err"], cpus)
    d_ins = _deltas(hdr["instructions"], hdr["instructions_err"], cpus)
    samples: list[LbrSample] = []
    for k in range(recs.shape[0]):
        h = hdr[k]
        nr = int(h["nr"])
        fields = Fields(int(h["fields"]))
        zero = np.zeros(nr, dtype=np.uint64)
        frm = recs["from"][k][:nr][::-1] if "from" in names else zero
        to = recs["to"][k][:nr][::-1] if "to" in names else zero
        lbr_cyc = None
        if "info" in names:
            info = recs["info"][k][:nr][::-1]
            lbr_cyc = ((info >> np.uint64(INFO_CYCLES_SHIFT)) & np.uint64(INFO_CYCLES_MASK)).astype(np.uint32)
        samples.append(LbrSample(
            from_=frm.copy(), to=to.copy(), lbr_cycles=lbr_cyc,
            cycles=int(d_cyc[k]) if d_cyc[k] >= 0 else None,
            instructions=int(d_ins[k]) if d_ins[k] >= 0 else None,
            ip=int(h["ip"]), time_ns=int(h["time_ns"]), cpu=int(h["cpu"]), pid=int(h["pid"]), tid=int(h["tid"]),
            comm=(comm or {}).get(int(h["pid"]), ""), vm=vm,
            branch_filter=BranchFilter(int(h["filter"])), fields=fields))
    return samples

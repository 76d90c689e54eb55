"""A host object file's symbol table as spool static data (`vmprof agent` stores one per build id).

An analysis node must name host user code of the process that was sampled, not of whatever file has
that path on the node, so the agent stores each sampled object's `ElfSymbols` once per build id and
windows reference it.  The format is text, gzipped by the spool (no pickle, readable with `zcat`)::

    {"format": "vmprof-object-symbols", "version": 1, "build_id": ..., "elf_type": 3,
     "segments": [[vaddr, offset, filesz, memsz, flags], ...], "symbols": N}
    START_HEX END_HEX NAME            (N lines, sorted by START)

Hand-written because it is a dozen lines and must be parsed with limits: a spool may sit on a shared
file system, so a table is untrusted input (counts, sizes and names are checked; a bad one is one
`BundleError` line and that object's samples stay [unknown]).
"""

from __future__ import annotations

import json

import numpy as np

from vmprof_tui.resolve.elf import ElfError, ElfSymbols, Segment
from vmprof_tui.resolve.untrusted import DEFAULT_LIMITS, MAX_NAME, U64_MAX, Limits, safe_text

FORMAT, VERSION = "vmprof-object-symbols", 1


def encode_object_table(sym: ElfSymbols) -> bytes:
    """The table as text (the spool gzips it)."""
    header = {"format": FORMAT, "version": VERSION, "build_id": sym.build_id, "elf_type": sym.elf_type,
              "segments": [[s.vaddr, s.offset, s.filesz, s.memsz, s.flags] for s in sym.segments],
              "symbols": len(sym)}
    lines = [json.dumps(header)]
    lines += [f"{a:x} {b:x} {n}" for a, b, n in zip(sym.starts.tolist(), sym.ends.tolist(), sym.names.tolist(),
                                                     strict=True)]
    return ("\n".join(lines) + "\n").encode()


def decode_object_table(data: bytes, build_id: str, limits: Limits = DEFAULT_LIMITS) -> ElfSymbols:
    """The ElfSymbols of a stored table, checked to be the one of `build_id`; ElfError (one line) if not usable."""
    head, _, body = data.partition(b"\n")
    try:
        h = json.loads(head[:1 << 20])
        if not isinstance(h, dict) or h.get("format") != FORMAT or h.get("version") != VERSION:
            raise ValueError("not a vmprof object symbol table of this version")
        if h.get("build_id") != build_id:
            raise ValueError(f"it is the table of build id {str(h.get('build_id'))[:130]}")
        count, segs = int(h["symbols"]), h["segments"]
        if not 0 <= count <= limits.max_symbols or not isinstance(segs, list) or len(segs) > limits.max_elf_segments:
            raise ValueError("symbol or segment count over the limit")
        segments = [Segment(*(_u64(v) for v in s)) for s in segs if isinstance(s, list) and len(s) == 5]
        lines = body.split(b"\n", count)
        if len(lines) != count + 1 or lines[count]:
            raise ValueError(f"not {count} symbol lines as its header says")
        starts, ends, names = np.zeros(count, np.uint64), np.zeros(count, np.uint64), []
        for i, line in enumerate(lines[:count]):
            a, b, name = line.split(b" ", 2)
            starts[i], ends[i] = _u64(int(a, 16)), _u64(int(b, 16))
            names.append(safe_text(name[:MAX_NAME].decode("utf-8", "replace"), MAX_NAME))
    except (ValueError, TypeError, KeyError, OverflowError) as e:
        raise ElfError(f"stored symbol table of build id {build_id}: {e}") from None
    order = np.argsort(starts, kind="stable")  # sorted when the agent wrote it; a lookup needs it to be
    return ElfSymbols(starts=starts[order], ends=ends[order], names=np.array(names, dtype=object)[order],
                      segments=segments, elf_type=int(h.get("elf_type", 0)), build_id=build_id)


def _u64(value: object) -> int:
    if not isinstance(value, int) or not 0 <= value <= U64_MAX:
        raise ValueError(f"{str(value)[:40]} is not an address")
    return value

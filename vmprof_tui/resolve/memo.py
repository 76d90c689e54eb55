"""A recording's samples resolved once per distinct key, not once per piece: the memo of a streamed report.

What a sample resolves to (resolver.py) is a function of a few of its fields: its kind (host user, host kernel,
guest user, guest kernel, guest RIP unknown), its pid (the host process, or the VMM and so the VM), its address,
and in a guest its address space (CR3).  Within one recording the processes' snapshots, the VM list, kallsyms and
the guest bundles do not change, so a key resolves to the same name code in every piece.  The pieces of a
recording hit the same keys again and again: the memo keeps each key's name code in a hash table (_keytable.c,
built by tools/bootstrap.sh), and only the first sample of each key it has not seen is resolved by the numpy
path, in the order they came, so new names are numbered as without the memo.

The table's hash is keyed with random bytes per recording (os.urandom) and no lookup or insert walks more than
MAX_PROBES slots, so keys a guest chose to collide cost no more than the numpy path (docs/analysis.md).  Without
the compiled table (a tree not built), or with one built from another version of _keytable.c (its VERSION is not
KEYTABLE_VERSION), there is no memo, and every piece is resolved whole, as before; `vmprof doctor` says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

import numpy as np

from vmprof_tui.record.bpf_records import SAMPLE_GUEST, SAMPLE_GUEST_KERNEL, SAMPLE_GUEST_UNKNOWN, SAMPLE_HOST_KERNEL
from vmprof_tui.resolve.bundle_format import CR3_ADDR_MASK, normalise_cr3_array

try:
    from vmprof_tui.resolve import _keytable
except ImportError:  # not built: resolved by the numpy path alone
    _keytable = None

KEYTABLE_VERSION = 2  # the _keytable.c this module calls (its VERSION); a .so built from another is not used

HOST_USER, HOST_KERNEL, GUEST_USER, GUEST_KERNEL, GUEST_UNKNOWN = range(5)


def sample_keys(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three uint64 words per sample that decide what it resolves to: kind << 32 | pid, the address (none for a
    guest RIP unknown), the normalised CR3 of a guest sample whose RIP is known (else 0)."""
    flags, pid = samples["flags"], samples["pid"]
    guest = (flags & SAMPLE_GUEST) != 0
    unknown = guest & ((flags & SAMPLE_GUEST_UNKNOWN) != 0)
    known = guest & ~unknown
    kind = np.where(guest, np.where((flags & SAMPLE_GUEST_KERNEL) != 0, GUEST_KERNEL, GUEST_USER),
                    np.where((flags & SAMPLE_HOST_KERNEL) != 0, HOST_KERNEL, HOST_USER))
    kind[unknown] = GUEST_UNKNOWN
    a = kind.astype(np.uint64) << np.uint64(32) | pid
    b = np.where(guest, samples["guest_ip"], samples["host_ip"])
    b[unknown] = 0
    c = np.zeros(len(samples), np.uint64)
    c[known] = normalise_cr3_array(samples["guest_cr3"][known])
    return a, b, c


def record_layout(dtype: np.dtype) -> tuple:
    """What KeyTable.lookup_samples reads of a sample record to make sample_keys' words: the record's size, the
    offsets of its fields, the CR3 mask and the flag bits."""
    offset = {name: dtype.fields[name][1] for name in ("flags", "pid", "host_ip", "guest_ip", "guest_cr3")}
    return (dtype.itemsize, *offset.values(), CR3_ADDR_MASK, SAMPLE_GUEST, SAMPLE_HOST_KERNEL, SAMPLE_GUEST_KERNEL,
            SAMPLE_GUEST_UNKNOWN)


def keytable_problem(module: ModuleType | None = None) -> str | None:
    """None when the compiled table is there and of this version, else what is wrong with it, in a few words."""
    module = _keytable if module is None else module
    if module is None:
        return "not built"
    version = getattr(module, "VERSION", None)
    if version != KEYTABLE_VERSION:
        return f"built from another _keytable.c (version {version}, this tree's is {KEYTABLE_VERSION})"
    return None


def keytable() -> ModuleType | None:
    """The compiled table's module when it can be used, else None (the numpy path alone)."""
    return _keytable if keytable_problem() is None else None


class ResolveMemo:
    """The name code of every key resolved so far in one recording (one per streamed report: a key means the same
    only with that recording's processes, VMs and symbols)."""

    def __init__(self, seed: bytes | None = None) -> None:
        """seed: of the table's hash (random unless a test gives one)."""
        module = keytable()
        assert module is not None, "new_memo() makes a memo only with the compiled table"
        self.module = module
        self.seed = os.urandom(module.SEED_BYTES) if seed is None else seed
        self.table = module.KeyTable(self.seed)

    def codes(self, samples: np.ndarray, resolve: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The name code of each sample: from the table, and for the keys it misses resolve(the first sample of
        each, in order: the names new in them are numbered as among all the samples), which are then kept."""
        codes = np.empty(len(samples), np.int64)
        samples = np.ascontiguousarray(samples)
        words = np.empty((3, len(samples)), np.uint64)  # the missed keys' words (those of sample_keys)
        missing = (self.table.lookup_samples(samples.view(np.uint8), record_layout(samples.dtype), codes, *words)
                   if len(samples) else 0)
        if not missing:
            return codes
        miss = np.flatnonzero(codes < 0)
        missed = tuple(words[:, :missing])
        first = np.empty(len(miss), np.int64)
        self.module.first(self.seed, *missed, first)
        is_first = first == np.arange(len(miss))
        resolved = resolve(np.take(samples, miss[is_first])).astype(np.int64, copy=False)
        self.table.insert(*(k[is_first] for k in missed), resolved)
        rank = np.cumsum(is_first) - 1  # of a first sample: its place among them
        codes[miss] = resolved[rank[first]]
        return codes


def new_memo() -> ResolveMemo | None:
    """A memo for one recording; None where the table is not built or is stale."""
    return ResolveMemo() if keytable() is not None else None

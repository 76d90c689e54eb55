"""Symbol tables: sorted address ranges → names, one class for every source (host and guest kallsyms,
ELF files), and the kallsyms parser (host /proc/kallsyms snapshots and guest bundles alike).

Lookups are ``searchsorted`` over the sorted starts: one numpy call per table, never a Python loop per
sample.  kallsyms text is untrusted when it comes from a guest, so its parser is bounded (`Limits`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.resolve import cache
from vmprof_tui.resolve.untrusted import DEFAULT_LIMITS, MAX_NAME, BundleError, Limits, safe_text


@dataclass
class SymbolTable:
    """Sorted function ranges: addresses in [starts[i], ends[i]) belong to names[i].  One class for host
    and guest kallsyms and ELF symbol tables, so every lookup behaves alike."""

    starts: np.ndarray  # uint64, sorted
    ends: np.ndarray  # uint64, exclusive
    names: np.ndarray | cache.PackedNames  # object (str); loaded from the cache: decoded when asked for

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, addrs: np.ndarray) -> np.ndarray:
        """Index of the symbol containing each address, -1 where none does.  Many addresses are looked up once
        each, in order (a binary search for addresses in random order misses the cache at every step)."""
        a = np.asarray(addrs, dtype=np.uint64)
        if len(a) > 4096:
            distinct, inverse = arrays.unique(a, return_inverse=True)
            return self._search(distinct)[inverse]
        return self._search(a)

    def _search(self, a: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.starts, a, side="right").astype(np.int64) - 1
        ok = idx >= 0
        ok[ok] &= a[ok] < self.ends[idx[ok]]
        return np.where(ok, idx, -1)

    @functools.cached_property
    def names_or_unknown(self) -> np.ndarray | cache.PackedNames:
        """Names with '[unknown]' last so that index -1 reads it."""
        if isinstance(self.names, cache.PackedNames):
            return self.names.appended("[unknown]")
        return np.append(self.names, "[unknown]").astype(object)


@dataclass
class KernelSymbols(SymbolTable):
    """Kernel text symbols from a kallsyms text; each ends where the next one starts."""

    modules: np.ndarray  # object (str, "" for the kernel image)

    @functools.cached_property
    def _bracketed_modules(self) -> np.ndarray:
        """'[module]' per symbol, '' for the kernel image and (last) for index -1."""
        return np.array([f"[{m}]" if m else "" for m in self.modules.tolist()] + [""], dtype=object)

    def module_labels(self, idx: np.ndarray, image: str) -> np.ndarray:
        """'[module]' for symbols of modules; `image` for the kernel image and for index -1."""
        labels = self._bracketed_modules[idx]
        labels[labels == ""] = image
        return labels

    def module_label_table(self, image: str) -> np.ndarray:
        """module_labels of every symbol index, -1 (the last entry) included; made once per image."""
        tables = self.__dict__.setdefault("_label_tables", {})
        if image not in tables:
            tables[image] = self.module_labels(np.arange(len(self) + 1), image)
        return tables[image]


# a kernel with no symbols: every address reads [unknown]
EMPTY_KERNEL = KernelSymbols(np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, object),
                             np.empty(0, object))


def parse_kallsyms(data: bytes, limits: Limits = DEFAULT_LIMITS) -> KernelSymbols:
    """Text symbols (t, T, w, W) of a kallsyms text, sorted; BundleError with one line for a malformed one.
    Parsed once per text (resolve/cache.py): later runs load the arrays."""
    if len(data) > limits.max_kallsyms_bytes:
        raise BundleError(f"kallsyms is {len(data)} bytes, over the limit of {limits.max_kallsyms_bytes}")
    lines = int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10)) + 1  # faster than bytes.count
    if lines > limits.max_symbols + 1:
        raise BundleError(f"kallsyms has {lines} lines, over the limit of {limits.max_symbols} symbols")
    return cache.parsed(cache.content_key("kallsyms", data), lambda: _parse_kallsyms(data), _to_arrays, _from_arrays)


def _to_arrays(t: KernelSymbols) -> dict[str, np.ndarray]:
    return {"starts": t.starts, "ends": t.ends, "names": cache.pack_strings(t.names.tolist()),
            "modules": cache.pack_strings(t.modules.tolist())}


def _from_arrays(a: dict[str, np.ndarray]) -> KernelSymbols:
    count = len(a["starts"])
    return KernelSymbols(starts=a["starts"], ends=a["ends"], names=cache.packed_names(a["names"], count),
                         modules=cache.unpack_strings(a["modules"], count))


def _parse_kallsyms(data: bytes) -> KernelSymbols:
    lines = data.split(b"\n")
    addrs: list[int] = []
    names: list[str] = []
    mods: list[str] = []
    for n, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 3 or len(parts[1]) != 1 or len(parts[0]) > 16:
            raise BundleError(f"kallsyms line {n} is not 'ADDRESS TYPE NAME [MODULE]'")
        if parts[1] not in (b"t", b"T", b"w", b"W"):
            continue
        try:
            addr = int(parts[0], 16)
        except ValueError:
            raise BundleError(f"kallsyms line {n}: bad address") from None
        addrs.append(addr)
        names.append(safe_text(parts[2][:MAX_NAME].decode("utf-8", "replace"), MAX_NAME))
        mod = parts[3].strip(b"[]") if len(parts) > 3 else b""
        mods.append(safe_text(mod[:256].decode("utf-8", "replace"), 256))
    a = np.array(addrs, dtype=np.uint64)
    order = np.argsort(a, kind="stable")
    a = a[order]
    ends = np.append(a[1:], a[-1:] + np.uint64(4096))
    return KernelSymbols(starts=a, ends=ends, names=np.array(names, dtype=object)[order],
                         modules=np.array(mods, dtype=object)[order])


def kallsyms_table(text: str, notes: list[str] | None = None) -> KernelSymbols:
    """Text symbols of a host kallsyms dump (the same parser as a guest's); an unreadable one gives none,
    and says why in `notes`."""
    try:
        return parse_kallsyms(text.encode())
    except BundleError as e:
        if notes is not None:
            notes.append(f"host kallsyms unreadable ({e}): host kernel samples show [unknown]")
        return EMPTY_KERNEL

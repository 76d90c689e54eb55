"""Parsed symbol tables kept across runs, under ``$VMPROF_CACHE`` or ``~/.cache/vmprof/symbols``.

A report reads the same kallsyms text and the same ELF files again and again (every recording of a host
carries its kallsyms; every guest bundle of a fleet the same libc); parsing them is most of what a report
costs.  Each parse result is stored once as an ``.npz`` of plain arrays (loaded with
``allow_pickle=False``) named by a SHA-256 hash of the parsed bytes themselves: guest files are hostile,
and a key they declare (a build id, a path) could make one guest's names show up in another's profile
or the host's; a content hash cannot.  (Files a host process maps, at their own paths, are named by their
identity on this machine instead: resolve/elf.py read_elf_symbols.)  Only successful parses are stored,
so an unreadable file fails every time with the same line.  The folder is bounded (the least recently used
entries beyond `MAX_ENTRIES` go: a load marks an entry used), and a cache that cannot be read or written is
no error: the table is parsed as if there were none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
MAX_ENTRIES = 256
VERSION = 1  # of the stored layout: bump when a parser's output changes


def cache_dir() -> Path:
    root = os.environ.get("VMPROF_CACHE") or Path.home() / ".cache" / "vmprof"
    return Path(root) / "symbols"


class SameBytes(Generic[T]):
    """Values made from large contents, found again by contents equal byte for byte (compared, not hashed), the
    last ones up to `held` bytes in all.  Thread-safe: the TUI's workers and `vmprof analyze`'s threads share one
    (the lock guards the dict and its running byte total; the comparison runs outside it)."""

    def __init__(self, held: int) -> None:
        self.held = held
        self._lock = threading.Lock()
        self._items: dict[tuple[str, int, bytes, bytes], tuple[bytes, T]] = {}
        self._bytes = 0  # of the contents held

    @staticmethod
    def _probe(kind: str, data: bytes | memoryview) -> tuple[str, int, bytes, bytes]:
        return kind, len(data), bytes(data[:64]), bytes(data[-64:])

    def get(self, kind: str, data: bytes | memoryview) -> T | None:
        with self._lock:
            seen = self._items.get(self._probe(kind, data))
        return seen[1] if seen is not None and seen[0] == data else None

    def put(self, kind: str, data: bytes | memoryview, value: T) -> None:
        if len(data) > self.held:
            return
        probe = self._probe(kind, data)
        data = data if isinstance(data, bytes) else bytes(data)
        with self._lock:
            if (old := self._items.pop(probe, None)) is not None:
                self._bytes -= len(old[0])
            while self._items and self._bytes + len(data) > self.held:
                oldest = self._items.pop(next(iter(self._items)))
                self._bytes -= len(oldest[0])
            self._items[probe] = (data, value)
            self._bytes += len(data)

    def held_bytes(self) -> int:
        with self._lock:
            return self._bytes


def content_key(kind: str, data: bytes | memoryview) -> str:
    # SHA-256: collision-resistant (guests are hostile and share the cache), and on CPUs with SHA extensions
    # faster than BLAKE2 (docs/performance.md)
    big = len(data) >= SAME_BYTES_MIN
    # VMs of one image carry the same kallsyms and libraries: compared byte for byte, not hashed again
    if big and (seen := _recent.get(kind, data)) is not None:
        return seen
    key = f"{kind}-v{VERSION}-{hashlib.sha256(data).hexdigest()[:32]}"
    if big:
        _recent.put(kind, data, key)
    return key


SAME_BYTES_MIN = 1 << 20  # contents this large are remembered with their key (content_key), the last ones ...
SAME_BYTES_HELD = 64 << 20  # ... up to this many bytes
_recent: SameBytes[str] = SameBytes(SAME_BYTES_HELD)


def parsed(key: str, parse: Callable[[], T], to_arrays: Callable[[T], dict[str, np.ndarray]],
           from_arrays: Callable[[dict[str, np.ndarray]], T]) -> T:
    """parse() once per key: made once in this process (20 guest bundles with one libc share one table),
    else read from the cache folder, else parsed and stored there."""
    with _made_lock:
        if key in _made:
            return _made[key]
    arrays = load(key)
    made = None
    if arrays is not None:
        try:
            made = from_arrays(arrays)
        except (KeyError, ValueError, IndexError):
            made = None
    if made is None:
        made = parse()
        store(key, to_arrays(made))
    with _made_lock:
        if len(_made) >= 64 and key not in _made:
            _made.pop(next(iter(_made)))
        _made[key] = made
    return made


_made: dict[str, Any] = {}
_made_lock = threading.Lock()


def load(key: str) -> dict[str, np.ndarray] | None:
    path = cache_dir() / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    with contextlib.suppress(OSError):  # used now: store() evicts the least recently used (the tables every report
        os.utime(path)                  # reads stay)
    return arrays


def store(key: str, arrays: dict[str, np.ndarray]) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, folder / f"{key}.npz")  # readers never see half a file
        entries = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def pack_strings(names: list[str]) -> np.ndarray:
    """Strings as one uint8 array (NUL-separated; names never hold NUL: they pass safe_text)."""
    return np.frombuffer("\0".join(names).encode("utf-8", "surrogatepass"), np.uint8)


class PackedNames:
    """A symbol table's names as stored (pack_strings), each decoded when asked for: the tables of a busy host's
    libraries hold hundreds of thousands of names, of which a recording's samples hit a few thousand, and making a
    str of each was most of loading them.  Indexed as the object array it stands for (an int, an array of indices
    or a mask); tolist() and iteration decode them all.  `last`: one more name after the stored ones (appended)."""

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray, last: str | None = None) -> None:
        self._data, self._starts, self._ends = data, starts, ends  # stored name i is data[starts[i]:ends[i]]
        self._last = last

    def appended(self, name: str) -> PackedNames:
        """These names and `name` last (without copying them)."""
        assert self._last is None
        return PackedNames(self._data, self._starts, self._ends, name)

    def __len__(self) -> int:
        return len(self._starts) + (self._last is not None)

    def _one(self, i: int) -> str:
        return self._data[self._starts[i]:self._ends[i]].decode("utf-8", "surrogatepass")

    def __getitem__(self, index: int | np.integer | np.ndarray) -> str | np.ndarray:
        n, stored = len(self), len(self._starts)
        if isinstance(index, (int, np.integer)):
            i = int(index) + n if index < 0 else int(index)
            if not 0 <= i < n:
                raise IndexError(f"index {index} is out of bounds for {n} names")
            return self._last if i == stored and self._last is not None else self._one(i)
        index = np.asarray(index)
        flat = np.flatnonzero(index) if index.dtype == bool else index.ravel()
        flat = np.where(flat < 0, flat + n, flat)
        if len(flat) and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"an index is out of bounds for {n} names")
        is_last = flat == stored  # only where there is a last name
        at = np.where(is_last, 0, flat)
        data = self._data
        out = np.empty(len(flat), object)
        out[:] = [data[a:b].decode("utf-8", "surrogatepass")
                  for a, b in zip(self._starts[at].tolist(), self._ends[at].tolist(), strict=True)]
        out[is_last] = self._last
        return out if index.dtype == bool else out.reshape(index.shape)

    def tolist(self) -> list[str]:
        names = self._data.decode("utf-8", "surrogatepass").split("\0") if len(self._starts) else []
        return names + [self._last] if self._last is not None else names

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())


def packed_names(packed: np.ndarray, count: int) -> PackedNames | np.ndarray:
    """unpack_strings(packed, count), its names decoded when asked for (PackedNames); ValueError where they are not
    `count` names of UTF-8 (a damaged entry: parsed again)."""
    if count == 0:
        return np.empty(0, object)
    data = packed.tobytes()
    if not data.isascii():  # what is decoded later must decode now
        data.decode("utf-8", "surrogatepass")
    ends = np.flatnonzero(packed == 0)
    if len(ends) != count - 1:
        raise ValueError("cached names do not match their table")
    return PackedNames(data, np.concatenate(([0], ends + 1)), np.append(ends, len(data)))


def unpack_strings(packed: np.ndarray, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, object)
    names = packed.tobytes().decode("utf-8", "surrogatepass").split("\0")
    if len(names) != count:
        raise ValueError("cached names do not match their table")
    return np.array(names + [None], dtype=object)[:-1]

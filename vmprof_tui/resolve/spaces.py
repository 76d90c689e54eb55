"""Address spaces: which object file a sampled address falls in, and its function there.

Host processes come from the recording's maps snapshots (`parse_proc_maps`), guest processes from
guest bundles (`guest_symbols`: normalised CR3 → process → its executable mappings).  Every object
file is read once through the hardened ELF reader (`ObjectCache`); a host object whose build id the snapshot
names is read from the symbol table `vmprof agent` stored for that build id, else from this machine's file
only if it is the same build.  Lookups are ``searchsorted``
over sorted address tables: one numpy call per (process, mapping), never a Python loop per sample.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from collections.abc import Mapping as MappingOf
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from vmprof_tui.arrays import group_by
from vmprof_tui.mapping import Mapping
from vmprof_tui.resolve import cache
from vmprof_tui.resolve.bundle import GuestBundle, load_bundle
from vmprof_tui.resolve.elf import ElfSymbols, read_elf_symbols
from vmprof_tui.resolve.object_table import decode_object_table
from vmprof_tui.resolve.symtab import EMPTY_KERNEL, KernelSymbols
from vmprof_tui.resolve.untrusted import BundleError


class ObjectCache:
    """ELF symbol tables by file, read once, through the hardened reader of guest bundles
    (host files get the same limits: a corrupt library must not stop an analysis)."""

    def __init__(self) -> None:
        self._cache: dict[str, ElfSymbols | None] = {}
        self._spaces: dict[tuple, AddressSpace] = {}
        self._tables: dict[str, bytes | ElfSymbols | None] = {}  # build id -> stored table, decoded once used
        self._host_paths: set[str] = set()  # files host processes map: cached by identity (read_elf_symbols)
        self.notes: list[str] = []  # taken by Resolver.resolve
        # each note's place in one walk over every sample (Resolver._spaces_ids: by space, then mapping), so that
        # notes met a piece at a time are put in the order of the whole read (analyse/stream.py)
        self.places: dict[str, tuple] = {}
        self._why: dict[str, str] = {}  # the note of a file or stored table that could not be read, by its key

    def add_tables(self, tables: MappingOf[str, bytes]) -> None:
        """Host objects' symbol tables by build id, as a `vmprof agent` window references them."""
        for build_id, data in tables.items():
            self._tables.setdefault(build_id, data)

    def host_space(self, name: str, pid: int, maps_text: str, build_ids: MappingOf[str, str] | None = None
                   ) -> AddressSpace:
        """The address space of a host process from its maps snapshot, parsed once per snapshot."""
        key = (name, pid, maps_text, tuple(sorted((build_ids or {}).items())))
        if key not in self._spaces:
            if len(self._spaces) >= 1024:  # the live screen meets ever new processes: forget the oldest
                del self._spaces[next(iter(self._spaces))]
            maps = [replace(m, build_id=(build_ids or {}).get(m.path)) for m in parse_proc_maps(maps_text)]
            self._host_paths.update(str(m.object_path) for m in maps if m.object_path is not None)
            self._spaces[key] = AddressSpace(name, pid, maps)
        return self._spaces[key]

    def symbols(self, m: Mapping) -> ElfSymbols | None:
        """The symbols of what mapping `m` maps: the stored table of its build id, else the file at its path
        unless that is another build (it would name the wrong functions)."""
        if m.build_id is not None and m.build_id in self._tables:
            table = self._tables[m.build_id]
            if isinstance(table, bytes):
                try:
                    table = decode_object_table(table, m.build_id)
                except BundleError as e:
                    self._note(f"{e}: samples in {m.path} show [unknown]", m.build_id)
                    table = None
                self._tables[m.build_id] = table
            return table
        obj = self.get(m.object_path) if m.object_path is not None else None
        if obj is not None and m.build_id is not None and obj.build_id != m.build_id:
            self._note(_other_build(m, obj))
            return None
        return obj

    def place(self, m: Mapping, key: tuple) -> None:
        """Mapping `m`, whose symbols are None, was met at `key` of the walk: the note about its file (if any) is
        placed at the first such key."""
        if m.build_id is not None and m.build_id in self._tables:
            note = self._why.get(m.build_id)
        elif m.object_path is None:
            return
        elif (obj := self._cache.get(str(m.object_path))) is None:
            note = self._why.get(str(m.object_path))
        else:
            note = _other_build(m, obj) if m.build_id is not None and obj.build_id != m.build_id else None
        if note is not None and key < self.places.get(note, key + (1,)):
            self.places[note] = key

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Reads whose notes go to no one (a streamed report's call stacks, analyse/stream_callgraph.py): their
        notes are dropped, and a file or table that failed is forgotten, so that resolving samples later notes it
        as the read of the whole recording does (its call stacks are resolved after its samples)."""
        notes, cached, places = list(self.notes), set(self._cache), dict(self.places)
        tables = {k: v for k, v in self._tables.items() if isinstance(v, bytes)}
        try:
            yield
        finally:
            self.notes[:] = notes
            self.places = places
            for key in set(self._cache) - cached:
                if self._cache[key] is None:
                    del self._cache[key]
            for key, data in tables.items():
                if self._tables[key] is None:
                    self._tables[key] = data

    def _note(self, text: str, key: str | None = None) -> None:
        """key: the file's or stored table's (place)."""
        if key is not None:
            self._why[key] = text
        if text not in self.notes and len(self.notes) < 100:
            self.notes.append(text)

    def get(self, path: Path) -> ElfSymbols | None:
        key = str(path)
        if key not in self._cache:
            try:
                self._cache[key] = read_elf_symbols(path, host=key in self._host_paths)
            except BundleError as e:  # a broken symbol table: its samples show [unknown], and the note says why
                self._cache[key] = None
                self._note(f"{e}: samples in {Path(path).name} show [unknown]", key)
            except OSError:  # not on this machine (a host file gone since): its addresses stay [unknown]
                self._cache[key] = None
        return self._cache[key]


def _other_build(m: Mapping, obj: ElfSymbols) -> str:
    return (f"{m.path} here is build {obj.build_id}, not the sampled build {m.build_id}, and no stored symbol table "
            "has it: its samples show [unknown]")


@dataclass
class AddressSpace:
    """The executable mappings of one process (host or guest)."""
    name: str
    pid: int | None
    maps: list[Mapping] = field(default_factory=list)

    @cached_property
    def _sorted_maps(self) -> tuple[list[Mapping], np.ndarray, np.ndarray]:
        maps = sorted(self.maps, key=lambda m: m.start)
        return maps, np.array([m.start for m in maps], np.uint64), np.array([m.end for m in maps], np.uint64)

    def user_maps(self) -> list[Mapping]:
        """The mappings locate searches, in its order."""
        return self._user_maps[0]

    @cached_property
    def _user_maps(self) -> tuple[list[Mapping], np.ndarray, np.ndarray]:
        """_sorted_maps below USER_LIMIT (what locate searches; a process is met again every second)."""
        maps, starts, ends = self._sorted_maps
        low = np.flatnonzero(ends <= USER_LIMIT)
        return [maps[i] for i in low.tolist()], starts[low], ends[low]

    def hits(self, ips: np.ndarray, objects: ObjectCache) -> Iterator[tuple[np.ndarray, Mapping,
                                                                         ElfSymbols | None, np.ndarray | None]]:
        """For each mapping some of `ips` fall in: (their positions in ips, the mapping, its file's symbols or
        None, the symbol index of each, -1 where none)."""
        maps, starts, ends = self._sorted_maps
        if not maps or not len(ips):
            return
        which = np.searchsorted(starts, ips, side="right").astype(np.int64) - 1
        inside = which >= 0
        inside[inside] = ips[inside] < ends[which[inside]]
        for mi, at in group_by(which, np.nonzero(inside)[0]):  # only the mappings that were hit
            m = maps[mi]
            obj = objects.symbols(m)
            yield at, m, obj, (obj.lookup(obj.link_addrs(m, ips[at])) if obj is not None else None)

    def resolve(self, ips: np.ndarray, objects: ObjectCache) -> tuple[list[str], list[str]]:
        """(function, module) for each ip; '[unknown]' where unresolved."""
        functions = np.full(len(ips), "[unknown]", dtype=object)
        modules = np.full(len(ips), "[unknown]", dtype=object)
        for at, m, obj, sym in self.hits(ips, objects):
            modules[at] = m.module_name
            if obj is not None:
                functions[at] = obj.names_or_unknown[sym]
        return functions.tolist(), modules.tolist()


USER_LIMIT = 1 << 47  # x86-64 user addresses (4-level paging) lie below this: 17 bits are left for a space's rank
MAX_SPACES = 1 << 17  # so locate() searches the addresses of at most this many address spaces at once


def locate(spaces: list[AddressSpace], which: np.ndarray, ips: np.ndarray) -> tuple[list[Mapping], np.ndarray]:
    """The mapping of each user address, for the addresses of many address spaces at once (`which`: the index in
    `spaces` of each address's space): one binary search over every space's mappings keyed (space, start), not one
    per space (a 64-CPU host has hundreds of processes in each second's samples).  Returns (the mappings, the
    index among them of each address's mapping, -1 where none holds it; an address at or above USER_LIMIT, or any
    address of more than MAX_SPACES spaces, is left to AddressSpace.hits, -1 here too)."""
    parts = [space._user_maps for space in spaces]
    maps = [m for user_maps, _starts, _ends in parts for m in user_maps]
    at = np.full(len(ips), -1, np.int64)
    if not maps or len(spaces) > MAX_SPACES:
        return maps, at
    # one concatenation for every space (numpy calls per space cost more than the search: thousands a second)
    own = np.repeat(np.arange(len(spaces), dtype=np.int64), [len(starts) for _maps, starts, _ends in parts])
    key = own.astype(np.uint64) << np.uint64(47) | np.concatenate([starts for _maps, starts, _ends in parts])
    end = np.concatenate([ends for _maps, _starts, ends in parts])
    user = np.flatnonzero(ips < USER_LIMIT)
    ip = ips[user].astype(np.uint64)
    found = np.searchsorted(key, which[user].astype(np.uint64) << np.uint64(47) | ip, side="right") - 1
    k = found.clip(0)
    ok = (found >= 0) & (own[k] == which[user]) & (ip < end[k])
    at[user[ok]] = found[ok]
    return maps, at


def parse_proc_maps(text: str) -> list[Mapping]:
    """Executable file mappings of a /proc/PID/maps text."""
    out = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5].replace(" (deleted)", "")
        obj = Path(path) if path.startswith("/") else None
        out.append(Mapping(lo, hi, int(parts[2], 16), path, obj, perms=parts[1]))
    return out


@dataclass
class GuestSymbols:
    """What one guest bundle tells: CR3 -> process, each process's mappings, guest kernel symbols."""
    vm: str
    processes: dict[int, AddressSpace]  # normalised CR3 -> process
    kernel: KernelSymbols
    note: str | None = None  # why the bundle could not be used
    bundle: GuestBundle | None = None  # kept open: a tar bundle's objects live in its folder


# Bundles loaded from a recording's bytes, the last ones up to BUNDLE_BYTES_HELD: VMs of one image store the same
# bundle, which is then extracted once (its objects, at one path, are read once by the ObjectCache too).  An extraction
# folder goes when its bundle is evicted and no GuestSymbols holds it, else at exit (bundle.py's finalizer).
BUNDLE_BYTES_HELD = 64 << 20
_bundles: cache.SameBytes[GuestBundle] = cache.SameBytes(BUNDLE_BYTES_HELD)


def _extracted_whole(b: GuestBundle) -> bool:
    """Whether every object file of a bundle's extraction is still there (a tmp cleaner may remove files and leave
    the folder: its samples would turn [unknown] with no note)."""
    paths = [m.object_path for p in b.processes for m in p.maps]
    paths.append(b.kernel.object_path if b.kernel is not None else None)
    return b.root.is_dir() and all(path.is_file() for path in paths if path is not None)


def _same_bundle(source: bytes) -> GuestBundle | None:
    """The bundle loaded from bytes equal to `source` (compared whole), if one is remembered and whole (a bundle
    closed since, or whose files were removed, is loaded again)."""
    seen = _bundles.get("bundle", source)
    return seen if seen is not None and _extracted_whole(seen) else None


def guest_symbols(vm: str, source: Path | bytes) -> GuestSymbols:
    """Guest symbols from a bundle folder/tar path or from tar bytes stored in a recording."""
    try:
        if isinstance(source, bytes):
            b = _same_bundle(source)
            if b is None:
                with tempfile.NamedTemporaryFile(suffix=".tar") as f:
                    f.write(source)
                    f.flush()
                    b = load_bundle(Path(f.name))
                _bundles.put("bundle", source, b)
        else:
            b = load_bundle(Path(source))
    except (BundleError, OSError) as e:
        return GuestSymbols(vm, {}, EMPTY_KERNEL, note=f"guest bundle of {vm} rejected: {e}")
    # Two processes running the same program are told apart: prog(1), prog(2)
    counts: dict[str, int] = {}
    for p in b.processes:
        counts[p.name] = counts.get(p.name, 0) + 1
    seen: dict[str, int] = {}
    processes: dict[int, AddressSpace] = {}
    for p in b.processes:
        name = p.name
        if counts[name] > 1:
            seen[name] = seen.get(name, 0) + 1
            name = f"{name}({seen[name]})"
        # the bundle's build ids are not the host snapshot's, which symbols() checks a file against
        maps = [replace(m, build_id=None) for m in p.maps if m.executable]
        space = AddressSpace(name, p.pid, maps)
        for cr3 in p.cr3:
            if cr3 not in processes or not p.exited:  # live processes win over exited ones with a reused CR3
                processes[cr3] = space
    kernel = b.kernel.symbols if b.kernel is not None and b.kernel.symbols is not None else EMPTY_KERNEL
    note = "; ".join(b.notes) if b.notes else None
    return GuestSymbols(vm, processes, kernel, note=None, bundle=b) if not note else \
        GuestSymbols(vm, processes, kernel, note=f"guest bundle of {vm}: {note}", bundle=b)

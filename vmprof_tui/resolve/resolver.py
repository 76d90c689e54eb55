"""Per-sample resolution: every sample's function, module, process and pid, and integer codes for them.

record → **resolve** → analyse: `Resolver.resolve` takes a samples array (SAMPLE_DTYPE), the host
processes' snapshots, which VM each VMM pid is, and the host kallsyms text, and returns a `Resolved`
(one entry per sample, in the order given).  The symbol sources it reads (host ELF files, guest
bundles, kallsyms) and the name codes are kept in the `Resolver` across calls, so the live screen
resolves each drained chunk once and a recording's analysis resolves all samples at once, through
the same code.

| sample | function | module | process |
|---|---|---|---|
| host kernel | host kallsyms | `[kernel.kallsyms]` or `[module]` | comm (`swapper` for pid 0) |
| host user | ELF symbols of the mapped file | file name | comm |
| guest kernel | the bundle's guest kallsyms | `[guest.kallsyms]` or `[module]` | by CR3 |
| guest user | bundle: CR3 → process → mapping → object | object name | guest process |
| guest RIP unknown | `[unknown]` | `(guest RIP unknown)` | by CR3 |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.arrays import group_by
from vmprof_tui.record.bpf_records import SAMPLE_GUEST, SAMPLE_GUEST_KERNEL, SAMPLE_GUEST_UNKNOWN, SAMPLE_HOST_KERNEL
from vmprof_tui.resolve import spaces
from vmprof_tui.resolve.bundle_format import normalise_cr3_array
from vmprof_tui.resolve.elf import ET_EXEC, ElfSymbols
from vmprof_tui.resolve.memo import ResolveMemo
from vmprof_tui.resolve.spaces import (
    MAX_SPACES,
    USER_LIMIT,
    AddressSpace,
    GuestSymbols,
    ObjectCache,
    guest_symbols,
    locate,
)
from vmprof_tui.resolve.symtab import EMPTY_KERNEL, KernelSymbols, kallsyms_table

KERNEL_MODULE = "[kernel.kallsyms]"
GUEST_KERNEL_MODULE = "[guest.kallsyms]"
UNKNOWN = "[unknown]"


class NameCodes:
    """Integer codes for (process, pid, function, module) and for (process, pid), kept across analyses: the
    live screen encodes each new chunk once, and a refresh then groups integers instead of strings.

    (process, pid) pairs are few: a dict.  Names are many (millions over a long session on a large host), so
    their codes live in numpy: each name as one int64 (its process code and the StringTable ids of its function
    and module, ID_BITS each), looked up with searchsorted in two sorted tables: the names of the session so far,
    and the recent ones.  New names go into the small recent table, which is merged into the large one once it
    holds an eighth as many: a chunk's new names cost what they are, not a copy of every name known."""

    ID_BITS = 21
    RECENT_MIN = 1 << 16  # names the recent table holds before it is merged, at least

    def __init__(self) -> None:
        self.procs: dict[tuple, int] = {}
        self.process_names: dict[str, int] = {}  # the code of each process name (rows sum by it)
        self.keys = np.empty(0, np.int64)  # sorted
        self.codes = np.empty(0, np.int32)  # the code of each key (int32: a name costs 12 bytes here)
        self._recent_keys = np.empty(0, np.int64)  # sorted, none in `keys`
        self._recent_codes = np.empty(0, np.int32)
        self._fallback: dict[tuple[int, int, int], int] = {}  # past 2**ID_BITS names or processes

    def __len__(self) -> int:
        """How many names have codes."""
        return len(self._fallback) or len(self.keys) + len(self._recent_keys)

    def encode(self, proc_code: np.ndarray, func: np.ndarray, module: np.ndarray) -> np.ndarray:
        """The code of each sample's name (its proc code, function and module string ids); names not seen
        before are numbered in the order of their first sample, as a walk over the samples would."""
        return self.encode_new(proc_code, func, module)[0]

    def encode_new(self, proc_code: np.ndarray, func: np.ndarray,
                   module: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """encode, and the positions of a sample of each name not seen before (RowNames records their names)."""
        limit = 1 << self.ID_BITS
        if self._fallback or max(len(self.procs), int(func.max(initial=0)) + 1, int(module.max(initial=0)) + 1) > limit:
            known = len(self)
            code = self._encode_slowly(proc_code, func, module)
            return code, np.flatnonzero(code >= known)
        # distinct names found on a key as narrow as the ids are (a faster sort: arrays.unique), then keyed as stored
        f_bits, m_bits = (int(a.max(initial=0)).bit_length() for a in (func, module))
        narrow = (proc_code << f_bits + m_bits) | (func.astype(np.int64) << m_bits) | module
        _narrow, first, inverse = arrays.unique(narrow, return_index=True, return_inverse=True)
        uniq = (proc_code[first] << 2 * self.ID_BITS) | (func[first].astype(np.int64) << self.ID_BITS) | module[first]
        code = np.full(len(uniq), -1, np.int64)
        for keys, codes in ((self.keys, self.codes), (self._recent_keys, self._recent_codes)):
            if len(keys):
                pos = np.searchsorted(keys, uniq).clip(max=len(keys) - 1)
                hit = keys[pos] == uniq
                code[hit] = codes[pos[hit]]
        new = np.flatnonzero(code < 0)
        code[new[np.argsort(first[new], kind="stable")]] = len(self) + np.arange(len(new))
        at = np.searchsorted(self._recent_keys, uniq[new])  # uniq is sorted: merged where they belong
        self._recent_keys = np.insert(self._recent_keys, at, uniq[new])
        self._recent_codes = np.insert(self._recent_codes, at, code[new])
        if len(self._recent_keys) > max(len(self.keys) // 8, self.RECENT_MIN):
            self._merge()
        return code[inverse], first[new]

    def _merge(self) -> None:
        # room for both tables first (where it can fail), then both filled: never one merged and the other not
        n = len(self.keys) + len(self._recent_keys)
        keys, codes = arrays.with_room(self.keys, n), arrays.with_room(self.codes, n)
        at = np.searchsorted(keys, self._recent_keys)
        self.keys = arrays.insert_in_place(keys, at, self._recent_keys)
        self.codes = arrays.insert_in_place(codes, at, self._recent_codes)
        self._recent_keys, self._recent_codes = self._recent_keys[:0], self._recent_codes[:0]

    def _encode_slowly(self, proc_code: np.ndarray, func: np.ndarray, module: np.ndarray) -> np.ndarray:
        """Per sample, through a dict (once the ids outgrow ID_BITS: then every later call comes here)."""
        if not self._fallback:  # the names coded so far, as the dict's keys
            self._merge()
            bits, mask = self.ID_BITS, (1 << self.ID_BITS) - 1
            self._fallback = {(k >> 2 * bits, (k >> bits) & mask, k & mask): c
                              for k, c in zip(self.keys.tolist(), self.codes.tolist(), strict=True)}
        names = self._fallback
        return np.fromiter((names.setdefault(k, len(names)) for k in zip(proc_code.tolist(), func.tolist(),
                                                                          module.tolist(), strict=True)),
                           np.int64, len(proc_code))


class StringTable:
    """Names as small integers while resolving (id 0 is ""), kept across calls; strings are made per sample
    only at the end, by one fancy index into `array()`."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self._ids: dict[str, int] = {"": 0}
        self._array: np.ndarray | None = None
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(names) -> (names, id of each, -1: not yet)

    def __len__(self) -> int:
        return len(self.strings)

    def intern(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.strings)
            self.strings.append(name)
        return i

    def ids(self, names: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The ids of names[index] (index -1: the last name).  Each array of names (a symbol table) keeps the ids
        of the names interned so far, so a later call (the live screen's next chunk) interns only names it had not
        hit; those are found through a table as long as `names`, not a sort of the index (millions of samples)."""
        known, table = self._tables.get(id(names), (None, None))
        if known is not names or table is None:
            table = np.full(len(names), -1, np.int32)
            self._tables[id(names)] = (names, table)
        ids = table[index]
        missing = ids < 0
        if missing.any():
            hit = np.zeros(len(names), bool)
            hit[index[missing]] = True
            used = np.flatnonzero(hit)
            table[used] = [self.intern(x) for x in names[used].tolist()]
            ids = table[index]
        return ids

    def array(self) -> np.ndarray:
        """All strings as an object array, index = id."""
        if self._array is None or len(self._array) != len(self.strings):
            self._array = np.array(self.strings + [None], dtype=object)[:-1]  # the None keeps it 1-d of str
        return self._array


class RowNames:
    """The names of every name code (NameCodes) given so far: function, module and process as StringTable ids, the
    code of the process name, the pid and the code of the process and pid, as arrays by code.  What the live screen's
    row sums carry is codes and counts only; names are looked up here for the rows a screen shows (names per row
    merged every second were most of summing a 64-CPU window).

    By code only the function, module and process code are kept (a long recording has over a million names), as
    uint16 while their ids fit (6 bytes a name: string ids and processes number thousands), else int32; the
    process, its name's code and the pid are the process code's, kept by it (processes are few)."""

    FIELDS = ("func", "module", "process", "process_name_code", "pid", "proc_code")
    BY_CODE = ("func", "module", "proc_code")
    GROWTH = 1.25  # capacity grown by a quarter: a name costs its 6 bytes, not up to twice that

    def __init__(self, strings: StringTable) -> None:
        self.strings = strings
        self._columns = {f: np.zeros(1024, np.uint16) for f in self.BY_CODE}
        self._by_proc = {f: np.zeros(64, np.int32) for f in self.FIELDS if f not in self.BY_CODE}

    def add(self, codes: np.ndarray, **columns: np.ndarray) -> None:
        """The names of `codes` (each column an array as long; a code may repeat, with the same names)."""
        if not len(codes):
            return
        self._columns = _grown(self._columns, int(codes.max()) + 1, self.GROWTH)
        for f, a in self._columns.items():
            if a.dtype == np.uint16 and not 0 <= columns[f].min() <= columns[f].max() <= NARROW_MAX:
                a = self._columns[f] = arrays.widened(a, np.int32)
            a[codes] = columns[f]
        procs = columns["proc_code"]
        self._by_proc = _grown(self._by_proc, int(procs.max()) + 1, 2)
        for f, a in self._by_proc.items():
            a[procs] = columns[f]

    def ids(self, codes: np.ndarray, column: str) -> np.ndarray:
        """A column of `codes` (string ids, codes or pids), as int32."""
        if column in self._columns:
            return self._columns[column][codes].astype(np.int32, copy=False)
        return self._by_proc[column][self._columns["proc_code"][codes]]

    def of_processes(self, column: str) -> np.ndarray:
        """A column of the process codes (process, process_name_code or pid), index = process code."""
        return self._by_proc[column]

    def unknown(self, codes: np.ndarray) -> np.ndarray:
        """Whether the function of each code is unresolved."""
        return self._columns["func"][codes] == self.strings.intern(UNKNOWN)

    def strings_of(self, codes: np.ndarray, column: str) -> np.ndarray:
        """A name column of `codes` as strings."""
        return self.strings.array()[self.ids(codes, column)]


NARROW_MAX = (1 << 16) - 1  # the largest id RowNames keeps by code in a uint16


def _grown(columns: dict[str, np.ndarray], size: int, growth: float) -> dict[str, np.ndarray]:
    """Columns at least `size` long, grown by `growth` times at least (zeros past the old ones; in pages of
    their own with room ahead once large, arrays.longer)."""
    have = len(next(iter(columns.values())))
    if size <= have:
        return columns
    grown = max(size, int(have * growth))
    return {f: arrays.longer(a, grown) for f, a in columns.items()}


def _column(name: str, strings: bool = False) -> property:
    """A per-sample column of Resolved: RowNames' column `name` of each sample's code (as strings: the names)."""
    def read(resolved: Resolved) -> np.ndarray:
        of = resolved.names.strings_of if strings else resolved.names.ids
        return of(resolved.name_code, name)
    return property(read)


@dataclass
class Resolved:
    """Per-sample names as NameCodes (`name_code`), read from the resolver's names of each code (`names`): the
    function, module and process, the pid (-1 when none), and the codes of the process and pid and of the process
    name.  Each column is made per sample when read (a streamed piece reads only the codes)."""
    name_code: np.ndarray
    names: RowNames

    func, module, process = (_column(c, strings=True) for c in ("func", "module", "process"))
    proc_pid, proc_code, process_name_code = (_column(c) for c in ("pid", "proc_code", "process_name_code"))

    def unresolved(self) -> np.ndarray:
        """Whether each sample's function is unresolved."""
        return self.names.unknown(self.name_code)

    def take(self, index: np.ndarray) -> Resolved:
        return Resolved(self.name_code[index], self.names)

    @staticmethod
    def concatenate(parts: list[Resolved]) -> Resolved:
        """Names resolved by one resolver (their codes are its own)."""
        assert all(p.names is parts[0].names for p in parts)
        return Resolved(np.concatenate([p.name_code for p in parts]), parts[0].names)


@dataclass
class Resolver:
    """Symbol sources and name codes kept across calls (the live screen resolves a new chunk every second;
    codes must stay the same for the samples of earlier chunks still in its window)."""
    objects: ObjectCache = field(default_factory=ObjectCache)
    guests: dict[str, GuestSymbols] = field(default_factory=dict)
    kallsyms: KernelSymbols | None = None
    codes: NameCodes = field(default_factory=NameCodes)
    strings: StringTable = field(default_factory=StringTable)
    # id of a mapping -> (the mapping, its module's string id, its file's symbols, address -> file offset): the
    # live screen meets the same thousands of mappings every second (the mapping is held so its id stays its own)
    _mappings: dict[int, tuple[spaces.Mapping, int, ElfSymbols | None, int]] = field(default_factory=dict, repr=False)
    row_names: RowNames = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.row_names = RowNames(self.strings)

    def load_guests(self, vms: Iterable[str], explicit: Mapping[str, Path],
                    stored: Mapping[str, bytes]) -> list[str]:
        """Guest symbols for each VM name, from a bundle given by the user (`explicit`), else one stored
        with the recording; returns the notes to show (a rejected or missing bundle costs only its VM).
        A VM whose bundle was loaded before is not loaded again."""
        notes = []
        for name in vms:
            if name in self.guests and self.guests[name].bundle is not None:
                continue
            if name in explicit:
                g = guest_symbols(name, explicit[name])
            elif name in stored:
                g = guest_symbols(name, stored[name])
            else:
                g = GuestSymbols(name, {}, EMPTY_KERNEL,
                                 note=f"no guest bundle for VM {name}: its guest samples show raw addresses "
                                      f"(give one with --guest-bundle {name}=PATH)")
            if g.note:
                notes.append(g.note)
            self.guests[name] = g
        return notes

    def resolve(self, samples: np.ndarray, processes: Mapping[int, dict], vm_of_pid: Mapping[int, str],
                kallsyms: str | None = None, notes: list[str] | None = None, memo: ResolveMemo | None = None
                ) -> Resolved:
        """Names of `samples`.  processes: host pid → its snapshot (comm, maps); vm_of_pid: VMM pid → VM
        name (guests are looked up by name among those load_guests loaded); kallsyms: the host's kallsyms
        text, None to keep the one already parsed (an unreadable one is noted in `notes`).  memo: the codes of
        the keys resolved before, of a recording read a piece at a time with these processes and VMs (memo.py):
        only the samples it misses are resolved.

        Samples are grouped by process (host pid; guest VMM pid and CR3) with one sort; each group's
        addresses are looked up with one searchsorted per symbol table, and names are string ids
        (`StringTable`) until the end: Python work per group and per distinct name, never per sample."""
        if self.kallsyms is None or kallsyms is not None:
            self.kallsyms = kallsyms_table(kallsyms or "", notes)

        def codes(s: np.ndarray) -> np.ndarray:
            return self._name_codes(s, processes, vm_of_pid, notes)

        return Resolved(memo.codes(samples, codes) if memo is not None else codes(samples), self.row_names)

    def _name_codes(self, samples: np.ndarray, processes: Mapping[int, dict], vm_of_pid: Mapping[int, str],
                    notes: list[str] | None) -> np.ndarray:
        """The name code of each sample (resolve), its names added to row_names."""
        s = samples
        n = len(s)
        st = self.strings
        unknown_id = st.intern(UNKNOWN)
        func = np.full(n, unknown_id, np.int32)
        module = np.full(n, unknown_id, np.int32)
        flags = s["flags"]
        guest = (flags & SAMPLE_GUEST) != 0
        kernel = ~guest & ((flags & SAMPLE_HOST_KERNEL) != 0)
        if kernel.any():
            self._kernel_ids(self.kallsyms, s["host_ip"], np.nonzero(kernel)[0], KERNEL_MODULE, func, module)
        groups = _Groups(n)  # (process, pid) of every sample, a group at a time
        pids = s["pid"]
        # host samples by process: Python per process, numpy per sample
        host = np.flatnonzero(~guest)
        upids, first, inverse = arrays.unique(pids[host], return_index=True, return_inverse=True)
        with_user = np.bincount(inverse[~kernel[host]], minlength=len(upids)) > 0
        slot_of, space_of = np.zeros(len(upids), np.int32), np.full(len(upids), -1, np.int64)
        host_spaces: list[AddressSpace] = []
        for u, pid in enumerate(upids.tolist()):
            snap = processes.get(pid)
            name = "swapper" if pid == 0 else (snap["comm"] if snap else str(pid))
            slot_of[u] = groups.slot_of(st.intern(name), name, pid, int(host[first[u]]))
            if with_user[u] and snap:
                space_of[u] = len(host_spaces)
                host_spaces.append(self.objects.host_space(name, pid, snap["maps"], snap.get("build_ids")))
        groups.slot[host] = slot_of[inverse]
        user = ~kernel[host] & (space_of[inverse] >= 0)
        self._spaces_ids(host_spaces, [(0, space.pid) for space in host_spaces], host[user], space_of[inverse[user]],
                         s["host_ip"], func, module)
        # guest samples by VM, then by process (CR3)
        guest_spaces: list[AddressSpace] = []
        guest_places: list[tuple] = []  # of each guest space in a walk over every sample: VM, then CR3
        guest_user, guest_space = [], []  # sample indices and their space (rank in guest_spaces), a VM at a time
        cr3s = normalise_cr3_array(s["guest_cr3"])
        rip_unknown = (flags & SAMPLE_GUEST_UNKNOWN) != 0
        gkernel = (flags & SAMPLE_GUEST_KERNEL) != 0
        for pid, idx in group_by(pids, np.nonzero(guest)[0]):
            # a VMM that is not in the VM list (it started between two discoveries) has no bundle yet
            g = self.guests.get(vm_of_pid.get(pid, f"vm-{pid}"))
            unknown = idx[rip_unknown[idx]]
            module[unknown] = st.intern("(guest RIP unknown)")
            if len(unknown):
                groups.slot[unknown] = groups.slot_of(0, "", -1, int(unknown[0]))
            known = idx[~rip_unknown[idx]]
            gk = known[gkernel[known]]
            if len(gk):
                self._kernel_ids(g.kernel if g is not None else EMPTY_KERNEL, s["guest_ip"], gk, GUEST_KERNEL_MODULE,
                                 func, module)
            ucr3, first, inverse = arrays.unique(cr3s[known], return_index=True, return_inverse=True)
            with_user = np.bincount(inverse[~gkernel[known]], minlength=len(ucr3)) > 0
            slot_of, space_of = np.zeros(len(ucr3), np.int32), np.full(len(ucr3), -1, np.int64)
            for u, cr3 in enumerate(ucr3.tolist()):
                space = g.processes.get(cr3) if g is not None else None
                if space is None:
                    label = f"[cr3 {cr3:#x}]"
                    slot_of[u] = groups.slot_of(st.intern(label), label, -1, int(known[first[u]]))
                    continue
                slot_of[u] = groups.slot_of(st.intern(space.name), space.name,
                                            space.pid if space.pid is not None else -1, int(known[first[u]]))
                if with_user[u]:
                    space_of[u] = len(guest_spaces)
                    guest_spaces.append(space)
                    guest_places.append((1, pid, cr3))
            groups.slot[known] = slot_of[inverse]
            user = ~gkernel[known] & (space_of[inverse] >= 0)
            guest_user.append(known[user])
            guest_space.append(space_of[inverse[user]])
        if guest_spaces:
            self._spaces_ids(guest_spaces, guest_places, np.concatenate(guest_user), np.concatenate(guest_space),
                             s["guest_ip"], func, module)
        if notes is not None:  # stored symbol tables unusable, local files of another build
            notes += self.objects.notes
        self.objects.notes.clear()
        name_code, proc_code, new = groups.codes(self.codes, func, module)
        process, pid = groups.names()
        process_name_code = groups.name_codes(self.codes)
        self.row_names.add(name_code[new], func=func[new], module=module[new], process=process[new],
                           process_name_code=process_name_code[new], pid=pid[new], proc_code=proc_code[new])
        return name_code

    def _kernel_ids(self, ks: KernelSymbols, ips: np.ndarray, idx: np.ndarray, image: str, func: np.ndarray,
                    module: np.ndarray) -> None:
        """Function and module ids of the samples `idx` whose address (in `ips`) is kernel text of `ks`."""
        sym = ks.lookup(ips[idx])
        func[idx] = self.strings.ids(ks.names_or_unknown, sym)
        module[idx] = self.strings.ids(ks.module_label_table(image), sym)

    def _spaces_ids(self, spaces: list[AddressSpace], places: list[tuple], idx: np.ndarray, which: np.ndarray,
                    ips: np.ndarray, func: np.ndarray, module: np.ndarray) -> None:
        """Function and module ids of the user samples `idx` of many processes (`which`: the index in `spaces` of
        each sample's address space), all at once: one search for their mappings (spaces.locate), then per mapping
        hit its module and symbol table, and per symbol table one lookup of all its samples, whichever process
        mapped it where.  places: each space's place in a walk over every sample ((host 0 | guest 1, ...):
        ObjectCache.place)."""
        if not len(idx):
            return
        addrs = ips[idx]
        maps, at = locate(spaces, which, addrs)
        # what locate leaves (e.g. [vsyscall], above USER_LIMIT): through each space's own search
        left = np.flatnonzero(addrs >= USER_LIMIT) if len(spaces) <= MAX_SPACES else np.arange(len(addrs))
        for rank, pos in group_by(which, left):
            self._space_ids(spaces[rank], (places[rank][0], 0, *places[rank][1:]), ips, idx[pos], func, module)
        hit = np.flatnonzero(at >= 0)
        module_id = np.zeros(len(maps), np.int32)
        table = np.full(len(maps), -1, np.int64)  # the index in `tables` of each mapping's symbols
        delta = np.zeros(len(maps), np.uint64)  # address -> file offset (mod 2**64), for position-independent files
        tables: dict[int, tuple[int, ElfSymbols]] = {}
        # the space of each mapping: maps are every space's user mappings, a space after the other (locate)
        owners = np.cumsum([len(space.user_maps()) for space in spaces]) if len(spaces) > 1 else None
        if len(self._mappings) > 1 << 16:  # a long live session meets ever new processes
            self._mappings.clear()
        for mi in np.unique(at[hit]).tolist():
            m = maps[mi]
            info = self._mappings.get(id(m))
            if info is None:
                obj = self.objects.symbols(m)
                if obj is None:
                    rank = int(np.searchsorted(owners, mi, side="right")) if owners is not None else 0
                    self.objects.place(m, (places[rank][0], 1, *places[rank][1:], m.start))
                offset = (m.offset - m.start) % (1 << 64) if obj is not None and obj.elf_type != ET_EXEC else 0
                info = self._mappings[id(m)] = (m, self.strings.intern(m.module_name), obj, offset)
            _m, module_id[mi], obj, delta[mi] = info
            if obj is not None:
                table[mi] = tables.setdefault(id(obj), (len(tables), obj))[0]
        module[idx[hit]] = module_id[at[hit]]
        objs = [obj for _i, obj in tables.values()]
        for ti, pos in group_by(table[at[hit]], np.flatnonzero(table[at[hit]] >= 0)):
            obj, mine = objs[ti], hit[pos]
            link = addrs[mine].astype(np.uint64)
            if obj.elf_type != ET_EXEC:
                link = obj.file_offsets_to_vaddrs(link + delta[at[mine]])
            func[idx[mine]] = self.strings.ids(obj.names_or_unknown, obj.lookup(link))

    def _space_ids(self, space: AddressSpace, place: tuple, ips: np.ndarray, idx: np.ndarray, func: np.ndarray,
                   module: np.ndarray) -> None:
        """Function and module ids of the samples `idx` of one process, from its mappings' ELF symbols (place: the
        space's in a walk over every sample, ObjectCache.place)."""
        for pos, mapping, obj, sym in space.hits(ips[idx], self.objects):
            at = idx[pos]
            if obj is None:
                self.objects.place(mapping, (*place, mapping.start))
            module[at] = self.strings.intern(mapping.module_name)
            if obj is not None:
                func[at] = self.strings.ids(obj.names_or_unknown, sym)


class _Groups:
    """The (process, pid) of each sample, given a group of samples at a time, and the NameCodes of the samples."""

    def __init__(self, n: int) -> None:
        self.slot = np.zeros(n, np.int32)  # which distinct (process, pid), set by the caller from slot_of
        self.slots: dict[tuple[str, int], int] = {}
        self.first: list[int] = []  # first sample of each slot
        self.process: list[int] = []  # each slot's process name as a string id (StringTable)
        self.pid: list[int] = []

    def slot_of(self, process: int, name: str, pid: int, first: int) -> int:
        """The slot of samples of process `name` (string id `process`) with pid `pid`, the first of them at `first`."""
        slot = self.slots.setdefault((name, pid), len(self.slots))
        if slot == len(self.first):
            self.first.append(first)
            self.process.append(process)
            self.pid.append(pid)
        self.first[slot] = min(self.first[slot], first)
        return slot

    def names(self) -> tuple[np.ndarray, np.ndarray]:
        """(process name string id, pid) of each sample."""
        if not self.slots:
            return np.zeros(len(self.slot), np.int32), np.full(len(self.slot), -1, np.int32)
        return np.array(self.process, np.int32)[self.slot], np.array(self.pid, np.int32)[self.slot]

    def name_codes(self, codes: NameCodes) -> np.ndarray:
        """The code of each sample's process name (NameCodes.process_names)."""
        of_slot = [codes.process_names.setdefault(name, len(codes.process_names)) for name, _pid in self.slots]
        return np.array(of_slot, np.int32)[self.slot] if of_slot else np.zeros(len(self.slot), np.int32)

    def codes(self, codes: NameCodes, func: np.ndarray,
              module: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(name code, process code) of every sample, and the positions of a sample of each name new to `codes`;
        new (process, pid) pairs are numbered in the order of their first sample."""
        slot_code = np.zeros(len(self.slots), np.int64)
        for slot, key in sorted(((s, k) for k, s in self.slots.items()), key=lambda x: self.first[x[0]]):
            slot_code[slot] = codes.procs.setdefault(key, len(codes.procs))
        proc_code = slot_code[self.slot]
        name_code, new = codes.encode_new(proc_code, func, module)
        return name_code, proc_code, new

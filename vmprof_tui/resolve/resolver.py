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
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from vmprof_tui.record.records import SAMPLE_GUEST, SAMPLE_GUEST_KERNEL, SAMPLE_GUEST_UNKNOWN, SAMPLE_HOST_KERNEL
from vmprof_tui.resolve.bundle_format import normalise_cr3_array
from vmprof_tui.resolve.spaces import GuestSymbols, ObjectCache, guest_symbols
from vmprof_tui.resolve.symtab import EMPTY_KERNEL, KernelSymbols, kallsyms_table

KERNEL_MODULE = "[kernel.kallsyms]"
GUEST_KERNEL_MODULE = "[guest.kallsyms]"
UNKNOWN = "[unknown]"


class NameCodes:
    """Integer codes for (process, pid, function, module) and for (process, pid), kept across analyses: the
    live screen encodes each new chunk once, and a refresh then groups integers instead of strings."""

    def __init__(self) -> None:
        self.names: dict[tuple, int] = {}
        self.procs: dict[tuple, int] = {}

    def encode(self, process: np.ndarray, pid: np.ndarray, func: np.ndarray,
               module: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, names, procs = len(process), self.names, self.procs
        p, q = process.tolist(), pid.tolist()
        name_code = np.fromiter((names.setdefault(k, len(names)) for k in zip(p, q, func.tolist(), module.tolist(),
                                                                             strict=True)), np.int64, n)
        proc_code = np.fromiter((procs.setdefault(k, len(procs)) for k in zip(p, q, strict=True)), np.int64, n)
        return name_code, proc_code


@dataclass
class Resolved:
    """Per-sample names: function, module, process and its pid (-1 when none), and their NameCodes."""
    func: np.ndarray
    module: np.ndarray
    process: np.ndarray
    proc_pid: np.ndarray
    name_code: np.ndarray
    proc_code: np.ndarray

    def take(self, index: np.ndarray) -> Resolved:
        return Resolved(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concatenate(parts: list[Resolved]) -> Resolved:
        return Resolved(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Resolved)))


@dataclass
class Resolver:
    """Symbol sources and name codes kept across calls (the live screen resolves a new chunk every second;
    codes must stay the same for the samples of earlier chunks still in its window)."""
    objects: ObjectCache = field(default_factory=ObjectCache)
    guests: dict[str, GuestSymbols] = field(default_factory=dict)
    kallsyms: KernelSymbols | None = None
    codes: NameCodes = field(default_factory=NameCodes)

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
                kallsyms: str | None = None, notes: list[str] | None = None) -> Resolved:
        """Names of `samples`.  processes: host pid → its snapshot (comm, maps); vm_of_pid: VMM pid → VM
        name (guests are looked up by name among those load_guests loaded); kallsyms: the host's kallsyms
        text, None to keep the one already parsed (an unreadable one is noted in `notes`)."""
        s = samples
        n = len(s)
        func = np.full(n, UNKNOWN, dtype=object)
        module = np.full(n, UNKNOWN, dtype=object)
        process = np.full(n, "", dtype=object)
        proc_pid = np.full(n, -1, dtype=np.int64)
        flags = s["flags"]
        guest = (flags & SAMPLE_GUEST) != 0
        host = ~guest
        kernel = host & ((flags & SAMPLE_HOST_KERNEL) != 0)
        if self.kallsyms is None or kallsyms is not None:
            self.kallsyms = kallsyms_table(kallsyms or "", notes)
        ks = self.kallsyms
        if kernel.any():
            idx = ks.lookup(s["host_ip"][kernel])
            func[kernel] = ks.names_or_unknown[idx]
            module[kernel] = ks.module_labels(idx, KERNEL_MODULE)
        pids = s["pid"]
        for pid in np.unique(pids[host]).tolist():
            sel = host & (pids == pid)
            snap = processes.get(pid)
            name = "swapper" if pid == 0 else (snap["comm"] if snap else str(pid))
            process[sel] = name
            proc_pid[sel] = pid
            user = sel & ~kernel
            if user.any() and snap:
                space = self.objects.host_space(name, pid, snap["maps"], snap.get("build_ids"))
                func[user], module[user] = space.resolve(s["host_ip"][user], self.objects)
        cr3s = normalise_cr3_array(s["guest_cr3"])
        for pid in np.unique(pids[guest]).tolist():
            # a VMM that is not in the VM list (it started between two discoveries) has no bundle yet
            g = self.guests.get(vm_of_pid.get(pid, f"vm-{pid}"))
            sel = guest & (pids == pid)
            unknown = sel & ((flags & SAMPLE_GUEST_UNKNOWN) != 0)
            module[unknown] = "(guest RIP unknown)"
            known = sel & ~unknown
            gkernel = known & ((flags & SAMPLE_GUEST_KERNEL) != 0)
            if gkernel.any():
                gks = g.kernel if g is not None else EMPTY_KERNEL
                idx = gks.lookup(s["guest_ip"][gkernel])
                func[gkernel] = gks.names_or_unknown[idx]
                module[gkernel] = gks.module_labels(idx, GUEST_KERNEL_MODULE)
            guser = known & ~gkernel
            for cr3 in np.unique(cr3s[known]).tolist():
                csel = known & (cr3s == cr3)
                space = g.processes.get(cr3) if g is not None else None
                if space is None:
                    process[csel] = f"[cr3 {cr3:#x}]"
                    module[csel & guser] = UNKNOWN
                    continue
                process[csel] = space.name
                proc_pid[csel] = space.pid if space.pid is not None else -1
                usel = csel & guser
                if usel.any():
                    func[usel], module[usel] = space.resolve(s["guest_ip"][usel], self.objects)
        if notes is not None:  # stored symbol tables unusable, local files of another build
            notes += self.objects.notes
        self.objects.notes.clear()
        name_code, proc_code = self.codes.encode(process, proc_pid, func, module)
        return Resolved(func, module, process, proc_pid, name_code, proc_code)

"""Call stacks of samples (`vmprof record -g`) as frames with names.

record → **resolve**: `resolve_stacks` joins each sample to its `vmprof_stack` record and turns the
addresses into frames, outermost first:

- host: the process's user chain (host stack map, frame pointers), then its kernel chain (kallsyms).
  A user chain whose outermost frame is not a process or thread entry (`_start`, `clone`, ...) stopped
  early, usually in an object built without frame pointers: the stack is marked *truncated* and the
  object named, never silently short.
- guest: the chain walked in guest memory at sample time (bpf/stacks.h).  Guest memory can change
  while it is read, so every return address is checked against the guest process's executable
  mappings (from its bundle) or the guest kernel's symbols: the first one that is no code ends the
  stack there, marked *partial*, as does a walk the BPF program could not finish.  No frame is invented.

Work is per distinct stack, not per sample: samples are grouped with ``np.unique`` over their stack
records, and each distinct stack's addresses are resolved in one vectorised lookup (docs/performance.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping as MappingOf
from dataclasses import dataclass, field

import numpy as np

from vmprof_tui.mapping import Mapping
from vmprof_tui.record.bpf_records import (
    SAMPLE_GUEST,
    SAMPLE_GUEST_KERNEL,
    SAMPLE_HOST_KERNEL,
    STACK_GUEST_MAX,
    STACK_GUEST_PARTIAL,
    STACK_GUEST_WALKED,
    STACK_HOST_USER_INLINE,
    STACK_USER_COPY,
    USTACK_GUEST_KERNEL,
    stack_rows,
)
from vmprof_tui.resolve.bundle_format import normalise_cr3_array
from vmprof_tui.resolve.cfi import read_cfi
from vmprof_tui.resolve.resolver import GUEST_KERNEL_MODULE, KERNEL_MODULE, UNKNOWN, Resolver
from vmprof_tui.resolve.spaces import AddressSpace, GuestSymbols
from vmprof_tui.resolve.symtab import EMPTY_KERNEL, KernelSymbols
from vmprof_tui.resolve.untrusted import BundleError
from vmprof_tui.resolve.unwind import (
    COMPLETE,
    LOST,
    REASONS,
    KernelRules,
    Rules,
    reason_notes,
    unwind,
    unwind_guest_kernel,
)

KERNEL_HALF = np.uint64(0xFFFF800000000000)
# Where a complete user chain of a host process or thread starts (glibc, musl, Go, Rust runtimes).
ENTRY_FUNCTIONS = frozenset({"_start", "__libc_start_main", "__libc_start_call_main", "clone", "clone3",
                             "__clone", "__clone3", "start_thread", "thread_start", "runtime.goexit",
                             "runtime.rt0_go", "__start", "_dl_start_user"})


@dataclass(frozen=True, slots=True)  # slots: a busy recording has a million of them
class Frame:
    function: str
    module: str
    address: int
    mapping: Mapping | None = None  # the mapped file the address falls in


@dataclass(slots=True)
class Stack:
    frames: tuple[Frame, ...]  # outermost first, the sampled address last
    guest: bool = False
    partial: bool = False  # guest: the chain ended early (a failed or inconsistent read); nothing after it is shown
    truncated: bool = False  # host: the user chain stopped before a process entry (no frame pointers)
    broken_in: str | None = None  # the object where the chain stopped (partial or truncated)


@dataclass
class SampleStacks:
    """stack_of[i]: index in `stacks` of sample i's stack; -1: the sample has no stack record."""
    stack_of: np.ndarray
    stacks: list[Stack] = field(default_factory=list)
    # what each stack was told apart by (stack_keys), in the stacks' order: a recording read a piece at a time
    # orders and merges its stacks by them
    keys: list[tuple[int, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    level_notes: dict[str, list[str]] = field(default_factory=dict)  # "guest"/"host" -> notes of that level only


@dataclass
class Unwinding:
    """The unwind rules of the objects and guest kernels met unwinding stack copies (--call-graph cfi), each found
    once: a new one per resolve_stacks call, or one for every piece of a recording (analyse/stream_callgraph.py),
    which then reads each call-frame table once, not once a piece."""
    rules: Rules
    kernels: dict[str, tuple[KernelRules | None, str | None]] = field(default_factory=dict)  # file -> rules, why not

    @staticmethod
    def of(resolver: Resolver) -> Unwinding:
        return Unwinding(Rules(resolver.objects, ENTRY_FUNCTIONS))


def stack_keys(kind: int, distinct: np.ndarray) -> list[tuple[int, bytes]]:
    """The key of each distinct stack record (rows of _distinct; kind: guest 0, host 1, host inline 2): its fields
    as big-endian bytes without the trailing zeros (an unused chain's), which order as the rows do."""
    rows = distinct.astype(">u8")
    return [(kind, rows[i].tobytes().rstrip(b"\0")) for i in range(len(rows))]


def _mapping_index(space: AddressSpace, addrs: np.ndarray) -> np.ndarray:
    """Index into space.maps of the executable mapping holding each address, -1 where none does."""
    if not space.maps or not len(addrs):
        return np.full(len(addrs), -1, np.int64)
    order = np.argsort([m.start for m in space.maps])
    starts = np.array([space.maps[i].start for i in order], np.uint64)
    ends = np.array([space.maps[i].end for i in order], np.uint64)
    at = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    ok = at >= 0
    ok[ok] = addrs[ok] < ends[at[ok]]
    return np.where(ok, order[np.maximum(at, 0)], -1)


def _space_frames(space: AddressSpace, addrs: np.ndarray, resolver: Resolver,
                  build_ids: MappingOf[str, str]) -> tuple[list[Frame], np.ndarray]:
    """Frames for addresses of one process (callers' return addresses already moved back into the call)
    and whether each lies in an executable mapping."""
    funcs, modules = space.resolve(addrs, resolver.objects)
    which = _mapping_index(space, addrs)
    infos = [Mapping(m.start, m.end, m.offset, m.path, build_id=build_ids.get(m.path)
                     or _object_build_id(resolver, m.object_path)) for m in space.maps]
    frames = [Frame(f, m, int(a), infos[w] if w >= 0 else None)
              for f, m, a, w in zip(funcs, modules, addrs.tolist(), which.tolist(), strict=True)]
    return frames, which >= 0


def _object_build_id(resolver: Resolver, path: object) -> str | None:
    obj = resolver.objects.get(path) if path is not None else None  # type: ignore[arg-type]
    return obj.build_id if obj is not None else None


def _kernel_frames(ks: KernelSymbols, addrs: np.ndarray, image: str) -> tuple[list[Frame], np.ndarray]:
    idx = ks.lookup(addrs)
    names, modules = ks.names_or_unknown[idx], ks.module_labels(idx, image)
    return [Frame(n, m, int(a)) for n, m, a in zip(names.tolist(), modules.tolist(), addrs.tolist(), strict=True)], \
        idx >= 0


def _lookup_addresses(chain: np.ndarray) -> np.ndarray:
    """Leaf first: the sampled address, then return addresses, which point after their call: look those up
    one byte back, inside the call instruction (as perf does)."""
    out = chain.astype(np.uint64).copy()
    out[1:] -= np.uint64(1)
    return out


def resolve_stacks(samples: np.ndarray, stacks: np.ndarray, host_stacks: MappingOf[int, np.ndarray],
                   resolver: Resolver, processes: MappingOf[int, dict], vm_of_pid: MappingOf[int, str],
                   ustacks: np.ndarray | None = None,
                   known: dict[tuple[int, bytes], Stack] | None = None,
                   unwinding: Unwinding | None = None) -> SampleStacks:
    """Stacks of `samples` from their stack records (`Recording.stacks`), the host stack map entries and the
    user-stack copies (`Recording.ustacks`, --call-graph cfi).  `resolver` must have resolved these samples
    already (its kallsyms and guest bundles are used).  known: stacks by key (SampleStacks.keys) resolved before,
    taken as they are (the pieces of one recording); the new ones are added.  unwinding: the unwind rules found
    before (the pieces of one recording), else new ones."""
    rows = stack_rows(samples, stacks)
    out = SampleStacks(np.full(len(samples), -1, np.int64))
    has = rows >= 0
    if not has.any():
        return out
    st = stacks[np.where(has, rows, 0)]  # a copy: unwound chains are written into it
    copied = has & ((st["flags"] & STACK_USER_COPY) != 0)
    if copied.any():
        _unwind_copies(samples, st, copied, ustacks, resolver, processes, vm_of_pid, out,
                       unwinding or Unwinding.of(resolver))
    guest = has & ((samples["flags"] & SAMPLE_GUEST) != 0) & ((st["flags"] & STACK_GUEST_WALKED) != 0)
    host = has & ~guest
    known = {} if known is None else known
    _guest_stacks(samples, st, guest, resolver, vm_of_pid, out, known)
    _host_stacks(samples, st, host, host_stacks, resolver, processes, out, known)
    return out


GUEST_USER_TOP = np.uint64(1 << 47)  # guest addresses below are user space (the sampler's GUEST_USER_TOP)


def _unwind_copies(samples: np.ndarray, st: np.ndarray, copied: np.ndarray, ustacks: np.ndarray | None,
                   resolver: Resolver, processes: MappingOf[int, dict], vm_of_pid: MappingOf[int, str],
                   out: SampleStacks, unwinding: Unwinding) -> None:
    """Unwind the user-stack copies of these samples into their stack records' guest[] as walked chains (guest)
    or inline user chains (host), marked partial where the unwinding stopped early."""
    idx = np.nonzero(copied)[0]
    s = samples[idx]
    urows = stack_rows(s, ustacks) if ustacks is not None and len(ustacks) else np.full(len(idx), -1, np.int64)
    guest = (s["flags"] & SAMPLE_GUEST) != 0
    cr3 = normalise_cr3_array(s["guest_cr3"])
    found: dict[tuple[int, int], AddressSpace | None] = {}
    for pid, is_guest, c in set(zip(s["pid"].tolist(), guest.tolist(), np.where(guest, cr3, 0).tolist(), strict=True)):
        if is_guest:
            vm = resolver.guests.get(vm_of_pid.get(pid, f"vm-{pid}"))
            found[(pid, c)] = vm.processes.get(c) if vm is not None else None
        else:
            snap = processes.get(pid)
            found[(pid, c)] = resolver.objects.host_space(snap["comm"], pid, snap["maps"]) \
                if snap and snap.get("maps") else None
    spaces = [found[k] for k in zip(s["pid"].tolist(), np.where(guest, cr3, 0).tolist(), strict=True)]
    have = urows >= 0
    rules = unwinding.rules
    noted = len(rules.notes)  # those of earlier pieces went with them
    chains = np.zeros((len(idx), STACK_GUEST_MAX), np.uint64)
    depth = np.ones(len(idx), np.uint8)
    reason = np.full(len(idx), LOST, np.int8)
    chains[:, 0] = np.where(guest, s["guest_ip"], s["host_ip"])  # a lost copy: the leaf is known anyway,
    depth[~guest & ((s["flags"] & SAMPLE_HOST_KERNEL) != 0)] = 0  # except a kernel-mode sample's user leaf
    if have.any():
        at = np.nonzero(have)[0]
        chains[at], depth[at], reason[at] = unwind(ustacks, urows[at], [spaces[i] for i in at.tolist()], rules)
    in_kernel = guest & (((s["flags"] & SAMPLE_GUEST_KERNEL) != 0) | (s["guest_ip"] >= GUEST_USER_TOP))
    if in_kernel.any():  # the guest kernel's own frames above the user chain it was entered from
        at = np.nonzero(in_kernel)[0]
        kernel = _guest_kernel_frames(s[at], st[idx[at]], urows[at], ustacks, resolver, vm_of_pid, out,
                                      unwinding.kernels)
        _below_guest_kernel(kernel, chains, depth, at, have)
    st["flags"][idx] &= np.uint8(~STACK_GUEST_PARTIAL & 0xFF)  # a walk's verdict; the unwinding's is below
    st["guest"][idx] = chains
    st["guest_depth"][idx] = depth
    partial = np.where(reason != COMPLETE, STACK_GUEST_PARTIAL, 0).astype(np.uint8)
    st["flags"][idx] |= np.where(guest, STACK_GUEST_WALKED, STACK_HOST_USER_INLINE).astype(np.uint8) | partial
    for part, level, what in ((guest, "guest", "guest"), (~guest, "host", "host user")):
        out.level_notes.setdefault(level, []).extend(reason_notes(reason[part], what))
    out.notes += rules.notes[noted:]


def _guest_kernel_frames(s: np.ndarray, walked: np.ndarray, urows: np.ndarray, ustacks: np.ndarray | None,
                         resolver: Resolver, vm_of_pid: MappingOf[int, str], out: SampleStacks,
                         kernels: dict[str, tuple[KernelRules | None, str | None]]) -> list[np.ndarray]:
    """Each guest-kernel sample's own frames, leaf first, above the user RIP its entry frame returns to: unwound
    by the kernel's call-frame information (its ELF file in the VM's bundle) from the kernel stack copied at the
    end of the user stack's copy (bpf/stacks.h), else as the sampler walked them by frame pointers, the reason
    counted in the notes."""
    frames = []
    for w in walked:
        f = w["guest"][:min(int(w["guest_depth"]), STACK_GUEST_MAX)]
        user = f < GUEST_USER_TOP
        frames.append(f[:int(np.argmax(user))] if user.any() else f)
    if ustacks is None or not len(ustacks):
        return frames
    flagged = (urows >= 0) & ((ustacks["flags"][np.maximum(urows, 0)] & USTACK_GUEST_KERNEL) != 0)
    fallback: dict[str, int] = {}
    by_cfi = 0
    for pid in set(s["pid"][flagged].tolist()):
        sel = np.nonzero(flagged & (s["pid"] == pid))[0]
        rules = _kernel_rules(resolver.guests.get(vm_of_pid.get(pid, f"vm-{pid}")), out.notes, kernels)
        if rules is None:
            why = "the VM's bundle has no call-frame information of its kernel"
            fallback[why] = fallback.get(why, 0) + len(sel)
            continue
        unwound = unwind_guest_kernel(ustacks, urows[sel], s["guest_ip"][sel], rules)
        for i, (chain, reason), user_ip in zip(sel.tolist(), unwound, ustacks["ip"][urows[sel]].tolist(), strict=True):
            if reason == COMPLETE and chain[-1] == user_ip:
                frames[i] = np.array(chain[:-1], np.uint64)
                by_cfi += 1
            else:
                why = REASONS.get(reason, "a return address other than the entry frame's user RIP")
                fallback[why] = fallback.get(why, 0) + 1
    notes = out.level_notes.setdefault("guest", [])
    if by_cfi:
        notes.append(f"{by_cfi} guest-kernel samples: kernel frames by the guest kernel's call-frame information")
    notes += [f"{n} guest-kernel samples: kernel frames by frame pointers ({why})" for why, n in fallback.items()]
    return frames


def _kernel_rules(g: GuestSymbols | None, notes: list[str],
                  kernels: dict[str, tuple[KernelRules | None, str | None]]) -> KernelRules | None:
    """The unwind rules of a VM's guest kernel, or None (no ELF file in its bundle, or one without CFI); read once
    per file into `kernels`, a failure noted at every call as at the first."""
    path = g.bundle.kernel.object_path if g is not None and g.bundle is not None and g.bundle.kernel else None
    if path is None:
        return None
    if str(path) not in kernels:
        try:
            table = read_cfi(path)
            kernels[str(path)] = (KernelRules(table) if len(table) else None, None)
        except (BundleError, OSError) as e:
            kernels[str(path)] = (None, f"guest kernel: {e}: its frames by frame pointers")
    rules, why = kernels[str(path)]
    if why is not None:
        notes.append(why)
    return rules


def _below_guest_kernel(kernel: list[np.ndarray], chains: np.ndarray, depth: np.ndarray, rows: np.ndarray,
                        have: np.ndarray) -> None:
    """Guest-kernel samples whose user stack was copied at the kernel's entry (bpf/stacks.h): each chain becomes
    the kernel frames and then the user chain unwound from the copy, which starts at the user address the entry
    frame returns to (none if the copy is missing: partial)."""
    for frames, row in zip(kernel, rows.tolist(), strict=True):
        k = len(frames)
        user = chains[row, :depth[row]].copy() if have[row] else chains[row, :0].copy()
        m = min(len(user), STACK_GUEST_MAX - k)
        chains[row, :k] = frames[:k]
        chains[row, k:k + m] = user[:m]
        chains[row, k + m:] = 0
        depth[row] = k + m


def _distinct(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of these columns (uint64) and each input row's index among them."""
    keys = np.column_stack([np.asarray(c).astype(np.uint64).reshape(len(c), -1) for c in columns])
    distinct, inverse = np.unique(keys, axis=0, return_inverse=True)
    return distinct, inverse.reshape(-1)


def _guest_stacks(samples: np.ndarray, st: np.ndarray, sel: np.ndarray, resolver: Resolver,
                  vm_of_pid: MappingOf[int, str], out: SampleStacks, known: dict[tuple[int, bytes], Stack]) -> None:
    idx = np.nonzero(sel)[0]
    if not len(idx):
        return
    g = st[idx]
    depth = np.minimum(g["guest_depth"], g["guest"].shape[1]).astype(np.int64)
    distinct, inverse = _distinct([samples["pid"][idx], normalise_cr3_array(samples["guest_cr3"][idx]),
                                   depth, g["flags"] & STACK_GUEST_PARTIAL, g["guest"]])
    first = len(out.stacks)
    for key, row in zip(stack_keys(0, distinct), distinct, strict=True):
        if key not in known:
            pid, cr3, n, partial, *chain = row.tolist()
            vm = resolver.guests.get(vm_of_pid.get(pid, f"vm-{pid}"))
            space = vm.processes.get(cr3) if vm is not None else None
            kernel_syms = vm.kernel if vm is not None else EMPTY_KERNEL
            known[key] = _guest_stack(np.array(chain[:n], np.uint64), bool(partial), space, kernel_syms, resolver)
        out.stacks.append(known[key])
        out.keys.append(key)
    out.stack_of[idx] = first + inverse


def _guest_stack(chain: np.ndarray, partial: bool, space: AddressSpace | None, kernel_syms: KernelSymbols,
                 resolver: Resolver) -> Stack:
    lookup = _lookup_addresses(chain)
    kernel = lookup >= KERNEL_HALF
    frames: list[Frame] = [Frame(f"{int(a):#x}", UNKNOWN, int(a)) for a in chain.tolist()]
    code = np.ones(len(chain), bool)  # without a bundle nothing can be checked: shown as raw addresses
    if kernel.any():
        kf, ok = _kernel_frames(kernel_syms, lookup[kernel], GUEST_KERNEL_MODULE)
        if len(kernel_syms):
            code[kernel] = ok
        for i, f in zip(np.nonzero(kernel)[0].tolist(), kf, strict=True):
            frames[i] = f
    if space is not None and (~kernel).any():
        uf, ok = _space_frames(space, lookup[~kernel], resolver, {})
        code[~kernel] = ok
        for i, f in zip(np.nonzero(~kernel)[0].tolist(), uf, strict=True):
            frames[i] = f
    bad = np.nonzero(~code[1:])[0]  # the leaf is where the CPU was: it is code even when unnamed
    if len(bad):
        frames, partial = frames[:bad[0] + 1], True
    return Stack(tuple(reversed(frames)), guest=True, partial=partial,
                 broken_in=frames[-1].module if partial else None)


def _host_stacks(samples: np.ndarray, st: np.ndarray, sel: np.ndarray, host_stacks: MappingOf[int, np.ndarray],
                 resolver: Resolver, processes: MappingOf[int, dict], out: SampleStacks,
                 known: dict[tuple[int, bytes], Stack]) -> None:
    inline = (st["flags"] & STACK_HOST_USER_INLINE) != 0
    ks = resolver.kallsyms or EMPTY_KERNEL
    missing = 0
    no_user_chain = int(np.count_nonzero(sel & ~inline & (st["user_stack_id"] < 0) & (samples["pid"] > 0)
                                         & ((samples["flags"] & SAMPLE_HOST_KERNEL) == 0)))
    no_kernel_chain = int(np.count_nonzero(sel & (st["kernel_stack_id"] < 0)
                                           & ((samples["flags"] & SAMPLE_HOST_KERNEL) != 0)))
    for idx, chains_inline in ((np.nonzero(sel & ~inline)[0], False), (np.nonzero(sel & inline)[0], True)):
        if not len(idx):
            continue
        s = samples[idx]
        in_kernel = (s["flags"] & SAMPLE_HOST_KERNEL) != 0
        kernel_ids = st["kernel_stack_id"][idx].astype(np.int64) + 1
        # the leaf address is part of the key only where no chain holds it
        leaf = np.where(in_kernel & (kernel_ids > 0), 0, s["host_ip"])
        columns = [s["pid"], kernel_ids, st["user_stack_id"][idx].astype(np.int64) + 1, in_kernel, leaf]
        # a user chain stored inline (its stack-map bucket was taken) is part of the key itself
        if chains_inline:
            columns += [st["flags"][idx] & STACK_GUEST_PARTIAL,
                        np.minimum(st["guest_depth"][idx], STACK_GUEST_MAX).astype(np.int64), st["guest"][idx]]
        distinct, inverse = _distinct(columns)
        first = len(out.stacks)
        keys = stack_keys(1 + chains_inline, distinct)
        chains = []
        for pid, kid, uid, kernel_mode, ip, *inline_chain in distinct.tolist():
            kchain = host_stacks.get(kid - 1, np.empty(0, np.uint64)) if kid else np.empty(0, np.uint64)
            uchain = host_stacks.get(uid - 1, np.empty(0, np.uint64)) if uid else np.empty(0, np.uint64)
            missing += (kid and (kid - 1) not in host_stacks) or (uid and (uid - 1) not in host_stacks)
            partial = False
            if inline_chain:
                partial = bool(inline_chain[0])  # a chain unwound from a stack copy that stopped early
                uchain = np.array(inline_chain[2:2 + inline_chain[1]], np.uint64)
            if kernel_mode and not len(kchain) and ip:
                kchain = np.array([ip], np.uint64)
            if not kernel_mode and not len(uchain):
                uchain = np.array([ip], np.uint64)
            chains.append((pid, kchain, uchain, partial))
        new = [(key, chain) for key, chain in zip(keys, chains, strict=True) if key not in known]
        frames = _user_frames([chain for _key, chain in new], resolver, processes)
        for key, (pid, kchain, uchain, partial) in new:
            known[key] = _host_stack(pid, kchain, uchain, ks, frames.get(pid), partial)
        out.stacks += [known[key] for key in keys]
        out.keys += keys
        out.stack_of[idx] = first + inverse
    if missing:
        out.notes.append(f"{missing} host stack ids had no stored chain (the stack map was read after they "
                         "were replaced or the recording was cut): those chains are left out")
    if no_user_chain:
        out.notes.append(f"{no_user_chain} host user-mode samples have no user chain (it could not be read): "
                         "they show their leaf only")
    if no_kernel_chain:
        out.notes.append(f"{no_kernel_chain} host kernel-mode samples have no kernel chain (the stack map was "
                         "full or the chain's bucket was taken; see record --stack-map-entries): they show their "
                         "leaf only")


def collapse_unknown(frames: list[Frame]) -> list[Frame]:
    """Runs of unresolved frames of one object as one frame, `[unknown ×N]` (`[libfoo.so ×N]`): a chain through
    code without frame pointers is ~100 return-address guesses that no one can read, and a flame graph of them is
    thousands of pixels tall.  Made here, in the stack model, so that every format and view shows the same."""
    def unresolved(f: Frame) -> bool:  # no symbol, or (without the process's maps) no object either
        return f.function == UNKNOWN or f.module == UNKNOWN

    out: list[Frame] = []
    run = 0
    for i, f in enumerate(frames):
        run = run + 1 if i and unresolved(f) and unresolved(frames[i - 1]) and frames[i - 1].module == f.module \
            else 1
        if run == 1:
            out.append(f)
        else:
            name = f.module[1:-1] if f.module.startswith("[") and f.module.endswith("]") else f.module
            out[-1] = Frame(f"[{name} ×{run}]", f.module, 0)
    return out


def _user_frames(chains: list[tuple[int, np.ndarray, np.ndarray, bool]], resolver: Resolver,
                 processes: MappingOf[int, dict]) -> dict[int, dict[int, Frame]]:
    """pid -> lookup address -> frame, for every user address of these chains: one lookup per process, not per
    chain (chains unwound from stack copies are many and deep: 20 000 distinct ones in a minute of a busy host)."""
    wanted: dict[int, set[int]] = {}
    for pid, _kchain, uchain, _partial in chains:
        if len(uchain):
            wanted.setdefault(pid, set()).update(_lookup_addresses(uchain).tolist())
    out: dict[int, dict[int, Frame]] = {}
    for pid, addrs in wanted.items():
        snap = processes.get(pid)
        lookup = np.array(sorted(addrs), np.uint64)
        if snap and snap.get("maps"):
            name = "swapper" if pid == 0 else snap["comm"]
            space = resolver.objects.host_space(name, pid, snap["maps"])
            frames = _space_frames(space, lookup, resolver, snap.get("build_ids") or {})[0]
        else:
            frames = [Frame(f"{a:#x}", UNKNOWN, a) for a in lookup.tolist()]
        out[pid] = dict(zip(lookup.tolist(), frames, strict=True))
    return out


def _host_stack(pid: int, kchain: np.ndarray, uchain: np.ndarray, ks: KernelSymbols,
                frames: MappingOf[int, Frame] | None, partial: bool = False) -> Stack:
    kframes = _kernel_frames(ks, _lookup_addresses(kchain), KERNEL_MODULE)[0] if len(kchain) else []
    uframes: list[Frame] = []
    truncated, broken_in = False, None
    if len(uchain) and frames is not None:
        uframes = [frames[a] for a in _lookup_addresses(uchain).tolist()]
        outermost = uframes[-1]
        if outermost.function not in ENTRY_FUNCTIONS:
            truncated, broken_in = not partial, outermost.module
        uframes = collapse_unknown(uframes)
    # leaf first in both chains: the stack is the user chain from its entry inwards, then the kernel's
    return Stack(tuple(reversed(uframes)) + tuple(reversed(kframes)), truncated=truncated, partial=partial,
                 broken_in=os.path.basename(broken_in) if broken_in else None)

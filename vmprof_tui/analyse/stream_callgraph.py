"""`vmprof report` of a recording with call stacks (`record -g`) read a piece at a time: the call paths of
analyse/callgraph.py summed over the pieces, in memory bounded by the distinct paths, not by the samples
(docs/scale.md, "Call stacks a piece at a time").

Each piece's samples are joined to their stack records (record/stream.py cuts those with the samples) and
resolved (resolve.stacks; a stack met in an earlier piece is taken as it was resolved then).  Its paths are
grouped as CallGraph.weighted groups them (context, process, stack, and the name where there is no stack; per
CPU and thread) and summed under keys that are the same in every piece: the VM code, the resolver's process and
name codes (numbered in the order of the samples, as one walk over the recording numbers them) and the fields
that tell the stack records apart.  Ordered by those keys, the paths come in the order the whole recording's
groups have, so every format made of them is the same text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.callgraph import FirstSample, WeightedStacks, ended_early, first_sample, path_of
from vmprof_tui.analyse.stream import PIECE_ROWS, WholeNeeded
from vmprof_tui.analyse.stream_stacks import StreamedStacks
from vmprof_tui.record.bpf_records import SAMPLE_GUEST_KERNEL
from vmprof_tui.record.recording import USTACKS
from vmprof_tui.record.stream import Scanned
from vmprof_tui.resolve.stacks import SampleStacks, Stack, Unwinding, resolve_stacks
from vmprof_tui.resolve.unwind import REASONS

PathKey = tuple  # (context, process, stack, name, cpu, tid): _add_paths
NOTE = re.compile(r"(\d+) (.+)", re.S)  # resolve.stacks' notes that count: "N what"
# the counted notes in the order resolve.stacks writes them (the guest kernel's frame-pointer reasons in the
# order they are met), then the unwinding's reasons in unwind.REASONS' order
NOTE_ORDER = ("host user-mode samples have no user chain", "host kernel-mode samples have no kernel chain",
              "guest-kernel samples: kernel frames by the guest kernel's", "guest-kernel samples: kernel frames by "
              "frame pointers")
FALLBACK = NOTE_ORDER[3]
REASON_ORDER = {text: i for i, text in enumerate(REASONS.values())}


def _rank(text: str) -> int | None:
    """The place of a counted note (its text after the count) in resolve.stacks' order; None: not one it writes
    (a new note would be summed and placed wrong: the stream gives up)."""
    for r, prefix in enumerate(NOTE_ORDER):
        if text.startswith(prefix):
            return r
    reason = REASON_ORDER.get(text.partition(" end [partial]: ")[2])
    return None if reason is None else len(NOTE_ORDER) + reason


@dataclass(slots=True)
class _Path:
    """One distinct path (of one CPU and thread), summed over the pieces so far."""
    samples: int
    first: int  # the recording's index of its first sample (of paths merged, the first of them all is kept)
    path: tuple[str, ...]
    context: int
    stack: Stack | None
    sample: FirstSample


@dataclass(slots=True)
class _Ended:
    """What the notes of a level's paths count (WeightedStacks.notes), without the paths (a table's notes): its
    samples, those without a stack, and per object those whose stack ended early there, with the first key."""
    samples: int = 0
    without_stack: int = 0
    early: dict[tuple[str, str], list] = field(default_factory=dict)  # ended_early -> [samples, least path key]

    def add(self, k: PathKey, n: int, stack: Stack | None) -> None:
        self.samples += n
        if stack is None:
            self.without_stack += n
            return
        for where in ended_early(stack):
            self._count(where, n, k)

    def merge(self, other: _Ended) -> None:
        self.samples += other.samples
        self.without_stack += other.without_stack
        for where, (n, k) in other.early.items():
            self._count(where, n, k)

    def _count(self, where: tuple[str, str], n: int, k: PathKey) -> None:
        got = self.early.setdefault(where, [0, k])
        got[0] += n
        got[1] = min(got[1], k)

    def weighted(self, level: str, notes: list[str]) -> WeightedStacks:
        """WeightedStacks without paths, its objects in the order the paths first name them (their least key)."""
        out = WeightedStacks(level, [], np.empty(0, np.int64), [], [], samples=self.samples,
                             without_stack=self.without_stack, resolve_notes=notes)
        for (what, obj), (n, _k) in sorted(self.early.items(), key=lambda kv: kv[1][1]):
            getattr(out, what)[obj] += n
        return out


class StreamedCallGraph(StreamedStacks):
    """A StreamedStacks that also sums the call paths of its level (host, or each VM's guest paths); paths=False:
    only what their notes count (table, JSON and CSV), in memory bounded by the objects."""

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None, level: str = "host",
                 vm: str | None = None, piece_rows: int = PIECE_ROWS,
                 keep: Callable[[np.ndarray], np.ndarray] | None = None, kernel: bool = True,
                 paths: bool = True, cpu: int | None = None, time_range: tuple[float, float] | None = None) -> None:
        self.with_paths = paths
        self.ended: dict[tuple[str | None, int | None, bool], _Ended] = {}  # by scope, vCPU, idle task (paths=False)
        self.known: dict[tuple[int, bytes], Stack] = {}  # every distinct stack met, resolved once
        self.paths: dict[tuple[str | None, PathKey], _Path] = {}  # by scope (None: host; guest: the VM) and key
        self.stack_notes: dict[str, dict[str, int]] = {}  # resolve.stacks' notes summed: level ("": both) -> text
        self.seen = 0  # samples of the pieces before
        self.kernel_vms: set[int] = set()  # VMM pids of guest-kernel samples (FALLBACK notes are per VM)
        self.unwinding: Unwinding | None = None  # the copies' unwind rules, found once for every piece
        self.split_vm_rows = paths  # table, JSON and CSV read no host-level VM row split (StreamedStacks)
        super().__init__(scanned, guest_bundles, level, vm, piece_rows, keep, kernel, cpu=cpu, time_range=time_range)

    def _add(self, an: Analysis, lo: int) -> None:
        if self.pieces and any(note not in self.notes for note in an.notes):
            # the whole recording orders its notes as it resolves every sample (by process and mapping), pieces
            # as they meet them: a note first met after the first piece may stand elsewhere in the whole's
            raise WholeNeeded("a note first met after the first piece")
        super()._add(an, lo)
        rec = an.rec
        for table in (rec.stacks, rec.ustacks):  # a record whose sample went with an earlier piece (of the piece's
            # start, not the range's: a record of a sample before the range is in the piece, joined to no sample)
            if table is not None and len(table) and int(table["time_ns"].min()) < self.piece_lo:
                raise WholeNeeded("a call-stack record written a piece after its sample")
        self.unwinding = self.unwinding or Unwinding.of(an.resolver)  # the same resolver in every piece
        resolved = resolve_stacks_of(an, self.known, self.unwinding)
        if not self.with_paths:  # the notes need no stack after its piece
            self.known = {}
        elif self.level == "guest":
            # only guest stacks are kept (kind 0, stack_keys): the host processes' stacks are on no guest path; a
            # guest sample whose record was not walked in the guest (no STACK_GUEST_WALKED) has a host stack, which
            # is resolved again in each piece that has it, to the same frames
            self.known = {k: v for k, v in self.known.items() if k[0] == 0}
        in_kernel = an.is_guest & ((an.samples["flags"] & SAMPLE_GUEST_KERNEL) != 0)
        self.kernel_vms.update(np.unique(an.samples["pid"][in_kernel]).tolist())
        self._add_notes(resolved)
        if self.level in ("host", "all"):  # --cpu: that CPU's paths; the stack notes are every CPU's, as CallGraph's
            every = np.arange(len(an.samples))
            self._add_paths(an, resolved, "host", None,
                            every if self.cpu is None else every[an.samples["cpu"] == self.cpu])
        if self.level != "host":
            for vm in an.vm_names() if self.vm is None else [self.vm]:
                threads = [an.vcpus.thread_samples(tl) for tl in an.vm_timelines(vm)]
                idx = np.unique(np.concatenate(threads)) if threads else np.empty(0, np.int64)
                self._add_paths(an, resolved, "guest", vm, idx[an.is_guest[idx]])
        self.seen += len(an.samples)

    def _add_paths(self, an: Analysis, resolved: SampleStacks, level: str, scope: str | None,
                   idx: np.ndarray) -> None:
        """The paths of these samples, grouped as CallGraph.weighted(split=True) groups them, added to the sums."""
        if not len(idx):
            return
        s = an.samples
        stack_of = resolved.stack_of[idx]
        vm_code = an.vm_code[idx].astype(np.int64)
        ctx = np.where(an.in_vm[idx], -1 - vm_code, an.proc_key[idx])
        keys = np.column_stack([ctx, an.proc_key[idx], stack_of, np.where(stack_of < 0, an.key[idx], -1),
                                s["cpu"][idx].astype(np.int64), s["tid"][idx].astype(np.int64)])
        distinct, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
        for (c, proc, sid, key, cpu, tid), f, n in zip(distinct.tolist(), first.tolist(), counts.tolist(),
                                                       strict=True):
            i = int(idx[f])
            code = int(vm_code[f])
            process = (code, int(an.proc_code_of_proc_key[proc]))  # proc_key's order, in every piece
            k = ((c, 0, 0) if c < 0 else (0, *process), process, resolved.keys[sid] if sid >= 0 else (-1, b""),
                 (code, int(an.name_code_of_key[key])) if sid < 0 else (-1, -1), cpu, tid)
            stack = resolved.stacks[sid] if sid >= 0 else None
            if not self.with_paths:
                vcpu = an.vcpu_of_tid.get(tid, (0, None))[1]
                self.ended.setdefault((scope, vcpu, int(s["pid"][i]) == 0), _Ended()).add(k, n, stack)
                continue
            entry = self.paths.get((scope, k))
            if entry is not None:
                entry.samples += n
                continue
            path, context = path_of(an, i, level, stack)
            self.paths[(scope, k)] = _Path(n, self.seen + i, path, context, stack, first_sample(an, i))

    def _add_notes(self, resolved: SampleStacks) -> None:
        """resolve.stacks' notes of a piece, summed: those that count samples; any other gives up the stream."""
        for level, notes in (("", resolved.notes), *resolved.level_notes.items()):
            summed = self.stack_notes.setdefault(level, {})
            for note in notes:
                m = NOTE.fullmatch(note)  # text, a count of distinct chains (host stack ids), or unknown: given up
                if m is None or _rank(m.group(2)) is None:
                    raise WholeNeeded(f"a note on call stacks that pieces do not add up: {note[:80]}")
                summed[m.group(2)] = summed.get(m.group(2), 0) + int(m.group(1))
        fallbacks = [t for t in self.stack_notes.get("guest", {}) if t.startswith(FALLBACK)]
        if len(fallbacks) > 1 and len(self.kernel_vms) > 1:  # their order is by VM, then as met: not kept so
            raise WholeNeeded("guest-kernel frames by frame pointers for several reasons in several VMs")

    def _notes(self, level: str) -> list[str]:
        """resolve.stacks' notes of the level's paths (CallGraph.weighted's resolve_notes: those of both levels,
        then the level's own), as summed."""
        out = []
        for lv in ("", level):
            summed = self.stack_notes.get(lv, {})
            out += [f"{summed[text]} {text}" for text in sorted(summed, key=lambda t: _rank(t) or 0)]  # stable
        return out

    # -- what the report reads -----------------------------------------------------------------------------
    def _chosen(self, level: str, vm: str | None, vcpu: int | None) -> Iterator[tuple[PathKey, _Path]]:
        """The paths summed of the level (one VM's, of one vCPU), in no order."""
        scope, idle = self._scope(level, vm)
        for (s, k), p in self.paths.items():
            if s == scope and vcpu in (None, p.sample.vcpu) and not (idle and p.sample.pid == 0):
                yield k, p

    def _scope(self, level: str, vm: str | None) -> tuple[str | None, bool]:
        """The sums' scope of a level (None: the host's; guest: the VM's), and whether the idle task's samples are
        left out (as the host profile leaves them: its idle is from sched events)."""
        return (None if level == "host" else vm), level == "host" and bool(self.idle_cpus)

    def _merged(self, level: str, vm: str | None, vcpu: int | None, split: bool) -> Iterator[tuple[_Path, int]]:
        """The paths of the level (one VM's, of one vCPU) in the whole recording's order, with their samples; not
        split: the paths of every CPU and thread merged, as CallGraph.weighted() groups them."""
        chosen = sorted(self._chosen(level, vm, vcpu))
        at = 0
        while at < len(chosen):
            end = at + 1
            while not split and end < len(chosen) and chosen[end][0][:4] == chosen[at][0][:4]:
                end += 1
            group = [p for _k, p in chosen[at:end]]
            yield min(group, key=lambda p: p.first), sum(p.samples for p in group)
            at = end

    def _ended_of(self, level: str, vm: str | None, vcpu: int | None) -> _Ended:
        """What the notes of the level's paths count, from the paths or (paths=False) the counts kept of them."""
        out = _Ended()
        if self.with_paths:
            for k, p in self._chosen(level, vm, vcpu):
                out.add(k, p.samples, p.stack)
            return out
        scope, idle = self._scope(level, vm)
        for (s, v, i), e in self.ended.items():
            if s == scope and vcpu in (None, v) and not (idle and i):
                out.merge(e)
        return out

    def stack_notes_of(self, level: str, vm: str | None = None, vcpu: int | None = None) -> list[str]:
        """CallGraph.weighted(level, vm, vcpu).notes() of the whole recording, without making its paths."""
        return self._ended_of(level, vm, vcpu).weighted(level, self._notes(level)).notes()

    def weighted(self, level: str, vm: str | None = None, vcpu: int | None = None) -> WeightedStacks:
        """CallGraph.weighted(level, vm, vcpu) of the whole recording (paths=False: without its paths, but with
        what its notes count, objects in the order the paths first name them)."""
        if not self.with_paths:
            return self._ended_of(level, vm, vcpu).weighted(level, self._notes(level))
        merged = list(self._merged(level, vm, vcpu, split=False))
        counts = np.array([n for _p, n in merged], np.int64)
        out = WeightedStacks(level, [], counts, [], [], samples=int(counts.sum()), resolve_notes=self._notes(level))
        for p, n in merged:
            out.add(p.path, p.context, n, p.stack, p.first)
        return out

    def split_paths(self, level: str, vm: str | None = None, vcpu: int | None = None
                    ) -> Iterator[tuple[tuple[str, ...], int, int, Stack | None, FirstSample]]:
        """The paths of CallGraph.weighted(level, vm, vcpu, split=True) of the whole recording: path, context,
        samples, stack and first sample of each (show.stacks.sorted_paths makes the formats' stacks of them)."""
        for p, n in self._merged(level, vm, vcpu, split=True):
            yield p.path, p.context, n, p.stack, p.sample


def resolve_stacks_of(an: Analysis, known: dict[tuple[int, bytes], Stack],
                      unwinding: Unwinding | None = None) -> SampleStacks:
    """The stacks of a piece's samples (as CallGraph resolves a whole recording's), those in `known` as they are,
    stack copies unwound with the rules found before (`unwinding`)."""
    rec = an.rec
    with an.resolver.objects.aside():  # the whole recording's notes are of its samples' names only
        return resolve_stacks(an.samples, rec.stacks, rec.host_stacks, an.resolver, rec.processes(), an.vm_by_pid,
                              rec.ustacks, known, unwinding)


COPIES_IN_A_PIECE = 128 << 20  # bytes of user-stack copies (record -g --call-graph cfi) a piece holds at most


def stack_piece_rows(scanned: Scanned, rows: int) -> int:
    """The samples of a piece of a recording with call stacks: a quarter of `rows` (a stack record is 560 bytes,
    joined and grouped with copies: docs/scale.md), fewer where each has a user-stack copy (8 KiB)."""
    rows = max(1, rows // 4)
    dtype = scanned.dtypes.get(USTACKS)
    if dtype is None or not any(c.kind == USTACKS for c in scanned.chunks):
        return rows
    return max(1, min(rows, COPIES_IN_A_PIECE // dtype.itemsize))

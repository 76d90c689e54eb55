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
from vmprof_tui.analyse.callgraph import FirstSample, WeightedStacks, first_sample, path_of
from vmprof_tui.analyse.stream import PIECE_ROWS, WholeNeeded
from vmprof_tui.analyse.stream_stacks import StreamedStacks
from vmprof_tui.record.bpf_records import SAMPLE_GUEST_KERNEL
from vmprof_tui.record.recording import USTACKS
from vmprof_tui.record.stream import Scanned
from vmprof_tui.resolve.resolver import UNKNOWN
from vmprof_tui.resolve.stacks import SampleStacks, Stack, resolve_stacks
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
    partial: dict[str, list] = field(default_factory=dict)  # object -> [samples, the least path key]
    truncated: dict[str, list] = field(default_factory=dict)


class StreamedCallGraph(StreamedStacks):
    """A StreamedStacks that also sums the call paths of its level (host, or each VM's guest paths); paths=False:
    only what their notes count (table, JSON and CSV), in memory bounded by the objects."""

    def __init__(self, scanned: Scanned, guest_bundles: dict[str, Path] | None = None, level: str = "host",
                 vm: str | None = None, piece_rows: int = PIECE_ROWS,
                 keep: Callable[[np.ndarray], np.ndarray] | None = None, kernel: bool = True,
                 paths: bool = True) -> None:
        self.with_paths = paths
        self.ended: dict[tuple[str | None, int | None, bool], _Ended] = {}  # by scope, vCPU, idle task (paths=False)
        self.known: dict[tuple[int, bytes], Stack] = {}  # every distinct stack met, resolved once
        self.paths: dict[tuple[str | None, PathKey], _Path] = {}  # by scope (None: host; guest: the VM) and key
        self.stack_notes: dict[str, dict[str, int]] = {}  # resolve.stacks' notes summed: level ("": both) -> text
        self.seen = 0  # samples of the pieces before
        self.kernel_vms: set[int] = set()  # VMM pids of guest-kernel samples (FALLBACK notes are per VM)
        super().__init__(scanned, guest_bundles, level, vm, piece_rows, keep, kernel)

    def _add(self, an: Analysis, lo: int) -> None:
        if self.pieces and any(note not in self.notes for note in an.notes):
            # the whole recording orders its notes as it resolves every sample (by process and mapping), pieces
            # as they meet them: a note first met after the first piece may stand elsewhere in the whole's
            raise WholeNeeded("a note first met after the first piece")
        super()._add(an, lo)
        rec = an.rec
        for table in (rec.stacks, rec.ustacks):  # a record whose sample went with an earlier piece
            if table is not None and len(table) and int(table["time_ns"].min()) < lo:
                raise WholeNeeded("a call-stack record written a piece after its sample")
        resolved = resolve_stacks_of(an, self.known)
        if not self.with_paths:  # the notes need no stack after its piece
            self.known = {}
        elif self.level == "guest":  # a host stack is on no guest path: not kept (kind 0: guest, stack_keys)
            self.known = {k: v for k, v in self.known.items() if k[0] == 0}
        in_kernel = an.is_guest & ((an.samples["flags"] & SAMPLE_GUEST_KERNEL) != 0)
        self.kernel_vms.update(np.unique(an.samples["pid"][in_kernel]).tolist())
        self._add_notes(resolved)
        if self.level in ("host", "all"):
            self._add_paths(an, resolved, "host", None, np.arange(len(an.samples)))
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
                self._add_ended(scope, an.vcpu_of_tid.get(tid, (0, None))[1], int(s["pid"][i]) == 0, k, n, stack)
                continue
            entry = self.paths.get((scope, k))
            if entry is not None:
                entry.samples += n
                continue
            path, context = path_of(an, i, level, stack)
            self.paths[(scope, k)] = _Path(n, self.seen + i, path, context, stack, first_sample(an, i))

    def _add_ended(self, scope: str | None, vcpu: int | None, idle: bool, k: PathKey, n: int,
                   stack: Stack | None) -> None:
        ended = self.ended.setdefault((scope, vcpu, idle), _Ended())
        ended.samples += n
        if stack is None:
            ended.without_stack += n
            return
        for early, by_object in ((stack.partial, ended.partial), (stack.truncated, ended.truncated)):
            if early:
                got = by_object.setdefault(stack.broken_in or UNKNOWN, [0, k])
                got[0] += n
                got[1] = min(got[1], k)

    def _add_notes(self, resolved: SampleStacks) -> None:
        """resolve.stacks' notes of a piece, summed: those that count samples; any other gives up the stream."""
        for level, notes in (("", resolved.notes), *resolved.level_notes.items()):
            summed = self.stack_notes.setdefault(level, {})
            for note in notes:
                m = NOTE.fullmatch(note)
                if m is None or m.group(2).startswith("host stack ids"):  # text, or a count of distinct chains
                    raise WholeNeeded(f"a note on call stacks that pieces do not add up: {note[:80]}")
                summed[m.group(2)] = summed.get(m.group(2), 0) + int(m.group(1))
        fallbacks = [t for t in self.stack_notes.get("guest", {}) if t.startswith(FALLBACK)]
        if len(fallbacks) > 1 and len(self.kernel_vms) > 1:  # their order is by VM, then as met: not kept so
            raise WholeNeeded("guest-kernel frames by frame pointers for several reasons in several VMs")

    def _notes(self, level: str) -> list[str]:
        def rank(text: str) -> int:
            for r, prefix in enumerate(NOTE_ORDER):
                if text.startswith(prefix):
                    return r
            return len(NOTE_ORDER) + REASON_ORDER.get(text.partition("end [partial]: ")[2], len(REASON_ORDER))

        summed = self.stack_notes.get(level, {})
        return [f"{summed[text]} {text}" for text in sorted(summed, key=rank)]  # stable: as met within a rank

    # -- what the report reads -----------------------------------------------------------------------------
    def _merged(self, level: str, vm: str | None, vcpu: int | None, split: bool) -> Iterator[tuple[_Path, int]]:
        """The paths of the level (one VM's, of one vCPU) in the whole recording's order, with their samples; not
        split: the paths of every CPU and thread merged, as CallGraph.weighted() groups them."""
        scope = None if level == "host" else vm
        idle = level == "host" and bool(self.idle_cpus)  # as the host profile: idle is from sched events
        chosen = sorted((k, p) for (s, k), p in self.paths.items()
                        if s == scope and vcpu in (None, p.sample.vcpu) and not (idle and p.sample.pid == 0))
        at = 0
        while at < len(chosen):
            end = at + 1
            while not split and end < len(chosen) and chosen[end][0][:4] == chosen[at][0][:4]:
                end += 1
            group = [p for _k, p in chosen[at:end]]
            yield min(group, key=lambda p: p.first), sum(p.samples for p in group)
            at = end

    def weighted(self, level: str, vm: str | None = None, vcpu: int | None = None) -> WeightedStacks:
        """CallGraph.weighted(level, vm, vcpu) of the whole recording (paths=False: without its paths, but with
        what its notes count, objects in the order the paths first name them)."""
        if not self.with_paths:
            scope = None if level == "host" else vm
            idle = level == "host" and bool(self.idle_cpus)
            chosen = [e for (s, v, i), e in self.ended.items() if s == scope and vcpu in (None, v) and not (idle and i)]
            out = WeightedStacks(level, [], np.empty(0, np.int64), [], [], samples=sum(e.samples for e in chosen),
                                 without_stack=sum(e.without_stack for e in chosen),
                                 resolve_notes=self._notes("") + self._notes(level))
            for name, into in (("partial", out.partial), ("truncated", out.truncated)):
                summed: dict[str, list] = {}
                for e in chosen:
                    for obj, (n, k) in getattr(e, name).items():
                        got = summed.setdefault(obj, [0, k])
                        got[0] += n
                        got[1] = min(got[1], k)
                for obj, (n, _k) in sorted(summed.items(), key=lambda kv: kv[1][1]):
                    into[obj] += n
            return out
        merged = list(self._merged(level, vm, vcpu, split=False))
        counts = np.array([n for _p, n in merged], np.int64)
        out = WeightedStacks(level, [], counts, [], [], samples=int(counts.sum()),
                             resolve_notes=self._notes("") + self._notes(level))
        for p, n in merged:
            out.add(p.path, p.context, n, p.stack, p.first)
        return out

    def split_paths(self, level: str, vm: str | None = None, vcpu: int | None = None
                    ) -> Iterator[tuple[tuple[str, ...], int, int, Stack | None, FirstSample]]:
        """The paths of CallGraph.weighted(level, vm, vcpu, split=True) of the whole recording: path, context,
        samples, stack and first sample of each (show.stacks.sorted_paths makes the formats' stacks of them)."""
        for p, n in self._merged(level, vm, vcpu, split=True):
            yield p.path, p.context, n, p.stack, p.sample


def resolve_stacks_of(an: Analysis, known: dict[tuple[int, bytes], Stack]) -> SampleStacks:
    """The stacks of a piece's samples (as CallGraph resolves a whole recording's), those in `known` as they are."""
    rec = an.rec
    with an.resolver.objects.aside():  # the whole recording's notes are of its samples' names only
        return resolve_stacks(an.samples, rec.stacks, rec.host_stacks, an.resolver, rec.processes(), an.vm_by_pid,
                              rec.ustacks, known)


COPIES_IN_A_PIECE = 128 << 20  # bytes of user-stack copies (record -g --call-graph cfi) a piece holds at most


def stack_piece_rows(scanned: Scanned, rows: int) -> int:
    """The samples of a piece of a recording with call stacks: a quarter of `rows` (a stack record is 560 bytes,
    joined and grouped with copies: docs/scale.md), fewer where each has a user-stack copy (8 KiB)."""
    rows = max(1, rows // 4)
    dtype = scanned.dtypes.get(USTACKS)
    if dtype is None or not any(c.kind == USTACKS for c in scanned.chunks):
        return rows
    return max(1, min(rows, COPIES_IN_A_PIECE // dtype.itemsize))

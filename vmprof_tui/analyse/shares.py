"""What a profile's percentages are made of, as parts in samples that add: across the vCPUs of a VM, and across
spans of time (the live screen sums each chunk's parts instead of analysing its whole window every refresh).

The one place where parts become the shares shown (OS:USER:IDLE:steal of a guest, OS:USER:IDLE:VM of the host),
and the types the outputs read: a profile's ``Row`` and the ``Profile`` (analysis.Analysis makes them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from vmprof_tui import arrays
from vmprof_tui.analyse.blanks import IDLE_CAUSE, Cause, steal_of_type
from vmprof_tui.analyse.kinds import RowKind
from vmprof_tui.resolve.demangle import demangle
from vmprof_tui.resolve.resolver import RowNames


@dataclass(slots=True)
class Row:
    """One line of a profile.  `kind` says what it counts; function and module are only what users read
    (exports keep their keys: the kind is not written out)."""
    samples: float
    function: str
    module: str
    process: str | None = None
    pid: int | None = None
    vm: str | None = None
    kind: RowKind = RowKind.FUNCTION
    kernel: float = 0.0  # of `samples`, those taken in kernel mode (the guest's kernel for guest samples)

    def to_json(self, total: float) -> dict:
        return {"samples": int(round(self.samples)), "ratio": round(100.0 * self.samples / total, 3) if total else 0.0,
                "function": demangle(self.function), "symbol": self.function, "module": self.module,
                "process": self.process, "pid": self.pid,
                "vm": self.vm}


def process_name(row: Row) -> str | None:
    """`name [pid]` of a row's process (None when it has none)."""
    if not row.process:
        return None
    return f"{row.process} [{row.pid}]" if row.pid is not None else row.process


@dataclass
class Profile:
    level: str  # host | guest
    vm: str | None
    vcpu: int | None
    total_samples: float
    duration_s: float
    lost_samples: int
    ratios: dict[str, float]
    rows: list[Row]  # or, in a report of a large recording, a row_table.RowTable (the same rows as columns)
    unresolved_samples: int = 0
    notes: list[str] = field(default_factory=list)
    virtual_samples: float | None = None  # of total_samples, made from the scheduler events (idle, steal)

    def __post_init__(self) -> None:
        if self.virtual_samples is None:
            summed = getattr(self.rows, "virtual_samples", None)  # rows as columns (analyse/row_table.py)
            # most rows are functions: an identity test first (is_virtual hashes an Enum, a Python call)
            self.virtual_samples = summed() if summed is not None else sum(
                r.samples for r in self.rows if r.kind is not RowKind.FUNCTION and r.kind.is_virtual)

    @property
    def shown_rows(self) -> list[Row]:
        """The rows users see: one that rounds to 0 samples (a few virtual samples of steal) is noise on a screen
        or in a table; `rows` keeps them for whoever adds rows up (the fleet store, pprof's totals)."""
        return [r for r in self.rows if r.samples >= 0.5]

    def to_json(self) -> dict:
        total = self.total_samples
        unresolved = self.unresolved_samples / total if total else 0.0
        return {"level": self.level, "vm": self.vm, "vcpu": self.vcpu, "total_samples": int(round(total)),
                "duration_s": round(self.duration_s, 6), "lost_samples": self.lost_samples,
                "unresolved_samples": self.unresolved_samples,
                "unresolved_ratio": round(unresolved, 5), "unresolved_percent": round(100.0 * unresolved, 3),
                "ratios": {k: round(v, 3) for k, v in self.ratios.items()},
                "rows": [r.to_json(total) for r in self.shown_rows], "notes": self.notes}


def row_ratios(level: str, rows: list[Row]) -> dict[str, float]:
    """The shares of a level made from its rows: what a filtered profile's ratios are of (the rows it kept).  The
    same keys as HostParts.ratios and GuestParts.ratios; host rows of pid 0 are the idle task, as in HostParts."""
    parts: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.kind in (RowKind.FUNCTION, RowKind.UNKNOWN):
            if level == "host" and r.pid == 0:
                parts["idle"] += r.samples
            else:
                parts["os"] += r.kernel
                parts["user"] += r.samples - r.kernel
        elif r.kind in (RowKind.IDLE, RowKind.CPU_IDLE):
            parts["idle"] += r.samples
        else:
            kind = "vm" if r.kind is RowKind.VM else "halt_poll" if r.kind is RowKind.HALT_POLL else "steal"
            parts[kind] += r.samples
    keys = ["os", "user", "idle", "vm"] if level == "host" else ["os", "user", "idle", "steal"] + (
        ["halt_poll"] if "halt_poll" in parts else [])
    return percent([(k, parts[k]) for k in keys], sum(parts.values()))


def whole_rows(rows: list[Row]) -> list[Row]:
    """The rows in whole samples that add up to their sum rounded: virtual rows (blank time over the sampling
    period) are fractional, and rounding each alone made every format's rows add up to a total one sample off
    the rounded total.  The fractions go to the rows with the largest remainders (ties: the earlier row), which
    is plain rounding whenever that adds up already; a row keeps its fractional samples (and so its percentage)
    unless its whole count is not its samples rounded."""
    samples = np.array([r.samples for r in rows], float)
    whole = np.floor(samples)
    remainder = samples - whole
    short = int(round(samples.sum() - whole.sum()))
    if short:
        whole[np.argsort(-remainder, kind="stable")[:short]] += 1
    return [r if n == round(r.samples) else replace(r, samples=n, kernel=min(r.kernel, n))
            for r, n in zip(rows, whole.tolist(), strict=True)]


def percent(parts: list[tuple[str, float]], total: float) -> dict[str, float]:
    return {k: 100.0 * v / total if total else 0.0 for k, v in parts}


@dataclass
class GuestParts:
    """A guest's (or one vCPU's) time in samples: real guest samples in its kernel and in user mode, blank time by
    cause (virtual samples at each vCPU's rate, in the order the blanks first show the causes), samples of its
    vCPU threads in the VMM or KVM (type 2 steal) and KVM's halt polling."""
    kernel: float = 0.0
    user: float = 0.0
    blank: dict[Cause, float] = field(default_factory=lambda: defaultdict(float))
    vmm: float = 0.0
    poll: float = 0.0

    def add(self, other: GuestParts) -> None:
        self.kernel += other.kernel
        self.user += other.user
        for cause, n in other.blank.items():
            self.blank[cause] += n
        self.vmm += other.vmm
        self.poll += other.poll

    def virtual(self) -> dict[Cause, float]:
        """The virtual rows of the guest profile: blank causes, then the VMM's samples, then halt polling."""
        out = dict(self.blank)
        if self.vmm:
            out[(RowKind.STEAL_VMM, None)] = out.get((RowKind.STEAL_VMM, None), 0.0) + self.vmm
        if self.poll:
            out[(RowKind.HALT_POLL, None)] = out.get((RowKind.HALT_POLL, None), 0.0) + self.poll
        return out

    @property
    def total(self) -> float:
        return self.kernel + self.user + sum(self.virtual().values())

    def ratios(self) -> dict[str, float]:
        virtual = self.virtual()
        steal = sum(v for (kind, _v), v in virtual.items() if kind.is_steal)
        parts = [("os", self.kernel), ("user", self.user), ("idle", virtual.get(IDLE_CAUSE, 0.0)), ("steal", steal)]
        if (RowKind.HALT_POLL, None) in virtual:
            parts.append(("halt_poll", virtual[(RowKind.HALT_POLL, None)]))
        return percent(parts, self.total)

    def steal_of_type(self, steal_type: int) -> float:
        return steal_of_type(self.virtual(), steal_type)


@dataclass
class HostParts:
    """The host's samples: its kernel and user mode, idle (samples, and idle time from the sched events as virtual
    samples), and the vCPU threads of the VMs."""
    kernel: float = 0.0
    user: float = 0.0
    idle: float = 0.0
    vm: float = 0.0

    def add(self, other: HostParts) -> None:
        self.kernel += other.kernel
        self.user += other.user
        self.idle += other.idle
        self.vm += other.vm

    @property
    def total(self) -> float:
        return self.kernel + self.user + self.idle + self.vm

    def ratios(self) -> dict[str, float]:
        return percent([("os", self.kernel), ("user", self.user), ("idle", self.idle), ("vm", self.vm)], self.total)


@dataclass
class RowCounts:
    """Samples by profile row (process, pid, function, module) under the resolver's name codes: what adds across spans
    (the codes are the same in every analysis that shares a resolver), the top process and function of a summary,
    and a window's rows.  Codes and counts only: the names are the resolver's (`RowNames`), read for the rows shown."""
    codes: np.ndarray  # int64, ascending, each once (the order of the rows)
    counts: np.ndarray  # float, whole samples
    names: RowNames | None  # None: no rows

    def negated(self) -> RowCounts:
        """The same rows with their counts taken away (a span leaving a window)."""
        return replace(self, counts=-self.counts)

    @staticmethod
    def combine(parts: list[RowCounts]) -> RowCounts:
        """The sum of counts, in the order of the codes; rows whose counts cancel out (negated parts) go."""
        parts = [p for p in parts if len(p.codes)]
        if not parts:
            return RowCounts(np.empty(0, np.int64), np.empty(0), None)
        if len(parts) == 1:
            return parts[0]
        uniq, inverse = arrays.unique(np.concatenate([p.codes for p in parts]), return_inverse=True)
        counts = np.bincount(inverse, np.concatenate([p.counts for p in parts]), minlength=len(uniq))
        return RowCounts(uniq, counts, parts[0].names)._nonzero()

    def plus(self, other: RowCounts) -> RowCounts:
        """self + other without sorting self again: other's rows are added to or inserted among self's (the
        live window's sum of the last refresh, plus what changed since).  Rows whose counts cancel out stay until
        they are a quarter of the rows (a window's rows come and go every second: dropping them is a copy), as no
        count of them is shown."""
        if not len(self.codes):
            return other
        pos = np.searchsorted(self.codes, other.codes)
        hit = pos < len(self.codes)
        hit[hit] = self.codes[pos[hit]] == other.codes[hit]
        counts = self.counts.copy()
        counts[pos[hit]] += other.counts[hit]  # codes are each once: no position twice
        new = np.flatnonzero(~hit)
        if not len(new):
            out = replace(self, counts=counts)
        else:  # one merge of places for both arrays (np.insert works them out again for each)
            size = len(self.codes) + len(new)
            to_new = pos[new] + np.arange(len(new))  # other.codes are sorted, as self's: their places in the merge
            to_old = np.ones(size, bool)
            to_old[to_new] = False

            def merged(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
                out = np.empty(size, mine.dtype)
                out[to_old] = mine
                out[to_new] = theirs[new]
                return out

            out = RowCounts(merged(self.codes, other.codes), merged(counts, other.counts), self.names or other.names)
        return out._nonzero() if 4 * np.count_nonzero(out.counts == 0) > len(out.counts) else out

    def _nonzero(self) -> RowCounts:
        keep = self.counts != 0  # whole samples: exact in floats
        if keep.all():
            return self
        return RowCounts(self.codes[keep], self.counts[keep], self.names)

    def top(self, by_name: bool) -> tuple[str, str]:
        """(process, function) of the resolved row with the most samples, ties to the earlier row; by_name: the
        process is instead the process name whose resolved rows sum to the most.  "-" where nothing resolved."""
        if not len(self.codes) or self.names is None:
            return "-", "-"
        unknown = self.names.unknown(self.codes)
        resolved = np.where(unknown, -1.0, self.counts)
        if not resolved.max() > 0:
            return "-", "-"
        best_row = int(np.argmax(resolved))
        top = self.codes[best_row:best_row + 1]
        function = str(self.names.strings_of(top, "func")[0])
        if not by_name:
            return str(self.names.strings_of(top, "process")[0]) or "-", function
        # summed by name over the rows here (a window's: the same as summing each span's sums); names are few
        rows = np.flatnonzero(~unknown)
        names = self.names.ids(self.codes[rows], "process_name_code")
        sums = np.bincount(names, self.counts[rows])
        best = np.flatnonzero(sums == sums.max())
        first = [int(np.argmax(names == b)) for b in best.tolist()]  # ties: the name of the earlier row
        named = rows[min(first)]
        name = str(self.names.strings_of(self.codes[named:named + 1], "process")[0])
        return name or "?", function

    def rows(self, vm: str | None, limit: int | None = None) -> tuple[list[Row], int]:
        """The rows of half a sample or more (what Profile.shown_rows shows) as Rows, the `limit` with the most
        samples first, and how many there are."""
        shown = np.flatnonzero(self.counts >= 0.5)
        count = len(shown)
        if not count or self.names is None:
            return [], count
        if limit is not None and limit < count:  # only rows that can be among the `limit` largest are sorted
            cut = -np.partition(-self.counts[shown], limit - 1)[limit - 1]
            shown = shown[self.counts[shown] >= cut]
        best = shown[np.argsort(-self.counts[shown], kind="stable")[:limit]]
        codes, names = self.codes[best], self.names
        kinds = (RowKind.FUNCTION, RowKind.UNKNOWN)
        return [Row(n, f, m, p or None, pid if pid >= 0 else None, vm, kinds[u]) for n, f, m, p, pid, u in zip(
            self.counts[best].tolist(), *(names.strings_of(codes, c).tolist() for c in ("func", "module", "process")),
            names.ids(codes, "pid").tolist(), names.unknown(codes).tolist(), strict=True)], count


@dataclass
class HostSummary:
    """The host at a glance (Analysis.host_summary)."""
    ratios: dict[str, float]
    total_samples: float
    lost_samples: int
    top_process: str
    top_function: str


@dataclass
class GuestSummary:
    """A VM at a glance (Analysis.guest_summary): its shares in %, steal of type 1 and 2 in samples, top names."""
    ratios: dict[str, float]
    total_samples: float
    steal1: float
    steal2: float
    top_process: str
    top_function: str


def guest_summary(parts: GuestParts, names: RowCounts) -> GuestSummary:
    return GuestSummary(parts.ratios(), parts.total, parts.steal_of_type(1), parts.steal_of_type(2),
                        *names.top(by_name=True))


@dataclass
class SpanSummary:
    """One span [lo, hi) of the host clock in parts and rows that add (Analysis.span_summary)."""
    span_ns: tuple[int, int]
    vms: list[str]
    host: HostParts
    host_rows: RowCounts  # the host profile's function rows
    host_others: list[Row]  # and its other rows: CPU idle, one per VM
    vcpus: dict[tuple[str, int], tuple[int, GuestParts, RowCounts]]  # (VM, vCPU id) -> (thread id, parts, rows)


def _rows_of(span: SpanSummary, of: tuple[str, int | None] | None) -> list[RowCounts]:
    """A span's rows of the host (None) or of a guest (VM, vCPU or None: each of its vCPUs')."""
    if of is None:
        return [span.host_rows]
    vm, vcpu = of
    return [names for (v_vm, v), (_tid, _parts, names) in span.vcpus.items() if v_vm == vm and vcpu in (None, v)]


class WindowSummary:
    """A sliding window from the summaries of the spans it is made of (the live screen's drained chunks, each
    summarised once): what Analysis.host_summary / guest_summary / guest_ratios / vm_names / vcpu_threads give
    for the whole window, and the rows of its host and guest profiles."""

    def __init__(self, spans: list[SpanSummary], lost_samples: int, previous: WindowSummary | None = None) -> None:
        """previous: the last refresh's summary; the row sums it made are slid (the spans that came in added, those
        that left taken out) instead of summing every span again."""
        self.spans = spans
        self.lost_samples = lost_samples
        self.host = HostParts()
        self.vcpus: dict[str, dict[int, int]] = {}  # VM -> vCPU id -> its thread (the latest span's)
        self.parts: dict[tuple[str, int], GuestParts] = {}
        vms: dict[str, None] = {}
        for span in spans:
            self.host.add(span.host)
            vms.update(dict.fromkeys(span.vms))
            for (vm, vcpu), (tid, parts, _names) in span.vcpus.items():
                self.vcpus.setdefault(vm, {})[vcpu] = tid
                self.parts.setdefault((vm, vcpu), GuestParts()).add(parts)
        self._vms = sorted(vms)
        self._summaries: dict[tuple[str, int | None], GuestSummary] = {}
        self._host_summary: HostSummary | None = None
        self._rows: dict[tuple[str, int | None] | None, RowCounts] = {}  # None: the host
        self._before = (previous.spans, previous._rows) if previous is not None else None

    def span(self) -> tuple[int, int]:
        if not self.spans:
            return 0, 0
        return self.spans[0].span_ns[0], self.spans[-1].span_ns[1]

    def vm_names(self) -> list[str]:
        return self._vms

    def vcpu_threads(self, vm: str) -> list[tuple[int, int]]:
        return sorted(self.vcpus.get(vm, {}).items())

    def host_summary(self) -> HostSummary:
        if self._host_summary is None:  # the overview's title, its host row and the history all ask
            self._host_summary = HostSummary(self.host.ratios(), self.host.total, self.lost_samples,
                                             *self._row_counts(None).top(by_name=False))
        return self._host_summary

    def host_rows(self, limit: int | None) -> tuple[list[Row], int]:
        """The host profile's `limit` rows (None: all) with the most samples (of those Profile.shown_rows shows), and
        how many rows it shows."""
        others: dict[tuple, Row] = {}
        for span in self.spans:
            for r in span.host_others:
                key = (r.kind, r.function, r.module, r.pid)
                if key in others:
                    others[key].samples += r.samples
                else:
                    others[key] = replace(r)
        shown = [r for r in others.values() if r.samples >= 0.5]
        rows, count = self._row_counts(None).rows(None, limit)
        return sorted(rows + shown, key=lambda r: -r.samples)[:limit], count + len(shown)

    def guest_rows(self, vm: str, vcpu: int | None = None) -> list[Row]:
        """The rows of a guest profile that Profile.shown_rows shows: functions, and the virtual rows by cause."""
        rows, _count = self._row_counts((vm, vcpu)).rows(vm)
        virtual = [Row(n, *kind.label(vcpu=v), None, None, vm, kind)
                   for (kind, v), n in self._guest_parts(vm, vcpu).virtual().items()]
        return rows + [r for r in virtual if r.samples >= 0.5]

    def guest_summary(self, vm: str, vcpu: int | None = None) -> GuestSummary:
        if (vm, vcpu) not in self._summaries:
            if vm not in self._vms:
                raise KeyError(vm)
            self._summaries[(vm, vcpu)] = guest_summary(self._guest_parts(vm, vcpu), self._row_counts((vm, vcpu)))
        return self._summaries[(vm, vcpu)]

    def _row_counts(self, of: tuple[str, int | None] | None) -> RowCounts:
        """The rows of the host (None) or of a guest (VM, vCPU or None), summed over the spans: the previous
        refresh's sum with the spans that came in since added and those that left taken out, when that is less to
        sum than the window (a refresh then costs what changed, not the window)."""
        if of not in self._rows:
            if self._before is not None and of in self._before[1]:
                spans_before, rows_before = self._before
                now, then = {id(span) for span in self.spans}, {id(span) for span in spans_before}
                came = [span for span in self.spans if id(span) not in then]
                left = [span for span in spans_before if id(span) not in now]
                if len(came) + len(left) < len(self.spans):
                    changed = [p for span in came for p in _rows_of(span, of)]
                    changed += [p.negated() for span in left for p in _rows_of(span, of)]
                    self._rows[of] = rows_before[of].plus(RowCounts.combine(changed))
                    return self._rows[of]
            self._rows[of] = RowCounts.combine([p for span in self.spans for p in _rows_of(span, of)])
        return self._rows[of]

    def guest_ratios(self, vm: str, vcpu: int | None = None) -> dict[str, float]:
        return self._guest_parts(vm, vcpu).ratios()

    def _vcpus(self, vm: str, vcpu: int | None) -> list[int]:
        return sorted(self.vcpus.get(vm, {})) if vcpu is None else [vcpu]

    def _guest_parts(self, vm: str, vcpu: int | None) -> GuestParts:
        parts = GuestParts()
        for v in self._vcpus(vm, vcpu):
            if (vm, v) in self.parts:
                parts.add(self.parts[(vm, v)])
        return parts

"""The collection patterns of the paper (Table 8) and their data volume.

| pattern | LBR filter     | kept per entry | paper  |
|---------|----------------|----------------|--------|
| type4   | call + return  | from + to      | Type4 (used for the paper's evaluation) |
| type1   | call only      | from + to      | Type1 |
| type2   | call + return  | from only      | Type2 (half the data) |
| type3   | call + return  | to only        | Type3 (half the data) |
| any     | every branch   | from + to      | not in the paper: exact straight-line blocks |

With a reduced pattern the missing half of each entry is reconstructed from the code
where that is unambiguous (see :mod:`vmprof_tui.lbr.reconstruct`); blocks that cannot be
reconstructed are counted, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmprof_tui.lbr.model import BranchFilter, Fields
from vmprof_tui.lbr.records import HEADER_DTYPE, RINGBUF_HDR_BYTES, ring_bytes_per_sample


@dataclass(frozen=True)
class Pattern:
    name: str
    branch_filter: BranchFilter
    fields: Fields
    description: str

    def with_options(self, kernel: bool = False, info: bool = False) -> Pattern:
        return Pattern(self.name, self.branch_filter | (BranchFilter.KERNEL if kernel else 0),
                       self.fields | (Fields.INFO if info else 0), self.description)


_CR = BranchFilter.CALL | BranchFilter.RETURN
PATTERNS: dict[str, Pattern] = {
    "type4": Pattern("type4", _CR, Fields.FROM | Fields.TO, "call+return, from+to pairs (paper Type4)"),
    "type1": Pattern("type1", BranchFilter.CALL, Fields.FROM | Fields.TO, "call only, from+to pairs (paper Type1)"),
    "type2": Pattern("type2", _CR, Fields.FROM, "call+return, sources only (paper Type2)"),
    "type3": Pattern("type3", _CR, Fields.TO, "call+return, targets only (paper Type3)"),
    "any": Pattern("any", BranchFilter.ANY, Fields.FROM | Fields.TO, "every taken branch, from+to (exact blocks)"),
}
DEFAULT_PATTERN = "type4"


def get(name: str) -> Pattern:
    try:
        return PATTERNS[name]
    except KeyError:
        raise ValueError(f"unknown LBR pattern {name!r}; choose from {', '.join(PATTERNS)}") from None


@dataclass(frozen=True)
class Volume:
    pattern: str
    description: str
    values_per_sample: int  # 64-bit addresses/words kept per sample (the paper's "32 / 16 values")
    payload_bytes: int  # branch data per sample
    ring_bytes: int  # whole sample in the ring buffer: header + payload + ring-buffer header
    bytes_per_s: float  # at the given sampling rate, over all CPUs


def volume(pattern: Pattern, nr: int = 16, samples_per_s: float = 1000.0, cpus: int = 1) -> Volume:
    n_arrays = sum(1 for f in (Fields.FROM, Fields.TO, Fields.INFO) if pattern.fields & f)
    ring = ring_bytes_per_sample(nr, pattern.fields)
    return Volume(pattern.name, pattern.description, n_arrays * nr, n_arrays * nr * 8, ring,
                  ring * samples_per_s * cpus)


def volume_table(nr: int = 16, samples_per_s: float = 1000.0, cpus: int = 1, info: bool = False) -> str:
    """A text table of every pattern's data volume (shown by `vmprof blocks --patterns`)."""
    rows = [volume(p.with_options(info=info), nr, samples_per_s, cpus) for p in PATTERNS.values()]
    head = (f"LBR collection patterns: {nr} entries, {samples_per_s:g} samples/s x {cpus} CPU(s)"
            f"{', with the info word (timed LBR)' if info else ''}; per-sample header "
            f"{HEADER_DTYPE.itemsize} B + ring-buffer header {RINGBUF_HDR_BYTES} B")
    lines = [head, f"{'pattern':8} {'values':>6} {'payload B':>9} {'sample B':>8} {'MB/s':>8}  description"]
    for v in rows:
        lines.append(f"{v.pattern:8} {v.values_per_sample:6d} {v.payload_bytes:9d} {v.ring_bytes:8d} "
                     f"{v.bytes_per_s / 1e6:8.3f}  {v.description}")
    return "\n".join(lines)

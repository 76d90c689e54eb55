"""pprof output: a gzipped ``profile.proto`` (github.com/google/pprof/proto/profile.proto).

``go tool pprof -http=: FILE``, speedscope, Grafana Pyroscope and most other
profile viewers read it.  Each row of the profile becomes one pprof Sample with
two values, ``samples/count`` and ``cpu/nanoseconds`` (samples × sampling
period, from the same whole count), and the frames of ``show.stacks``, leaf first::

    function (Function.filename = module)   e.g. compute_a / compute, [libcrypto.so.3]
    process  "VM/name [pid]"                e.g. twoprocs/compute [1]
    VM       "[name]"                       e.g. [twoprocs]

so that flame views group the whole machine by VM → process → function.  At
the host level the one row per VM is split into that VM's guest processes and
functions (the VM frame then carries exactly the VM row's samples): one flame
graph shows host processes, host kernel and every guest program side by side.
Demangled functions keep the mangled symbol in ``Function.system_name``.
Samples also carry labels ``vm``, ``process``, ``pid`` and ``module`` for
``-tagfocus``/``-tagshow``.

With call stacks (a recording made with -g) each sample's stack is its call path (``show.stacks``):
every call frame is a Location with its address and the Mapping of its file (file name, build id,
start, limit, offset; symbolized already, so ``has_functions``), and samples are split by CPU and
thread with labels ``cpu``, ``vcpu`` and ``tid``.

Why the protobuf is encoded by hand: the ``protobuf`` runtime cannot encode a
message without classes generated from ``profile.proto`` by ``protoc`` (or a
descriptor built at run time), which would add a dependency and a build step
for a handful of flat messages.  The wire format needed here is small — varints,
length-delimited fields and packed repeated integers — and is written directly
below; the tests decode the output with the independent ``protobuf`` package.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence

import numpy as np

from vmprof_tui.analyse.analysis import Analysis
from vmprof_tui.analyse.shares import Profile
from vmprof_tui.mapping import Mapping
from vmprof_tui.show.formats import ReportInput
from vmprof_tui.show.stacks import Frame, Stack, profile_stacks

# Field numbers of profile.proto.
# Profile
P_SAMPLE_TYPE, P_SAMPLE, P_MAPPING, P_LOCATION, P_FUNCTION, P_STRING_TABLE = 1, 2, 3, 4, 5, 6
P_TIME_NANOS, P_DURATION_NANOS, P_PERIOD_TYPE, P_PERIOD, P_COMMENT, P_DEFAULT_SAMPLE_TYPE = 9, 10, 11, 12, 13, 14
# ValueType
VT_TYPE, VT_UNIT = 1, 2
# Sample
S_LOCATION_ID, S_VALUE, S_LABEL = 1, 2, 3
# Label
L_KEY, L_STR, L_NUM, L_NUM_UNIT = 1, 2, 3, 4
# Mapping
M_ID, M_START, M_LIMIT, M_OFFSET, M_FILENAME, M_BUILD_ID, M_HAS_FUNCTIONS = 1, 2, 3, 4, 5, 6, 7
# Location
LOC_ID, LOC_MAPPING_ID, LOC_ADDRESS, LOC_LINE = 1, 2, 3, 4
# Line
LINE_FUNCTION_ID, LINE_LINE = 1, 2
# Function
F_ID, F_NAME, F_SYSTEM_NAME, F_FILENAME = 1, 2, 3, 4

WIRE_VARINT, WIRE_LEN = 0, 2

# One mapping for every location: frames are already symbolized (has_functions), so pprof
# neither looks for binaries to symbolize nor warns that the main binary has no name.
MAPPING_ID, MAPPING_NAME = 1, "[vmprof]"
NUM_UNIT = "id"  # the unit of the numeric labels (cpu, vcpu, tid, pid): numbers that name things


# -- protobuf wire format ------------------------------------------------------------

ONE_PROFILE = True

def varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes (two's complement), as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint((field << 3) | wire)


def field_varint(field: int, value: int) -> bytes:
    """A scalar integer field; zero is the proto3 default and is left out."""
    return key(field, WIRE_VARINT) + varint(value) if value else b""


def field_bytes(field: int, data: bytes) -> bytes:
    return key(field, WIRE_LEN) + varint(len(data)) + data


def field_packed(field: int, values: Iterable[int]) -> bytes:
    body = b"".join(varint(v) for v in values)
    return field_bytes(field, body) if body else b""


class StringTable:
    """The profile's string table: deduplicated, index 0 is the empty string."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.strings)
            self.strings.append(s)
        return i


# -- the profile --------------------------------------------------------------------

class ProfileBuilder:
    """Functions, locations (one per function: a frame) and samples, interned as they come."""

    def __init__(self) -> None:
        self.strings = StringTable()
        self.functions: list[bytes] = []
        self.locations: list[bytes] = []
        self.samples: list[bytes] = []
        self.mappings: list[bytes] = []
        self._location_of: dict[tuple, int] = {}
        self._function_of: dict[tuple[str, str, str], int] = {}
        self._mapping_of: dict[Mapping, int] = {}

    def mapping(self, m: Mapping | None) -> int:
        """The id of a file mapping (MAPPING_ID, the one pseudo mapping, for frames without one)."""
        if m is None:
            return MAPPING_ID
        mid = self._mapping_of.get(m)
        if mid is None:
            mid = self._mapping_of[m] = len(self.mappings) + MAPPING_ID + 1
            self.mappings.append(field_varint(M_ID, mid) + field_varint(M_START, m.start) +
                                 field_varint(M_LIMIT, m.end) + field_varint(M_OFFSET, m.offset) +
                                 field_varint(M_FILENAME, self.strings(m.path)) +
                                 field_varint(M_BUILD_ID, self.strings(m.build_id or "")) +
                                 field_varint(M_HAS_FUNCTIONS, 1))
        return mid

    def function(self, name: str, filename: str, system_name: str) -> int:
        k = (name, filename, system_name)
        fid = self._function_of.get(k)
        if fid is None:
            fid = self._function_of[k] = len(self.functions) + 1
            self.functions.append(field_varint(F_ID, fid) + field_varint(F_NAME, self.strings(name)) +
                                  field_varint(F_SYSTEM_NAME, self.strings(system_name)) +
                                  field_varint(F_FILENAME, self.strings(filename)))
        return fid

    def frame_location(self, f: Frame) -> int:
        """A call frame at its address in its mapping; frames without an address as location()."""
        if not f.address:
            return self.location(f.name, f.module, f.system_name)
        k = (f.name, f.module, f.address, f.mapping)
        loc = self._location_of.get(k)
        if loc is None:
            line = field_varint(LINE_FUNCTION_ID, self.function(f.name, f.module, f.system_name))
            loc = self._location_of[k] = len(self.locations) + 1
            self.locations.append(field_varint(LOC_ID, loc) + field_varint(LOC_MAPPING_ID, self.mapping(f.mapping)) +
                                  field_varint(LOC_ADDRESS, f.address) + field_bytes(LOC_LINE, line))
        return loc

    def location(self, name: str, filename: str = "", system_name: str = "") -> int:
        """The location id of a frame; a frame is one Location with one Line of one Function.

        Function.system_name is set only to a mangled symbol whose demangled form is the name: pprof
        demangles a system name that looks like C++ unless the name already differs from it, and would cut
        "compute(1) [1]" down to "compute [1]".
        """
        k = (name, filename)
        loc = self._location_of.get(k)
        if loc is None:
            fid = self.function(name, filename, system_name)
            loc = self._location_of[k] = len(self.locations) + 1
            line = field_varint(LINE_FUNCTION_ID, fid)
            self.locations.append(field_varint(LOC_ID, loc) + field_varint(LOC_MAPPING_ID, MAPPING_ID) +
                                  field_bytes(LOC_LINE, line))
        return loc

    def label(self, name: str, text: str | None = None, num: int | None = None) -> bytes:
        body = field_varint(L_KEY, self.strings(name))
        if text is not None:
            body += field_varint(L_STR, self.strings(text))
        if num is not None:
            # written even when 0 (pid 0, CPU 0 and vCPU 0 are values), with a unit: pprof drops a numeric
            # label whose number and unit are both 0, so `go tool pprof` would lose every vcpu=0 label
            body += key(L_NUM, WIRE_VARINT) + varint(num) + field_varint(L_NUM_UNIT, self.strings(NUM_UNIT))
        return field_bytes(S_LABEL, body)

    def sample(self, stack: Sequence[int], values: Sequence[int], labels: Sequence[bytes]) -> None:
        self.samples.append(field_packed(S_LOCATION_ID, stack) + field_packed(S_VALUE, values) + b"".join(labels))

    def value_type(self, field: int, type_: str, unit: str) -> bytes:
        body = field_varint(VT_TYPE, self.strings(type_)) + field_varint(VT_UNIT, self.strings(unit))
        return field_bytes(field, body)

    def encode(self, *, period_ns: int, time_nanos: int, duration_nanos: int, comments: Sequence[str]) -> bytes:
        head = self.value_type(P_SAMPLE_TYPE, "samples", "count") + self.value_type(P_SAMPLE_TYPE, "cpu", "nanoseconds")
        period_type = self.value_type(P_PERIOD_TYPE, "cpu", "nanoseconds")
        comment_ids = [self.strings(c) for c in comments]
        default_type = self.strings("cpu")
        # every string is interned by now: the table can be written
        mapping = (field_varint(M_ID, MAPPING_ID) + field_varint(M_FILENAME, self.strings(MAPPING_NAME)) +
                   field_varint(M_HAS_FUNCTIONS, 1))
        parts = [head]
        parts += [field_bytes(P_SAMPLE, s) for s in self.samples]
        parts.append(field_bytes(P_MAPPING, mapping))
        parts += [field_bytes(P_MAPPING, m) for m in self.mappings]
        parts += [field_bytes(P_LOCATION, loc) for loc in self.locations]
        parts += [field_bytes(P_FUNCTION, f) for f in self.functions]
        parts += [field_bytes(P_STRING_TABLE, s.encode()) for s in self.strings.strings]
        parts += [field_varint(P_TIME_NANOS, time_nanos), field_varint(P_DURATION_NANOS, duration_nanos), period_type,
                  field_varint(P_PERIOD, period_ns), field_packed(P_COMMENT, comment_ids),
                  field_varint(P_DEFAULT_SAMPLE_TYPE, default_type)]
        return b"".join(parts)


def _labels(b: ProfileBuilder, st: Stack) -> list[bytes]:
    row = st.row
    labels = [b.label("module", row.module)] + [b.label(k, num=v) for k, v in st.labels]
    if row.vm:
        labels.append(b.label("vm", row.vm))
    if row.process:
        labels.append(b.label("process", row.process))
    if row.pid is not None:
        labels.append(b.label("pid", num=row.pid))
    return labels


def rounded_counts(samples: Sequence[float]) -> np.ndarray:
    """Integer sample counts whose sum is the rounded total (cumulative rounding; never negative)."""
    cum = np.rint(np.cumsum(np.asarray(samples, dtype=float)))
    return np.diff(np.concatenate([[0.0], cum])).astype(np.int64)


def comments(an: Analysis | None, profile: Profile) -> list[str]:
    where = "host" if profile.level == "host" else f"guest {profile.vm}"
    if profile.vcpu is not None:
        where += f" vcpu{profile.vcpu}"
    out = [f"vmprof report: level {where}",
           f"total samples {int(round(profile.total_samples))}, duration {profile.duration_s:.3f} s, "
           f"lost samples {profile.lost_samples}, unresolved samples {profile.unresolved_samples}",
           "ratios: " + ", ".join(f"{k} {v:.1f}%" for k, v in profile.ratios.items())]
    if an is not None:
        out.append(f"sampling: {an.frequency} Hz (period {an.period_ns:.0f} ns), backend {an.backend}")
    out += [f"note: {n}" for n in profile.notes]
    return out


def render_profile(profile: Profile, period_ns: float, time_nanos: int = 0, an: Analysis | None = None,
                   cpu: int | None = None) -> bytes:
    """The gzipped profile.proto of one Profile (with an Analysis, VM rows of the host level are split)."""
    sts = profile_stacks(an, profile, cpu)
    counts = rounded_counts([st.samples for st in sts])
    b = ProfileBuilder()
    for st, n in zip(sts, counts.tolist(), strict=True):
        if n > 0:  # cpu is the count times the period: the two values never disagree
            stack = [b.frame_location(f) for f in reversed(st.frames)]
            b.sample(stack, (n, int(round(n * period_ns))), _labels(b, st))
    data = b.encode(period_ns=int(round(period_ns)), time_nanos=time_nanos,
                    duration_nanos=int(round(profile.duration_s * 1e9)), comments=comments(an, profile))
    return gzip.compress(data, compresslevel=6, mtime=0)


def render(inp: ReportInput) -> bytes:
    an = inp.analysis
    start = an.rec.meta.get("start_unix_s")
    time_nanos = int(float(start) * 1e9) if isinstance(start, int | float) else 0
    return render_profile(inp.profiles[0], an.period_ns, time_nanos, an, inp.cpu)

"""The numpy dtypes are the C structs of bpf/sample.h (same size, same offsets), and the flag constants
are its #defines (same names, same values)."""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from vmprof_tui.record import bpf_records as records
from vmprof_tui.record.writer import Writer


def compile_and_run(tmp_path: Path, body: list[str]) -> list[str]:
    """The output lines of a C program that includes sample.h and runs `body` in main()."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "sample.h"', "int main(void) {", *body,
             "return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{ROOT / 'bpf'}", "-o", str(exe), str(src)], check=True)
    return [line for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
            if line]


def test_dtypes_match_c_structs(tmp_path: Path) -> None:
    lines = []
    for struct, dtype in records.C_STRUCTS.items():
        lines.append(f'printf("{struct} size %zu\\n", sizeof(struct {struct}));')
        for name in dtype.names:
            lines.append(f'printf("{struct} {name} %zu\\n", offsetof(struct {struct}, {name}));')
    c_layout = {tuple(line.split()[:2]): int(line.split()[2]) for line in compile_and_run(tmp_path, lines)}
    for struct, dtype in records.C_STRUCTS.items():
        assert c_layout[(struct, "size")] == dtype.itemsize, struct
        for name in dtype.names:
            assert c_layout[(struct, name)] == dtype.fields[name][1], (struct, name)


FLAG_PREFIXES = ("SAMPLE_", "SCHED_", "STACK_", "USTACK_")


def test_flag_constants_match_defines(tmp_path: Path) -> None:
    """Every SAMPLE_*/SCHED_*/STACK_* flag of sample.h exists in records.py with the value the C compiler gives it,
    and records.py has no flag that sample.h lacks."""
    header = (ROOT / "bpf" / "sample.h").read_text()
    c_names = re.findall(r"^\s*#\s*define\s+((?:SAMPLE|SCHED|STACK|USTACK)_\w+)\s+\S", header, re.MULTILINE)
    assert c_names, "no flag #defines found in sample.h"
    c_values = {name: int(value) for name, value in (line.split() for line in compile_and_run(
        tmp_path, [f'printf("{n} %llu\\n", (unsigned long long)({n}));' for n in c_names]))}
    py_values = {name: value for name, value in vars(records).items()
                 if name.startswith(FLAG_PREFIXES) and isinstance(value, int)}
    assert py_values == c_values


def test_sched_events_of_the_older_layout_still_load() -> None:
    """Recordings made before cpu_irq_ns took 4 of the 7 pad bytes load with cpu_irq_ns 0 (the golden
    recordings are of that layout)."""
    from vmprof_tui.record import recording

    stored = recording.load(ROOT / "tests" / "data" / "golden" / "steal3.vmprof")
    assert stored.sched.dtype == records.SCHED_DTYPE and len(stored.sched)
    assert not stored.sched["cpu_irq_ns"].any() and stored.sched["next_comm"].all()


def test_a_table_chunk_that_does_not_decode_costs_only_its_rows(tmp_path: Path) -> None:
    """Table chunks are decoded into one array per kind: a chunk whose body is not what its header says
    (checksum intact) is left out with one problem, in file order, and the chunks around it keep their rows."""
    import json
    import struct

    import numpy as np

    from vmprof_tui.record import recording

    path = tmp_path / "rec.vmprof"
    w = Writer(path, {"frequency": 1000})
    for part in range(3):
        samples = np.zeros(100 + part, records.SAMPLE_DTYPE)
        samples["time_ns"] = 1000 * part + np.arange(len(samples))
        samples["pid"] = part + 1
        w.add(samples, np.empty(0, records.SCHED_DTYPE))
        if part == 1:  # this chunk's header claims more rows than its body holds
            table = recording.encode_table(samples)
            (hlen,) = struct.unpack_from("<I", table)
            header = json.loads(table[4:4 + hlen])
            for rows in (header["rows"] + 5, 10**12):  # a few more rows than the body holds; absurdly many
                h = json.dumps(dict(header, rows=rows)).encode()
                w.chunk(recording.SAMPLES, struct.pack("<I", len(h)) + h + table[4 + hlen:])
            w._pending_samples.clear()
        w.flush()
    w.close({"duration_s": 1.0})
    rec = recording.load(path)
    assert rec.problems == ["unreadable samples chunk skipped: a table chunk is shorter than its header says",
                            "unreadable samples chunk skipped: a table chunk's header states 1000000000000 rows, "
                            "more than its body can hold"]
    assert rec.samples["pid"].tolist() == [1] * 100 + [3] * 102


def _chunk_starts(data: bytes) -> list[int]:
    """Where each chunk of an intact recording starts (walking the lengths)."""
    from vmprof_tui.record import recording

    pos, out = len(recording.MAGIC) + 2, []
    while pos < len(data):
        out.append(pos)
        pos += recording.CHUNK_HEADER.size + recording.CHUNK_HEADER.unpack_from(data, pos)[3]
    return out


def _sample_chunks(path: Path, parts: int) -> None:
    """A recording of `parts` sample chunks of 50 samples each (pid = part + 1), then an end chunk."""
    import numpy as np


    w = Writer(path, {"frequency": 1000})
    for part in range(parts):
        samples = np.zeros(50, records.SAMPLE_DTYPE)
        samples["time_ns"] = 1000 * part + np.arange(50)
        samples["pid"] = part + 1
        w.add(samples, np.empty(0, records.SCHED_DTYPE))
        w.flush()
    w.close({"duration_s": 1.0})


def test_a_corrupt_chunk_length_costs_only_that_chunk(tmp_path: Path) -> None:
    """0xFFFFFFFF as the length of the 4th chunk: the reader resynchronises on the next whole chunk, keeps every
    intact chunk after it and says what it skipped (bytes and chunks); a small wrong length and a flipped
    magic do the same; `vmprof report` prints the note."""
    import struct

    from conftest import vmprof

    from vmprof_tui.record import recording

    path = tmp_path / "rec.vmprof"
    _sample_chunks(path, 30)
    data = bytearray(path.read_bytes())
    starts = _chunk_starts(bytes(data))
    fourth = starts[3]  # meta, then sample chunks: this one holds pid 3
    for damage, offset, value in (("length", 8, 0xFFFFFFFF), ("length", 8, 7), ("magic", 0, 0x58585858)):
        bad = bytearray(data)
        struct.pack_into("<I", bad, fourth + offset, value)
        damaged = tmp_path / f"{damage}-{value}.vmprof"
        damaged.write_bytes(bytes(bad))
        rec = recording.load(damaged)
        assert sorted(set(rec.samples["pid"].tolist())) == [p for p in range(1, 31) if p != 3], damage
        assert rec.end == {"duration_s": 1.0}
        assert rec.skipped_chunks == 1 and rec.skipped_bytes == starts[4] - fourth, rec.problems
        assert len(rec.problems) == 1 and f"skipped {starts[4] - fourth} bytes (1 chunk) up to the next whole " \
            f"chunk at byte {starts[4]}" in rec.problems[0], rec.problems
    out = vmprof("report", str(tmp_path / f"length-{0xFFFFFFFF}.vmprof"), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert "skipped" in " ".join(json.loads(out.stdout)["notes"])


def test_a_corrupt_chunk_at_the_end_is_named_with_what_it_cost(tmp_path: Path) -> None:
    """A damaged chunk with no whole chunk after it: everything before it is kept, the note says how much went."""
    import struct

    from vmprof_tui.record import recording

    path = tmp_path / "rec.vmprof"
    _sample_chunks(path, 5)
    data = bytearray(path.read_bytes())
    last = _chunk_starts(bytes(data))[-1]  # the end chunk
    struct.pack_into("<I", data, last + 8, 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    rec = recording.load(path)
    assert len(rec.samples) == 250 and rec.end is None
    assert rec.problems == [f"corrupt length (4294967295 bytes) in the end chunk at byte {last}: skipped "
                            f"{len(data) - last} bytes (1 chunk) to the end"]


def _crafted(path: Path, meta: bytes, end: bytes | None = None, snapshot: bytes | None = None) -> Path:
    """A recording whose meta (and end, snapshot) chunks hold these bytes, with valid checksums."""
    import zlib

    import numpy as np

    from vmprof_tui.record import recording

    w = Writer(path, {})
    w.file.seek(len(recording.MAGIC) + 2)
    w.file.truncate()
    w.chunk(recording.META, meta)
    samples = np.zeros(10, records.SAMPLE_DTYPE)
    samples["time_ns"] = np.arange(10)
    w.add(samples, np.empty(0, records.SCHED_DTYPE))
    w.flush()
    if snapshot is not None:
        w.chunk(recording.SNAPSHOT, zlib.compress(snapshot))
    if end is not None:
        w.chunk(recording.END, end)
    w.sync()
    w.file.close()
    return path


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("meta", "says"), [
    (b"[1, 2]", "the metadata chunk is an array, not an object"),
    (b'"a string"', "the metadata chunk is a string, not an object"),
    (b'{"frequency": 0}', "the metadata's frequency (Hz) is 0, not between 1 and 1e+06"),
    (b'{"frequency": -5}', "the metadata's frequency (Hz) is -5"),
    (b'{"frequency": "fast"}', "the metadata's frequency (Hz) is a string, not a number"),
    (DEEP, "the metadata chunk nests deeper than 32 levels"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, "the metadata chunk nests deeper than 32 levels"),
])
def test_a_crafted_metadata_chunk_gives_one_line(tmp_path: Path, meta: bytes, says: str) -> None:
    """Valid checksums, hostile JSON: `report` and `steal` say what is wrong with the metadata in one line, exit 1."""
    from conftest import vmprof

    path = _crafted(tmp_path / "rec.vmprof", meta)
    for command in ("report", "steal"):
        out = vmprof(command, str(path))
        assert out.returncode == 1, out.stderr
        assert out.stderr.splitlines() == [f"vmprof: {path} has no readable metadata chunk: {says}"
                                           + out.stderr.split(says, 1)[1].rstrip("\n")], out.stderr
        assert "Traceback" not in out.stderr and says in out.stderr


@pytest.mark.parametrize(("end", "snapshot", "says"), [
    (b"[1]", None, "unreadable end chunk skipped: the end chunk is an array, not an object"),
    (b'"done"', None, "unreadable end chunk skipped: the end chunk is a string, not an object"),
    (b'{"duration_s": NaN}', None, "unreadable end chunk skipped: the end chunk: NaN is not a finite number"),
    (DEEP, None, "unreadable end chunk skipped: the end chunk nests deeper than 32 levels"),
    (b'{"duration_s": 1}', b"[]", "unreadable snapshot chunk skipped: a snapshot chunk is an array, not an object"),
    (b'{"duration_s": 1}', b'{"vms": [{"name": 3, "pid": 1}]}',
     "unreadable snapshot chunk skipped: a VM name of a snapshot's VMs is a number, not a string"),
    (b'{"duration_s": 1}', DEEP, "unreadable snapshot chunk skipped: a snapshot chunk nests deeper than 32 levels"),
])
def test_a_crafted_end_or_snapshot_chunk_costs_only_itself(tmp_path: Path, end: bytes, snapshot: bytes | None,
                                                           says: str) -> None:
    """An end or snapshot chunk of the wrong shape is skipped with a note naming it; the samples are reported."""
    from conftest import vmprof

    from vmprof_tui.record import recording

    path = _crafted(tmp_path / "rec.vmprof", b'{"frequency": 1000}', end, snapshot)
    rec = recording.load(path)
    assert says in rec.problems and len(rec.samples) == 10
    out = vmprof("report", str(path))
    assert out.returncode == 0 and says in " ".join(out.stdout.split()) and "Traceback" not in out.stderr, out.stderr


def test_switches_are_ordered_per_cpu_one_way() -> None:
    """cpu_order sorts switches by CPU then time, keeping the order of switches of one time; next_on_cpu says when
    the CPU switched next (the last switch of each CPU: the given end).  Timelines and exports use these two."""
    ev = np.zeros(6, records.SCHED_DTYPE)
    ev["cpu"] = [1, 0, 1, 0, 1, 0]
    ev["time_ns"] = [10, 20, 10, 5, 30, 40]
    ev["next_tid"] = [1, 2, 3, 4, 5, 6]
    order = records.cpu_order(ev)
    assert ev["next_tid"][order].tolist() == [4, 2, 6, 1, 3, 5]
    until = records.next_on_cpu(ev["cpu"][order], ev["time_ns"][order], -1)
    assert until.tolist() == [20, 40, -1, 10, 30, -1]


def test_json_nesting_is_refused_as_deep_with_or_without_the_walk() -> None:
    """bounded_json.loads walks a value for its depth only when its text has more brackets than the limit (a value
    nests no deeper than that): at the limit and past it, in bytes and in str, with brackets in strings too."""
    from vmprof_tui import bounded_json

    for depth in (31, 32, 33, 40):
        for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
            for given in (text, text.encode()):
                if depth <= 32:
                    assert bounded_json.loads(given, "x") is not None
                else:
                    with pytest.raises(bounded_json.JSONLimitError, match="nests deeper than 32 levels"):
                        bounded_json.loads(given, "x")
    assert bounded_json.loads('["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", [[1]]]', "x")[1] == [[1]]
    with pytest.raises(bounded_json.JSONLimitError):
        bounded_json.loads("[" * 5, "x", max_depth=2)


@pytest.mark.parametrize("codec", ["zlib", "zstd"])
def test_table_decoded_a_block_of_rows_at_a_time_equals_the_table_encoded(codec: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables of many blocks (a partial one last), of records with sub-array fields (stack records), and empty."""
    from vmprof_tui.record import recording

    monkeypatch.setattr(recording, "_BLOCK_BYTES", 1000)
    rng = np.random.default_rng(7)
    for dtype, rows in ((records.SAMPLE_DTYPE, 1234), (records.SCHED_DTYPE, 301), (records.STACK_DTYPE, 17),
                        (records.SAMPLE_DTYPE, 0)):
        table = np.frombuffer(rng.integers(0, 256, rows * dtype.itemsize, np.uint8).tobytes(), dtype).copy()
        table["time_ns"] = np.sort(table["time_ns"] >> np.uint64(12))  # below 2**53, as host clock times are
        decoded = recording._decode_table(recording.encode_table(table, codec=codec), dtype)
        assert decoded.tobytes() == table.tobytes(), (dtype, rows)
        into = np.zeros(rows, dtype)
        recording._decode_table(recording.encode_table(table, codec=codec), dtype, into)
        assert into.tobytes() == table.tobytes(), (dtype, rows)


def test_times_past_2_to_the_53_ns_are_stored_exactly() -> None:
    """A table's times are stored as int64 deltas, never through float64: a host up more than 104 days has clock
    times past 2^53 ns, and times up to 2^63 - 1 come back to the nanosecond; one past that (no host clock's) is
    refused."""
    from vmprof_tui.record import recording

    table = np.zeros(5, records.SAMPLE_DTYPE)
    table["time_ns"] = [2**53 + 1, 2**53 + 2, 2**53 + 3, 2**62 + 1, 2**63 - 1]
    for codec in ("zlib", "zstd"):
        decoded = recording._decode_table(recording.encode_table(table, codec=codec), records.SAMPLE_DTYPE)
        assert decoded["time_ns"].tolist() == table["time_ns"].tolist(), codec
        table["time_ns"][-1] = 2**64 - 1
        with pytest.raises(recording.RecordingError, match="past 2\\^63 ns"):
            recording._decode_table(recording.encode_table(table, codec=codec), records.SAMPLE_DTYPE)
        table["time_ns"][-1] = 2**63 - 1

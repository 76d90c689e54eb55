"""The numpy dtypes are the C structs of bpf/sample.h (same size, same offsets), and the flag constants
are its #defines (same names, same values)."""

import re
import subprocess
from pathlib import Path

from conftest import ROOT

from vmprof_tui.record import records


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
    w = recording.Writer(path, {"frequency": 1000})
    for part in range(3):
        samples = np.zeros(100 + part, records.SAMPLE_DTYPE)
        samples["time_ns"] = 1000 * part + np.arange(len(samples))
        samples["pid"] = part + 1
        w.add(samples, np.empty(0, records.SCHED_DTYPE))
        if part == 1:  # this chunk's header claims more rows than its body holds
            table = recording._encode_table(samples)
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

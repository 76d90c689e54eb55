"""The numpy dtypes are the C structs of bpf/sample.h: same size, same offsets."""

import subprocess
from pathlib import Path

from conftest import ROOT

from vmprof_tui.record import records


def test_dtypes_match_c_structs(tmp_path: Path) -> None:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "sample.h"', "int main(void) {"]
    for struct, dtype in records.C_STRUCTS.items():
        lines.append(f'printf("{struct} size %zu\\n", sizeof(struct {struct}));')
        for name in dtype.names:
            lines.append(f'printf("{struct} {name} %zu\\n", offsetof(struct {struct}, {name}));')
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{ROOT / 'bpf'}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    c_layout = {tuple(line.split()[:2]): int(line.split()[2]) for line in out if line}
    for struct, dtype in records.C_STRUCTS.items():
        assert c_layout[(struct, "size")] == dtype.itemsize, struct
        for name in dtype.names:
            assert c_layout[(struct, name)] == dtype.fields[name][1], (struct, name)

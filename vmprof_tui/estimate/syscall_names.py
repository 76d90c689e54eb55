"""System call names by number, from the machine's unistd_64.h (libc6-dev): what `predict` counts by."""

from __future__ import annotations

import re
from pathlib import Path

UNISTD_HEADERS = ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h",
                  "/usr/include/asm-generic/unistd.h")


def syscall_names(headers: tuple[str, ...] = UNISTD_HEADERS) -> dict[int, str]:
    """Number -> name from the first readable unistd_64.h; {} if none."""
    pattern = re.compile(r"^#define\s+__NR_(\w+)\s+(\d+)\s*$", re.M)
    for h in headers:
        try:
            text = Path(h).read_text()
        except OSError:
            continue
        table = {int(nr): name for name, nr in pattern.findall(text)}
        if table:
            return table
    return {}


def syscall_name(nr: int, table: dict[int, str]) -> str:
    return table.get(nr, f"syscall_{nr}")

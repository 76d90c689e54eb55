"""One memory mapping of a process, as /proc/PID/maps and a guest bundle's maps list describe it: the one
mapping type of vmprof_tui.  Host processes' snapshots (resolve/spaces.py), guest bundles (resolve/bundle.py),
the frames of call stacks (resolve/stacks.py, the pprof and speedscope exports) and the demo VMM's guest
processes (demo/loader.py) all use it.  Kept free of other imports: the demo VMM imports it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mapping:
    start: int  # the address range [start, end)
    end: int
    offset: int  # of `start` in the mapped file
    path: str  # as the process's maps name it ("[stack]" for an anonymous one)
    object_path: Path | None = None  # the file to read symbols from (None: none available)
    build_id: str | None = None  # of the file the process mapped, when known
    perms: str = ""  # "r-xp" ... ("" when only executable mappings were kept)

    @property
    def module_name(self) -> str:
        """What profiles show as the module: the file name."""
        return os.path.basename(self.path) or self.path

    @property
    def executable(self) -> bool:
        return "x" in self.perms

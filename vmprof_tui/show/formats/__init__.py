"""Output formats of `vmprof report`: one module per format behind one contract.

Every format module has ``render(inp: ReportInput) -> str | bytes`` and ``ONE_PROFILE``: True when
its file holds one profile (one VM at the guest level), so `report` asks for --vm instead of
writing several files into one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vmprof_tui.analyse.analysis import Analysis
    from vmprof_tui.analyse.shares import Profile

# format name -> module in this package
MODULES = {"table": "table", "json": "jsonfmt", "csv": "csvfmt", "collapsed": "collapsed", "pprof": "pprof",
           "chrome": "chrome", "speedscope": "speedscope", "svg": "svg"}
FORMATS = tuple(MODULES)


@dataclass(frozen=True)
class ReportInput:
    """What a format renders: the analysis, the profiles asked for, and the report's options."""
    analysis: Analysis
    profiles: list[Profile]  # several only at the guest level without --vm
    vm: str | None = None
    vcpu: int | None = None
    cpu: int | None = None
    sort: str = "samples"  # samples | name
    limit: int | None = None  # rows per profile
    cols: int | None = None  # the width of text tables; None: whole names (to a pipe or a file)


def module(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{MODULES[name]}")


def joined(inp: ReportInput, one: Callable[[Profile, str, int | None], str]) -> str:
    """Text formats that hold several profiles: one after the other, separated by a blank line."""
    return "\n".join(one(p, inp.sort, inp.limit) for p in inp.profiles)

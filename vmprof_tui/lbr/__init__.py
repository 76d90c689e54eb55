"""LBR block timing with measured CPI (issue 7; Yamamoto et al. 2014, DESIGN.md section 1 item 4).

Data flow: collect (bpf/lbr.bpf.c via :mod:`.collect`, PMU hosts only) or import
(:mod:`.perf_script`) -> :class:`.model.LbrSample` list -> :func:`.analysis.analyse`
-> :class:`.analysis.BlockReport` -> :mod:`.format_table` / :mod:`.format_json` /
:mod:`.format_csv`.  :mod:`.groundtruth` produces exact reference data by single-stepping
a program with ptrace.  See docs/lbr.md.
"""

from vmprof_tui.lbr.analysis import BlockReport, analyse
from vmprof_tui.lbr.model import BranchFilter, Fields, LbrSample, ResolvedAddr, from_msr_stack

__all__ = ["BlockReport", "BranchFilter", "Fields", "LbrSample", "ResolvedAddr", "analyse", "from_msr_stack"]

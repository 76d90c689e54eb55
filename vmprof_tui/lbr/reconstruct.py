"""Filling in the half of each branch entry that a reduced pattern did not collect.

Only what the code determines is filled in; everything else stays 0 (unknown) and the
blocks that need it are counted as ``unknown`` by the analysis.

from only (Type2, call+return filter): the target of entry j is
  * a direct call's target, decoded from the call instruction at from[j];
  * for a return, the address after the matching call earlier in the same window
    (calls and returns are all recorded, so they pair up last-in first-out).
to only (Type3, call+return filter): the source of entry j (the end of block j) is the
first call or return instruction at or after to[j-1] in its function, provided no jump
or conditional branch lies before it (execution from to[j-1] is then straight-line up to
it, and under a call/return filter that call or return is the next recorded branch).  A
direct call found this way must target to[j]; a return must land just after a call.
"""

from __future__ import annotations

import numpy as np

from vmprof_tui.lbr.disasm import KIND_CALL, KIND_FAR, KIND_JCC, KIND_JMP, KIND_RET, CodeCache, FunctionCode
from vmprof_tui.lbr.model import BranchFilter, Fields, LbrSample, Resolve


def _code_at(addr: int, resolve: Resolve, code: CodeCache) -> tuple[FunctionCode, int, int] | None:
    """(function table, instruction index, bias = runtime - vaddr) for a runtime address."""
    if not addr:
        return None
    r = resolve(addr)
    if r is None:
        return None
    fc = code.get(r.object_path, r.function, r.func_start, r.func_end)
    idx = fc.index_of(r.vaddr)
    if idx < 0:
        return None
    return fc, idx, addr - r.vaddr


def fill_targets(s: LbrSample, resolve: Resolve, code: CodeCache) -> int:
    """from-only samples: set s.to where determinable; returns how many were filled."""
    filled = 0
    stack: list[int] = []
    for j in range(s.nr):
        at = _code_at(int(s.from_[j]), resolve, code)
        if at is None:
            stack.clear()  # an unknown branch may have been a call or a return: the pairing is lost
            continue
        fc, idx, bias = at
        kind = int(fc.kinds[idx])
        if kind == KIND_CALL:
            stack.append(int(s.from_[j]) + int(fc.sizes[idx]))
            tgt = int(fc.targets[idx])
            if tgt and not s.to[j]:
                s.to[j] = tgt + bias
                filled += 1
        elif kind == KIND_RET:
            if stack and not s.to[j]:
                s.to[j] = stack.pop()
                filled += 1
            elif stack:
                stack.pop()
        else:
            stack.clear()
    return filled


def fill_sources(s: LbrSample, resolve: Resolve, code: CodeCache) -> int:
    """to-only samples: set s.from_[j] (j >= 1) where determinable; returns how many."""
    filled = 0
    for j in range(1, s.nr):
        if s.from_[j]:
            continue
        at = _code_at(int(s.to[j - 1]), resolve, code)
        if at is None:
            continue
        fc, idx, bias = at
        kinds = fc.kinds[idx:]
        hits = np.nonzero((kinds == KIND_CALL) | (kinds == KIND_RET) | (kinds == KIND_FAR))[0]
        if hits.size == 0:
            continue
        k = idx + int(hits[0])
        jumps = np.count_nonzero((fc.kinds[idx:k] == KIND_JCC) | (fc.kinds[idx:k] == KIND_JMP))
        if jumps or int(fc.kinds[k]) == KIND_FAR:
            continue
        src = int(fc.addrs[k]) + bias
        to_j = int(s.to[j])
        if int(fc.kinds[k]) == KIND_CALL:
            tgt = int(fc.targets[k])
            if tgt and tgt + bias != to_j:
                continue  # the next recorded branch is not this call: something unseen happened
        else:  # a return must land right after a call instruction
            after = _code_at(to_j, resolve, code)
            if after is None:
                continue
            afc, aidx, _ = after
            if aidx == 0 or int(afc.kinds[aidx - 1]) != KIND_CALL:
                continue
        s.from_[j] = src
        filled += 1
    return filled


def reconstruct(s: LbrSample, resolve: Resolve, code: CodeCache) -> int:
    """Fill what a reduced pattern left out (in place); returns the number of values filled."""
    callret = (s.branch_filter & (BranchFilter.CALL | BranchFilter.RETURN)) == (BranchFilter.CALL |
                                                                                 BranchFilter.RETURN)
    if not callret or s.branch_filter & BranchFilter.ANY:
        return 0
    if not s.fields & Fields.TO:
        return fill_targets(s, resolve, code)
    if not s.fields & Fields.FROM:
        return fill_sources(s, resolve, code)
    return 0

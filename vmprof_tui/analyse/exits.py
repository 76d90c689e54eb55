"""Exit reasons of every backend by category (halt, external interrupt, I/O, MSR, EPT/NPF, ...): the analysis
works on categories, the numbers differ per backend."""

from __future__ import annotations

from vmprof_tui.analyse.vmx_exits import VMX_EXIT_REASONS
from vmprof_tui.collect.backends import PVM, SVM, VMX

# SVM exit codes (AMD APM vol. 2 appendix C).
SVM_EXITS = {**{0x40 + i: "exception" for i in range(32)}, 0x60: "external_interrupt",
             0x61: "external_interrupt", 0x72: "cpuid", 0x77: "pause", 0x78: "halt", 0x7B: "io",
             0x7C: "msr", 0x81: "hypercall", 0x400: "ept"}


def _pvm_category(reason: int) -> str | None:
    """PVM reports the vector that left the guest: exceptions below 32, host interrupts up to 255, the
    switcher's syscall exit (1024) and synthetic reasons from bit 16 on.  Variants of PVM differ in the
    synthetic numbers, so only these well-established ranges are named."""
    if reason == 14:
        return "ept"  # #PF: shadow paging / MMIO, the PVM counterpart of EPT violations
    if reason < 32:
        return "exception"
    if reason < 256:
        return "external_interrupt"
    if reason in (1024, 1 << 16):
        return "hypercall"
    return None


def exit_category(backend: str, reason: int) -> str:
    """Category of an exit reason, or 'BACKEND exit 0xN' for a number this table does not know."""
    if backend == VMX:
        cat = VMX_EXIT_REASONS.get(reason & 0xFFFF, ("", None))[1]
    elif backend == SVM:
        cat = SVM_EXITS.get(reason)
    elif backend == PVM:
        cat = _pvm_category(reason)
    else:
        cat = None
    return cat or f"{backend} exit {reason:#x}"

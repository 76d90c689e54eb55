"""Exit reasons of every backend by category (halt, external interrupt, I/O, MSR, EPT/NPF, ...): the analysis
works on categories, the numbers differ per backend."""

from __future__ import annotations

from vmprof_tui.analyse.vmx_exits import VMX_EXIT_REASONS
from vmprof_tui.collect.backends import PVM, SVM, VMX

# SVM exit codes (AMD APM vol. 2 appendix C).
SVM_EXITS = {**{0x40 + i: "exception" for i in range(32)}, 0x60: "external_interrupt",
             0x61: "external_interrupt", 0x72: "cpuid", 0x77: "pause", 0x78: "halt", 0x7B: "io",
             0x7C: "msr", 0x81: "hypercall", 0x400: "ept"}


# PVM's hypercall numbers: the anonymous enum of PVM_HC_* in this kernel's BTF (/sys/kernel/btf/vmlinux).
PVM_HYPERCALLS = {0x1000: "SET_CR0", 0x1001: "SET_CR3", 0x1002: "SET_CR4", 0x1003: "WRMSR", 0x1004: "LOAD_GDT",
                  0x1005: "LOAD_IDT", 0x1006: "LOAD_TR", 0x1007: "FLUSH_TLB", 0x1008: "FLUSH_TLB_ONE",
                  0x1009: "HALT", 0x100A: "IRET", 0x100B: "SYSRET", 0x100C: "SET_VIF_GPA", 0x100D: "IRET_FRAME",
                  0x100E: "FLUSH_TLB_MULTI"}
# The switcher's own reasons (PVM: SWITCH_EXIT_REASONS_SYSCALL, _FAILED_VMENTRY).
PVM_SYSCALL, PVM_FAILED_VMENTRY = 1024, 1025
# Measured on the development machines, not named in their BTF: every sample taken in the host's timer
# interrupt while a guest ran, and every preemption of a vCPU in guest mode, reads exit reason 0x2000 in
# vcpu_pvm.exit_reason: this PVM variant's reason for a host interrupt that arrived in guest mode.
PVM_HOST_INTERRUPT = 0x2000
X86_EXCEPTIONS = ("#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "coprocessor overrun", "#TS",
                  "#NP", "#SS", "#GP", "#PF", "reserved 15", "#MF", "#AC", "#MC", "#XM", "#VE", "#CP")


# struct kvm_run's exit_reason: why KVM_RUN returned to the VMM (include/uapi/linux/kvm.h)
KVM_RUN_EXITS = {0: "UNKNOWN", 1: "EXCEPTION", 2: "IO", 3: "HYPERCALL", 4: "DEBUG", 5: "HLT", 6: "MMIO",
                 7: "IRQ_WINDOW_OPEN", 8: "SHUTDOWN", 9: "FAIL_ENTRY", 10: "INTR", 17: "INTERNAL_ERROR",
                 24: "SYSTEM_EVENT", 29: "X86_RDMSR", 30: "X86_WRMSR"}


SVM_NAMES = {0x60: "INTR", 0x61: "NMI", 0x72: "CPUID", 0x77: "PAUSE", 0x78: "HLT", 0x7B: "IOIO", 0x7C: "MSR",
             0x81: "VMMCALL", 0x400: "NPF"}


def _pvm_category(reason: int) -> str | None:
    """PVM reports the vector that left the guest: exceptions below 32, host interrupts up to 255, the
    switcher's syscall exit (1024), hypercalls by number (0x1000 on), this variant's host-interrupt reason
    (0x2000) and, in other variants, synthetic reasons from bit 16 on."""
    if reason == 14:
        return "ept"  # #PF: shadow paging / MMIO, the PVM counterpart of EPT violations
    if reason < 32:
        return "exception"
    if reason < 256 or reason == PVM_HOST_INTERRUPT:
        return "external_interrupt"
    if reason in (PVM_SYSCALL, 1 << 16) or reason in PVM_HYPERCALLS:
        return "halt" if reason == 0x1009 else "hypercall"
    if reason == PVM_FAILED_VMENTRY:
        return "failed_vmentry"
    return None


def exit_name(backend: str, reason: int) -> str:
    """The most specific name this table knows for an exit reason (VMX's own names, PVM's vectors and
    hypercalls); the category for the others."""
    if backend == VMX and (reason & 0xFFFF) in VMX_EXIT_REASONS:
        return VMX_EXIT_REASONS[reason & 0xFFFF][0] or exit_category(backend, reason)
    if backend == SVM:
        if reason in SVM_NAMES:
            return SVM_NAMES[reason]
        if 0x40 <= reason < 0x40 + len(X86_EXCEPTIONS):
            return f"exception {X86_EXCEPTIONS[reason - 0x40]}"
    if backend == PVM:
        if reason < len(X86_EXCEPTIONS):
            return X86_EXCEPTIONS[reason]
        if 32 <= reason < 256:
            return f"host interrupt vector {reason:#x}"
        if reason in PVM_HYPERCALLS:
            return f"hypercall PVM_HC_{PVM_HYPERCALLS[reason]}"
        if reason == PVM_HOST_INTERRUPT:
            return "host interrupt"
        if reason == PVM_SYSCALL:
            return "syscall (switcher)"
    return exit_category(backend, reason)


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

"""The typed categories of the analysis: what a profile row is, and what a vCPU blank was.

Consumers (the steal split, the live screen's filters, the exporters) compare these values;
nobody decodes a row's category from its labels.  The labels users see (``[steal]``
``(outside)``, ``[NAME] (VMn)``, ...) are made here, from the kind, and nowhere else.
"""

from __future__ import annotations

from enum import Enum, StrEnum


class BlankKind(StrEnum):
    """Why a vCPU was not on a CPU (from the sched event that took it off); the value is what exports show."""
    IDLE = "idle"  # the guest halted the vCPU
    PREEMPTED = "preempted"  # still runnable: another task held its pCPU (steal type 1)
    BLOCKED = "blocked"  # the VMM blocked the thread outside KVM_RUN on the vCPU's behalf (steal type 2)
    THROTTLED = "throttled"  # runnable, but its CPU cgroup had used up its cpu.max quota (steal type 1)

    @property
    def steal_type(self) -> int:
        """0 for idle (its wake-up wait is type 1: Blank.wakeup_ns), 1 for a preemption or throttling (the
        run-queue wait the host reports to guests), 2 for VMM-blocked."""
        return {BlankKind.IDLE: 0, BlankKind.PREEMPTED: 1, BlankKind.BLOCKED: 2, BlankKind.THROTTLED: 1}[self]


class RowKind(Enum):
    """What the samples of a profile row are.

    Real samples: FUNCTION (resolved), UNKNOWN (not resolved: ``[unknown]``).
    Guest level, virtual samples of the blanks and the VMM's work (thesis ch. 3):
    IDLE ``[idle] (halt_exit)``, STEAL_OUTSIDE ``[steal] (outside)``, STEAL_SIBLING
    ``[steal] (on vcpuN)``, STEAL_VMM_BLOCKED ``[steal] (vmm blocked)``, STEAL_WAKEUP ``[steal] (wakeup)``
    (a halted vCPU woken up but not yet running), STEAL_THROTTLED ``[steal] (throttled)`` (its cgroup's
    cpu.max quota used up), STEAL_IRQ ``[steal] (irq)`` (its pCPU handled interrupts while it waited),
    STEAL_VMM ``[steal] (vmm)`` (real samples of the vCPU thread outside guest mode), and HALT_POLL
    ``[halt poll] (kvm)`` (samples of KVM polling a halted vCPU: neither guest work nor idle).
    Host level: VM ``[NAME] (VMn)`` (the time a VM's vCPU threads held a CPU) and
    CPU_IDLE ``[idle] (cpu idle)`` (measured from switches to the idle task).
    """
    FUNCTION = "function"
    UNKNOWN = "unknown"
    IDLE = "idle"
    STEAL_OUTSIDE = "steal outside"
    STEAL_SIBLING = "steal sibling"
    STEAL_VMM = "steal vmm"
    STEAL_VMM_BLOCKED = "steal vmm blocked"
    STEAL_WAKEUP = "steal wakeup"
    STEAL_THROTTLED = "steal throttled"
    STEAL_IRQ = "steal irq"
    HALT_POLL = "halt poll"
    VM = "vm"
    CPU_IDLE = "cpu idle"

    @property
    def steal_type(self) -> int:
        """1: the vCPU waited for its pCPU; 2: the VMM or KVM worked on its behalf; 0: not steal."""
        return _STEAL_TYPE.get(self, 0)

    @property
    def is_virtual(self) -> bool:
        """Samples made from the scheduler events' blank time, not taken by an interrupt."""
        return self in (RowKind.CPU_IDLE, RowKind.IDLE, RowKind.STEAL_OUTSIDE, RowKind.STEAL_SIBLING,
                        RowKind.STEAL_VMM_BLOCKED)

    @property
    def is_steal(self) -> bool:
        return self.steal_type != 0

    def label(self, vcpu: int | None = None, vm: str | None = None, vm_index: int = 0) -> tuple[str, str]:
        """(function, module) of a row of this kind, for kinds other than FUNCTION and UNKNOWN (whose labels
        are the resolved names): vcpu for STEAL_SIBLING, vm and vm_index for VM."""
        if self is RowKind.STEAL_SIBLING:
            return "[steal]", f"(on vcpu{vcpu})"
        if self is RowKind.VM:
            return f"[{vm}]", f"(VM{vm_index})"
        return _LABELS[self]


_STEAL_TYPE = {RowKind.STEAL_OUTSIDE: 1, RowKind.STEAL_SIBLING: 1, RowKind.STEAL_WAKEUP: 1,
               RowKind.STEAL_THROTTLED: 1, RowKind.STEAL_IRQ: 1, RowKind.STEAL_VMM: 2, RowKind.STEAL_VMM_BLOCKED: 2}
_LABELS = {RowKind.IDLE: ("[idle]", "(halt_exit)"), RowKind.STEAL_OUTSIDE: ("[steal]", "(outside)"),
           RowKind.STEAL_VMM: ("[steal]", "(vmm)"), RowKind.STEAL_VMM_BLOCKED: ("[steal]", "(vmm blocked)"),
           RowKind.CPU_IDLE: ("[idle]", "(cpu idle)"), RowKind.STEAL_WAKEUP: ("[steal]", "(wakeup)"),
           RowKind.STEAL_THROTTLED: ("[steal]", "(throttled)"), RowKind.STEAL_IRQ: ("[steal]", "(irq)"),
           RowKind.HALT_POLL: ("[halt poll]", "(kvm)")}

"""Hypervisor backends: which KVM flavour runs here, and the kernel offsets the
BPF programs need to read guest state from ``struct kvm_vcpu`` (docs/backends.md).

Every offset comes from the running kernel's BTF; ``kvm_sched_in`` comes from
/proc/kallsyms.  Exit reasons are numbered per backend; analyse/exits.py maps them to the
categories the analysis works on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from vmprof_tui import files
from vmprof_tui.collect.btf import BTF_DIR, VMLINUX_BTF, Btf, BtfError

PVM, SVM, VMX, NONE = "pvm", "svm", "vmx", "none"

# The module (or built-in) that provides each backend and its vCPU struct.
_BACKEND_MODULES = {PVM: ("kvm_pvm", "vcpu_pvm"), SVM: ("kvm_amd", "vcpu_svm"), VMX: ("kvm_intel", "vcpu_vmx")}
VMX_HELPER_PARAMS = Path("/sys/module/vmprof_vmx/parameters")


class BackendError(RuntimeError):
    pass


@dataclass
class Backend:
    name: str  # pvm | svm | vmx | none
    kvm_sched_in: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    vmx_helper: dict[str, int] | None = None  # helper_kmod parameters when loaded
    notes: list[str] = field(default_factory=list)

    def cflags(self) -> list[str]:
        flags = [f"-DKVM_SCHED_IN={self.kvm_sched_in:#x}ULL"]
        flags += [f"-D{k}={v}" for k, v in sorted(self.offsets.items())]
        if self.name != NONE:
            flags.append(f"-DBACKEND_{self.name.upper()}")
        if self.vmx_helper:
            flags += [f"-DVMX_REC_BASE={self.vmx_helper['records']:#x}ULL",
                      f"-DVMX_NR_REC={self.vmx_helper['nr_records']}"]
        return flags


def kallsyms_address(name: str, path: str = "/proc/kallsyms") -> int:
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == name:
                return int(parts[0], 16)
    return 0


def detect_backend() -> str:
    for name, (module, _struct) in _BACKEND_MODULES.items():
        if Path(f"/sys/module/{module}").exists():
            return name
    return NONE


def _btf_for(module: str) -> tuple[Path, bool]:
    split = BTF_DIR / module
    return (split, True) if split.exists() else (BTF_DIR / "vmlinux", False)


def _compute_offsets(backend: str) -> dict[str, int]:
    vmlinux = Btf.load(VMLINUX_BTF)
    off: dict[str, int] = {
        "TASK_PREEMPT_NOTIFIERS": vmlinux.offset("task_struct.preempt_notifiers"),
        "TASK_PID": vmlinux.offset("task_struct.pid"),
        "TASK_TGID": vmlinux.offset("task_struct.tgid"),
        "TASK_COMM": vmlinux.offset("task_struct.comm"),
        "PN_OPS": vmlinux.offset("preempt_notifier.ops"),
        "OPS_SCHED_IN": vmlinux.offset("preempt_ops.sched_in"),
    }
    # CPU throttling (cpu.max) exists only with CONFIG_CFS_BANDWIDTH; without it nothing is throttled
    with contextlib.suppress(BtfError):
        off.update({"TASK_SE_CFS_RQ": vmlinux.offset("task_struct.se.cfs_rq"),
                    "CFS_RQ_THROTTLED": vmlinux.offset("cfs_rq.throttled"),
                    "CFS_RQ_THROTTLE_COUNT": vmlinux.offset("cfs_rq.throttle_count"),
                    "CFS_RQ_THROTTLED_TIME": vmlinux.offset("cfs_rq.throttled_clock_self_time")})
    if backend == NONE:
        return off
    module, struct = _BACKEND_MODULES[backend]
    path, split = _btf_for(module)
    btf = Btf.load(path, base=vmlinux) if split else vmlinux
    regs = btf.field("kvm_vcpu.arch.regs")
    off.update({
        "VCPU_PREEMPT_NOTIFIER": btf.offset("kvm_vcpu.preempt_notifier"),
        "VCPU_VCPU_ID": btf.offset("kvm_vcpu.vcpu_id"),
        "VCPU_RIP": regs.offset + btf.enum_value("VCPU_REGS_RIP") * 8,
        "VCPU_CR3": btf.offset("kvm_vcpu.arch.cr3"),
        "VCPU_MP_STATE": btf.offset("kvm_vcpu.arch.mp_state"),
        "VCPU_INTR_FROM_GUEST": btf.offset("kvm_vcpu.arch.handling_intr_from_guest"),
    })
    off.update(_guest_memory_offsets(btf, regs.offset))
    if backend == PVM:
        off.update({"PVM_VCPU": btf.offset(f"{struct}.vcpu"),
                    "PVM_EXIT_REASON": btf.offset(f"{struct}.exit_reason"),
                    "PVM_CPL": btf.offset(f"{struct}.cpl")})
    elif backend == SVM:
        off.update({"SVM_VCPU": btf.offset(f"{struct}.vcpu"), "SVM_VMCB": btf.offset(f"{struct}.vmcb"),
                    "VMCB_SAVE_CR3": btf.offset("vmcb.save.cr3"), "VMCB_SAVE_CPL": btf.offset("vmcb.save.cpl"),
                    "VMCB_EXIT_CODE": btf.offset("vmcb.control.exit_code")})
    elif backend == VMX:
        off.update({"VMX_VCPU": btf.offset(f"{struct}.vcpu"),
                    "VMX_EXIT_REASON": btf.offset(f"{struct}.exit_reason")})
    return off


def _guest_memory_offsets(btf: Btf, regs: int) -> dict[str, int]:
    """What the guest stack walk (bpf/stacks.h) reads: guest RSP/RBP/RCX in ``kvm_vcpu.arch.regs`` and the
    VM's memslots (address space 0: ``kvm->memslots[0]``, a gfn-ordered red-black tree)."""
    return {
        "VCPU_RSP": regs + btf.enum_value("VCPU_REGS_RSP") * 8,
        "VCPU_RBP": regs + btf.enum_value("VCPU_REGS_RBP") * 8,
        "VCPU_RCX": regs + btf.enum_value("VCPU_REGS_RCX") * 8,  # SYSCALL's user RIP (cfi: a kernel's entry/exit)
        "VCPU_KVM": btf.offset("kvm_vcpu.kvm"),
        "KVM_MEMSLOTS": btf.offset("kvm.memslots"),
        "MEMSLOTS_GFN_TREE": btf.offset("kvm_memslots.gfn_tree"),
        "MEMSLOTS_NODE_IDX": btf.offset("kvm_memslots.node_idx"),
        "SLOT_GFN_NODE": btf.offset("kvm_memory_slot.gfn_node"),
        "SLOT_BASE_GFN": btf.offset("kvm_memory_slot.base_gfn"),
        "SLOT_NPAGES": btf.offset("kvm_memory_slot.npages"),
        "SLOT_USERSPACE_ADDR": btf.offset("kvm_memory_slot.userspace_addr"),
        "RB_NODE_SIZE": btf.struct_size("rb_node"),
        "RB_LEFT": btf.offset("rb_node.rb_left"),
        "RB_RIGHT": btf.offset("rb_node.rb_right"),
    }


_OFFSETS_VERSION = b"2"  # bump when _compute_offsets gains offsets, so older caches are recomputed


def _cache_key(backend: str) -> str:
    # this module's own text: a vmprof that computes other offsets (another version, another worktree
    # sharing the cache) never takes this one's cached set
    h = hashlib.sha256(os.uname().release.encode() + backend.encode() + Path(__file__).read_bytes())
    for p in sorted(BTF_DIR.glob("*")) if BTF_DIR.exists() else []:
        if p.name in ("vmlinux", *(m for m, _ in _BACKEND_MODULES.values())):
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _read_vmx_helper() -> dict[str, int] | None:
    try:
        return {"records": int((VMX_HELPER_PARAMS / "records").read_text().strip(), 0),
                "nr_records": int((VMX_HELPER_PARAMS / "nr_records").read_text().strip(), 0)}
    except (OSError, ValueError):
        return None


def load_backend(cache_dir: Path | None = None) -> Backend:
    """Detect the backend and compute its offsets (cached per kernel and BTF)."""
    if not (BTF_DIR / "vmlinux").exists():
        raise BackendError("this kernel has no BTF (/sys/kernel/btf/vmlinux missing): vmprof needs "
                           "CONFIG_DEBUG_INFO_BTF=y to find kernel structure offsets")
    name = detect_backend()
    cache_dir = cache_dir or Path(os.environ.get("VMPROF_CACHE") or Path.home() / ".cache/vmprof")
    cache = cache_dir / f"offsets-{_cache_key(name)}.json"
    try:
        offsets = json.loads(cache.read_text())
    except (OSError, ValueError):
        try:
            offsets = _compute_offsets(name)
        except BtfError as e:
            raise BackendError(f"cannot find KVM structure offsets in BTF: {e}") from None
        try:
            files.make_dirs(cache.parent)
            files.write_file(cache, json.dumps(offsets))
        except OSError:
            pass
    backend = Backend(name=name, offsets=offsets)
    if name != NONE:
        backend.kvm_sched_in = kallsyms_address("kvm_sched_in")
        if not backend.kvm_sched_in:
            raise BackendError("kvm_sched_in is not in /proc/kallsyms (kptr_restrict? run as root)")
    if name == VMX:
        backend.vmx_helper = _read_vmx_helper()
        if backend.vmx_helper is None:
            backend.notes.append("Intel VMX without helper_kmod: guest RIP/CR3 are recorded as unknown "
                                 "(load helper_kmod/vmprof_vmx.ko to read them)")
    if name == NONE:
        backend.notes.append("no KVM module on this host: profiling the host alone")
    return backend

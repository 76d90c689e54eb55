"""Thin ctypes binding of the KVM ioctl API used by the demo VMM.

Written by hand because no maintained Python package wraps /dev/kvm; only the
ioctls the demo VMM needs are here.  The structures follow
include/uapi/linux/kvm.h and arch/x86/include/uapi/asm/kvm.h.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct

from vmprof_tui.libc import LIBC

_IOC_WRITE, _IOC_READ = 1, 2
KVMIO = 0xAE


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (KVMIO << 8) | nr


class KvmRegs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rsp", "rbp",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip", "rflags")]


class KvmSegment(ctypes.Structure):
    _fields_ = [("base", ctypes.c_uint64), ("limit", ctypes.c_uint32),
                ("selector", ctypes.c_uint16), ("type", ctypes.c_uint8),
                ("present", ctypes.c_uint8), ("dpl", ctypes.c_uint8),
                ("db", ctypes.c_uint8), ("s", ctypes.c_uint8), ("l", ctypes.c_uint8),
                ("g", ctypes.c_uint8), ("avl", ctypes.c_uint8),
                ("unusable", ctypes.c_uint8), ("padding", ctypes.c_uint8)]


class KvmDtable(ctypes.Structure):
    _fields_ = [("base", ctypes.c_uint64), ("limit", ctypes.c_uint16),
                ("padding", ctypes.c_uint16 * 3)]


class KvmSregs(ctypes.Structure):
    _fields_ = [("cs", KvmSegment), ("ds", KvmSegment), ("es", KvmSegment),
                ("fs", KvmSegment), ("gs", KvmSegment), ("ss", KvmSegment),
                ("tr", KvmSegment), ("ldt", KvmSegment),
                ("gdt", KvmDtable), ("idt", KvmDtable),
                ("cr0", ctypes.c_uint64), ("cr2", ctypes.c_uint64),
                ("cr3", ctypes.c_uint64), ("cr4", ctypes.c_uint64),
                ("cr8", ctypes.c_uint64), ("efer", ctypes.c_uint64),
                ("apic_base", ctypes.c_uint64),
                ("interrupt_bitmap", ctypes.c_uint64 * 4)]


class KvmUserspaceMemoryRegion(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("guest_phys_addr", ctypes.c_uint64), ("memory_size", ctypes.c_uint64),
                ("userspace_addr", ctypes.c_uint64)]


class KvmRunIo(ctypes.Structure):
    _fields_ = [("direction", ctypes.c_uint8), ("size", ctypes.c_uint8),
                ("port", ctypes.c_uint16), ("count", ctypes.c_uint32),
                ("data_offset", ctypes.c_uint64)]


class KvmRunMmio(ctypes.Structure):
    _fields_ = [("phys_addr", ctypes.c_uint64), ("data", ctypes.c_uint8 * 8),
                ("len", ctypes.c_uint32), ("is_write", ctypes.c_uint8)]


class KvmRunExit(ctypes.Union):
    _fields_ = [("io", KvmRunIo), ("mmio", KvmRunMmio), ("raw", ctypes.c_uint8 * 256)]


class KvmRunHead(ctypes.Structure):
    """The first bytes of struct kvm_run (the shared page of a vCPU)."""
    _fields_ = [("request_interrupt_window", ctypes.c_uint8),
                ("immediate_exit", ctypes.c_uint8), ("padding1", ctypes.c_uint8 * 6),
                ("exit_reason", ctypes.c_uint32),
                ("ready_for_interrupt_injection", ctypes.c_uint8),
                ("if_flag", ctypes.c_uint8), ("flags", ctypes.c_uint16),
                ("cr8", ctypes.c_uint64), ("apic_base", ctypes.c_uint64),
                ("exit", KvmRunExit)]


KVM_GET_API_VERSION = _ioc(0, 0x00, 0)
KVM_CREATE_VM = _ioc(0, 0x01, 0)
KVM_GET_VCPU_MMAP_SIZE = _ioc(0, 0x04, 0)
KVM_CREATE_VCPU = _ioc(0, 0x41, 0)
KVM_SET_USER_MEMORY_REGION = _ioc(_IOC_WRITE, 0x46, ctypes.sizeof(KvmUserspaceMemoryRegion))
KVM_RUN = _ioc(0, 0x80, 0)
KVM_GET_REGS = _ioc(_IOC_READ, 0x81, ctypes.sizeof(KvmRegs))
KVM_SET_REGS = _ioc(_IOC_WRITE, 0x82, ctypes.sizeof(KvmRegs))
KVM_GET_SREGS = _ioc(_IOC_READ, 0x83, ctypes.sizeof(KvmSregs))
KVM_SET_SREGS = _ioc(_IOC_WRITE, 0x84, ctypes.sizeof(KvmSregs))
KVM_GET_FPU = _ioc(_IOC_READ, 0x8C, 416)  # struct kvm_fpu, kept as raw bytes
KVM_SET_FPU = _ioc(_IOC_WRITE, 0x8D, 416)
KVM_SET_MP_STATE = _ioc(_IOC_WRITE, 0x99, 4)
KVM_CREATE_IRQCHIP = _ioc(0, 0x60, 0)
KVM_GET_STATS_FD = _ioc(0, 0xCE, 0)
KVM_GET_SUPPORTED_CPUID = _ioc(_IOC_READ | _IOC_WRITE, 0x05, 8)  # struct kvm_cpuid2 header
KVM_SET_CPUID2 = _ioc(_IOC_WRITE, 0x90, 8)
KVM_SET_MSRS = _ioc(_IOC_WRITE, 0x89, 8)  # struct kvm_msrs header
KVM_SET_SIGNAL_MASK = _ioc(_IOC_WRITE, 0x8B, 4)  # struct kvm_signal_mask { __u32 len; __u8 sigset[]; }
MP_STATE_RUNNABLE, MP_STATE_HALTED = 0, 3

# kvm_run.exit_reason values
EXIT_NAMES = {0: "UNKNOWN", 1: "EXCEPTION", 2: "IO", 3: "HYPERCALL", 4: "DEBUG",
              5: "HLT", 6: "MMIO", 8: "SHUTDOWN", 9: "FAIL_ENTRY", 10: "INTR",
              17: "INTERNAL_ERROR", 24: "SYSTEM_EVENT"}

_libc = LIBC
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.ioctl.restype = ctypes.c_int


class KvmError(OSError):
    pass


def ioctl(fd: int, request: int, arg: ctypes.Structure | int | None = None) -> int:
    """ioctl that releases the GIL (ctypes does) so vCPU threads run in parallel."""
    if isinstance(arg, ctypes.Structure):
        ptr: int | None = ctypes.addressof(arg)
    else:
        ptr = arg
    ret = _libc.ioctl(fd, request, ptr)
    if ret < 0:
        err = ctypes.get_errno()
        raise KvmError(err, os.strerror(err))
    return ret


def kvm_device() -> str:
    """The KVM device path (VMPROF_KVM_DEVICE overrides it, e.g. for a container's own node)."""
    return os.environ.get("VMPROF_KVM_DEVICE", "/dev/kvm")


def open_kvm(path: str | None = None) -> int:
    """Open /dev/kvm, raising a KvmError whose message says what to do."""
    path = path or kvm_device()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KvmError(errno.ENOENT, f"{path} does not exist: this kernel has no KVM "
                       "(load kvm_intel/kvm_amd, or run on a host with virtualisation)") from None
    except PermissionError:
        raise KvmError(errno.EACCES, f"no permission to open {path}: run as root or "
                       "add the user to the 'kvm' group") from None
    version = ioctl(fd, KVM_GET_API_VERSION)
    if version != 12:
        os.close(fd)
        raise KvmError(errno.EINVAL, f"unexpected KVM API version {version} (want 12)")
    return fd


class GuestMemory:
    """One anonymous mapping registered as guest-physical memory at GPA 0."""

    def __init__(self, vm_fd: int, size: int) -> None:
        self.size = size
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._buf = (ctypes.c_char * size).from_buffer(self.map)
        self.address = ctypes.addressof(self._buf)  # where the VMM's C parts (the NIC) reach it
        region = KvmUserspaceMemoryRegion(slot=0, flags=0, guest_phys_addr=0,
                                          memory_size=size,
                                          userspace_addr=self.address)
        ioctl(vm_fd, KVM_SET_USER_MEMORY_REGION, region)

    def write(self, gpa: int, data: bytes) -> None:
        if gpa < 0 or gpa + len(data) > self.size:
            raise ValueError(f"guest write outside memory: {gpa:#x}+{len(data)}")
        self.map[gpa:gpa + len(data)] = data

    def write_u64(self, gpa: int, value: int) -> None:
        self.write(gpa, value.to_bytes(8, "little"))


class Vcpu:
    def __init__(self, kvm_fd: int, vm_fd: int, index: int) -> None:
        self.index = index
        self.fd = ioctl(vm_fd, KVM_CREATE_VCPU, index)
        size = ioctl(kvm_fd, KVM_GET_VCPU_MMAP_SIZE)
        self._run_map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        self.run_page = KvmRunHead.from_buffer(self._run_map)

    def run(self) -> bool:
        """Enter the guest.  Returns False when a signal interrupted KVM_RUN."""
        ret = _libc.ioctl(self.fd, KVM_RUN, None)
        if ret < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                return False
            raise KvmError(err, f"KVM_RUN: {os.strerror(err)}")
        return True

    def set_signal_mask(self, blocked: set[int]) -> None:
        """The signals blocked while this vCPU is in KVM_RUN (the kernel's 8-byte sigset: bit sig-1)."""
        bits = sum(1 << (sig - 1) for sig in blocked)
        arg = ctypes.create_string_buffer(struct.pack("<IQ", 8, bits), 12)
        ioctl(self.fd, KVM_SET_SIGNAL_MASK, ctypes.addressof(arg))

    def stats(self) -> dict[str, int]:
        """KVM's own counters of this vCPU (KVM_GET_STATS_FD, Documentation/virt/kvm/api.rst 4.133):
        `halt_poll_success_ns`, `halt_successful_poll`, … (the first value of each; histograms are left out).
        Empty where the kernel has no binary stats."""
        try:
            fd = ioctl(self.fd, KVM_GET_STATS_FD)
        except KvmError:
            return {}
        try:
            # struct kvm_stats_header: flags, name_size, num_desc, id_offset, desc_offset, data_offset
            _flags, name_size, num_desc, _id, desc_offset, data_offset = struct.unpack(
                "<6I", os.pread(fd, 24, 0))
            desc_size = 16 + name_size  # struct kvm_stats_desc: flags, exponent, size, offset, bucket_size, name
            descs = os.pread(fd, num_desc * desc_size, desc_offset)
            out: dict[str, int] = {}
            for i in range(num_desc):
                d = descs[i * desc_size:(i + 1) * desc_size]
                _f, _exp, size, offset, _bucket = struct.unpack("<IhHII", d[:16])
                name = d[16:].split(b"\0", 1)[0].decode()
                if size == 1:
                    out[name] = struct.unpack("<Q", os.pread(fd, 8, data_offset + offset))[0]
            return out
        finally:
            os.close(fd)

    def set_supported_cpuid(self, kvm_fd: int) -> None:
        """Give the guest the CPUID leaves KVM supports (a real program's libc picks its code by them)."""
        count = 256
        buf = ctypes.create_string_buffer(8 + 40 * count)  # struct kvm_cpuid2 + kvm_cpuid_entry2[count]
        struct.pack_into("<I", buf, 0, count)
        ioctl(kvm_fd, KVM_GET_SUPPORTED_CPUID, ctypes.addressof(buf))
        ioctl(self.fd, KVM_SET_CPUID2, ctypes.addressof(buf))

    def set_msrs(self, values: dict[int, int]) -> None:
        """KVM_SET_MSRS; KvmError if KVM took fewer than all of them."""
        buf = ctypes.create_string_buffer(struct.pack("<II", len(values), 0) + b"".join(
            struct.pack("<IIQ", index, 0, value) for index, value in values.items()))
        if ioctl(self.fd, KVM_SET_MSRS, ctypes.addressof(buf)) != len(values):
            raise KvmError(errno.EINVAL, f"KVM_SET_MSRS refused one of {', '.join(map(hex, values))}")

    def get_regs(self) -> KvmRegs:
        regs = KvmRegs()
        ioctl(self.fd, KVM_GET_REGS, regs)
        return regs

    def set_regs(self, regs: KvmRegs) -> None:
        ioctl(self.fd, KVM_SET_REGS, regs)

    def get_sregs(self) -> KvmSregs:
        sregs = KvmSregs()
        ioctl(self.fd, KVM_GET_SREGS, sregs)
        return sregs

    def set_sregs(self, sregs: KvmSregs) -> None:
        ioctl(self.fd, KVM_SET_SREGS, sregs)


class Vm:
    def __init__(self, mem_size: int) -> None:
        self.kvm_fd = open_kvm()
        self.fd = ioctl(self.kvm_fd, KVM_CREATE_VM, 0)
        self.memory = GuestMemory(self.fd, mem_size)

    def create_vcpu(self, index: int) -> Vcpu:
        return Vcpu(self.kvm_fd, self.fd, index)

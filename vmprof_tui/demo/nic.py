"""The demo VMM's virtual NIC: guest packets sent and received over a loopback UDP socket.

The guest (programs/load.c) owns an area of one header page and NET_SLOTS packet pages and
rings doorbells: PORT_NET_BUF registers the area once, PORT_NET_TX hands over the packets in
the first slots, PORT_NET_RX posts receive buffers and collects what arrived since the last
call (its count in the header page).  The vCPU thread only copies packets between guest memory
and two queues, as a virtio device model does; a separate thread, ``nic``, does the socket
work: it sends each TX packet to a peer socket standing for the remote end (and drains it),
and for each posted RX buffer has the peer send one packet that it receives.  So the VMM's I/O
work costs real host CPU, in a thread of its own that host tools can tell from the vCPUs.

The queues and the I/O thread are C (nic_io.c, built with gcc on first use like the guest programs):
a Python I/O thread shared the interpreter lock with the vCPU thread, which made the host work of a
packet differ from one VM to the next (measured in docs/model.md).  This module checks the guest's
doorbells (its page tables are hostile input) and hands the C side guest-physical addresses only.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from vmprof_tui.demo import builds
from vmprof_tui.demo.kvm import GuestMemory

PORT_NET_BUF, PORT_NET_TX, PORT_NET_RX = 0x20, 0x21, 0x22  # contract with programs/load.c
PORTS = (PORT_NET_BUF, PORT_NET_TX, PORT_NET_RX)
NET_SLOTS = 32  # BATCH in nic_io.c
PAGE = 4096
PTE_ADDR = 0x000FFFFFFFFFF000
SOURCE = Path(__file__).with_name("nic_io.c")
CFLAGS = ["-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-pthread"]


class _Stats(ctypes.Structure):  # struct nic_stats
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("tx_packets", "tx_bytes", "rx_packets", "rx_bytes", "rx_dropped", "tx_dropped")] + [
                   ("tid", ctypes.c_int64)]


def _library() -> ctypes.CDLL:
    """nic_io.c as a shared library, built once per source (cached by its hash, as the guest programs are)."""
    out = builds.compiled(SOURCE, CFLAGS, "nic_io.so", "the demo NIC")
    lib = ctypes.CDLL(str(out))
    lib.nic_start.restype = ctypes.c_void_p
    lib.nic_start.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.nic_tx.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint]
    lib.nic_rx.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint]
    lib.nic_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
    lib.nic_stop.argtypes = [ctypes.c_void_p]
    return lib


class Nic:
    def __init__(self, memory: GuestMemory) -> None:
        self.memory = memory
        self.pages: dict[int, list[int]] = {}  # per CR3: the GPA of the header page, then of each slot
        self._lib = _library()
        self._nic = self._lib.nic_start(memory.address, memory.size)
        if not self._nic:
            raise OSError("the demo NIC could not start (loopback UDP sockets or its I/O thread)")
        self._final: dict | None = None

    # -- the vCPU thread side -------------------------------------------------
    def doorbell(self, cr3: int, port: int, value: int) -> bool:
        """Handle a doorbell of the NIC.  False when the guest broke the contract."""
        if port == PORT_NET_BUF:
            va = value * PAGE
            pages = [self._translate(cr3, va + i * PAGE) for i in range(NET_SLOTS + 1)]
            if None in pages:
                return False
            self.pages[cr3] = pages  # type: ignore[assignment]
            return True
        pages = self.pages.get(cr3)
        if pages is None or not 0 <= value <= NET_SLOTS:
            return False
        if port == PORT_NET_TX:
            return self._lib.nic_tx(self._nic, (ctypes.c_uint64 * value)(*pages[1:value + 1]), value) == 0
        return self._lib.nic_rx(self._nic, pages[0], (ctypes.c_uint64 * value)(*pages[1:value + 1]), value) == 0

    def _translate(self, cr3: int, va: int) -> int | None:
        """Guest virtual → guest physical through the process's 4-level page table (hostile: bounded reads)."""
        mem, table = self.memory.map, cr3 & PTE_ADDR
        for shift in (39, 30, 21, 12):
            at = table + ((va >> shift) & 511) * 8
            if at + 8 > self.memory.size:
                return None
            entry = int.from_bytes(mem[at:at + 8], "little")
            if not entry & 1:
                return None
            table = entry & PTE_ADDR
        return table if table + PAGE <= self.memory.size else None

    def _stats(self) -> dict:
        stats = _Stats()
        self._lib.nic_stats(self._nic, ctypes.byref(stats))
        return {name: int(getattr(stats, name)) for name, _t in _Stats._fields_}

    def stop(self) -> None:
        if self._final is None:
            self._final = self._stats()
            self._lib.nic_stop(self._nic)

    def truth(self) -> dict:
        return self._final if self._final is not None else self._stats()

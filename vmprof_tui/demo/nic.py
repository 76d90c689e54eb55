"""The demo VMM's virtual NIC: guest packets sent and received over a loopback UDP socket.

The guest (programs/load.c) owns an area of one header page and NET_SLOTS packet pages and
rings doorbells: PORT_NET_BUF registers the area once, PORT_NET_TX hands over the packets in
the first slots, PORT_NET_RX posts receive buffers and collects what arrived since the last
call (its count in the header page).  The vCPU thread only copies packets between guest memory
and two queues, as a virtio device model does; a separate thread, ``nic``, does the socket
work: it sends each TX packet to a peer socket standing for the remote end (and drains it),
and for each posted RX buffer has the peer send one packet that it receives.  So the VMM's I/O
work costs real host CPU, in a thread of its own that host tools can tell from the vCPUs.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import socket
import threading
from collections.abc import Callable

from vmprof_tui.demo.kvm import GuestMemory

PORT_NET_BUF, PORT_NET_TX, PORT_NET_RX = 0x20, 0x21, 0x22  # contract with programs/load.c
PORTS = (PORT_NET_BUF, PORT_NET_TX, PORT_NET_RX)
NET_SLOTS = 32
PAGE = 4096
MAX_PACKET = PAGE - 4
RX_PACKET = 1024  # what the peer sends (load.c sends packets of this size too)
RX_QUEUE_LIMIT = 4096  # packets waiting for the guest; beyond it the NIC drops, as a full ring does
PTE_ADDR = 0x000FFFFFFFFFF000


class Nic:
    def __init__(self, memory: GuestMemory, set_name: Callable[[str], None]) -> None:
        self.memory = memory
        self.pages: dict[int, list[int]] = {}  # per CR3: the GPA of the header page, then of each slot
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for s in (self.sock, self.peer):
            s.bind(("127.0.0.1", 0))
        self.sock.connect(self.peer.getsockname())
        self.peer.connect(self.sock.getsockname())
        self.peer.setblocking(False)
        self.sock.settimeout(1.0)  # a lost packet must not hang the NIC
        self.work: queue.SimpleQueue = queue.SimpleQueue()  # ("tx", [packets]) | ("rx", n) | None to stop
        self.received: collections.deque[bytes] = collections.deque()
        self.stats = {"tx_packets": 0, "tx_bytes": 0, "rx_packets": 0, "rx_bytes": 0, "rx_dropped": 0}
        self._set_name = set_name
        self.thread = threading.Thread(target=self._run, name="nic", daemon=True)
        self.thread.start()

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
        mem = self.memory.map
        if port == PORT_NET_TX:
            packets = []
            for gpa in pages[1:value + 1]:
                length = min(int.from_bytes(mem[gpa:gpa + 4], "little"), MAX_PACKET)
                packets.append(mem[gpa + 4:gpa + 4 + length])
            self.work.put(("tx", packets))
            return True
        got = 0
        while got < value and self.received:
            packet = self.received.popleft()
            gpa = pages[1 + got]
            mem[gpa:gpa + 4] = len(packet).to_bytes(4, "little")
            mem[gpa + 4:gpa + 4 + len(packet)] = packet
            got += 1
        mem[pages[0]:pages[0] + 4] = got.to_bytes(4, "little")
        self.work.put(("rx", value))
        return True

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

    # -- the I/O thread ---------------------------------------------------------
    def _run(self) -> None:
        self._set_name("nic")
        scratch = bytearray(PAGE)
        payload = bytes(range(256)) * (RX_PACKET // 256)
        while (item := self.work.get()) is not None:
            kind, what = item
            with contextlib.suppress(OSError):  # a full socket buffer drops, as a wire would
                if kind == "tx":
                    for packet in what:
                        self.sock.send(packet)
                        self.stats["tx_packets"] += 1
                        self.stats["tx_bytes"] += len(packet)
                    while True:
                        try:
                            self.peer.recv_into(scratch)
                        except BlockingIOError:
                            break
                else:
                    for _ in range(what):
                        self.peer.send(payload)
                        n = self.sock.recv_into(scratch)
                        if len(self.received) < RX_QUEUE_LIMIT:
                            self.received.append(bytes(scratch[:n]))
                            self.stats["rx_packets"] += 1
                            self.stats["rx_bytes"] += n
                        else:
                            self.stats["rx_dropped"] += 1

    def stop(self) -> None:
        self.work.put(None)

    def truth(self) -> dict:
        return dict(self.stats, tid=self.thread.native_id)

"""Prometheus metrics of the continuous agent (`vmprof agent --metrics ADDR:PORT`), per VM and vCPU.

Counters grow by each stored window's seconds, so `rate()` over them gives shares of time, the way
operators already graph libvirt's vCPU delay; the steal counters say why (who held the pCPU, which
exit kept the VMM busy).  Served by prometheus_client's own HTTP server.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from vmprof_tui.analyse.source import ProfileSource
from vmprof_tui.fleet.history import STATES
from vmprof_tui.fleet.tasks import vcpu_seconds

TOP_HOLDERS = 5  # holders per vCPU and window that may have a series of their own; the rest go to "other"
MAX_HOLDER_LABELS = 20  # distinct holder names ever given a series (host process names are unbounded)
DEFAULT_ADDRESS = "127.0.0.1"  # `--metrics PORT`: this host only; `:PORT` every interface; `ADDR:PORT` that one


def parse_address(text: str) -> tuple[str, int]:
    """(address to listen on, port) of --metrics: PORT (127.0.0.1), :PORT (every interface), ADDR:PORT,
    [IPv6]:PORT.  ValueError with the reason when it is none of these."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = DEFAULT_ADDRESS
    elif host == "":
        host = "0.0.0.0"  # noqa: S104 - `:PORT` means every interface, as the user asked
    host = host.removeprefix("[").removesuffix("]")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--metrics takes PORT, :PORT or ADDR:PORT with a port from 1 to 65535, not {text!r}")
    return host, int(port)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.vcpu_seconds = Counter("vmprof_vcpu_seconds", "Seconds of each vCPU by state: guest_user, "
                                    "guest_kernel, idle, steal_type1 (another task held the pCPU), steal_type2 "
                                    "(the VMM or KVM worked on the vCPU's behalf)", ["vm", "vcpu", "state"], registry=r)
        self.steal_seconds = Counter("vmprof_vcpu_steal_seconds", "Steal by cause: type 1 by who held the pCPU, "
                                     "type 2 by exit reason", ["vm", "vcpu", "type", "cause"], registry=r)
        self.cause_seconds = Counter("vmprof_vcpu_steal_type1_cause_seconds", "Steal of type 1 by cause: preempted "
                                     "(a sibling vCPU or anything else held the pCPU), wakeup (woken from a halt, "
                                     "waiting for the pCPU), throttled (cpu.max quota used up), irq (the pCPU "
                                     "handled interrupts)", ["vm", "vcpu", "cause"], registry=r)
        self.vcpu_extra_seconds = Counter("vmprof_vcpu_other_seconds", "costop: waiting for a pCPU while a sibling "
                                          "vCPU ran (part of steal); halt_poll: KVM polling a halted vCPU; "
                                          "irq_while_running: IRQ time of the pCPU inside the vCPU's run time",
                                          ["vm", "vcpu", "what"], registry=r)
        self.lost = Counter("vmprof_lost_samples", "Samples dropped because a ring buffer was full", registry=r)
        self.windows = Counter("vmprof_windows", "Windows by outcome", ["outcome"], registry=r)
        self.store_seconds = Gauge("vmprof_window_store_seconds", "Time to store the last window (t0)", registry=r)
        self.holder_labels: set[str] = set()
        self.uncovered_seconds = Counter("vmprof_uncovered_seconds", "Time between windows not covered by any",
                                         registry=r)

    def serve(self, address: str) -> object:
        """Serve on `address` (parse_address) from a thread of its own; returns the server (shutdown() ends it)."""
        host, port = parse_address(address)
        return start_http_server(port, addr=host, registry=self.registry)[0]

    def holder_label(self, holder: str) -> str:
        """The `cause` label of a holder: its own name for the first MAX_HOLDER_LABELS holders that were ever in a
        vCPU's top TOP_HOLDERS of a window, "other" for the rest (a counter cannot move to another series, so a
        holder keeps the label it got)."""
        if holder not in self.holder_labels and len(self.holder_labels) < MAX_HOLDER_LABELS:
            self.holder_labels.add(holder)
        return holder if holder in self.holder_labels else "other"

    def add_window(self, source: ProfileSource, stored: bool, store_s: float, uncovered_s: float, lost: int) -> None:
        self.windows.labels("stored" if stored else "not_stored").inc()
        self.store_seconds.set(store_s)
        self.uncovered_seconds.inc(uncovered_s)
        self.lost.inc(lost)
        for vm in source.vm_names():
            for v in vcpu_seconds(source, vm):
                labels = (vm, str(v["vcpu"]))
                for state in STATES:
                    self.vcpu_seconds.labels(*labels, state).inc(v[state])
                holders = list(v["type1_by_holder"].items())  # largest first
                by_label: dict[str, float] = {}
                for n, (holder, seconds) in enumerate(holders):
                    label = self.holder_label(holder) if n < TOP_HOLDERS else "other"
                    by_label[label] = by_label.get(label, 0.0) + seconds
                for label, seconds in by_label.items():
                    self.steal_seconds.labels(*labels, "1", label).inc(seconds)
                for cause, seconds in v["type2_by_exit"].items():
                    self.steal_seconds.labels(*labels, "2", cause).inc(seconds)
                for cause, seconds in v["type1_by_cause"].items():
                    self.cause_seconds.labels(*labels, cause).inc(seconds)
                for what, key in (("costop", "skew"), ("halt_poll", "halt_poll"),
                                  ("irq_while_running", "irq_while_running")):
                    self.vcpu_extra_seconds.labels(*labels, what).inc(v[key])

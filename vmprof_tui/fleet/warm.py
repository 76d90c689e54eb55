"""What a fleet worker keeps across windows: guest bundles' symbols and the host's kallsyms, by content.

A node analyses the same hosts window after window, and a host's guest bundles and kallsyms change seldom (the agent
stores each content once, docs/fleet.md), so each is parsed once per worker process instead of once per window.  The
key is the content (a bundle's SHA-256 with its VM's name, the kallsyms text): a changed bundle is a new key, never
a stale symbol (a guest's bundle is hostile input: no weak hash a guest could make collide).  Only what loaded
cleanly is kept: a rejected bundle or an unreadable kallsyms is left to the window's own resolver, which says so in
that window's notes as before.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from vmprof_tui.record.recording import Recording
from vmprof_tui.resolve.resolver import Resolver
from vmprof_tui.resolve.spaces import GuestSymbols, guest_symbols
from vmprof_tui.resolve.symtab import KernelSymbols, kallsyms_table

# bundles kept per worker: each holds its parsed symbols and its extracted folder (7 MB for the synthetic 64-CPU
# host's guests), so a few hosts' VMs, not a whole node's: a worker whose windows cycle over more bundles than this
# parses each again, as without the cache
MAX_GUESTS = 64
MAX_KALLSYMS = 16  # host kernels kept per worker


class WarmSymbols:
    """Symbols loaded by earlier windows of this process, the least recently used forgotten first."""

    def __init__(self) -> None:
        self.guests: OrderedDict[tuple[str, bytes], GuestSymbols | None] = OrderedDict()
        self.kallsyms: OrderedDict[str, KernelSymbols] = OrderedDict()

    def resolver(self, rec: Recording) -> Resolver:
        """A new resolver for `rec` (its name codes its own) with the window's guest bundles and kallsyms loaded."""
        r = Resolver()
        if text := rec.kallsyms():
            r.kallsyms = _get(self.kallsyms, text, MAX_KALLSYMS, _kernel)
        for name in list(rec.bundles):
            data = rec.bundles[name]
            key = (name, hashlib.sha256(data).digest())
            if (g := _get(self.guests, key, MAX_GUESTS, lambda _key, d=data, n=name: _guest(n, d))) is not None:
                r.guests[name] = g  # load_guests skips a VM whose bundle is loaded
        return r


def _kernel(text: str) -> KernelSymbols | None:
    notes: list[str] = []
    table = kallsyms_table(text, notes)
    return None if notes else table


def _guest(name: str, data: bytes) -> GuestSymbols | None:
    g = guest_symbols(name, data)
    return g if g.note is None and g.bundle is not None else None


def _get(cache: OrderedDict, key, size: int, load):  # type: ignore[no-untyped-def]
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = load(key)
    if value is not None:
        cache[key] = value
        while len(cache) > size:
            cache.popitem(last=False)
    return value


WARM = WarmSymbols()  # the worker process's

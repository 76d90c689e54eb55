"""What a guest bundle's producers and its reader agree on (docs/bundle.md): the format's name and
version, the file names inside a bundle, and how a CR3 value is normalised to a page-table root.

This is the one definition inside vmprof_tui: the reader (bundle.py), the resolver (CR3 of sampled
guests) and the demo VMM (which writes bundles) import it.  The guest agent (guest/vmprof_guest) must
run alone inside a guest without vmprof_tui, so it keeps its own copy (assemble.py, cr3.py);
tests/test_bundle.py proves the two agree.

Kept free of numpy at import time: the demo VMM imports this module and nothing else of resolve/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

FORMAT = "vmprof-guest-bundle"
VERSION = 1  # the version demo VMs and vmprof-guest write
VERSIONS = (VERSION,)  # the versions this reader accepts
INDEX = "bundle.json"
KALLSYMS = "kallsyms"

CR3_ADDR_MASK = 0x000F_FFFF_FFFF_F000  # bits 51:12 of CR3: the page-table root


def normalise_cr3(value: int) -> int:
    """The page-table root in a sampled CR3: PCID (11:0), LAM (62:61) and no-flush (63) bits cleared.

    With page-table isolation a process runs on two roots 4 KiB apart (kernel and user);
    bundles list both, so bit 12 is kept.
    """
    return int(value) & CR3_ADDR_MASK


def normalise_cr3_array(values: np.ndarray) -> np.ndarray:
    """normalise_cr3 over a uint64 array (the sampled CR3 column)."""
    import numpy as np  # here, not at the top: see the module docstring

    return np.asarray(values, dtype=np.uint64) & np.uint64(CR3_ADDR_MASK)

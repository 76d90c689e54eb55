"""Readable names for mangled C++ and Rust symbols, as `c++filt` (and `rustfilt`) print them.

Itanium C++ names (``_Z...``) and Rust's legacy mangling (the same scheme, with a ``::h<hash>`` suffix) go
through libstdc++'s ``__cxa_demangle`` via the ``cxxfilt`` package; the Rust hash is dropped as rustfilt
does.  Names that are not mangled, or that the demangler refuses, come back unchanged.
"""

from __future__ import annotations

import re
from functools import lru_cache

_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")
MAX_NAME = 4096  # guest symbol names are hostile: longer ones are not handed to the demangler


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    if not name.startswith("_Z") or len(name) > MAX_NAME:
        return name
    import cxxfilt  # only for a mangled name: most profiles have none, and a small report need not import it

    try:
        out = cxxfilt.demangle(name, external_only=False)
    except cxxfilt.Error:
        return name
    return _RUST_HASH.sub("", out) if name.endswith("E") and _RUST_HASH.search(out) else out

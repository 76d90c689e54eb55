"""Inflating a zstd table chunk: through the system's libzstd (ctypes) where it loads, else through pyarrow.

A report of a recording past ZSTD_AFTER_SAMPLES (writer.py) inflates zstd tables in its read-ahead thread, where
importing pyarrow holds the interpreter's lock longer than inflating a long recording's tables takes
(docs/scale.md); libzstd.so.1, which pyarrow's wheel does not expose, is a base library of the distributions the
recorder runs on, and ctypes imports at once.  Both inflate into a buffer of exactly the size the chunk's header
states: a hostile frame cannot make either write more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


class ZstdError(ValueError):
    """The body is not a zstd frame of the stated size (libzstd's or pyarrow's message)."""


@cache
def _libzstd() -> ctypes.CDLL | None:
    """libzstd's decompress and error functions, or None where the library cannot be loaded."""
    for name in ("libzstd.so.1", ctypes.util.find_library("zstd")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.ZSTD_decompress.restype = ctypes.c_size_t
        lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
        lib.ZSTD_isError.restype = ctypes.c_uint
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        lib.ZSTD_getErrorName.restype = ctypes.c_char_p
        lib.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
        return lib
    return None


def decompress(body: bytes, size: int, use_libzstd: bool = True) -> bytes | bytearray:
    """body inflated, at most `size` bytes (fewer when the frame holds fewer: the caller checks the length).
    use_libzstd: False takes pyarrow's path even where libzstd loads (tests compare the two)."""
    lib = _libzstd() if use_libzstd else None
    if lib is None:
        import pyarrow as pa

        try:
            return pa.decompress(body, decompressed_size=size, codec="zstd", asbytes=True)
        except (OSError, ValueError, pa.ArrowException) as e:
            raise ZstdError(str(e).splitlines()[0][:200] if str(e) else type(e).__name__) from None
    out = bytearray(size)
    # the GIL is released for the call (ctypes.CDLL), so the main thread analyses while this inflates
    n = lib.ZSTD_decompress((ctypes.c_char * size).from_buffer(out) if size else None, size, body, len(body))
    if lib.ZSTD_isError(n):
        raise ZstdError(lib.ZSTD_getErrorName(n).decode(errors="replace")[:200])
    return out if n == size else out[:n]

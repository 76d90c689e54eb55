"""Inflating a zstd table chunk: through the system's libzstd (ctypes) where it loads, else through pyarrow.

A report of a recording past ZSTD_AFTER_SAMPLES (writer.py) inflates zstd tables in its read-ahead thread, where
importing pyarrow holds the interpreter's lock longer than inflating a long recording's tables takes
(docs/scale.md); libzstd.so.1, which pyarrow's wheel does not expose, is a base library of the distributions the
recorder runs on, and ctypes imports at once.  The size a chunk's header states is hostile: the frame must state
the same size (stated_size, read here for both paths so that both refuse alike), and the output is allocated
without touching its pages, so a frame that stops early commits only what it wrote.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from functools import cache

import numpy as np

FRAME_MAGIC = 0xFD2FB528  # RFC 8878, 3.1.1
SKIPPABLE_MAGIC = 0x184D2A50  # ... to 0x184D2A5F: a frame of no content
MAX_WINDOW_LOG = 31  # libzstd's largest window on 64-bit hosts: a larger one is refused as it refuses it


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
        lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
        lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        return lib
    return None


def stated_size(body: bytes | memoryview) -> int | None:
    """The content size the first frame's header states (None: it states none); ZstdError where the body does not
    start with a whole frame header.  Read from the header's bytes (RFC 8878, 3.1.1.1) rather than by libzstd's
    ZSTD_getFrameContentSize so that hosts without libzstd refuse the same frames (the tests compare the two)."""
    if len(body) < 5:
        raise ZstdError("not a zstd frame (too short)")
    (magic,) = struct.unpack_from("<I", body)
    if magic & 0xFFFFFFF0 == SKIPPABLE_MAGIC:
        if len(body) < 8:
            raise ZstdError("not a zstd frame (too short)")
        return 0
    if magic != FRAME_MAGIC:
        raise ZstdError("not a zstd frame (bad magic)")
    fhd = body[4]
    single, did_flag, fcs_flag = fhd >> 5 & 1, fhd & 3, fhd >> 6
    if fhd & 0x08:
        raise ZstdError("not a zstd frame (reserved bit set)")
    pos = 5
    if not single:
        if len(body) < 6:
            raise ZstdError("not a zstd frame (too short)")
        if (body[5] >> 3) + 10 > MAX_WINDOW_LOG:
            raise ZstdError("not a zstd frame (window too large)")
        pos += 1
    pos += (0, 1, 2, 4)[did_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if len(body) < pos + width:
        raise ZstdError("not a zstd frame (too short)")
    if width == 0:
        return None
    value = int.from_bytes(bytes(body[pos:pos + width]), "little")
    return value + 256 if width == 2 else value


def decompress(body: bytes, size: int, use_libzstd: bool = True) -> bytes | np.ndarray:
    """body inflated: exactly `size` bytes (fewer only when the frame states no size and holds fewer: the caller
    checks the length).  The caller bounds `size` (rows.unpack_rows); a frame stating another size is refused
    before anything is allocated.  use_libzstd: False takes pyarrow's path even where libzstd loads (tests compare
    the two)."""
    stated = stated_size(body)
    if stated is not None and stated != size:
        raise ZstdError(f"the frame holds {stated} bytes, not the {size} the header states")
    lib = _libzstd() if use_libzstd else None
    if lib is None:
        import pyarrow as pa

        try:
            return pa.decompress(body, decompressed_size=size, codec="zstd", asbytes=True)
        except (OSError, ValueError, pa.ArrowException) as e:  # libzstd's error name, as the ctypes path gives it
            text = str(e).splitlines()[0].removeprefix("ZSTD decompression failed: ") if str(e) else type(e).__name__
            raise ZstdError(text[:200]) from None
    out = np.empty(size, np.uint8)  # not zero-filled: a page is committed only when the frame writes it
    # the GIL is released for the call (ctypes.CDLL), so the main thread analyses while this inflates
    n = lib.ZSTD_decompress(out.ctypes.data if size else None, size, body, len(body))
    if lib.ZSTD_isError(n):
        raise ZstdError(lib.ZSTD_getErrorName(n).decode(errors="replace")[:200])
    return out if n == size else out[:n]

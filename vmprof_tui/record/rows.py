"""Row chunks of a recording (tables, LBR records, host stacks; docs/recording.md): packed, and unpacked only
after the sizes their headers state are checked against their bodies (the file is hostile)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from types import ModuleType

import numpy as np

from vmprof_tui import bounded_json

MAX_INFLATED = 1 << 30
ZSTD_RATIO = 1 << 15  # zstd inflates at most this many times over (a 128 KiB block of one byte in 4)


class RecordingError(RuntimeError):
    pass


def load_zstd() -> ModuleType:
    """pyarrow, which compresses and inflates zstd: its import takes a while, so a writer that will use it imports
    it when it is made (writer.py), not when its first zstd chunk is due."""
    import pyarrow

    return pyarrow


def pack_rows(header: dict, body: bytes | memoryview, codec: str = "zlib") -> bytes:
    """A row chunk's payload: header length, JSON header (with "rows"), compressed body (zlib; zstd for user-stack
    copies, said in the header: 8 KiB a sample, where zlib at its fastest level held a recorder back)."""
    if codec == "zstd":
        pa = load_zstd()
        h = json.dumps({**header, "codec": "zstd"}).encode()
        return struct.pack("<I", len(h)) + h + pa.compress(body, codec="zstd", asbytes=True)
    h = json.dumps(header).encode()
    return struct.pack("<I", len(h)) + h + zlib.compress(body, 6)


def row_header(payload: bytes | memoryview, what: str) -> tuple[dict, memoryview]:
    """(header, compressed body) of a row chunk."""
    (hlen,) = struct.unpack_from("<I", payload)
    header = bounded_json.expect(bounded_json.loads(bytes(payload[4:4 + hlen]), f"the header of {what}"), dict,
                                 f"the header of {what}")
    return header, memoryview(payload)[4 + hlen:]


def check_size(header: dict, body: memoryview, size: int, what: str, states: str = "") -> None:
    """Refuse a stated inflated size the body cannot hold, before anything is allocated for it: at most what the
    codec's densest encoding gives (zlib's ratio is under 1032:1, zstd's under 32768:1 and at most MAX_INFLATED,
    as ZSTD_RATIO says), and for zstd the size the frame's own header states."""
    zstd_codec = header.get("codec") == "zstd"
    most = min(ZSTD_RATIO * len(body), MAX_INFLATED) if zstd_codec else 1032 * len(body)
    if size < 0:
        raise RecordingError(f"{what}'s header states a negative size")
    if size > most:
        raise RecordingError(f"{what}'s header states {states or f'{size} bytes'}, more than its body can hold")
    if zstd_codec:
        from vmprof_tui.record import zstd

        try:
            stated = zstd.stated_size(body)
        except zstd.ZstdError as e:
            raise RecordingError(f"{what} does not decompress: {e}") from None
        if stated is not None and stated != size:
            raise RecordingError(f"{what}'s header states {size} bytes, its zstd frame {stated}")


def stated_count(header: dict, key: str, what: str) -> int:
    """A non-negative whole number of a row chunk's header."""
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecordingError(f"{what}'s header has no valid {key} count")
    return value


def unpack_rows(payload: bytes | memoryview, itemsize_of: Callable[[dict], int], what: str,
                 extra_of: Callable[[dict], int] = lambda h: 0) -> tuple[dict, bytes | np.ndarray]:
    """(header, body) of a row chunk; the body inflated to exactly rows * itemsize (+ extra) bytes, never more,
    and only after that size is checked against the body (check_size): every row chunk kind comes here."""
    header, body = row_header(payload, what)
    size = stated_count(header, "rows", what) * itemsize_of(header) + extra_of(header)
    check_size(header, body, size, what)
    try:
        if header.get("codec") == "zstd":
            from vmprof_tui.record import zstd

            try:  # never more than the header's size: a hostile frame cannot make it inflate further
                raw = zstd.decompress(bytes(body), size)
            except zstd.ZstdError as e:
                raise RecordingError(f"{what} does not decompress: {e}") from None
        else:
            raw = zlib.decompressobj().decompress(body, size + 1)
    except MemoryError:  # within the bounds, yet more than this host holds now: this chunk only is lost
        raise RecordingError(f"{what} does not fit in memory ({size} bytes)") from None
    if len(raw) != size:
        raise RecordingError(f"{what} is shorter than its header says")
    return header, raw

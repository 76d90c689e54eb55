"""Hand-made hostile guest bundles (docs/bundle.md, "Rules for readers").

Each case is written on demand into a scratch folder, because some are large or
are links, and both the tests and the fuzz seed corpus use them:

    python tests/data/bundles/hostile.py OUTDIR      writes every case into OUTDIR

CASES maps a case name to (builder, the phrase its rejection message must contain).
Every builder gets the folder to write into and returns the bundle path to load.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vmprof_tui.resolve.bundle import Limits

HERE = Path(__file__).resolve().parent
TRAVERSAL_TARGET = "vmprof-escaped"  # what a traversal would create beside the scratch folder


def minimal_elf() -> bytes:
    """A tiny valid 64-bit x86-64 ELF executable with one PT_LOAD and a .symtab holding `hello`."""
    import struct

    # layout: ehdr(64) | phdr(56) | code(16) | symtab(2*24) | strtab | shstrtab | shdrs(5*64)
    code_off, code = 120, b"\xc3" * 16
    strtab = b"\0hello\0"
    shstrtab = b"\0.text\0.symtab\0.strtab\0.shstrtab\0"
    sym_off = code_off + len(code)
    syms = b"\0" * 24 + struct.pack("<IBBHQQ", 1, 0x12, 0, 1, 0x401000 + code_off, 16)
    str_off = sym_off + len(syms)
    shstr_off = str_off + len(strtab)
    sh_off = (shstr_off + len(shstrtab) + 7) & ~7
    ehdr = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7, 2, 62, 1,
                       0x401000 + code_off, 64, sh_off, 0, 64, 56, 1, 64, 5, 4)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, 0x401000, 0x401000, sh_off, sh_off, 0x1000)

    def sh(name: int, typ: int, flags: int, addr: int, off: int, size: int, link: int = 0, info: int = 0,
           align: int = 1, entsize: int = 0) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, typ, flags, addr, off, size, link, info, align, entsize)

    shdrs = (sh(0, 0, 0, 0, 0, 0) + sh(1, 1, 6, 0x401000 + code_off, code_off, len(code), align=16)
             + sh(7, 2, 0, 0, sym_off, len(syms), link=3, info=1, align=8, entsize=24)
             + sh(15, 3, 0, 0, str_off, len(strtab)) + sh(23, 3, 0, 0, shstr_off, len(shstrtab)))
    body = ehdr + phdr + code + syms + strtab + shstrtab
    return body + b"\0" * (sh_off - len(body)) + shdrs


def index(objects: list[str | None] | None = None, **over: object) -> dict:
    objects = objects if objects is not None else ["objects/good"]
    maps = [{"start": 0x401000 + 0x1000 * i, "end": 0x402000 + 0x1000 * i, "perms": "r-xp", "offset": 0,
             "path": "/bin/hello", "object": obj} for i, obj in enumerate(objects)]
    base = {"format": "vmprof-guest-bundle", "version": 1, "vm": "hostile", "created_by": "tests",
            "cr3_method": "vmm", "kernel": None,
            "processes": [{"pid": 1, "tids": [1], "name": "hello", "cmdline": ["/bin/hello"], "exe": "/bin/hello",
                           "cr3": [0x1000], "maps": maps}]}
    base.update(over)
    return base


def write_folder(root: Path, idx: dict | bytes, objects: dict[str, bytes] | None = None) -> Path:
    (root / "objects").mkdir(parents=True, exist_ok=True)
    for name, data in (objects if objects is not None else {"good": minimal_elf()}).items():
        (root / "objects" / name).write_bytes(data)
    (root / "bundle.json").write_bytes(idx if isinstance(idx, bytes) else json.dumps(idx).encode())
    return root


def _member(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
            linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def write_tar(path: Path, members: list[tuple], gz: bool = False) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            _member(tar, *m)
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    return path


def good_members(idx: dict | None = None) -> list[tuple]:
    return [("objects/good", minimal_elf()), ("bundle.json", json.dumps(idx or index()).encode())]


# -- the cases -----------------------------------------------------------------------------------


def tar_traversal(d: Path) -> Path:
    return write_tar(d / "traversal.tar", [(f"../{TRAVERSAL_TARGET}", b"owned"), *good_members()])


def tar_absolute(d: Path) -> Path:
    return write_tar(d / "absolute.tar", [(f"/tmp/{TRAVERSAL_TARGET}", b"owned"), *good_members()])


def tar_symlink(d: Path) -> Path:
    return write_tar(d / "symlink.tar", [("objects/good", b"", tarfile.SYMTYPE, "/etc/passwd"),
                                         ("bundle.json", json.dumps(index()).encode())])


def tar_hardlink(d: Path) -> Path:
    return write_tar(d / "hardlink.tar", [("objects/good", b"", tarfile.LNKTYPE, "/etc/shadow"),
                                          ("bundle.json", json.dumps(index()).encode())])


def tar_device(d: Path) -> Path:
    return write_tar(d / "device.tar", [("objects/good", b"", tarfile.CHRTYPE),
                                        ("bundle.json", json.dumps(index()).encode())])


def tar_huge_member(d: Path) -> Path:
    """A member that claims 600 MiB (only its header is present): rejected before any byte is read."""
    info = tarfile.TarInfo("objects/good")
    info.size = 600 << 20
    path = d / "huge-member.tar"
    path.write_bytes(info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 512)
    return path


def tar_bomb_members(d: Path) -> Path:
    """Very many tiny members (checked with a member limit of 1000)."""
    return write_tar(d / "bomb-members.tar.gz", [(f"objects/o{i}", b"x") for i in range(1500)], gz=True)


def gzip_bomb(d: Path) -> Path:
    """64 MiB of one object compressed to ~64 KiB (checked with a 16 MiB object limit)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|") as tar:
        info = tarfile.TarInfo("objects/good")
        info.size = 64 << 20
        tar.addfile(info, _Zeros(info.size))
    path = d / "gzip-bomb.tar.gz"
    path.write_bytes(gzip.compress(buf.getvalue(), 9))
    return path


def pax_bomb(d: Path) -> Path:
    """A PAX extended header of 4 MiB: refused before tarfile reads it into memory."""
    path = d / "pax-bomb.tar"
    info = tarfile.TarInfo("bundle.json")
    info.pax_headers = {"comment": "A" * (4 << 20)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    path.write_bytes(buf.getvalue())
    return path


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def json_traversal(d: Path) -> Path:
    return write_folder(d / "json-traversal", index(["objects/../../../etc/passwd"]))


def json_absolute(d: Path) -> Path:
    return write_folder(d / "json-absolute", index(["/etc/passwd"]))


def kernel_object_traversal(d: Path) -> Path:
    """The guest kernel's ELF file (its call-frame information) named outside objects/."""
    kernel = {"release": "6.1", "build_id": None, "kallsyms": None, "object": "objects/../../etc/passwd",
              "modules": []}
    return write_folder(d / "kernel-object-traversal", index(kernel=kernel))


def kernel_object_missing(d: Path) -> Path:
    kernel = {"release": "6.1", "build_id": None, "kallsyms": None, "object": "objects/kernel", "modules": []}
    return write_tar(d / "kernel-object-missing.tar", good_members(index(kernel=kernel)))


def folder_symlink_object(d: Path) -> Path:
    root = write_folder(d / "folder-symlink", index(["objects/evil"]), objects={})
    os.symlink("/etc/passwd", root / "objects" / "evil")
    return root


def folder_symlink_objects_dir(d: Path) -> Path:
    root = d / "folder-symlink-dir"
    root.mkdir()
    outside = d / "outside-objects"
    outside.mkdir()
    (outside / "good").write_bytes(minimal_elf())
    os.symlink(outside, root / "objects")
    (root / "bundle.json").write_text(json.dumps(index()))
    return root


def folder_symlink_index(d: Path) -> Path:
    root = d / "folder-symlink-index"
    root.mkdir()
    os.symlink("/etc/hostname", root / "bundle.json")
    return root


def folder_huge_object(d: Path) -> Path:
    """A 600 MiB object (sparse: no disk space used)."""
    root = write_folder(d / "huge-object", index(), objects={})
    with open(root / "objects" / "good", "wb") as f:
        f.truncate(600 << 20)
    return root


def many_symbols(d: Path) -> Path:
    """kallsyms with more lines than the symbol limit (checked with a limit of 10000)."""
    idx = index(kernel={"release": "6.1", "build_id": None, "kallsyms": "kallsyms", "modules": []})
    root = write_folder(d / "many-symbols", idx)
    (root / "kallsyms").write_bytes(b"".join(b"ffffffff%08x T f%d\n" % (0x81000000 + 16 * i, i)
                                             for i in range(20000)))
    return root


def many_processes(d: Path) -> Path:
    idx = index()
    idx["processes"] = idx["processes"] * 2000  # checked with a limit of 1000
    return write_folder(d / "many-processes", idx)


def malformed_elf(d: Path) -> Path:
    elf = bytearray(minimal_elf())
    elf[40:48] = (1 << 40).to_bytes(8, "little")  # e_shoff far beyond the end of the file
    return write_folder(d / "malformed-elf", index(), objects={"good": bytes(elf)})


def not_elf(d: Path) -> Path:
    return write_folder(d / "not-elf", index(), objects={"good": b"#!/bin/sh\necho hi\n"})


def wrong_version(d: Path) -> Path:
    return write_folder(d / "wrong-version", index(version=2))


def wrong_format(d: Path) -> Path:
    return write_folder(d / "wrong-format", index(format="something-else"))


def bad_json(d: Path) -> Path:
    return write_folder(d / "bad-json", b'{"format": "vmprof-guest-bundle", "version": 1, "processes": [')


def deep_json(d: Path) -> Path:
    return write_folder(d / "deep-json", b"[" * 200_000 + b"]" * 200_000)


def bad_types(d: Path) -> Path:
    idx = index()
    idx["processes"][0]["maps"][0]["start"] = "0x401000"
    return write_folder(d / "bad-types", idx)


def huge_pid(d: Path) -> Path:
    """A pid no kernel gives (2^31): the resolver keeps pids as int32."""
    idx = index()
    idx["processes"][0]["pid"] = 1 << 31
    return write_folder(d / "huge-pid", idx)


def pickle_object(d: Path) -> Path:
    """A pickle where an object file should be: never unpickled, rejected as not ELF."""
    import pickle

    return write_folder(d / "pickle", index(), objects={"good": pickle.dumps({"x": 1})})


def missing_object(d: Path) -> Path:
    return write_folder(d / "missing-object", index(["objects/absent"]), objects={})


def tar_no_index(d: Path) -> Path:
    return write_tar(d / "no-index.tar", [("objects/good", minimal_elf())])


def tar_unexpected(d: Path) -> Path:
    return write_tar(d / "unexpected.tar", [(".bashrc", b"evil"), *good_members()])


def tar_truncated(d: Path) -> Path:
    path = write_tar(d / "truncated.tar", good_members())
    data = path.read_bytes()
    path.write_bytes(data[:700])
    return path


def not_a_tar(d: Path) -> Path:
    path = d / "random.tar"
    path.write_bytes(os.urandom(4096))
    return path


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "tar-traversal": (tar_traversal, "path traversal"),
    "tar-absolute": (tar_absolute, "absolute path"),
    "tar-symlink": (tar_symlink, "is a link"),
    "tar-hardlink": (tar_hardlink, "is a link"),
    "tar-device": (tar_device, "not a regular file"),
    "tar-huge-member": (tar_huge_member, "over the limit"),
    "tar-bomb-members": (tar_bomb_members, "more than 1000 tar members"),
    "gzip-bomb": (gzip_bomb, "over the limit"),
    "pax-bomb": (pax_bomb, "extended header"),
    "json-traversal": (json_traversal, "path traversal"),
    "json-absolute": (json_absolute, "absolute path"),
    "kernel-object-traversal": (kernel_object_traversal, "path traversal"),
    "kernel-object-missing": (kernel_object_missing, "not in the archive"),
    "folder-symlink-object": (folder_symlink_object, "symbolic link"),
    "folder-symlink-objects-dir": (folder_symlink_objects_dir, "link is not followed"),
    "folder-symlink-index": (folder_symlink_index, "symbolic link"),
    "folder-huge-object": (folder_huge_object, "over the limit"),
    "many-symbols": (many_symbols, "over the limit of 10000 symbols"),
    "many-processes": (many_processes, "over the limit of 1000"),
    "malformed-elf": (malformed_elf, "malformed ELF"),
    "not-elf": (not_elf, "not an ELF file"),
    "pickle": (pickle_object, "not an ELF file"),
    "wrong-version": (wrong_version, "unsupported bundle version 2"),
    "wrong-format": (wrong_format, "not a guest bundle"),
    "bad-json": (bad_json, "not valid JSON"),
    "deep-json": (deep_json, "not acceptable JSON"),
    "bad-types": (bad_types, "must be an integer"),
    "huge-pid": (huge_pid, "pid is out of range"),
    "missing-object": (missing_object, "referenced but missing"),
    "tar-no-index": (tar_no_index, "has no bundle.json"),
    "tar-unexpected": (tar_unexpected, "unexpected tar member"),
    "tar-truncated": (tar_truncated, "the archive is truncated or corrupt"),
    "not-a-tar": (not_a_tar, "not a tar archive"),
}


def case_limits() -> Limits:
    """The tighter limits the cases are checked with (so that no case needs gigabytes)."""
    from vmprof_tui.resolve.bundle import Limits

    return Limits(max_members=1000, max_symbols=10_000, max_processes=1000, max_object_bytes=16 << 20,
                  max_total_bytes=64 << 20)


def good_tar(d: Path) -> Path:
    return write_tar(d / "good.tar", good_members())


def good_folder(d: Path) -> Path:
    return write_folder(d / "good", index())


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile-bundles")
    out.mkdir(parents=True, exist_ok=True)
    for name, (build, _phrase) in CASES.items():
        print(name, build(out))

"""Guest bundles on the host (docs/bundle.md): reading hostile input safely.

A bundle comes from inside a guest, so everything in it is untrusted: the index
may lie about types and sizes, the tar may hold links, devices, traversal names
or decompression bombs, the object files may be malformed ELF.  This module
bounds every size and count (`Limits`), follows no link, never writes outside a
private folder, never unpickles or executes anything, and reports a rejected
bundle with one line (`BundleError`).  The caller then leaves that guest's rows
as raw addresses with the message as a note; other guests are unaffected.

It owns the loading only: the checks of the index (`parse_index`), of tar members
and object names, and the validated model (`GuestBundle`).  The readers of the
files inside a bundle live beside it (elf.py: object files, symtab.py: kallsyms),
the format's name, version and CR3 convention in bundle_format.py.

Demo VMs and real guests (the `vmprof-guest` agent) write the same format, so both resolve through this one
code path."""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from vmprof_tui.mapping import Mapping
from vmprof_tui.resolve.bundle_format import FORMAT, INDEX, KALLSYMS, VERSIONS, normalise_cr3
from vmprof_tui.resolve.elf import check_elf_header
from vmprof_tui.resolve.symtab import KernelSymbols, parse_kallsyms
from vmprof_tui.resolve.untrusted import (  # callers of load_bundle take Limits and BundleError from here
    DEFAULT_LIMITS,
    PID_MAX,
    U64_MAX,
    BundleError,
    Limits,
    open_regular,
    safe_text,
)

OBJECT_RE = re.compile(r"^objects/([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")


# -- the data model ------------------------------------------------------------------


@dataclass
class GuestModule:
    name: str
    start: int
    size: int


@dataclass
class GuestKernel:
    release: str | None
    build_id: str | None
    symbols: KernelSymbols | None
    modules: list[GuestModule] = field(default_factory=list)
    object_path: Path | None = None  # its ELF file: call-frame information for its own frames (unwind.py)


@dataclass
class GuestProcess:
    pid: int
    tids: list[int]
    name: str
    cmdline: list[str]
    exe: str | None
    cr3: list[int]  # normalised page-table roots
    maps: list[Mapping]
    exited: bool = False  # ended during a `vmprof-guest watch` (its CR3 may have been reused since)
    kernel_thread: bool = False


@dataclass
class GuestBundle:
    vm: str
    created_by: str
    cr3_method: str
    kernel: GuestKernel | None
    processes: list[GuestProcess]
    notes: list[str]
    source: Path
    root: Path  # where objects/ lives (the folder itself, or a private extraction folder for tars)
    cr3_detail: dict[str, Any] = field(default_factory=dict)
    _cleanup: Any = field(default=None, repr=False)

    def close(self) -> None:
        """Remove the private extraction folder of a tar bundle (also done when garbage-collected)."""
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> GuestBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the index ---------------------------------------------------------------------------------


class _Checker:
    """Type and range checks of the untrusted index, with the JSON path in every message."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def obj(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise BundleError(f"{where} must be an object")
        return value

    def int(self, parent: dict, key: str, where: str, optional: bool = False, lo: int = 0,
            hi: int = U64_MAX) -> int | None:
        value = parent.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BundleError(f"{where}.{key} must be an integer")
        if not lo <= value <= hi:
            raise BundleError(f"{where}.{key} is out of range")
        return value

    def str(self, parent: dict, key: str, where: str, optional: bool = False) -> str | None:
        value = parent.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise BundleError(f"{where}.{key} must be a string")
        if len(value) > self.limits.max_string:
            raise BundleError(f"{where}.{key} is longer than {self.limits.max_string} characters")
        return safe_text(value, self.limits.max_string)

    def list(self, parent: dict, key: str, where: str, limit: int, optional: bool = False) -> list:
        value = parent.get(key)
        if value is None and optional:
            return []
        if not isinstance(value, list):
            raise BundleError(f"{where}.{key} must be a list")
        if len(value) > limit:
            raise BundleError(f"{where}.{key} has {len(value)} entries, over the limit of {limit}")
        return value

    def build_id(self, parent: dict, key: str, where: str) -> str | None:
        value = self.str(parent, key, where, optional=True)
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{2,128}", value):
            raise BundleError(f"{where}.{key} is not a hex build id")
        return value.lower() if value else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_index(data: bytes, limits: Limits = DEFAULT_LIMITS) -> dict:
    """Decode and check bundle.json (format, version, types, counts).  Object paths are checked by
    the caller against what the bundle really holds."""
    if len(data) > limits.max_index_bytes:
        raise BundleError(f"{INDEX} is {len(data)} bytes, over the limit of {limits.max_index_bytes}")
    try:
        index = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BundleError(f"{INDEX} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{INDEX} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:
        raise BundleError(f"{INDEX} is not acceptable JSON: {e}") from None
    c = _Checker(limits)
    c.obj(index, INDEX)
    if index.get("format") != FORMAT:
        raise BundleError(f"not a guest bundle: {INDEX} format is {str(index.get('format'))[:60]!r}, "
                          f"expected {FORMAT!r}")
    version = index.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise BundleError(f"unsupported bundle version {str(version)[:20]} (this vmprof reads version "
                          f"{', '.join(map(str, VERSIONS))}); upgrade vmprof or use a matching vmprof-guest")
    c.str(index, "vm", INDEX, optional=True)
    c.str(index, "created_by", INDEX, optional=True)
    c.str(index, "cr3_method", INDEX, optional=True)
    kernel = index.get("kernel")
    if kernel is not None:
        c.obj(kernel, f"{INDEX}.kernel")
        c.str(kernel, "release", "kernel", optional=True)
        c.build_id(kernel, "build_id", "kernel")
        ks = c.str(kernel, "kallsyms", "kernel", optional=True)
        if ks is not None and ks != KALLSYMS:
            raise BundleError(f"kernel.kallsyms must be {KALLSYMS!r} or null, not {ks[:60]!r}")
        if kernel.get("object") is not None:
            check_object_name(kernel["object"], "kernel")
        for i, m in enumerate(c.list(kernel, "modules", "kernel", limits.max_list, optional=True)):
            c.obj(m, f"kernel.modules[{i}]")
            c.str(m, "name", f"kernel.modules[{i}]")
            c.int(m, "start", f"kernel.modules[{i}]")
            c.int(m, "size", f"kernel.modules[{i}]")
    procs = c.list(index, "processes", INDEX, limits.max_processes)
    total_maps = 0
    for i, p in enumerate(procs):
        w = f"processes[{i}]"
        c.obj(p, w)
        c.int(p, "pid", w, hi=PID_MAX)
        for j, t in enumerate(c.list(p, "tids", w, limits.max_list, optional=True)):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= PID_MAX:
                raise BundleError(f"{w}.tids[{j}] must be an integer")
        c.str(p, "name", w, optional=True)
        for j, a in enumerate(c.list(p, "cmdline", w, limits.max_list, optional=True)):
            if not isinstance(a, str) or len(a) > limits.max_string:
                raise BundleError(f"{w}.cmdline[{j}] must be a string of at most {limits.max_string} characters")
        c.str(p, "exe", w, optional=True)
        for j, v in enumerate(c.list(p, "cr3", w, 64, optional=True)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= U64_MAX:
                raise BundleError(f"{w}.cr3[{j}] must be an integer")
        maps = c.list(p, "maps", w, limits.max_maps_per_process, optional=True)
        total_maps += len(maps)
        if total_maps > limits.max_maps_total:
            raise BundleError(f"more than {limits.max_maps_total} maps in all")
        for j, m in enumerate(maps):
            mw = f"{w}.maps[{j}]"
            c.obj(m, mw)
            start = c.int(m, "start", mw)
            end = c.int(m, "end", mw)
            assert start is not None and end is not None
            if end < start:
                raise BundleError(f"{mw} ends before it starts")
            perms = c.str(m, "perms", mw)
            if perms is None or not re.fullmatch(r"[r-][w-][x-][ps-]", perms):
                raise BundleError(f"{mw}.perms must look like 'r-xp'")
            c.int(m, "offset", mw, lo=-(1 << 63), hi=U64_MAX)
            c.str(m, "path", mw, optional=True)
            c.build_id(m, "build_id", mw)
            obj = m.get("object")
            if obj is not None:
                check_object_name(obj, mw)
    c.list(index, "notes", INDEX, limits.max_list, optional=True)
    return index


def check_object_name(name: Any, where: str = "object") -> str:
    """An `object` reference: objects/<key>, relative, no traversal, a plain file name."""
    if not isinstance(name, str):
        raise BundleError(f"{where}.object must be a string or null")
    shown = safe_text(name, 80)
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise BundleError(f"{where}.object {shown!r} is an absolute path; objects must be under objects/")
    if ".." in name.replace("\\", "/").split("/"):
        raise BundleError(f"{where}.object {shown!r} contains '..' (path traversal)")
    m = OBJECT_RE.match(name)
    if not m or m.group(1) in (".", ".."):
        raise BundleError(f"{where}.object {shown!r} is not objects/<name> with a plain file name")
    return m.group(1)


# -- reading folders and tars --------------------------------------------------------------------


class _LimitedReader(io.RawIOBase):
    """Reads at most `limit` bytes from a (decompressing) stream: the bound on a tar or gzip bomb."""

    def __init__(self, f: BinaryIO, limit: int, what: str) -> None:
        self.f, self.left, self.what = f, limit, what

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = len(buf)
        if n == 0:
            return 0
        if self.left <= 0:
            raise BundleError(f"{self.what}: more data than the bundle size limit allows (a decompression bomb?)")
        data = self.f.read(min(n, self.left))
        self.left -= len(data)
        buf[: len(data)] = data
        return len(data)


def _safe_tarinfo_class(limits: Limits) -> type[tarfile.TarInfo]:
    class SafeTarInfo(tarfile.TarInfo):
        """Refuses oversized PAX / GNU long-name headers before tarfile reads them into memory."""

        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                             tarfile.GNUTYPE_LONGLINK) and self.size > limits.max_tar_header_bytes:
                raise BundleError(f"tar member {safe_text(self.name, 80)!r} has an extended header of "
                                  f"{self.size} bytes, over the limit of {limits.max_tar_header_bytes}")
            return super()._proc_member(tar)

    return SafeTarInfo


def _open_decompressed(raw: BinaryIO) -> BinaryIO:
    head = raw.read(6)
    raw.seek(0)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head[:3] == b"BZh":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    if head == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw, mode="rb")  # type: ignore[return-value]
    return raw


def _member_key(name: str) -> str:
    """Classify a tar member name: 'index', 'kallsyms', 'dir', or the object key.  Rejects anything else."""
    shown = safe_text(name, 80)
    if name.startswith("/"):
        raise BundleError(f"tar member {shown!r} has an absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"tar member {shown!r} contains '..' (path traversal)")
    clean = "/".join(p for p in parts if p not in ("", "."))
    if clean == INDEX:
        return "index"
    if clean == KALLSYMS:
        return "kallsyms"
    if clean in ("", "objects"):
        return "dir"
    m = OBJECT_RE.match(clean)
    if not m or m.group(1) in (".", ".."):
        raise BundleError(f"unexpected tar member {shown!r} (a version-1 bundle holds {INDEX}, {KALLSYMS} "
                          "and objects/<name> only)")
    return m.group(1)


def _copy_limited(src: BinaryIO, dst_fd: int, size: int, what: str) -> None:
    left = size
    while left > 0:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            raise BundleError(f"{what}: truncated")
        os.write(dst_fd, chunk)
        left -= len(chunk)


def _extract_tar(path: Path, workdir: Path, limits: Limits) -> tuple[bytes, bytes | None, dict[str, Path]]:
    """Stream the tar once: keep the index and kallsyms in memory, write objects into workdir/objects.
    Nothing is ever written anywhere else; no link, device or sparse member is accepted."""
    objects_dir = workdir / "objects"
    objects_dir.mkdir(mode=0o700)
    dir_fd = os.open(objects_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    index: bytes | None = None
    kallsyms: bytes | None = None
    objects: dict[str, Path] = {}
    seen: set[str] = set()
    total = members = 0
    try:
        with open(path, "rb") as raw:
            if os.fstat(raw.fileno()).st_size > limits.max_total_bytes + (64 << 20):
                raise BundleError(f"the archive is larger than the bundle limit of {limits.max_total_bytes} bytes")
            stream = _LimitedReader(_open_decompressed(raw), limits.max_total_bytes + (64 << 20), "the archive")
            try:
                tar = tarfile.open(fileobj=io.BufferedReader(stream, 1 << 16), mode="r|",  # noqa: SIM115
                                   tarinfo=_safe_tarinfo_class(limits))
            except _archive_errors() as e:
                raise BundleError(f"not a tar archive, or a corrupt one: {e}") from None
            with tar:
                while True:
                    try:
                        member = tar.next()
                    except _archive_errors() as e:
                        raise BundleError(f"malformed or truncated archive: {e}") from None
                    if member is None:
                        break
                    members += 1
                    if members > limits.max_members:
                        raise BundleError(f"more than {limits.max_members} tar members")
                    tar.members = []  # do not accumulate TarInfo objects
                    key = _member_key(member.name)
                    shown = safe_text(member.name, 80)
                    if key == "dir":
                        if not member.isdir():
                            raise BundleError(f"tar member {shown!r} must be a directory")
                        continue
                    if member.issym() or member.islnk():
                        raise BundleError(f"tar member {shown!r} is a link; bundles hold regular files only")
                    if not member.isreg() or member.issparse():
                        raise BundleError(f"tar member {shown!r} is not a regular file")
                    if key in seen:
                        raise BundleError(f"tar member {shown!r} appears twice")
                    seen.add(key)
                    limit = {"index": limits.max_index_bytes, "kallsyms": limits.max_kallsyms_bytes}.get(
                        key, limits.max_object_bytes)
                    if member.size > limit:
                        raise BundleError(f"{shown}: {member.size} bytes, over the limit of {limit}")
                    total += member.size
                    if total > limits.max_total_bytes:
                        raise BundleError(f"the bundle holds more than {limits.max_total_bytes} bytes")
                    data = tar.extractfile(member)
                    assert data is not None
                    try:
                        if key in ("index", "kallsyms"):
                            content = data.read(member.size)
                            if len(content) != member.size:
                                raise BundleError(f"{shown}: truncated")
                            if key == "index":
                                index = content
                            else:
                                kallsyms = content
                            continue
                        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o600, dir_fd=dir_fd)
                        try:
                            _copy_limited(data, fd, member.size, shown)
                        finally:
                            os.close(fd)
                        objects[key] = objects_dir / key
                    except _archive_errors() as e:
                        raise BundleError(f"{shown}: the archive is truncated or corrupt ({e})") from None
    except OSError as e:
        raise BundleError(f"cannot read the archive: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)
    if index is None:
        raise BundleError(f"the archive has no {INDEX}")
    return index, kallsyms, objects


@functools.cache
def _archive_errors() -> tuple[type[BaseException], ...]:
    """What tarfile and the decompressors raise on corrupt input (bz2 raises OSError)."""
    import zlib

    return (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


def _read_dir(root: Path, limits: Limits) -> tuple[bytes, bytes | None]:
    idx_path = root / INDEX
    with open_regular(idx_path, limits.max_index_bytes, INDEX) as f:
        index = f.read(limits.max_index_bytes + 1)
    kallsyms = None
    if (root / KALLSYMS).exists() or (root / KALLSYMS).is_symlink():
        with open_regular(root / KALLSYMS, limits.max_kallsyms_bytes, KALLSYMS) as f:
            kallsyms = f.read(limits.max_kallsyms_bytes + 1)
    return index, kallsyms


def _check_dir_objects(root: Path, keys: set[str], limits: Limits) -> dict[str, Path]:
    """Each referenced object: objects/ is a real directory, the file a regular file (no link), bounded."""
    if not keys:
        return {}
    objects_dir = root / "objects"
    try:
        st = os.lstat(objects_dir)
    except OSError:
        raise BundleError("objects/ is referenced but missing") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BundleError("objects/ is not a directory (a link is not followed)")
    if len(keys) > limits.max_members:
        raise BundleError(f"more than {limits.max_members} object files")
    dir_fd = os.open(objects_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    out: dict[str, Path] = {}
    total = 0
    try:
        for key in sorted(keys):
            try:
                st = os.stat(key, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                raise BundleError(f"objects/{key} is referenced but missing") from None
            if stat.S_ISLNK(st.st_mode):
                raise BundleError(f"objects/{key} is a symbolic link; links are not followed")
            if not stat.S_ISREG(st.st_mode):
                raise BundleError(f"objects/{key} is not a regular file")
            if st.st_size > limits.max_object_bytes:
                raise BundleError(f"objects/{key}: {st.st_size} bytes, over the limit of {limits.max_object_bytes}")
            total += st.st_size
            if total > limits.max_total_bytes:
                raise BundleError(f"the bundle holds more than {limits.max_total_bytes} bytes")
            out[key] = objects_dir / key
    finally:
        os.close(dir_fd)
    return out


def _check_objects_are_elf(objects: dict[str, Path], limits: Limits) -> None:
    for key, path in objects.items():
        with open_regular(path, limits.max_object_bytes, f"objects/{key}") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
        check_elf_header(head, size, limits, f"objects/{key}")


def load_bundle(path: Path, limits: Limits = DEFAULT_LIMITS, workdir: Path | None = None) -> GuestBundle:
    """Read and validate a bundle folder or tar (.tar, .tar.gz, .tar.xz, .tar.bz2).

    Tar bundles are extracted, with all checks, into `workdir` (must not exist yet) or a private
    temporary folder removed by GuestBundle.close().  Raises BundleError with one line.
    """
    path = Path(path)
    try:
        try:
            is_dir = path.is_dir()
        except OSError as e:
            raise BundleError(f"cannot read {path}: {e.strerror}") from None
        if not is_dir and not path.is_file():
            raise BundleError("no such bundle (expected a folder with bundle.json or a tar file)")
        if is_dir:
            return _load_folder(path, limits)
        return _load_tar(path, limits, workdir)
    except BundleError as e:
        raise BundleError(f"guest bundle {path}: {e}") from None


def _object_refs(index: dict) -> list[tuple[str, str]]:
    """(reference, key) of every object the index names: its maps' and the kernel's ELF file."""
    refs = [m["object"] for p in index["processes"] for m in p.get("maps") or [] if m.get("object") is not None]
    refs += [r for r in [(index.get("kernel") or {}).get("object")] if r is not None]
    return [(r, check_object_name(r)) for r in refs]


def _load_folder(path: Path, limits: Limits) -> GuestBundle:
    index_bytes, kallsyms = _read_dir(path, limits)
    index = parse_index(index_bytes, limits)
    keys = {key for _ref, key in _object_refs(index)}
    objects = _check_dir_objects(path, keys, limits)
    _check_objects_are_elf(objects, limits)
    return _build(index, kallsyms, objects, path, path, limits)


def _load_tar(path: Path, limits: Limits, workdir: Path | None) -> GuestBundle:
    if workdir is None:
        work = Path(tempfile.mkdtemp(prefix="vmprof-bundle-"))
    else:
        work = Path(workdir)
        try:
            work.mkdir(mode=0o700, parents=False)
        except OSError as e:
            raise BundleError(f"cannot create the extraction folder {work}: {e.strerror}") from None
    cleanup = functools.partial(shutil.rmtree, work, ignore_errors=True)
    try:
        index_bytes, kallsyms, extracted = _extract_tar(path, work, limits)
        index = parse_index(index_bytes, limits)
        objects: dict[str, Path] = {}
        for ref, key in _object_refs(index):
            if key not in extracted:
                raise BundleError(f"{ref} is referenced but not in the archive")
            objects[key] = extracted[key]
        _check_objects_are_elf(objects, limits)
        bundle = _build(index, kallsyms, objects, path, work, limits)
    except BaseException:
        cleanup()
        raise
    bundle._cleanup = weakref.finalize(bundle, cleanup)
    return bundle


def _build(index: dict, kallsyms: bytes | None, objects: dict[str, Path], source: Path, root: Path,
           limits: Limits) -> GuestBundle:
    kernel = None
    k = index.get("kernel")
    if k is not None:
        if k.get("kallsyms") and kallsyms is None:
            raise BundleError("kernel.kallsyms names a file the bundle does not hold")
        symbols = parse_kallsyms(kallsyms, limits) if k.get("kallsyms") and kallsyms is not None else None
        obj = k.get("object")
        kernel = GuestKernel(release=_opt_text(k.get("release"), limits), build_id=k.get("build_id"),
                             symbols=symbols, object_path=objects[check_object_name(obj)] if obj else None,
                             modules=[GuestModule(safe_text(m["name"], 256), m["start"], m["size"])
                                      for m in k.get("modules") or []])
    processes = []
    for p in index["processes"]:
        maps = []
        for m in p.get("maps") or []:
            obj = m.get("object")
            maps.append(Mapping(start=m["start"], end=m["end"], perms=m["perms"], offset=m["offset"],
                                path=safe_text(m.get("path") or "", limits.max_string),
                                # a validated regular file inside the bundle, or None
                                object_path=objects[check_object_name(obj)] if obj is not None else None,
                                build_id=(m.get("build_id") or None) and m["build_id"].lower()))
        cr3 = []
        for v in p.get("cr3") or []:
            n = normalise_cr3(v)
            if n not in cr3:
                cr3.append(n)
        processes.append(GuestProcess(
            pid=p["pid"], tids=list(p.get("tids") or [p["pid"]]), name=safe_text(p.get("name") or "?", 256),
            cmdline=[safe_text(a, limits.max_string) for a in p.get("cmdline") or []],
            exe=_opt_text(p.get("exe"), limits), cr3=cr3, maps=maps, exited=p.get("exited") is True,
            kernel_thread=p.get("kernel_thread") is True))
    notes = [safe_text(n, 1000) for n in index.get("notes") or [] if isinstance(n, str)]
    detail = index.get("cr3_detail") if isinstance(index.get("cr3_detail"), dict) else {}
    return GuestBundle(vm=safe_text(index.get("vm") or source.stem, 256),
                       created_by=safe_text(index.get("created_by") or "?", 256),
                       cr3_method=safe_text(index.get("cr3_method") or "none", 64), kernel=kernel,
                       processes=processes, notes=notes, source=source, root=root, cr3_detail=detail)


def _opt_text(value: Any, limits: Limits) -> str | None:
    return safe_text(value, limits.max_string) if isinstance(value, str) else None

"""Files vmprof writes (issue 33, items 1-3, 6, 15): private modes, never through a planted symlink, a private
Dask scratch folder, the .old copy, and a full disk during `record`."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, require_root, start_recording, start_sampling, vmprof

from vmprof_tui import files
from vmprof_tui.record import recording
from vmprof_tui.record.writer import Writer

GOLDEN = str(ROOT / "tests/data/golden/steal3.vmprof")
NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def sticky(tmp_path: Path) -> Path:
    """A sticky world-writable folder (as /tmp) reachable by nobody, and a root-owned file outside it."""
    require_root()
    os.chmod(tmp_path, 0o755)
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    return d


def plant(folder: Path, name: str) -> Path:
    """nobody's symlink `name` in `folder`, pointing to the root-owned victim file."""
    link = folder / name
    link.symlink_to(folder.parent / "victim")
    os.lchown(link, NOBODY, NOBODY)
    return link


def run_in(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmprof_tui", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_files_and_folders_are_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(files.GROUP_READABLE_ENV, raising=False)
    os.umask(0o022)
    files.make_dirs(tmp_path / "a" / "b")
    files.write_file(tmp_path / "a" / "b" / "out.json", "{}")
    w = Writer(tmp_path / "a" / "rec.vmprof", {})
    w.close({})
    assert [mode(tmp_path / "a"), mode(tmp_path / "a" / "b")] == [0o700, 0o700]
    assert [mode(tmp_path / "a" / "b" / "out.json"), mode(tmp_path / "a" / "rec.vmprof")] == [0o600, 0o600]
    monkeypatch.setenv(files.GROUP_READABLE_ENV, "1")  # --group-readable
    files.make_dirs(tmp_path / "g")
    files.write_file(tmp_path / "g" / "out.json", "{}")
    assert (mode(tmp_path / "g"), mode(tmp_path / "g" / "out.json")) == (0o750, 0o640)


def test_record_writes_0600_and_nobody_cannot_read_it(sticky: Path) -> None:
    res = run_in(sticky, "record", "-d", "0.3", "-q", "-o", "rec.vmprof")
    assert res.returncode == 0, res.stderr
    assert mode(sticky / "rec.vmprof") == 0o600
    assert as_nobody("cat", str(sticky / "rec.vmprof")).returncode != 0


def test_agent_spool_is_private_and_nobody_cannot_read_kallsyms(tmp_path: Path) -> None:
    """The KASLR leak of issue 33: nobody read the host's kernel addresses from the spool's kallsyms copy."""
    require_root()
    os.chmod(tmp_path, 0o755)
    spool = tmp_path / "spool"
    agent = start_sampling("agent", "--spool", str(spool), "--host", "h1", "--window", "1s", "-d", "1.5")
    assert agent.wait(120) == 0, "".join(agent.lines)
    host = spool / "h1"
    assert list((host / "static").glob("kallsyms-*.txt.gz")) and list((host / "windows").glob("W*.vmprof"))
    for p in [spool, *spool.rglob("*")]:
        assert mode(p) == (0o700 if p.is_dir() else 0o600), p
    kallsyms = next((host / "static").glob("kallsyms-*.txt.gz"))
    denied = as_nobody("zcat", str(kallsyms))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr


def test_store_written_by_tasks_is_private(tmp_path: Path) -> None:
    import pyarrow as pa

    from vmprof_tui.fleet.tasks import write_table

    path = tmp_path / "store" / "profile" / "host=h1" / "day=2026-01-01" / "w1.parquet"
    write_table(path, pa.Table.from_pylist([{"x": 1}], schema=pa.schema([("x", pa.int64())])))
    assert mode(path) == 0o600
    assert {mode(d) for d in path.parents if d != tmp_path and tmp_path in d.parents} == {0o700}


def test_report_output_replaces_a_planted_symlink_never_writes_through_it(sticky: Path) -> None:
    link = plant(sticky, "out.txt")
    res = vmprof("report", GOLDEN, "-o", str(link))
    assert res.returncode == 0, res.stderr
    assert (sticky.parent / "victim").read_text() == "root's file\n"
    assert not link.is_symlink() and link.read_text().startswith("Level: host")
    assert mode(link) == 0o600


def test_record_output_and_default_recording_never_follow_a_planted_symlink(sticky: Path) -> None:
    for name, args in (("rec.vmprof", ["-o", "rec.vmprof"]), ("vmprof.data", [])):
        link = plant(sticky, name)
        res = run_in(sticky, "record", "-d", "0.3", "-q", *args)
        assert res.returncode == 0, res.stderr
        assert (sticky.parent / "victim").read_text() == "root's file\n"
        assert recording.load(sticky / name).complete and not (sticky / name).is_symlink()
        assert Path(f"{link}.old").is_symlink()  # the planted link was moved aside, as an older file would be


def test_recording_writer_removes_a_planted_symlink_never_writes_through_it(sticky: Path) -> None:
    link = plant(sticky, "w.vmprof")
    Writer(link, {"frequency": 1000}).close({})
    assert (sticky.parent / "victim").read_text() == "root's file\n"
    assert recording.load(link).end == {} and not link.is_symlink() and not Path(f"{link}.old").exists()


def test_output_helpers_write_devices_and_our_own_links_in_place(tmp_path: Path) -> None:
    files.write_file(Path("/dev/null"), "x")  # a device is written, never replaced
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    target = tmp_path / "target.txt"
    (tmp_path / "mine").symlink_to(target)  # our own link in our own folder: followed, as any tool does
    files.write_file(tmp_path / "mine", "through")
    assert target.read_text() == "through" and (tmp_path / "mine").is_symlink()
    Writer(tmp_path / "mine", {}, keep_old=True).close({})  # record -o /dev/stdout is this case
    assert recording.load(target).end == {} and (tmp_path / "mine").is_symlink()
    w = Writer(Path("/dev/null"), {}, keep_old=True)
    w.abandon(keep=False)  # a failure never removes what it did not create
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and not Path("/dev/null.old").exists()


def test_record_output_existing_keeps_the_old_copy(tmp_path: Path) -> None:
    require_root()
    out = tmp_path / "run.vmprof"
    for _ in range(2):
        res = vmprof("record", "-d", "0.3", "-q", "-o", str(out))
        assert res.returncode == 0, res.stderr
    assert recording.load(out).complete and recording.load(Path(f"{out}.old")).complete


def test_analyze_uses_a_private_scratch_folder_not_tmpdir_dask_scratch_space(tmp_path: Path) -> None:
    """A link planted at $TMPDIR/dask-scratch-space must not be where the embedded cluster works."""
    tmpdir = tmp_path / "tmp"
    target = tmp_path / "target"
    tmpdir.mkdir()
    target.mkdir()
    (tmpdir / "dask-scratch-space").symlink_to(target)
    (tmp_path / "spool" / "h1" / "windows").mkdir(parents=True)
    res = vmprof("analyze", str(tmp_path / "spool"), "--store", str(tmp_path / "store"), "--workers", "1",
                 env={**os.environ, "TMPDIR": str(tmpdir)})
    assert res.returncode == 0, res.stderr
    assert list(target.iterdir()) == [], "the embedded cluster worked in the planted folder"
    assert sorted(p.name for p in tmpdir.iterdir()) == ["dask-scratch-space"], "its private folder is removed"


@pytest.fixture
def small_disk(tmp_path: Path):  # noqa: ANN201 - a generator fixture
    require_root()
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'filler'}", "bs=4k"], capture_output=True)


def test_full_disk_during_record_says_the_path_and_what_was_kept(small_disk: Path) -> None:
    """The disk fills up while a recording runs (once its first samples are on disk): one line with the path and
    what the file keeps, and the file holds just that."""
    out = small_disk / "rec.vmprof"
    proc = start_recording(out, "-d", "60")
    # readiness: a progress line (each second) with samples, so at least one flush to disk came before it
    deadline = time.monotonic() + 60
    while not any(re.search(r"samples [1-9]", line) for line in proc.lines):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline and proc.poll() is None, proc.lines  # type: ignore[attr-defined]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    fill(small_disk)
    assert proc.wait(timeout=60) == 1
    said = proc.lines  # type: ignore[attr-defined]
    lines = [line for line in said if ": sampling every CPU" not in line and not line.startswith("recording ")]
    assert len(lines) == 1, lines
    assert str(out) in lines[0] and "No space left on device" in lines[0] and "keeps the first" in lines[0], lines
    rec = recording.load(out)
    kept = int(lines[0].split(" samples)")[0].rpartition("(")[2])
    assert len(rec.samples) == kept > 0 and rec.end is None


def test_full_disk_before_anything_is_written_leaves_no_file(small_disk: Path) -> None:
    fill(small_disk)
    out = small_disk / "rec.vmprof"
    res = vmprof("record", "-d", "1", "-q", "-o", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert str(out) in lines[0] and "nothing was recorded, no file is left" in lines[0]
    assert not out.exists()


def test_full_disk_keeps_the_older_recording_where_it_was(small_disk: Path) -> None:
    out = small_disk / "rec.vmprof"
    out.write_bytes(b"older")
    fill(small_disk)
    res = vmprof("record", "-d", "1", "-q", "-o", str(out))
    assert res.returncode == 1 and f"nothing was recorded, the older recording stays at {out}" in res.stderr, res.stderr
    assert out.read_bytes() == b"older" and not Path(f"{out}.old").exists()

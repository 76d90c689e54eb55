"""`vmprof guest fetch --vm NAME`: collect a guest bundle through the QEMU guest agent, without SSH.

libvirt passes QMP-style commands to qemu-ga inside the guest (docs/guest-agent.md):

  virsh qemu-agent-command VM '{"execute":"guest-exec","arguments":{"path":"vmprof-guest",
        "arg":["bundle","-o","-","--vm","VM"],"capture-output":true}}'            -> {"return":{"pid":N}}
  virsh qemu-agent-command VM '{"execute":"guest-exec-status","arguments":{"pid":N}}'
        -> {"return":{"exited":true,"exitcode":0,"out-data":"<base64 tar>","out-truncated":false,...}}

qemu-ga keeps at most 16 MiB of a command's output.  When the bundle is larger
(`out-truncated`), the agent is run again writing to a file in the guest, which is
read with guest-file-open / guest-file-read (base64 chunks) / guest-file-close and
then removed with guest-exec rm.  The result is stored as OUT/<VM>.tar and checked
with load_bundle before it is kept: the guest is untrusted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vmprof_tui import files
from vmprof_tui.resolve.bundle import DEFAULT_LIMITS, BundleError, GuestBundle, Limits, load_bundle

READ_CHUNK = 4 << 20  # bytes per guest-file-read
MAX_REPLY = 64 << 20  # bytes of virsh output accepted per command
GUEST_TMP = "/tmp"
INSTALL_HINT = ("install it in the guest (pip install ./guest), or copy guest/vmprof_guest there and pass "
                "--guest-command 'python3 -m vmprof_guest'")


class FetchError(RuntimeError):
    """One line for the user: what failed and how to fix it."""


def _short(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


class Agent:
    """QMP commands to one domain's qemu-ga through `virsh qemu-agent-command`."""

    def __init__(self, vm: str, connect: str | None = None, virsh: str = "virsh", timeout_s: int = 30) -> None:
        self.vm, self.connect, self.virsh, self.timeout_s = vm, connect, virsh, timeout_s
        if shutil.which(virsh) is None:
            raise FetchError(f"{virsh} not found: install libvirt-clients (virsh) on this host")

    def command(self, execute: str, **arguments: Any) -> Any:
        msg: dict[str, Any] = {"execute": execute}
        if arguments:
            msg["arguments"] = arguments
        cmd = [self.virsh, *(["-c", self.connect] if self.connect else []), "qemu-agent-command", self.vm,
               json.dumps(msg), "--timeout", str(self.timeout_s)]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=self.timeout_s + 15, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FetchError(f"virsh qemu-agent-command {execute} on {self.vm} timed out after "
                             f"{self.timeout_s} s; is qemu-ga running in the guest?") from None
        if proc.returncode != 0:
            err = _short(proc.stderr.decode(errors="replace")) or f"exit status {proc.returncode}"
            hint = ""
            if "not connected" in err or "agent is not" in err or "Guest agent" in err:
                hint = ("; install and start qemu-guest-agent in the guest and give the domain a "
                        "org.qemu.guest_agent.0 channel")
            elif "failed to get domain" in err or "Domain not found" in err:
                hint = "; check the name with: virsh list --all"
            raise FetchError(f"virsh qemu-agent-command {execute} on {self.vm} failed: {err}{hint}")
        if len(proc.stdout) > MAX_REPLY:
            raise FetchError(f"qemu-ga reply to {execute} is larger than {MAX_REPLY} bytes")
        try:
            reply = json.loads(proc.stdout)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise FetchError(f"qemu-ga reply to {execute} is not JSON") from None
        if not isinstance(reply, dict):
            raise FetchError(f"qemu-ga reply to {execute} is not a JSON object")
        if "error" in reply:
            error = reply["error"]
            desc = error.get("desc") if isinstance(error, dict) else error
            raise FetchError(f"qemu-ga {execute} failed in {self.vm}: {str(desc)[:300]}")
        return reply.get("return")

    def exec(self, path: str, args: list[str], deadline: float, poll_s: float = 0.25) -> dict:
        """guest-exec with captured output, then guest-exec-status until it exits."""
        try:
            started = self.command("guest-exec", path=path, arg=args, **{"capture-output": True})
        except FetchError as e:
            if "Failed to execute" in str(e) or "No such file" in str(e):
                raise FetchError(f"{path} is not installed in {self.vm} ({e}): {INSTALL_HINT}") from None
            raise
        pid = started.get("pid") if isinstance(started, dict) else None
        if not isinstance(pid, int):
            raise FetchError("qemu-ga guest-exec returned no pid")
        while True:
            status = self.command("guest-exec-status", pid=pid)
            if not isinstance(status, dict):
                raise FetchError("qemu-ga guest-exec-status returned no status")
            if status.get("exited"):
                return status
            if time.monotonic() > deadline:
                raise FetchError(f"{path} in {self.vm} did not finish in time (guest pid {pid})")
            time.sleep(poll_s)


def _b64(text: Any, what: str) -> bytes:
    if text is None:
        return b""
    if not isinstance(text, str):
        raise FetchError(f"qemu-ga {what} is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FetchError(f"qemu-ga {what} is not valid base64") from None


def _check_exit(status: dict, vm: str, what: str) -> None:
    code = status.get("exitcode")
    if code == 0:
        return
    err = _short(_b64(status.get("err-data"), "err-data")[-4096:].decode(errors="replace"))
    if status.get("signal") is not None:
        raise FetchError(f"{what} in {vm} was killed by signal {status.get('signal')}")
    if code in (126, 127) or "No such file" in err or "Failed to execute" in err:
        raise FetchError(f"{what} is not installed in {vm} (exit {code}): {INSTALL_HINT}")
    raise FetchError(f"{what} failed in {vm} (exit {code}): {err or 'no message'}")


def fetch_bundle(vm: str, out: Path, *, connect: str | None = None, guest_command: list[str] | None = None,
                 extra_args: list[str] | None = None, timeout_s: float = 300.0, virsh: str = "virsh",
                 limits: Limits = DEFAULT_LIMITS, log: Any = None,
                 on_loaded: Callable[[GuestBundle], None] | None = None) -> Path:
    """Run vmprof-guest in `vm` through qemu-ga and store its bundle as OUT/<vm>.tar (validated).
    on_loaded sees the validated bundle (read once: loading unpacks and checks everything)."""
    guest_command = guest_command or ["vmprof-guest"]
    extra = list(extra_args or [])
    agent = Agent(vm, connect, virsh)
    deadline = time.monotonic() + timeout_s
    say = log or (lambda _msg: None)
    out = Path(out)
    files.make_dirs(out)
    safe_vm = "".join(c if c.isalnum() or c in "._-" else "_" for c in vm)[:100] or "guest"
    target = out / f"{safe_vm}.tar"
    part = out / f".{safe_vm}.tar.part"
    part.unlink(missing_ok=True)  # left over, or a planted link: the part is created anew, never through a link
    say(f"running {' '.join(guest_command)} bundle -o - in {vm} through qemu-ga")
    status = agent.exec(guest_command[0], [*guest_command[1:], "bundle", "-o", "-", "--vm", vm, "-q", *extra],
                        deadline)
    _check_exit(status, vm, guest_command[0])
    if status.get("out-truncated"):
        say("the bundle is larger than qemu-ga's output buffer; copying it through a guest file")
        data_written = _fetch_via_file(agent, guest_command, vm, extra, deadline, part, limits)
    else:
        data = _b64(status.get("out-data"), "out-data")
        if len(data) > limits.max_total_bytes:
            raise FetchError(f"the bundle from {vm} is larger than {limits.max_total_bytes} bytes")
        with files.create_new(part) as f:
            f.write(data)
        data_written = len(data)
    try:
        with load_bundle(part, limits) as bundle:
            if on_loaded is not None:
                on_loaded(bundle)
    except BundleError as e:
        part.unlink(missing_ok=True)
        raise FetchError(f"the bundle from {vm} was rejected: {e}") from None
    os.replace(part, target)
    say(f"stored {target} ({data_written} bytes)")
    return target


def _fetch_via_file(agent: Agent, guest_command: list[str], vm: str, extra: list[str], deadline: float,
                    part: Path, limits: Limits) -> int:
    guest_path = f"{GUEST_TMP}/vmprof-bundle-{secrets.token_hex(8)}.tar"
    status = agent.exec(guest_command[0], [*guest_command[1:], "bundle", "-o", guest_path, "--vm", vm, "-q",
                                           *extra], deadline)
    _check_exit(status, vm, guest_command[0])
    written = 0
    try:
        handle = agent.command("guest-file-open", path=guest_path, mode="r")
        if not isinstance(handle, int):
            raise FetchError("qemu-ga guest-file-open returned no handle")
        try:
            with files.create_new(part) as f:
                while True:
                    chunk = agent.command("guest-file-read", handle=handle, count=READ_CHUNK)
                    if not isinstance(chunk, dict):
                        raise FetchError("qemu-ga guest-file-read returned nothing")
                    data = _b64(chunk.get("buf-b64"), "buf-b64")
                    written += len(data)
                    if written > limits.max_total_bytes:
                        raise FetchError(f"the bundle from {vm} is larger than {limits.max_total_bytes} bytes")
                    f.write(data)
                    if chunk.get("eof") or not data:
                        break
                    if time.monotonic() > deadline:
                        raise FetchError(f"copying the bundle out of {vm} did not finish in time")
        finally:
            agent.command("guest-file-close", handle=handle)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        with contextlib.suppress(FetchError):  # best effort: else a leftover file in the guest's /tmp
            agent.exec("rm", ["-f", guest_path], time.monotonic() + 30)
    return written

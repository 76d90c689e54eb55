#!/usr/bin/env bash
# Set up vmprof on a fresh Debian/Ubuntu host, idempotently:
#   Debian packages (bcc's Python module, bpftool, gcc, a kernel-headers tree
#   when the running kernel ships none), a venv at .venv that can import bcc,
#   and the project with its test dependencies.
# Used by both README commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

kver=$(uname -r)
# golang-go and npm: the consumers the output tests load vmprof's files with (go tool pprof, speedscope's schema);
# linux-perf: the reference the call-stack tests compare host chains with (perf record -g)
# busybox-static and the static -dev libraries: the real programs the demo guest kernel runs (docs/demo.md)
# libpython3-dev: Python.h, for the one C extension (vmprof_tui/resolve/_keytable.c, built below)
pkgs=(python3-bpfcc bpftool gcc libc6-dev make python3-venv tmux prometheus golang-go linux-perf libpython3-dev
      busybox-static libquantum-dev zlib1g-dev liblzma-dev libsqlite3-dev liblua5.4-dev)
command -v npm >/dev/null || pkgs+=(npm)  # a nodejs package may bring its own npm
[ -e "/lib/modules/$kver/build/Makefile" ] || pkgs+=(linux-headers-amd64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "Debian packages missing (${missing[*]}); run this script as root once"
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} with your package manager"
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed (no network to the package mirror?)"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
fi

# bcc compiles BPF C against /lib/modules/$kver/build.  Our BPF C uses UAPI
# headers only (kernel offsets come from BTF), so any Debian headers tree works
# when the running kernel ships none (docs/backends.md).
if [ ! -e "/lib/modules/$kver/build/Makefile" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  [ -n "$hdr" ] || die "no kernel headers tree found in /usr/src; apt-get install linux-headers-amd64"
  common=${hdr%-amd64}-common
  say "linking $hdr as /lib/modules/$kver/build (the running kernel ships no headers)"
  mkdir -p "/lib/modules/$kver"
  ln -sfn "$hdr" "/lib/modules/$kver/build"
  [ -d "$common" ] && ln -sfn "$common" "/lib/modules/$kver/source"
fi

# A venv on the system Python, which is where Debian puts bcc's module.
if ! .venv/bin/python -c 'import bcc' 2>/dev/null; then
  say "creating .venv (system site packages, for bcc)"
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv || die "could not create .venv with /usr/bin/python3"
fi
say "installing vmprof and its test dependencies into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' -e ./guest \
  || die "pip install failed (is PyPI reachable?)"
# the memo of streamed reports (resolve/memo.py): without it they run the numpy path alone, to the same output.
# Rebuilt every time (a second of gcc): a .so left from an older _keytable.c would be skipped as stale (its VERSION).
# Built beside and moved into place, so a process that has the old one loaded keeps its file.  No -Werror: a newer
# gcc's new warning must not stop an install; a failed build or import does, below.
say "building vmprof_tui/resolve/_keytable (gcc)"
py_include=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext_suffix=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
so="vmprof_tui/resolve/_keytable$ext_suffix"
gcc -O2 -Wall -Wextra -shared -fPIC -I"$py_include" vmprof_tui/resolve/_keytable.c -o "$so.tmp" \
  || { rm -f "$so.tmp"; die "gcc could not build vmprof_tui/resolve/_keytable.c"; }
mv -f "$so.tmp" "$so"
.venv/bin/python -c 'import bcc, numpy, elftools, capstone, textual, distributed, pyarrow, duckdb, prometheus_client, cxxfilt, textual_plotext, vmprof_tui.resolve._keytable' \
  || die "the venv cannot import its dependencies"
.venv/bin/python -c 'from vmprof_tui.resolve import memo; p = memo.keytable_problem(); assert p is None, p' \
  || die "the built vmprof_tui/resolve/_keytable is not the version resolve/memo.py expects"
# speedscope's file-format schema (the npm package ships it), for tests/test_outputs.py; project-local, git-ignored
if [ ! -e .cache/npm/node_modules/speedscope/dist/release/file-format-schema.json ]; then
  say "installing npm speedscope into .cache/npm"
  npm install -q --no-audit --no-fund --prefix .cache/npm speedscope >/dev/null || die "npm install speedscope failed"
fi
say "ready: .venv/bin/vmprof (and .venv/bin/vmprof-guest, the guest agent)"

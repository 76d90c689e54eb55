#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# CI build of helper_kmod/vmprof_vmx.ko with warnings as errors.
#
#   bash helper_kmod/ci-build.sh            # every /usr/src/linux-headers-*-amd64
#   KDIR=/path/to/kernel/build bash helper_kmod/ci-build.sh
#
# Builds a copy of the sources in a temporary directory (the work tree stays
# clean; nothing is left behind), fails on any compiler or modpost warning,
# and checks the exit-reason table (vmprof_tui/analyse/vmx_exits.py) against the same tree's
# uapi <asm/vmx.h>.  If no headers tree is installed and we are root, installs
# Debian's linux-headers-amd64 first.  Never loads the module.
# Exit 0 with one "helper_kmod: OK" line, or 1 with one "helper_kmod: FAIL" line.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start=$(date +%s)
work="$(mktemp -d "${TMPDIR:-/tmp}/vmprof_kmod.XXXXXX")" || { echo "helper_kmod: FAIL: mktemp failed"; exit 1; }
trap 'rm -rf "$work"' EXIT

fail() { echo "helper_kmod: FAIL: $*" >&2; exit 1; }

find_trees() {
    if [ -n "${KDIR:-}" ]; then
        echo "$KDIR"
        return
    fi
    ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V
}

trees="$(find_trees)"
if [ -z "$trees" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "helper_kmod: no kernel headers found; installing linux-headers-amd64" >&2
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q --no-install-recommends linux-headers-amd64 >"$work/apt.log" 2>&1; then
            apt-get update -q >>"$work/apt.log" 2>&1
            apt-get install -y -q --no-install-recommends linux-headers-amd64 >>"$work/apt.log" 2>&1 \
                || { tail -n 5 "$work/apt.log" >&2; fail "apt-get install linux-headers-amd64 failed"; }
        fi
        trees="$(find_trees)"
    fi
    [ -n "$trees" ] || fail "no kernel headers tree (install linux-headers-amd64, or set KDIR=)"
fi

command -v make >/dev/null || fail "make is not installed (apt-get install make)"

built=""
for kdir in $trees; do
    [ -f "$kdir/Makefile" ] || fail "$kdir is not a kernel build tree (no Makefile)"
    name="$(basename "$kdir")"
    src="$work/$name"
    mkdir -p "$src"
    cp "$here"/Kbuild "$here"/vmprof_vmx.c "$here"/vmprof_vmx_abi.h "$src"/ \
        || fail "cannot copy sources from $here"
    log="$work/$name.log"
    if ! make -C "$kdir" M="$src" modules >"$log" 2>&1; then
        grep -E 'error|warning|Error' "$log" | head -n 20 >&2
        fail "vmprof_vmx.ko does not build against $kdir (-Werror); see the lines above"
    fi
    # -Werror turns compiler warnings into errors; modpost warnings are not
    # compiler output, so count every "warning:" line ourselves.
    warnings=$(grep -c 'warning:' "$log")
    if [ "$warnings" -ne 0 ]; then
        grep 'warning:' "$log" | head -n 20 >&2
        fail "$warnings warning(s) building against $kdir"
    fi
    [ -f "$src/vmprof_vmx.ko" ] || fail "make succeeded but no vmprof_vmx.ko against $kdir"
    grep -q -- '-Werror ' "$src/.vmprof_vmx.o.cmd" || fail "-Werror was not on the compile line for $kdir"

    # uapi/asm/vmx.h of this tree: in the tree itself or, on Debian, in the
    # -common tree its Makefile includes.
    vmx_h=""
    for d in "$kdir" $(sed -n 's|^include \(.*\)/Makefile$|\1|p' "$kdir/Makefile"); do
        if [ -f "$d/arch/x86/include/uapi/asm/vmx.h" ]; then
            vmx_h="$d/arch/x86/include/uapi/asm/vmx.h"
            break
        fi
    done
    if command -v python3 >/dev/null; then
        out=$(python3 "$here/check_exit_table.py" $vmx_h) || fail "${out#check_exit_table: FAIL: }"
    fi
    built="$built $name"
done

echo "helper_kmod: OK: vmprof_vmx.ko built with -Werror, 0 warnings, against:$built ($(( $(date +%s) - start ))s)"

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Load vmprof_vmx.ko on an Intel VMX KVM host (root). Never needed on PVM/SVM.
#   helper_kmod/load.sh [path/to/vmprof_vmx.ko]
# Unload with: rmmod vmprof_vmx   (stop vmprof first)
set -eu
ko=${1:-"$(dirname "$0")/vmprof_vmx.ko"}
[ -f "$ko" ] || { echo "load.sh: $ko not found; build it with: make -C helper_kmod" >&2; exit 1; }
addr=$(awk '$3 == "kvm_sched_in" { print $1; exit }' /proc/kallsyms)
case "$addr" in
  ""|0000000000000000)
    echo "load.sh: kvm_sched_in is not readable in /proc/kallsyms (is kvm loaded? run as root)" >&2
    exit 1 ;;
esac
exec insmod "$ko" "kvm_sched_in=0x$addr"

/* SPDX-License-Identifier: GPL-2.0 */
/*
 * BPF (bcc) side of the vmprof_vmx contract: include from the sampler's BPF C
 * with -I<repo>/helper_kmod.  Needs only <linux/types.h> and bcc's helpers.
 *
 * Compile-time inputs (bcc cflags, from /sys/module/vmprof_vmx/parameters/):
 *   -DVMX_REC_BASE=0x...ULL   contents of `records`
 *   -DVMX_NR_REC=<n>          contents of `nr_records`
 * Without VMX_REC_BASE the helper is reported absent and nothing is read.
 *
 * Use only for a sample the sampler already classified as a guest sample:
 * vcpu = the struct kvm_vcpu * found via current's preempt notifier, and
 * expected = the handling_intr_from_guest value this event type implies
 * (VMPROF_KVM_HANDLING_IRQ for cpu-clock, VMPROF_KVM_HANDLING_NMI for
 * cycles), equal to what that vcpu's flag says.  See BPF_CONTRACT.md.
 */
#ifndef VMPROF_VMX_BPF_H
#define VMPROF_VMX_BPF_H

#include "vmprof_vmx_abi.h"

/* The record is written microseconds before the sample's BPF program runs. */
#ifndef VMX_MAX_AGE_NS
#define VMX_MAX_AGE_NS 1000000ULL
#endif

enum vmx_helper_status {
	VMX_HELPER_OK = 0,	  /* out->guest_rip/cr3/cpl/exit_reason are this sample's */
	VMX_HELPER_ABSENT = 1,	  /* compiled without the module's parameters */
	VMX_HELPER_NO_RECORD = 2, /* cpu out of range, unreadable, or module gone */
	VMX_HELPER_STALE = 3,	  /* record is not from this interrupt */
	VMX_HELPER_INVALID = 4,	  /* captured, but out->flags says why not valid */
};

static __always_inline int vmx_helper_read(__u64 vcpu, __u8 expected,
					   struct vmprof_vmx_rec *out)
{
#ifndef VMX_REC_BASE
	return VMX_HELPER_ABSENT;
#else
	__u32 cpu = bpf_get_smp_processor_id();
	__u64 now;

	if (cpu >= VMX_NR_REC)
		return VMX_HELPER_NO_RECORD;
	if (bpf_probe_read_kernel(out, sizeof(*out),
				  (void *)(VMX_REC_BASE + (__u64)cpu * VMPROF_VMX_REC_SIZE)))
		return VMX_HELPER_NO_RECORD;
	if (out->magic != VMPROF_VMX_MAGIC)
		return VMX_HELPER_NO_RECORD;
	if ((out->seq & 1) || out->vcpu != vcpu)
		return VMX_HELPER_STALE;
	if (((out->flags & VMPROF_VMX_F_NMI) != 0) != (expected == VMPROF_KVM_HANDLING_NMI))
		return VMX_HELPER_STALE;
	now = bpf_ktime_get_ns();
	if (now < out->stamp_ns || now - out->stamp_ns > VMX_MAX_AGE_NS)
		return VMX_HELPER_STALE;
	if (!(out->flags & VMPROF_VMX_F_VALID))
		return VMX_HELPER_INVALID;
	return VMX_HELPER_OK;
#endif
}

#endif /* VMPROF_VMX_BPF_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * vmprof_vmx - publish the VMCS guest RIP / CR3 / CPL / exit reason of the
 * vCPU whose guest-mode interrupt a CPU is handling, for the vmprof BPF
 * sampler on Intel VMX hosts.
 *
 * On VMX the guest RIP and CR3 live in the VMCS and only VMREAD reaches them,
 * and KVM caches RIP lazily: a BPF program on a perf event runs *before* perf
 * asks KVM for the guest IP of that sample, so kvm_vcpu.arch.regs[RIP] is
 * stale when the sampler looks at it.  This module runs just ahead of the
 * sampler, in the same interrupt, and copies what the sampler needs into a
 * per-CPU record that the BPF program reads with bpf_probe_read_kernel().
 *
 * Hooks (nothing else runs):
 *   - tracepoint timer:hrtimer_expire_entry, i.e. immediately before each
 *     hrtimer callback, including perf's cpu-clock callback (IRQ samples);
 *   - an NMI_LOCAL handler registered first in the list, i.e. before perf's
 *     PMI handler (cycles samples, NMI).
 * Each hook does something only when the interrupted task is a KVM vCPU
 * thread loaded on this CPU whose handling_intr_from_guest says this very
 * interrupt (IRQ resp. NMI) arrived while the guest was running.  That is
 * the window between KVM's kvm_before_interrupt() and kvm_after_interrupt():
 * interrupts are off, the vCPU's VMCS is the current VMCS of this CPU, and
 * no VM entry can happen.  The module then only executes VMREAD (never
 * VMWRITE, never touches KVM state) and writes its own record.
 *
 * The vCPU is found exactly as the BPF side does (docs/backends.md): the
 * first preempt notifier of `current` whose ops->sched_in is kvm_sched_in.
 * kvm_sched_in is static in KVM and KVM's exports are being restricted to
 * KVM's own modules, so its address is a module parameter, taken from
 * /proc/kallsyms by load.sh and verified here with sprint_symbol().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/version.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/kallsyms.h>
#include <linux/tracepoint.h>
#include <linux/timekeeping.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/preempt.h>
#include <linux/kvm_host.h>
#include <asm/nmi.h>
#include <asm/asm.h>
#include <asm/cpufeature.h>
#include <asm/processor-flags.h>
#include <asm/special_insns.h>
#include <asm/vmx.h>

#include "vmprof_vmx_abi.h"

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 1, 0)
#error "vmprof_vmx supports Linux 6.1 to 6.18 (needs handling_intr_from_guest with the IRQ/NMI split)"
#endif
#ifndef CONFIG_X86_64
#error "vmprof_vmx is for x86-64 hosts"
#endif
#ifndef CONFIG_PREEMPT_NOTIFIERS
#error "vmprof_vmx needs CONFIG_PREEMPT_NOTIFIERS (selected by CONFIG_KVM)"
#endif

/* VMCS field encodings, Intel SDM vol. 3 appendix B; checked against <asm/vmx.h>. */
#define VMPROF_VMCS_CPU_BASED_CTL	0x4002UL
#define VMPROF_VMCS_SECONDARY_CTL	0x401eUL
#define VMPROF_VMCS_EXIT_REASON		0x4402UL
#define VMPROF_VMCS_GUEST_SS_AR		0x4818UL
#define VMPROF_VMCS_GUEST_CR3		0x6802UL
#define VMPROF_VMCS_GUEST_RIP		0x681eUL
#define VMPROF_CTL_SECONDARY		(1UL << 31)
#define VMPROF_SEC_ENABLE_EPT		(1UL << 1)

static_assert(VMPROF_VMCS_CPU_BASED_CTL == CPU_BASED_VM_EXEC_CONTROL);
static_assert(VMPROF_VMCS_SECONDARY_CTL == SECONDARY_VM_EXEC_CONTROL);
static_assert(VMPROF_VMCS_EXIT_REASON == VM_EXIT_REASON);
static_assert(VMPROF_VMCS_GUEST_SS_AR == GUEST_SS_AR_BYTES);
static_assert(VMPROF_VMCS_GUEST_CR3 == GUEST_CR3);
static_assert(VMPROF_VMCS_GUEST_RIP == GUEST_RIP);
static_assert(VMPROF_CTL_SECONDARY == CPU_BASED_ACTIVATE_SECONDARY_CONTROLS);
static_assert(VMPROF_SEC_ENABLE_EPT == SECONDARY_EXEC_ENABLE_EPT);

static_assert(sizeof(struct vmprof_vmx_rec) == VMPROF_VMX_REC_SIZE);
static_assert(offsetof(struct vmprof_vmx_rec, vcpu) == 8);
static_assert(offsetof(struct vmprof_vmx_rec, guest_rip) == 24);
static_assert(offsetof(struct vmprof_vmx_rec, guest_cr3) == 32);
static_assert(offsetof(struct vmprof_vmx_rec, exit_reason) == 40);
static_assert(offsetof(struct vmprof_vmx_rec, magic) == 60);
static_assert(sizeof(((struct kvm_vcpu_arch *)0)->handling_intr_from_guest) == 1);

static unsigned long kvm_sched_in;
module_param(kvm_sched_in, ulong, 0400);
MODULE_PARM_DESC(kvm_sched_in,
		 "address of kvm_sched_in from /proc/kallsyms (required; load.sh passes it)");

static struct vmprof_vmx_rec *vmprof_recs;
static unsigned int vmprof_nr_recs;
static struct tracepoint *vmprof_tp_hrtimer;

/*
 * VMREAD of the current VMCS.  false on VMfailInvalid/VMfailValid (CF or ZF
 * set) and, through the exception table, on #UD (CPU not in VMX operation):
 * a failed read never oopses, it is reported as F_VMREAD_FAIL.
 */
static __always_inline bool vmprof_vmread(unsigned long field, unsigned long *val)
{
	unsigned long v = 0;
	u8 fail = 1;

	asm volatile("1: vmread %[field], %[v]\n\t"
		     "setbe %[fail]\n\t"
		     "2:\n\t"
		     _ASM_EXTABLE(1b, 2b)
		     : [v] "+r" (v), [fail] "+q" (fail)
		     : [field] "r" (field)
		     : "cc");
	*val = v;
	return !fail;
}

/*
 * The KVM vCPU loaded on this CPU by the interrupted task, or NULL.  Safe in
 * NMI: a task's preempt notifiers are only added/removed by that task, which
 * we interrupted, and a registered notifier is embedded in a live kvm_vcpu.
 */
static __always_inline struct kvm_vcpu *vmprof_running_vcpu(void)
{
	struct hlist_node *first = READ_ONCE(current->preempt_notifiers.first);
	struct preempt_notifier *pn;
	struct preempt_ops *ops;
	struct kvm_vcpu *vcpu;

	if (!first)
		return NULL;
	pn = hlist_entry(first, struct preempt_notifier, link);
	ops = READ_ONCE(pn->ops);
	if (!ops || (unsigned long)READ_ONCE(ops->sched_in) != kvm_sched_in)
		return NULL;
	vcpu = container_of(pn, struct kvm_vcpu, preempt_notifier);
	if (READ_ONCE(vcpu->cpu) != (int)raw_smp_processor_id())
		return NULL;
	return vcpu;
}

static __always_inline bool vmprof_state_protected(struct kvm_vcpu *vcpu)
{
	if (READ_ONCE(vcpu->arch.guest_state_protected))
		return true;
#ifdef KVM_X86_TDX_VM
	/* 6.16+: even a debug TD's VMCS is owned by the TDX module. */
	if (READ_ONCE(vcpu->kvm->arch.vm_type) == KVM_X86_TDX_VM)
		return true;
#endif
	return false;
}

/* notrace: runs in NMI and before every hrtimer callback; keep it out of ftrace. */
static notrace void vmprof_capture(u8 want)
{
	struct vmprof_vmx_rec *r;
	struct kvm_vcpu *vcpu;
	unsigned long rip = 0, cr3 = 0, reason = 0, ss_ar = 0, ctl = 0, sec = 0;
	unsigned int cpu;
	u32 flags;
	bool ok;

	vcpu = vmprof_running_vcpu();
	if (!vcpu || READ_ONCE(vcpu->arch.handling_intr_from_guest) != want)
		return;
	cpu = raw_smp_processor_id();
	if (unlikely(cpu >= vmprof_nr_recs))
		return;
	r = &vmprof_recs[cpu];

	flags = want == VMPROF_KVM_HANDLING_NMI ? VMPROF_VMX_F_NMI : 0;
	if (!(__read_cr4() & X86_CR4_VMXE)) {
		flags |= VMPROF_VMX_F_NO_VMX;		/* e.g. a PVM vCPU */
		ok = false;
	} else if (vmprof_state_protected(vcpu)) {
		flags |= VMPROF_VMX_F_PROTECTED;
		ok = false;
	} else {
		ok = vmprof_vmread(VMPROF_VMCS_GUEST_RIP, &rip);
		ok &= vmprof_vmread(VMPROF_VMCS_EXIT_REASON, &reason);
		ok &= vmprof_vmread(VMPROF_VMCS_GUEST_SS_AR, &ss_ar);
		if (vmprof_vmread(VMPROF_VMCS_CPU_BASED_CTL, &ctl) &&
		    (ctl & VMPROF_CTL_SECONDARY) &&
		    vmprof_vmread(VMPROF_VMCS_SECONDARY_CTL, &sec) &&
		    (sec & VMPROF_SEC_ENABLE_EPT)) {
			ok &= vmprof_vmread(VMPROF_VMCS_GUEST_CR3, &cr3);
		} else {
			/* Shadow paging: CR3 loads exit, KVM's copy is current. */
			cr3 = READ_ONCE(vcpu->arch.cr3);
			flags |= VMPROF_VMX_F_CR3_VCPU;
		}
		if (!ok)
			flags |= VMPROF_VMX_F_VMREAD_FAIL;
	}
#ifdef HF_GUEST_MASK
	if (READ_ONCE(vcpu->arch.hflags) & HF_GUEST_MASK)
		flags |= VMPROF_VMX_F_NESTED;
#endif
	if (ok)
		flags |= VMPROF_VMX_F_VALID;

	/* Same-CPU seqcount: only a BPF program in a nested NMI can see odd. */
	WRITE_ONCE(r->seq, r->seq + 1);
	barrier();
	WRITE_ONCE(r->flags, flags);
	WRITE_ONCE(r->vcpu, (u64)(unsigned long)vcpu);
	WRITE_ONCE(r->stamp_ns, ktime_get_mono_fast_ns());
	WRITE_ONCE(r->guest_rip, ok ? (u64)rip : 0);
	WRITE_ONCE(r->guest_cr3, ok ? (u64)cr3 : 0);
	WRITE_ONCE(r->exit_reason, ok ? (u32)reason : 0);
	WRITE_ONCE(r->guest_cpl, ok ? (u32)((ss_ar >> 5) & 3) : 0);
	WRITE_ONCE(r->captures, r->captures + 1);
	if (!ok)
		WRITE_ONCE(r->fails, r->fails + 1);
	barrier();
	WRITE_ONCE(r->seq, r->seq + 1);
}

/* timer:hrtimer_expire_entry, prototype unchanged from 4.x to 6.18. */
static notrace void vmprof_hrtimer_probe(void *data, struct hrtimer *timer, ktime_t *now)
{
	vmprof_capture(VMPROF_KVM_HANDLING_IRQ);
}

static notrace int vmprof_nmi(unsigned int type, struct pt_regs *regs)
{
	vmprof_capture(VMPROF_KVM_HANDLING_NMI);
	return NMI_DONE;	/* never claims the NMI */
}

static void vmprof_find_tp(struct tracepoint *tp, void *priv)
{
	if (!strcmp(tp->name, "hrtimer_expire_entry"))
		*(struct tracepoint **)priv = tp;
}

/* --- read-only sysfs: /sys/module/vmprof_vmx/parameters/ --- */

static int vmprof_get_abi(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", VMPROF_VMX_ABI_VERSION);
}

static int vmprof_get_records(char *buf, const struct kernel_param *kp)
{
	/* A kernel address on purpose (mode 0400): the BPF side reads it. */
	return sysfs_emit(buf, "0x%lx\n", (unsigned long)vmprof_recs);
}

static int vmprof_get_record_size(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", VMPROF_VMX_REC_SIZE);
}

static int vmprof_get_nr_records(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%u\n", vmprof_nr_recs);
}

static int vmprof_get_stats(char *buf, const struct kernel_param *kp)
{
	u64 captures = 0, fails = 0;
	unsigned int i;

	for (i = 0; i < vmprof_nr_recs; i++) {
		captures += READ_ONCE(vmprof_recs[i].captures);
		fails += READ_ONCE(vmprof_recs[i].fails);
	}
	return sysfs_emit(buf, "captures %llu fails %llu\n", captures, fails);
}

#define VMPROF_RO_PARAM(name, mode)						\
	static const struct kernel_param_ops vmprof_ops_##name = {		\
		.get = vmprof_get_##name,					\
	};									\
	module_param_cb(name, &vmprof_ops_##name, NULL, mode)

VMPROF_RO_PARAM(abi, 0444);
VMPROF_RO_PARAM(records, 0400);
VMPROF_RO_PARAM(record_size, 0444);
VMPROF_RO_PARAM(nr_records, 0444);
VMPROF_RO_PARAM(stats, 0444);

static int __init vmprof_vmx_init(void)
{
	char sym[KSYM_SYMBOL_LEN];
	unsigned int i;
	int ret;

	if (!boot_cpu_has(X86_FEATURE_VMX)) {
		pr_err("this CPU has no VMX; the helper is only for Intel VMX hosts\n");
		return -ENODEV;
	}
	if (!kvm_sched_in) {
		pr_err("kvm_sched_in=<address from /proc/kallsyms> is required (use load.sh)\n");
		return -EINVAL;
	}
	sprint_symbol(sym, kvm_sched_in);
	if (strncmp(sym, "kvm_sched_in+0x0/", strlen("kvm_sched_in+0x0/"))) {
		pr_err("kvm_sched_in=0x%lx is not kvm_sched_in\n", kvm_sched_in);
		return -EINVAL;
	}

	vmprof_nr_recs = nr_cpu_ids;
	vmprof_recs = kvzalloc(PAGE_ALIGN(array_size(vmprof_nr_recs, sizeof(*vmprof_recs))),
			       GFP_KERNEL);
	if (!vmprof_recs)
		return -ENOMEM;
	for (i = 0; i < vmprof_nr_recs; i++)
		vmprof_recs[i].magic = VMPROF_VMX_MAGIC;

	for_each_kernel_tracepoint(vmprof_find_tp, &vmprof_tp_hrtimer);
	if (!vmprof_tp_hrtimer) {
		pr_err("tracepoint timer:hrtimer_expire_entry not found\n");
		ret = -ENOENT;
		goto err_free;
	}
	ret = tracepoint_probe_register(vmprof_tp_hrtimer, vmprof_hrtimer_probe, NULL);
	if (ret) {
		pr_err("cannot attach to hrtimer_expire_entry: %d\n", ret);
		goto err_free;
	}
	ret = register_nmi_handler(NMI_LOCAL, vmprof_nmi, NMI_FLAG_FIRST, "vmprof_vmx");
	if (ret) {
		pr_err("cannot register the NMI handler: %d\n", ret);
		goto err_tp;
	}
	pr_info("ready: %u records at /sys/module/vmprof_vmx/parameters/records\n",
		vmprof_nr_recs);
	return 0;

err_tp:
	tracepoint_probe_unregister(vmprof_tp_hrtimer, vmprof_hrtimer_probe, NULL);
	tracepoint_synchronize_unregister();
err_free:
	kvfree(vmprof_recs);
	vmprof_recs = NULL;
	return ret;
}

static void __exit vmprof_vmx_exit(void)
{
	unsigned int i;

	unregister_nmi_handler(NMI_LOCAL, "vmprof_vmx");	/* waits for running handlers */
	tracepoint_probe_unregister(vmprof_tp_hrtimer, vmprof_hrtimer_probe, NULL);
	tracepoint_synchronize_unregister();
	/* Tell a sampler that still holds the address that the records are gone. */
	for (i = 0; i < vmprof_nr_recs; i++)
		WRITE_ONCE(vmprof_recs[i].magic, 0);
	kvfree(vmprof_recs);
}

module_init(vmprof_vmx_init);
module_exit(vmprof_vmx_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vmprof: read-only VMCS guest RIP/CR3/exit reason for the BPF sampler");
MODULE_VERSION("1.0");

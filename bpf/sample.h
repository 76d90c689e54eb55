/* The one definition of vmprof's records, shared by the BPF programs and by
 * Python (vmprof_tui/record/bpf_records.py declares the same layout as numpy dtypes and
 * tests/test_records.py proves sizes and offsets agree).
 * Only fixed-size UAPI types: bcc compiles this against any headers tree. */
#ifndef VMPROF_SAMPLE_H
#define VMPROF_SAMPLE_H

#include <linux/types.h>

/* vmprof_sample.flags */
#define SAMPLE_HOST_KERNEL   0x0001  /* host IP is in the host kernel */
#define SAMPLE_VCPU          0x0002  /* interrupted task is a vCPU thread with its vCPU loaded */
#define SAMPLE_GUEST         0x0004  /* the interrupt arrived while the guest ran */
#define SAMPLE_GUEST_KERNEL  0x0008  /* guest privilege was kernel (CPL 0) */
#define SAMPLE_GUEST_UNKNOWN 0x0010  /* guest RIP/CR3 unknown (VMX without helper_kmod) */
#define SAMPLE_HALTED        0x0020  /* vCPU mp_state was HALTED */

/* One sampling interrupt (perf_event: cycles on PMU hosts, cpu-clock otherwise). */
struct vmprof_sample {
	__u64 time_ns;     /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, one clock for all CPUs */
	__u64 host_ip;
	__u64 guest_ip;    /* guest RIP, when SAMPLE_GUEST */
	__u64 guest_cr3;   /* guest CR3 as the vCPU holds it, when SAMPLE_GUEST */
	__u32 pid;         /* host process (tgid); for vCPU threads, the VMM: the VM's identity */
	__u32 tid;         /* host thread */
	__u32 exit_reason; /* last VM-exit reason of the vCPU (backend numbering) */
	__s32 stack_id;    /* 0: a vmprof_stack record with this cpu and time_ns follows (-g); -1: none */
	__u16 cpu;
	__u16 vcpu_id;     /* kvm_vcpu.vcpu_id, when SAMPLE_VCPU */
	__u16 flags;
	__u16 pad;
};

/* vmprof top --host-counts: samples of host tasks (no vCPU loaded, not a vCPU thread, not idle) are
 * counted in a hash map by (process, privilege, IP) instead of each one going through the ring buffer,
 * as bcc's profile counts stacks; user space takes and clears the counts on every drain. */
struct vmprof_host_count_key {
	__u32 pid;         /* host process (tgid) */
	__u16 flags;       /* SAMPLE_HOST_KERNEL or 0 */
	__u16 pad;
	__u64 ip;          /* host IP */
};

/* vmprof_stack.flags */
#define STACK_GUEST_WALKED  0x01  /* the guest frame-pointer chain was walked (a guest sample) */
#define STACK_GUEST_PARTIAL 0x02  /* the walk stopped early: a read failed, a frame was inconsistent, or depth ran out */
#define STACK_HOST_USER_INLINE 0x04 /* a host sample whose user chain lost its stack-map bucket to another
                                      * chain (get_stackid's -EEXIST): the chain is in guest[] instead */
#define STACK_GUEST_MAX 64        /* guest frames per stack, the leaf (guest RIP) included */

/* The call stacks of one sample (vmprof record -g), in a ring buffer of their own so that a
 * recording without -g stays as small as before.  Host chains are ids in the BPF stack map
 * (recorded separately, id -> addresses); guest frames are walked from guest memory. */
struct vmprof_stack {
	__u64 time_ns;          /* = its sample's time_ns (with cpu: the key that joins the two) */
	__s32 kernel_stack_id;  /* host kernel chain, -1 when none or not stored */
	__s32 user_stack_id;    /* host user chain by frame pointers, -1 when none or not stored */
	__u16 cpu;
	__u8 guest_depth;       /* frames in guest[]: guest[0] is the guest RIP (host IP when inline), then return addresses */
	__u8 flags;
	__u32 pad;
	__u64 guest[STACK_GUEST_MAX];
};

/* --call-graph cfi: vmprof_stack.flags STACK_USER_COPY says a vmprof_ustack record with the same cpu and
 * time_ns carries the user stack (host user code, or the guest's) to be unwound afterwards by call-frame
 * information (resolve/unwind.py). */
#define STACK_USER_COPY 0x08
#ifndef STACK_COPY_BYTES
#define STACK_COPY_BYTES 8192     /* bytes of user stack copied from RSP up (-DSTACK_COPY_BYTES=N, a power of two) */
#endif
#define USTACK_GUEST 0x01         /* vmprof_ustack.flags: a guest's stack, read through its page tables */
/* vmprof_ustack.flags: a guest-kernel sample; data[] ends with the guest kernel's stack (KSTACK_TAIL bytes:
 * its RSP, its RBP, then KSTACK_COPY_BYTES from that RSP up), unwound by the kernel's own call-frame
 * information; the user stack it was entered from is the first `copied` bytes (at most
 * STACK_COPY_BYTES - KSTACK_TAIL) */
#define USTACK_GUEST_KERNEL 0x02
#define KSTACK_COPY_BYTES 512
#define KSTACK_TAIL (16 + KSTACK_COPY_BYTES)

/* A bounded copy of a user stack and the registers unwinding starts from.  `copied` bytes from `sp` up
 * were read (a read stops at the first page that is not resident or not mapped); the rest is zero. */
struct vmprof_ustack {
	__u64 time_ns;          /* = its sample's time_ns (with cpu: the key that joins the two) */
	__u16 cpu;
	__u8 flags;
	__u8 pad;
	__u32 copied;           /* bytes of data[] read */
	__u64 ip, sp, bp;       /* user (or guest) RIP, RSP, RBP at the sample */
	__u8 data[STACK_COPY_BYTES];
};

/* vmprof_sched_event.flags */
#define SCHED_PREV_VCPU    0x01  /* prev is a vCPU thread */
#define SCHED_NEXT_VCPU    0x02  /* next is a vCPU thread */
#define SCHED_PREV_LOADED  0x04  /* prev left the CPU inside KVM_RUN (vCPU loaded) */
#define SCHED_PREV_HALTED  0x08  /* prev's vCPU mp_state was HALTED */
#define SCHED_PREV_RUNNABLE 0x10 /* prev was still runnable: preempted, not blocked */
#define SCHED_PREV_THROTTLED 0x20 /* prev was runnable but its CPU cgroup had used up its cpu.max quota */
/* The two kinds of record in the sched ring that are not context switches (flags say which):
 * SCHED_WAKEUP: sched_wakeup of a vCPU thread (prev_*), woken by the task in next_* on cpu; with
 *   SCHED_PREV_THROTTLED it was woken into a CPU cgroup throttled at that moment;
 * SCHED_HALT_END: kvm_vcpu_wakeup, a halt of the vCPU thread prev_* ended; prev_exit_reason is the
 *   halt's length in ns (capped at 2^32-1) and SCHED_PREV_RUNNABLE says it ended while KVM still
 *   polled (halt polling succeeded: the thread never blocked). */
#define SCHED_WAKEUP       0x40
#define SCHED_HALT_END     0x80
#define SCHED_NOT_SWITCH   (SCHED_WAKEUP | SCHED_HALT_END)
/* both bits: SCHED_THROTTLE_END, a vCPU thread prev_* that left its CPU throttled (or was woken into a
 * throttled group) takes one again; prev_exit_reason is how long its group was throttled since it left
 * (or was woken), in ns (capped at 2^32-1), from the
 * kernel's own count (cfs_rq.throttled_clock_self_time, what cpu.stat.local reports) */
#define SCHED_THROTTLE_END SCHED_NOT_SWITCH

/* A context switch on a CPU where the thread leaving or arriving is a vCPU thread or the idle task
 * (or one of the two other kinds above). */
struct vmprof_sched_event {
	__u64 time_ns;
	__u32 prev_pid;
	__u32 prev_tid;
	__u32 next_pid;
	__u32 next_tid;
	__u32 prev_exit_reason; /* last VM-exit reason of prev's vCPU, when SCHED_PREV_LOADED */
	__u16 cpu;
	__u16 prev_vcpu_id;
	__u8 flags;
	__u8 pad[3];
	__u32 cpu_irq_ns;       /* hard + soft IRQ time this CPU has spent so far, in ns modulo 2^32:
	                         * the difference between two events of one CPU is its IRQ time between them */
	char next_comm[16];
};

#endif

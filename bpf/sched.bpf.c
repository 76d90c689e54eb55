/* vmprof scheduler events: every context switch in which a vCPU thread (or the
 * idle task) leaves or takes a CPU, with whether the one leaving was preempted, throttled or
 * blocked, and whether its vCPU was halted.  These give exact run/blank intervals.  Also the
 * wake-ups of vCPU threads (where a halt's idle time ends and its wake-up wait begins), KVM's
 * end-of-halt event (halt polling), and each CPU's running total of IRQ time. */
#include "sample.h"

BPF_RINGBUF_OUTPUT(sched_events, SCHED_RING_PAGES);
BPF_PERCPU_ARRAY(sched_lost, u64, 1);

/* Per CPU: IRQ time so far, and the start of the hard and the soft IRQ running now (0: none).  A hard
 * IRQ inside a soft IRQ counts once (nested_ns is taken off the soft one); a missed exit loses one
 * interval, never the clock. */
struct irq_clock {
	u64 total_ns;
	u64 hard_start_ns;
	u64 soft_start_ns;
	u64 nested_ns;
};
BPF_PERCPU_ARRAY(irq_clocks, struct irq_clock, 1);

#include "vcpu.h"

static __always_inline struct irq_clock *irq_clock(void)
{
	int zero = 0;
	return irq_clocks.lookup(&zero);
}

static __always_inline u32 cpu_irq_ns(void)
{
	struct irq_clock *c = irq_clock();
	return c ? (u32)c->total_ns : 0;
}

static __always_inline int hard_enter(void)
{
	struct irq_clock *c = irq_clock();
	if (c)
		c->hard_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int hard_exit(void)
{
	struct irq_clock *c = irq_clock();
	if (!c || !c->hard_start_ns)
		return 0;
	u64 d = bpf_ktime_get_ns() - c->hard_start_ns;
	c->total_ns += d;
	if (c->soft_start_ns)
		c->nested_ns += d;
	c->hard_start_ns = 0;
	return 0;
}

static __always_inline int soft_enter(void)
{
	struct irq_clock *c = irq_clock();
	if (c) {
		c->soft_start_ns = bpf_ktime_get_ns();
		c->nested_ns = 0;
	}
	return 0;
}

static __always_inline int soft_exit(void)
{
	struct irq_clock *c = irq_clock();
	if (!c || !c->soft_start_ns)
		return 0;
	u64 d = bpf_ktime_get_ns() - c->soft_start_ns;
	c->total_ns += d > c->nested_ns ? d - c->nested_ns : 0;
	c->soft_start_ns = 0;
	return 0;
}

/* VMPROF_STEAL_CAUSES=0 (-DNO_STEAL_CAUSES) leaves the IRQ clock, the wake-ups and the halt ends out:
 * benchmarks/overhead.py measures what they cost.  cpu_irq_ns then stays 0. */
#ifndef NO_STEAL_CAUSES
/* hard IRQs (device handlers and the APIC vectors that do the host's own work) and soft IRQs */
RAW_TRACEPOINT_PROBE(irq_handler_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(irq_handler_exit) { return hard_exit(); }
RAW_TRACEPOINT_PROBE(softirq_entry) { return soft_enter(); }
RAW_TRACEPOINT_PROBE(softirq_exit) { return soft_exit(); }
RAW_TRACEPOINT_PROBE(local_timer_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(local_timer_exit) { return hard_exit(); }
RAW_TRACEPOINT_PROBE(reschedule_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(reschedule_exit) { return hard_exit(); }
RAW_TRACEPOINT_PROBE(call_function_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(call_function_exit) { return hard_exit(); }
RAW_TRACEPOINT_PROBE(call_function_single_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(call_function_single_exit) { return hard_exit(); }
RAW_TRACEPOINT_PROBE(irq_work_entry) { return hard_enter(); }
RAW_TRACEPOINT_PROBE(irq_work_exit) { return hard_exit(); }
#endif

static __always_inline struct vmprof_sched_event *new_event(void)
{
	struct vmprof_sched_event *e = sched_events.ringbuf_reserve(sizeof(struct vmprof_sched_event));
	if (!e) {
		int zero = 0;
		sched_lost.increment(zero);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->prev_exit_reason = 0;
	e->cpu = bpf_get_smp_processor_id();
	e->prev_vcpu_id = 0;
	__builtin_memset(e->pad, 0, sizeof(e->pad));
	e->cpu_irq_ns = cpu_irq_ns();
	return e;
}

/* A record about vCPU thread `tid` that is not a switch: `value` in prev_exit_reason, capped at 32 bits. */
static __always_inline void vcpu_record(u32 pid, u32 tid, u16 vcpu_id, u64 value, u8 flags)
{
	struct vmprof_sched_event *e = new_event();
	if (!e)
		return;
	e->prev_pid = pid;
	e->prev_tid = tid;
	e->next_pid = 0;
	e->next_tid = 0;
	e->prev_exit_reason = value > 0xffffffffULL ? 0xffffffffU : (u32)value;
	e->prev_vcpu_id = vcpu_id;
	e->flags = flags | SCHED_PREV_VCPU;
	__builtin_memset(e->next_comm, 0, sizeof(e->next_comm));
	sched_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* vCPU threads that left their CPU throttled -> their group's throttled time then */
BPF_HASH(throttled_at, u32, u64, 4096);

/* A runnable task whose CFS group (or an ancestor) is throttled: it waits for the next quota period.
 * Remembers the group's throttled time so far, for the SCHED_THROTTLE_END record when it runs again. */
static __always_inline bool throttled(const void *task, u32 tid)
{
#ifndef TASK_SE_CFS_RQ
	return false; /* no CONFIG_CFS_BANDWIDTH */
#else
	void *cfs_rq = (void *)read_u64(task + TASK_SE_CFS_RQ);
	if (!cfs_rq || !(read_u32(cfs_rq + CFS_RQ_THROTTLED) || read_u32(cfs_rq + CFS_RQ_THROTTLE_COUNT)))
		return false;
	u64 so_far = read_u64(cfs_rq + CFS_RQ_THROTTLED_TIME);
	throttled_at.update(&tid, &so_far);
	return true;
#endif
}

/* A vCPU thread that left its CPU throttled takes one: how long its group stayed throttled. */
static __always_inline void throttle_end(const void *task, u32 tid)
{
#ifdef TASK_SE_CFS_RQ
	u64 *before = throttled_at.lookup(&tid);
	if (!before)
		return;
	u64 was = *before;
	throttled_at.delete(&tid);
	void *cfs_rq = (void *)read_u64(task + TASK_SE_CFS_RQ);
	u64 ns = cfs_rq ? read_u64(cfs_rq + CFS_RQ_THROTTLED_TIME) - was : 0;
	vcpu_record(read_u32(task + TASK_TGID), tid, 0, ns, SCHED_THROTTLE_END);
#endif
}

#ifndef NO_STEAL_CAUSES
RAW_TRACEPOINT_PROBE(sched_wakeup)
{
	/* TP_PROTO(struct task_struct *p) */
	void *p = (void *)ctx->args[0];
	u32 tid = read_u32(p + TASK_PID);
	void *vcpu = loaded_vcpu(p);
	if (!vcpu && !vcpu_tids.lookup(&tid))
		return 0;
	struct vmprof_sched_event *e = new_event();
	if (!e)
		return 0;
	u64 id = bpf_get_current_pid_tgid();
	e->prev_pid = read_u32(p + TASK_TGID);
	e->prev_tid = tid;
	e->next_pid = id >> 32;
	e->next_tid = (u32)id;
	if (vcpu)
		e->prev_vcpu_id = read_u32(vcpu + VCPU_VCPU_ID);
	e->flags = SCHED_WAKEUP | SCHED_PREV_VCPU;
	/* woken into a throttled group (it slept as the quota ran out): it waits for the next period, which
	 * the SCHED_THROTTLE_END record of its next switch-in measures from here */
	if (throttled(p, tid))
		e->flags |= SCHED_PREV_THROTTLED;
	bpf_get_current_comm(e->next_comm, sizeof(e->next_comm));
	sched_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

RAW_TRACEPOINT_PROBE(kvm_vcpu_wakeup)
{
	/* TP_PROTO(ktime_t ns, bool waited, bool valid); runs on the vCPU thread as its halt ends */
	bool waited = (bool)ctx->args[1];
	u64 id = bpf_get_current_pid_tgid();
	void *vcpu = loaded_vcpu((void *)bpf_get_current_task());
	vcpu_record(id >> 32, (u32)id, vcpu ? read_u32(vcpu + VCPU_VCPU_ID) : 0, ctx->args[0],
		    SCHED_HALT_END | (waited ? 0 : SCHED_PREV_RUNNABLE));
	return 0;
}

#endif

/* Per CPU: the thread the last context switch put there, and whether that switch was recorded.  Two kinds of
 * switch-in of a vCPU thread are not recorded when they happen: one before the thread is known as a vCPU thread
 * (not in KVM_RUN yet, not yet in vcpu_tids), and one from a task that emits no trace events at all (on these
 * machines, the sandbox's own agent: docs/analysis.md).  The sampler, which runs in the switched-in thread's
 * context, finds either and records it (seen_running).  Only with the cpu-clock sampler (EXPECTED_HANDLING 1):
 * its interrupt is masked from the sched_switch tracepoint until the new thread runs, where a cycles NMI could
 * sample the thread that is leaving and take it for one that arrived. */
#if EXPECTED_HANDLING == 1
#define RECOVER_SWITCHES
#ifndef SAMPLE_PERIOD_NS
#error "SAMPLE_PERIOD_NS: the cpu-clock sampling period, in ns"
#endif
struct cpu_thread {
	u64 since_ns;   /* of the last recorded switch */
	u64 task;       /* the task_struct the last switch put here */
	u64 prev_task;  /* and the one it took the CPU from, when that switch was not recorded */
	u32 tid;
	u32 prev_tid;
	u8 known;       /* 0 until this CPU's first switch since the programs were attached, or after a lost one */
	u8 recorded;
	u8 prev_flags;  /* SCHED_PREV_RUNNABLE or 0 */
	u8 pad[5];
};
BPF_PERCPU_ARRAY(cpu_threads, struct cpu_thread, 1);

static __always_inline struct cpu_thread *cpu_thread(void)
{
	int zero = 0;
	return cpu_threads.lookup(&zero);
}

/* The process of `task`, if it is still thread `tid` (it may have exited since it was kept); else `tid`. */
static __always_inline u32 kept_pid(u64 task, u32 tid)
{
	return read_u32((void *)task + TASK_PID) == tid ? read_u32((void *)task + TASK_TGID) : tid;
}

/* The sampler found vCPU (or idle) thread pid/tid running: record its switch-in if that was not recorded, at
 * the middle of the stretch after the last recorded switch and the CPU's previous sampling tick.  From a task
 * that emits no events (it takes no samples either), the switch came in that stretch.  Of a thread not yet known
 * as a vCPU thread, the switch kept here may be older (its time is not taken, to keep switches that are not
 * recorded cheap): the thread's time before, as a plain VMM thread, is left to its host samples. */
static __always_inline void seen_running(u32 pid, u32 tid, bool vcpu)
{
	struct cpu_thread *c = cpu_thread();
	if (!c || !c->known || (c->tid == tid && c->recorded))
		return;
	struct vmprof_sched_event *e = new_event();
	if (!e)
		return;
	u64 now = e->time_ns, after = now - SAMPLE_PERIOD_NS;
	if (after <= c->since_ns)
		after = c->since_ns < now ? c->since_ns + 1 : now;
	e->time_ns = after + (now - after) / 2;
	if (c->tid == tid) {
		e->prev_pid = kept_pid(c->prev_task, c->prev_tid);
		e->prev_tid = c->prev_tid;
		e->flags = c->prev_flags;
	} else {
		e->prev_pid = kept_pid(c->task, c->tid);
		e->prev_tid = c->tid;
		e->flags = 0;
	}
	e->next_pid = pid;
	e->next_tid = tid;
	if (vcpu)
		e->flags |= SCHED_NEXT_VCPU;
	bpf_get_current_comm(e->next_comm, sizeof(e->next_comm));
	c->since_ns = e->time_ns;
	c->task = bpf_get_current_task();
	c->tid = tid;
	c->recorded = 1;
	sched_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	if (vcpu)
		throttle_end((void *)c->task, tid);
}
#endif

RAW_TRACEPOINT_PROBE(sched_switch)
{
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
	 *          unsigned int prev_state) */
	bool preempt = (bool)ctx->args[0];
	void *prev = (void *)ctx->args[1];
	void *next = (void *)ctx->args[2];
	u32 prev_state = (u32)ctx->args[3];
	u32 prev_tid = read_u32(prev + TASK_PID);
	u32 next_tid = read_u32(next + TASK_PID);
	void *prev_vcpu = loaded_vcpu(prev);
	u8 flags = 0;

	if (prev_vcpu || vcpu_tids.lookup(&prev_tid))
		flags |= SCHED_PREV_VCPU;
	if (loaded_vcpu(next) || vcpu_tids.lookup(&next_tid))
		flags |= SCHED_NEXT_VCPU;
	/* also every switch to or from the idle task (pid 0): the host level measures idle
	 * from these, since an idle CPU may take no sampling interrupts at all */
	bool record = flags || prev_tid == 0 || next_tid == 0;
#ifdef RECOVER_SWITCHES
	struct cpu_thread *now = cpu_thread();
	if (now) {
		now->task = (u64)next;
		now->tid = next_tid;
		now->known = 1;
		now->recorded = record;
		if (!record) {
			now->prev_task = (u64)prev;
			now->prev_tid = prev_tid;
			now->prev_flags = preempt || prev_state == 0 ? SCHED_PREV_RUNNABLE : 0;
		}
	}
#endif
	if (!record)
		return 0;

	struct vmprof_sched_event *e = new_event();
#ifdef RECOVER_SWITCHES
	if (now) {
		now->since_ns = e ? e->time_ns : 0;
		now->known = e != 0; /* a lost switch is counted, never guessed: nothing is recovered until the next */
	}
#endif
	if (!e)
		return 0;
	e->prev_pid = read_u32(prev + TASK_TGID);
	e->prev_tid = prev_tid;
	e->next_pid = read_u32(next + TASK_TGID);
	e->next_tid = next_tid;
	if (preempt || prev_state == 0) {
		flags |= SCHED_PREV_RUNNABLE;
		if ((flags & SCHED_PREV_VCPU) && throttled(prev, prev_tid))
			flags |= SCHED_PREV_THROTTLED;
	}
	if (prev_vcpu) {
		flags |= SCHED_PREV_LOADED;
		e->prev_vcpu_id = read_u32(prev_vcpu + VCPU_VCPU_ID);
		e->prev_exit_reason = vcpu_exit_reason(prev_vcpu);
		if (read_u32(prev_vcpu + VCPU_MP_STATE) == KVM_MP_STATE_HALTED)
			flags |= SCHED_PREV_HALTED;
	}
	e->flags = flags;
	bpf_probe_read_kernel_str(e->next_comm, sizeof(e->next_comm), next + TASK_COMM);
	sched_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	if (flags & SCHED_NEXT_VCPU)
		throttle_end(next, next_tid);
	return 0;
}

/* Every return of KVM_RUN to the VMM (kvm_userspace_exit), by thread and kvm_run exit reason: what the VMM
 * serves then is type-2 steal (the analysis names it by these reasons), and the count is the number of
 * exits it served (a demo VM's system calls: its MMIO doorbells). */
struct vmm_exit_key {
	u32 tid;
	u32 reason;
};
BPF_HASH(vmm_exits, struct vmm_exit_key, u64, 16384);

RAW_TRACEPOINT_PROBE(kvm_userspace_exit)
{
	/* TP_PROTO(__u32 reason, int errno) */
	struct vmm_exit_key key = {.tid = (u32)bpf_get_current_pid_tgid(), .reason = (u32)ctx->args[0]};
	u64 zero = 0;
	u64 *n = vmm_exits.lookup_or_try_init(&key, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

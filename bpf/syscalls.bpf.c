/* vmprof predict: system calls of one process tree, by number, with bytes moved.
 *
 * The tree: user space puts the root's tgid in `tracked` before the root execs the
 * measured command; sched_process_fork adds every child whose parent is tracked, so
 * children, grandchildren and their threads count.  Raw tracepoints only (no kprobes
 * or fentry on these kernels), and nothing from task_struct is needed: the forking
 * task is the current task, and the child's pid/tgid are read from the `pid`/`tgid`
 * fields whose offsets user space passes in from the running kernel's BTF.
 *
 * Per syscall number: calls, and for the numbers user space marks in `byte_nrs`
 * (read, write, pread64, ...) the sum of positive return values, i.e. bytes moved.
 */
#include <uapi/linux/ptrace.h>

#ifndef NR_SLOTS
#define NR_SLOTS 512
#endif

struct nr_count {
	u64 calls;
	u64 bytes;
};

BPF_HASH(tracked, u32, u8, 65536);            /* tgids of the measured tree */
BPF_PERCPU_ARRAY(counts, struct nr_count, NR_SLOTS);
BPF_ARRAY(byte_nrs, u8, NR_SLOTS);            /* 1: the return value is a byte count */
BPF_PERCPU_ARRAY(forks, u64, 2);              /* [0] new processes, [1] new threads */
BPF_PERCPU_ARRAY(dropped, u64, 1);            /* tracked map full: a child went uncounted */

RAW_TRACEPOINT_PROBE(sched_process_fork)
{
	/* TP_PROTO(struct task_struct *parent, struct task_struct *child) */
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!tracked.lookup(&parent))
		return 0;
	void *child = (void *)ctx->args[1];
	u32 child_tgid = 0;
	bpf_probe_read_kernel(&child_tgid, sizeof(child_tgid), child + TASK_TGID);
	int slot = child_tgid == parent ? 1 : 0;
	u64 *n = forks.lookup(&slot);
	if (n)
		*n += 1;
	if (slot == 0) {
		u8 one = 1;
		if (tracked.update(&child_tgid, &one) != 0) {
			int zero = 0;
			u64 *d = dropped.lookup(&zero);
			if (d)
				*d += 1;
		}
	}
	return 0;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
	/* TP_PROTO(struct pt_regs *regs, long id) */
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tracked.lookup(&tgid))
		return 0;
	u32 nr = (u32)ctx->args[1];
	if (nr >= NR_SLOTS)
		nr = NR_SLOTS - 1; /* x32 and unknown numbers share the last slot */
	struct nr_count *c = counts.lookup(&nr);
	if (c)
		c->calls += 1;
	return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit)
{
	/* TP_PROTO(struct pt_regs *regs, long ret); the number is regs->orig_ax (UAPI layout) */
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tracked.lookup(&tgid))
		return 0;
	long ret = (long)ctx->args[1];
	if (ret <= 0)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 orig_ax = 0;
	bpf_probe_read_kernel(&orig_ax, sizeof(orig_ax), &regs->orig_ax);
	u32 nr = (u32)orig_ax;
	if (nr >= NR_SLOTS)
		return 0;
	u8 *moves = byte_nrs.lookup(&nr);
	if (!moves || !*moves)
		return 0;
	struct nr_count *c = counts.lookup(&nr);
	if (c)
		c->bytes += (u64)ret;
	return 0;
}

/* The tree leaves the map when its processes exit (pids are reused). */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if ((u32)id == tgid && tracked.lookup(&tgid))
		tracked.delete(&tgid);
	return 0;
}

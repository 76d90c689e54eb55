/* Call stacks of a sample (vmprof record -g, docs/stacks.md "Guest stacks from the host").
 *
 * Host: kernel and user chains as ids in a BPF stack map (the kernel's own frame-pointer
 * unwinder; user chains stop where a binary has no frame pointers, which resolving marks).
 * Guest: the vCPU thread's mm is the VMM's, which maps guest RAM, so the guest's own
 * frame-pointer chain is walked here, at sample time:
 *   guest virtual -> guest physical  through the 4-level guest page tables at the sampled CR3,
 *   guest physical -> host virtual   through the VM's KVM memslots (kvm->memslots[0], a
 *                                    gfn-ordered red-black tree of kvm_memory_slot),
 *   read                             with bpf_probe_read_user (no faults: a page that is not
 *                                    resident fails the read).
 * Every read can fail and guest memory can change while it is read: a failed read or a frame
 * that does not climb the stack ends the walk with STACK_GUEST_PARTIAL, never a made-up frame.
 * Return addresses are checked against the guest process's code when resolving.
 * All offsets are -D macros from the running kernel's BTF (collect/backends.py). */
#ifndef VMPROF_STACKS_H
#define VMPROF_STACKS_H

#define GUEST_PHYS_MASK 0x000ffffffffff000ULL
#define PTE_PRESENT 0x1ULL
#define PTE_LARGE 0x80ULL
#define MEMSLOT_TREE_DEPTH 16  /* a red-black tree of up to 255 slots is at most 16 deep */
#define GUEST_STACK_PAGES 8    /* the window of guest stack the walk follows frames in, from RSP up */
#define GUEST_USER_TOP 0x800000000000ULL  /* guest addresses below are user space (x86-64, 4-level) */

BPF_STACK_TRACE(host_stacks, HOST_STACK_ENTRIES);
BPF_RINGBUF_OUTPUT(stacks, STACK_RING_PAGES);
BPF_PERCPU_ARRAY(stacks_lost, u64, 1);

/* One walk's view of guest memory, with the last memslot it used. */
struct guest_mem {
	void *memslots;
	u64 node_idx;
	u64 cr3;
	u64 slot_base_gfn, slot_npages, slot_hva;
};

/* Host virtual address of guest physical `gpa`, or 0. */
static __always_inline u64 gpa_to_hva(struct guest_mem *m, u64 gpa)
{
	u64 gfn = gpa >> 12;
	if (gfn - m->slot_base_gfn >= m->slot_npages) {
		void *node = (void *)read_u64(m->memslots + MEMSLOTS_GFN_TREE);
		int found = 0;
		for (int i = 0; i < MEMSLOT_TREE_DEPTH && node && !found; i++) {
			void *slot = node - SLOT_GFN_NODE - m->node_idx * RB_NODE_SIZE;
			u64 base = read_u64(slot + SLOT_BASE_GFN);
			u64 npages = read_u64(slot + SLOT_NPAGES);
			if (gfn < base) {
				node = (void *)read_u64(node + RB_LEFT);
			} else if (gfn - base >= npages) {
				node = (void *)read_u64(node + RB_RIGHT);
			} else {
				m->slot_base_gfn = base;
				m->slot_npages = npages;
				m->slot_hva = read_u64(slot + SLOT_USERSPACE_ADDR);
				found = 1;
			}
		}
		if (!found)
			return 0;
	}
	return m->slot_hva + ((gfn - m->slot_base_gfn) << 12) + (gpa & 0xfff);
}

static __always_inline int read_guest_phys(struct guest_mem *m, u64 gpa, u64 *out)
{
	u64 hva = gpa_to_hva(m, gpa);
	return hva ? bpf_probe_read_user(out, sizeof(*out), (void *)hva) : -1;
}

/* Host virtual address of guest virtual `gva` under the walk's CR3 (4-level paging), or 0. */
static __always_inline u64 gva_to_hva(struct guest_mem *m, u64 gva)
{
	u64 table = m->cr3 & GUEST_PHYS_MASK, gpa = 0;
	int done = 0;
#pragma unroll
	for (int level = 3; level >= 0; level--) {
		if (done)
			break;
		u64 entry = 0;
		if (read_guest_phys(m, table + ((gva >> (12 + 9 * level)) & 511) * 8, &entry) || !(entry & PTE_PRESENT))
			return 0;
		if (level == 0) {
			gpa = (entry & GUEST_PHYS_MASK) | (gva & 0xfff);
			done = 1;
		} else if (level < 3 && (entry & PTE_LARGE)) {  /* a 1 GiB or 2 MiB page */
			u64 within = (1ULL << (12 + 9 * level)) - 1;
			gpa = (entry & GUEST_PHYS_MASK & ~within) | (gva & within);
			done = 1;
		} else {
			table = entry & GUEST_PHYS_MASK;
		}
	}
	return gpa_to_hva(m, gpa);
}

/* Walk the guest frame-pointer chain into st->guest[]: guest[0] = RIP, then each frame's
 * return address, from the frame at RBP up, until a frame's saved RBP is 0 (the outermost).
 *
 * The verifier cannot follow a page-table walk per frame for 64 frames (measured on 6.18: "the
 * sequence of 8193 jumps is too complex"), and bcc 0.26 cannot load bpf_loop callbacks.  So the
 * stack pages from RSP up (GUEST_STACK_PAGES, 32 KiB) are translated first, each once, and the
 * chain is followed inside that window: a frame outside it ends the walk as partial. */
/* The user registers where a guest entered its kernel, found by the walk (cfi mode, a guest-kernel sample). */
struct guest_user {
	u64 ip, sp, bp;
};

#ifdef STACK_COPY
/* A guest-kernel sample's kernel stack (cfi): KSTACK_COPY_BYTES from its RSP, read through the walk's window;
 * `ok` says the copy is whole.  The slack lets the verifier bound the second read's offset + length. */
struct kstack_scratch {
	u64 sp, bp;
	u8 data[KSTACK_COPY_BYTES];
	u8 slack[KSTACK_COPY_BYTES];
	u64 ok;
};
BPF_PERCPU_ARRAY(kstack_scratch, struct kstack_scratch, 1);

static __always_inline void copy_kernel_stack(u64 *pages, u64 rsp, u64 rbp)
{
	int zero = 0;
	struct kstack_scratch *k = kstack_scratch.lookup(&zero);
	if (!k)
		return;
	k->ok = 0;
	k->sp = rsp;
	k->bp = rbp;
	u64 off = rsp & 0xfff, first = 4096 - off;
	if (first > KSTACK_COPY_BYTES)
		first = KSTACK_COPY_BYTES;
	asm volatile("" : "+r"(first));  /* the verifier must see the clamp on `first` itself, not on `off` */
	if (!pages[0] || bpf_probe_read_user(k->data, first, (void *)(pages[0] + off)))
		return;
	if (first < KSTACK_COPY_BYTES &&
	    (!pages[1] || bpf_probe_read_user(k->data + first, KSTACK_COPY_BYTES - first, (void *)pages[1])))
		return;
	k->ok = 1;
}
#endif

static __always_inline void walk_guest_stack(void *vcpu, u64 rip, u64 cr3, struct vmprof_stack *st,
					     struct guest_user *user)
{
	struct guest_mem m = {.cr3 = cr3};
	void *kvm = (void *)read_u64(vcpu + VCPU_KVM);
	m.memslots = kvm ? (void *)read_u64(kvm + KVM_MEMSLOTS) : 0;
	st->flags |= STACK_GUEST_WALKED;
	st->guest[0] = rip;
	st->guest_depth = 1;
	u64 fp = read_u64(vcpu + VCPU_RBP);
	if (fp == 0)
		return;  /* no frame at all: a leaf-only chain, complete */
	st->flags |= STACK_GUEST_PARTIAL;  /* cleared when the chain ends where it should */
	if (!m.memslots)
		return;
	m.node_idx = read_u32(m.memslots + MEMSLOTS_NODE_IDX) & 1;
	u64 base = read_u64(vcpu + VCPU_RSP) & ~0xfffULL;
	u64 pages[GUEST_STACK_PAGES] = {};
	for (int k = 0; k < GUEST_STACK_PAGES; k++) {
		pages[k] = gva_to_hva(&m, base + ((u64)k << 12));
		if (!pages[k])
			break;
	}
#ifdef STACK_COPY
	if (user)
		copy_kernel_stack(pages, read_u64(vcpu + VCPU_RSP), fp);
#endif
	for (int i = 1; i < STACK_GUEST_MAX; i++) {
		u64 off = fp - base, ret = 0, next = 0;
		if ((fp & 7) || off > (GUEST_STACK_PAGES << 12) - 16)
			return;  /* misaligned, below RSP or outside the window */
		u64 at = pages[(off >> 12) & (GUEST_STACK_PAGES - 1)];
		u64 ret_at = pages[((off + 8) >> 12) & (GUEST_STACK_PAGES - 1)];
		if (!at || !ret_at || bpf_probe_read_user(&next, 8, (void *)(at + (off & 0xfff))) ||
		    bpf_probe_read_user(&ret, 8, (void *)(ret_at + ((off + 8) & 0xfff))) || ret == 0)
			return;
		st->guest[i & (STACK_GUEST_MAX - 1)] = ret;
		st->guest_depth = i + 1;
		if (user && ret < GUEST_USER_TOP && !user->ip) {
			/* the kernel's entry frame (the demo guest kernel's contract, kernel.h struct uregs): the caller's
			 * RBP at fp, the user RIP at fp + 8, the user RSP at fp + 16 */
			u64 sp_at = pages[((off + 16) >> 12) & (GUEST_STACK_PAGES - 1)];
			if (off <= (GUEST_STACK_PAGES << 12) - 24 && sp_at &&
			    !bpf_probe_read_user(&user->sp, 8, (void *)(sp_at + ((off + 16) & 0xfff)))) {
				user->ip = ret;
				user->bp = next;
			}
		}
		if (next == 0) {
			st->flags &= ~STACK_GUEST_PARTIAL;  /* the outermost frame: complete */
			return;
		}
		if (next <= fp)
			return;  /* a caller's frame lies below its callee's: this chain is torn */
		fp = next;
	}
}


#ifdef STACK_COPY
/* --call-graph cfi: the user stack is copied, not walked; resolve/unwind.py unwinds it afterwards by the
 * objects' call-frame information (frame pointers where an object has none). */
BPF_RINGBUF_OUTPUT(ustacks, USTACK_RING_PAGES);
BPF_PERCPU_ARRAY(ustacks_lost, u64, 1);
/* Built in a per-CPU scratch value and sent with one ringbuf_output: the page-sized reads land at a
 * variable offset, and the slack after the record lets the verifier bound offset + length. */
struct ustack_scratch {
	struct vmprof_ustack rec;
	u8 slack[4096];
};
BPF_PERCPU_ARRAY(ustack_scratch, struct ustack_scratch, 1);

/* Copy up to STACK_COPY_BYTES from `sp` up, page by page (a page of a guest through its page tables and
 * the memslots: m != 0), stopping at the first page that cannot be read; emit the record. */
static __always_inline int copy_user_stack(struct vmprof_sample *s, u64 ip, u64 sp, u64 bp, struct guest_mem *m,
					   int kernel)
{
	int zero = 0;
	struct ustack_scratch *u = ustack_scratch.lookup(&zero);
	if (!u)
		return -1;
	u->rec.time_ns = s->time_ns;
	u->rec.cpu = s->cpu;
	u->rec.flags = m ? USTACK_GUEST : 0;
	u->rec.pad = 0;
	u->rec.ip = ip;
	u->rec.sp = sp;
	u->rec.bp = bp;
	u32 done = 0;
	for (int k = 0; k < STACK_COPY_BYTES / 4096 + 1; k++) {  /* a bounded loop: the verifier follows it */
		if (done >= STACK_COPY_BYTES)
			break;
		u64 len = 4096 - ((sp + done) & 4095);
		u64 src = sp + done;
		if (m) {
			src = gva_to_hva(m, src);
			if (!src)
				break;
		}
		if (bpf_probe_read_user(u->rec.data + done, len, (void *)src))
			break;
		done += len;
	}
	u->rec.copied = done > STACK_COPY_BYTES ? STACK_COPY_BYTES : done;
#if STACK_COPY_BYTES >= 4 * KSTACK_TAIL
	struct kstack_scratch *k = kernel ? kstack_scratch.lookup(&zero) : 0;
	if (k && k->ok) {  /* the guest kernel's stack goes in the copy's last KSTACK_TAIL bytes */
		if (u->rec.copied > STACK_COPY_BYTES - KSTACK_TAIL)
			u->rec.copied = STACK_COPY_BYTES - KSTACK_TAIL;
		bpf_probe_read_kernel(u->rec.data + STACK_COPY_BYTES - KSTACK_TAIL, KSTACK_TAIL, k);
		u->rec.flags |= USTACK_GUEST_KERNEL;
	}
#endif
	if (ustacks.ringbuf_output(&u->rec, sizeof(u->rec), BPF_RB_NO_WAKEUP)) {
		ustacks_lost.increment(zero);
		return -1;
	}
	return 0;
}

static __always_inline int copy_guest_stack(void *vcpu, u64 rip, u64 sp, u64 bp, u64 cr3, struct vmprof_sample *s,
					    int kernel)
{
	struct guest_mem m = {.cr3 = cr3};
	void *kvm = (void *)read_u64(vcpu + VCPU_KVM);
	m.memslots = kvm ? (void *)read_u64(kvm + KVM_MEMSLOTS) : 0;
	if (!m.memslots)
		return -1;
	m.node_idx = read_u32(m.memslots + MEMSLOTS_NODE_IDX) & 1;
	return copy_user_stack(s, rip, sp, bp, &m, kernel);
}
#endif

/* Emit the stacks of the sample `s`; returns the sample's stack_id (0: a record follows, -1: none). */
static __always_inline s32 record_stacks(struct bpf_perf_event_data *ctx, struct vmprof_sample *s, void *vcpu)
{
	struct vmprof_stack *st = stacks.ringbuf_reserve(sizeof(struct vmprof_stack));
	if (!st) {
		int zero = 0;
		stacks_lost.increment(zero);
		return -1;
	}
	st->time_ns = s->time_ns;
	st->cpu = s->cpu;
	st->flags = 0;
	st->guest_depth = 0;
	st->pad = 0;
	__builtin_memset(st->guest, 0, sizeof(st->guest));
	st->kernel_stack_id = (s->flags & SAMPLE_HOST_KERNEL) ? host_stacks.get_stackid(ctx, 0) : -1;
	if (st->kernel_stack_id < 0)
		st->kernel_stack_id = -1;
	st->user_stack_id = -1;
	int guest = (s->flags & (SAMPLE_GUEST | SAMPLE_GUEST_UNKNOWN)) == SAMPLE_GUEST && vcpu;
#ifdef STACK_COPY
	/* a kernel RIP at CPL 3 too: this host's kvm_pvm reports the SYSCALL entry's first instructions so */
	if (guest && ((s->flags & SAMPLE_GUEST_KERNEL) || s->guest_ip >= GUEST_USER_TOP)) {
		/* a guest kernel: its own frames by frame pointers, as fp; below its entry frame, the user stack it
		 * was entered from is copied (resolve/stacks.py joins the two) */
		struct guest_user user = {};
		walk_guest_stack(vcpu, s->guest_ip, s->guest_cr3, st, &user);
		int entry_frame = user.ip != 0;  /* the walk met the entry frame: its kernel stack was copied */
		u64 rsp = read_u64(vcpu + VCPU_RSP), rcx = read_u64(vcpu + VCPU_RCX);
		if (!user.ip && rsp && rsp < GUEST_USER_TOP && rcx && rcx < GUEST_USER_TOP) {
			/* still on the user stack: the kernel's SYSCALL entry before it switches stacks, or its SYSRET;
			 * x86-64's SYSCALL left the user RIP in RCX.  The walk (from the user's RBP) meant nothing. */
			user.ip = rcx;
			user.sp = rsp;
			user.bp = read_u64(vcpu + VCPU_RBP);
			st->guest_depth = 1;
			st->flags &= ~STACK_GUEST_PARTIAL;
		}
		if (user.ip && user.sp && copy_guest_stack(vcpu, user.ip, user.sp, user.bp, s->guest_cr3, s, entry_frame) == 0)
			st->flags |= STACK_USER_COPY;
	} else if (guest) {
		if (copy_guest_stack(vcpu, s->guest_ip, read_u64(vcpu + VCPU_RSP), read_u64(vcpu + VCPU_RBP),
				     s->guest_cr3, s, 0) == 0) {
			st->flags |= STACK_USER_COPY;
		} else {  /* its copy could not be sent: the leaf, partial (and never a host chain) */
			st->flags |= STACK_GUEST_WALKED | STACK_GUEST_PARTIAL;
			st->guest[0] = s->guest_ip;
			st->guest_depth = 1;
		}
	} else if (s->pid && !(s->flags & SAMPLE_HOST_KERNEL)) {
		/* a host sample in user mode: the interrupted registers are the user's */
		if (copy_user_stack(s, s->host_ip, ctx->regs.sp, ctx->regs.bp, 0, 0) == 0)
			st->flags |= STACK_USER_COPY;
	} else if (s->pid) {
		/* in the kernel on a task's behalf: its user registers are where it entered the kernel (a kernel
		 * thread has none: not user mode there) */
		struct pt_regs user = {};
		bpf_probe_read_kernel(&user, sizeof(user), (void *)bpf_task_pt_regs(bpf_get_current_task_btf()));
		if ((user.cs & 3) == 3 && user.ip && copy_user_stack(s, user.ip, user.sp, user.bp, 0, 0) == 0)
			st->flags |= STACK_USER_COPY;
	}
#else
	if (guest)
		walk_guest_stack(vcpu, s->guest_ip, s->guest_cr3, st, 0);
#endif
	if (s->pid && !(st->flags & STACK_USER_COPY))
		st->user_stack_id = host_stacks.get_stackid(ctx, BPF_F_USER_STACK);
	if (!guest && st->user_stack_id < 0 && s->pid && !(st->flags & STACK_USER_COPY)) {
		/* The map keeps one chain per hash bucket and never replaces it: a hot chain whose bucket
		 * another chain took would lose every sample's callers.  A host sample has guest[] free. */
		long n = bpf_get_stack(ctx, st->guest, sizeof(st->guest), BPF_F_USER_STACK);
		if (n > 0) {
			st->guest_depth = n / sizeof(st->guest[0]);
			st->flags |= STACK_HOST_USER_INLINE;
		}
	}
	if (st->user_stack_id < 0)
		st->user_stack_id = -1;
	stacks.ringbuf_submit(st, BPF_RB_NO_WAKEUP);
	return 0;
}

#endif

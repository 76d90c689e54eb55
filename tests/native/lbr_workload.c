/* Ground-truth workload for the LBR block analysis (tests/test_lbr_groundtruth.py).
 *
 * Freestanding and static (no libc), so that every instruction the process
 * executes is one of these, at a fixed address: the test single-steps it with
 * ptrace and knows its complete branch sequence.  The functions are chosen to
 * exercise the cases the analysis must handle:
 *   leaf        straight-line code, no branch: blocks that are exact under any filter
 *   pair        calls leaf twice with straight-line code between the calls
 *   loopy       an inner loop: under a call/return filter its blocks hide jumps
 *   via_table   an indirect call through a function-pointer table
 *   fib         recursion (deep call/return chains, LBR wrap-around)
 *   tail        a tail call (jmp to another function): crosses a function end
 *               under a call/return filter
 * Build: gcc -O2 -nostdlib -static -no-pie ... (see the test).
 */

typedef unsigned long u64;

volatile u64 sink;

#define NOINLINE __attribute__((noinline))

NOINLINE u64 leaf(u64 x)
{
	u64 y = x * 2654435761u;
	y ^= y >> 13;
	y += x << 3;
	return y ^ 0x5bd1e995u;
}

NOINLINE u64 leaf2(u64 x)
{
	return (x + 7) * 31 + (x >> 2);
}

NOINLINE u64 pair(u64 x)
{
	u64 a = leaf(x);
	u64 b = a * 3 + (x ^ 0x1234);
	return leaf(b) + a;
}

NOINLINE u64 loopy(u64 n)
{
	u64 acc = 1;
	for (u64 i = 0; i < n; i++) {
		acc = acc * 6364136223846793005ul + i;
		if (acc & 8)
			acc ^= acc >> 7;
	}
	return acc;
}

NOINLINE u64 fib(u64 n)
{
	if (n < 2)
		return n;
	return fib(n - 1) + fib(n - 2);
}

NOINLINE u64 tail(u64 x)
{
	sink = x;
	return leaf2(x + 1); /* compiled as a jmp at -O2 */
}

typedef u64 (*fn_t)(u64);
fn_t table[3] = { leaf, leaf2, pair };

NOINLINE u64 via_table(u64 i)
{
	return table[i % 3](i) ^ i; /* an indirect call (not a tail call: the xor follows) */
}

NOINLINE int main(void)
{
	u64 total = 0;
	for (u64 i = 0; i < ROUNDS; i++) {
		total += pair(i);
		total += loopy(i % 5);
		total += via_table(i);
		total += tail(i);
		if ((i & 7) == 0)
			total += fib(6);
	}
	sink = total;
	return 0;
}

#include "host_start.h"

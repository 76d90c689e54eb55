/* The host program of `vmprof demo --scenario lbr`: single-stepped by `vmprof record
 * --lbr=simulate` (every instruction traced), so it is small and freestanding (no libc:
 * every instruction it runs is its own).  Its functions give the block view something to show:
 *   hash_step   calls mix twice with straight-line code between the calls: exact blocks
 *               of different lengths (the hot function the demo opens)
 *   mix         a straight-line leaf
 *   scan        a loop: under the call/return filter its blocks are marked "has branches"
 *   dispatch    an indirect call through a table
 */

typedef unsigned long u64;

volatile u64 sink;

#define NOINLINE __attribute__((noinline))

NOINLINE u64 mix(u64 x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdul;
	x ^= x >> 33;
	return x;
}

NOINLINE u64 fold(u64 x)
{
	return (x + 11) * 29 + (x >> 3);
}

NOINLINE u64 hash_step(u64 h, u64 v)
{
	u64 a = mix(h ^ v);
	u64 b = a * 31 + (v << 7) - (h >> 5);
	b ^= b >> 17;
	b += 0x9e3779b97f4a7c15ul;
	return mix(b) ^ a;
}

NOINLINE u64 scan(u64 n)
{
	u64 acc = n;
	for (u64 i = 0; i < n; i++)
		acc = acc * 6364136223846793005ul + i;
	return acc;
}

typedef u64 (*fn_t)(u64);
fn_t table[2] = { mix, fold };

NOINLINE u64 dispatch(u64 i)
{
	return table[i & 1](i) + 1; /* an indirect call */
}

NOINLINE int main(void)
{
	u64 h = 1;
	for (u64 i = 0; i < ROUNDS; i++) {
		h = hash_step(h, i);
		h += scan(i % 7);
		h += dispatch(i);
	}
	sink = h;
	return 0;
}

#include "host_start.h"

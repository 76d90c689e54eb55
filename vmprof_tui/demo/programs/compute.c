/* compute: a CPU-bound program whose time split is known by construction.
 *
 * compute_a and compute_b run the same loop body; per round compute_a runs
 * 4 x ROUND_ITERS iterations and compute_b 1 x ROUND_ITERS, so compute_a takes
 * 80% and compute_b 20% of the time spent in the two (the small helpers
 * mix_result and report_progress take well under 1%).
 * Parameters: a = iterations per round unit on average (0: default), b = rounds (0: forever).
 * Progress is reported every REPORT_EVERY rounds (each report is an exit to the VMM).
 */
#include "guest_rt.h"

#define REPORT_EVERY 16

static unsigned long sink;

__attribute__((noinline)) unsigned long compute_a(unsigned long x, unsigned long n)
{
	for (int k = 0; k < 4; k++) {
		for (unsigned long i = 0; i < n; i++) {
			x = x * 6364136223846793005UL + 1442695040888963407UL;
			__asm__ volatile("" : "+r"(x));
		}
	}
	return x;
}

__attribute__((noinline)) unsigned long compute_b(unsigned long x, unsigned long n)
{
	for (unsigned long i = 0; i < n; i++) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		__asm__ volatile("" : "+r"(x));
	}
	return x;
}

__attribute__((noinline)) void mix_result(unsigned long x)
{
	sink ^= x;
}

__attribute__((noinline)) void report_progress(unsigned long units)
{
	port_out(PORT_PROGRESS, (unsigned int)units);
}

int main(unsigned long iters, unsigned long rounds, unsigned long c, unsigned long d)
{
	(void)c; (void)d;
	if (iters == 0)
		iters = 200000;
	unsigned long x = 12345, jitter = 88172645463325252UL;
	for (unsigned long r = 0; rounds == 0 || r < rounds; r++) {
		/* a round of 0.5-1.5 x iters units (iters on average): rounds of one length would beat with a
		 * periodic sampler (a phase of the round seen again and again) and bias the 80/20 split */
		jitter ^= jitter << 13;
		jitter ^= jitter >> 7;
		jitter ^= jitter << 17;
		unsigned long n = iters / 2 + jitter % (iters + 1);
		x = compute_a(x, n);
		x = compute_b(x, n);
		mix_result(x);
		if ((r + 1) % REPORT_EVERY == 0)
			report_progress(REPORT_EVERY);
	}
	if (rounds % REPORT_EVERY)
		report_progress(rounds % REPORT_EVERY);
	return 0;
}

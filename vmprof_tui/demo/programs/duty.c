/* duty: busy for BUSY ms, then sleep IDLE ms, repeated (the papers' VM that
 * is busy 1/3 and idle 2/3 of the time).
 * Parameters: a = busy ms, b = idle ms, c = TSC ticks per ms (from the VMM),
 * d = periods (0: forever).
 */
#include "guest_rt.h"

static unsigned long sink;

__attribute__((noinline)) void busy_work(unsigned long ticks)
{
	unsigned long end = rdtsc() + ticks, x = sink, units = 0;
	while (rdtsc() < end) {
		for (int i = 0; i < 1000; i++) {
			x = x * 6364136223846793005UL + 1442695040888963407UL;
			__asm__ volatile("" : "+r"(x));
		}
		units++;
	}
	sink = x;
	port_out(PORT_PROGRESS, (unsigned int)units);
}

int main(unsigned long busy_ms, unsigned long idle_ms, unsigned long tsc_per_ms, unsigned long periods)
{
	for (unsigned long p = 0; periods == 0 || p < periods; p++) {
		busy_work(busy_ms * tsc_per_ms);
		if (idle_ms)
			guest_sleep_ms((unsigned int)idle_ms);
	}
	return 0;
}

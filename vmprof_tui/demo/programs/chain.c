/* chain: time splits over three known call chains (frame pointers on).
 *
 * Per round: _start → main → solve → sweep → kernel_a runs 6 units,
 * _start → main → solve → copy 3 units, _start → main → report 1 unit, the
 * same loop body everywhere: 60% / 30% / 10% of the time (the call overhead
 * in main, solve and sweep is far below 0.1%).
 * Parameters: a = units per tenth of a round (0: 50), b = rounds (0: forever).
 */
#include "stack_rt.h"

static unsigned long sink;

NOINLINE unsigned long kernel_a(unsigned long x, unsigned long units)
{
	WORK(x, units);
	return x;
}

NOINLINE unsigned long sweep(unsigned long x, unsigned long units)
{
	return kernel_a(x, units) + 1;
}

NOINLINE unsigned long copy(unsigned long x, unsigned long units)
{
	WORK(x, units);
	return x;
}

NOINLINE unsigned long solve(unsigned long x, unsigned long units)
{
	x = sweep(x, 6 * units);
	return copy(x, 3 * units) + 1;
}

NOINLINE unsigned long report(unsigned long x, unsigned long units)
{
	WORK(x, units);
	port_out(PORT_PROGRESS, 1);
	return x;
}

int main(unsigned long units, unsigned long rounds, unsigned long c, unsigned long d)
{
	(void)c; (void)d;
	if (units == 0)
		units = 50;
	unsigned long x = 12345;
	for (unsigned long r = 0; rounds == 0 || r < rounds; r++) {
		x = solve(x, units);
		x = report(x, units);
	}
	sink = x;
	return 0;
}

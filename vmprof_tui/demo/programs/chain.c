/* chain: time splits over three known call chains (frame pointers on).
 *
 * Per round: _start → main → solve → sweep → kernel_a runs 6 units,
 * _start → main → solve → copy 3 units, _start → main → report 1 unit, the
 * same loop body everywhere: 60% / 30% / 10% of the time (the call overhead
 * in main, solve and sweep is far below 0.1%).
 * Parameters: a = units per tenth of a round (0: 50), b = rounds (0: forever).
 */
#include "stack_rt.h"

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
	return x;
}

INLINE unsigned long chain_round(unsigned long x, unsigned long units)
{
	return report(solve(x, units), units);
}

STACK_PROGRAM_MAIN(chain_round)

/* recurse: a recursive function with a known depth distribution (frame pointers on).
 *
 * Per round, descend(d) for d = 1..4 recurses d deep (d frames of descend) and
 * the innermost one runs d units: depth d takes d/10 of the time
 * (10% / 20% / 30% / 40%).
 * Parameters: a = units (0: 50), b = rounds (0: forever).
 */
#include "stack_rt.h"

NOINLINE unsigned long descend(unsigned long x, unsigned long depth, unsigned long units)
{
	if (depth > 1)
		return descend(x, depth - 1, units) + 1;
	WORK(x, units);
	return x;
}

INLINE unsigned long recurse_round(unsigned long x, unsigned long units)
{
	for (unsigned long depth = 1; depth <= 4; depth++)
		x = descend(x, depth, depth * units);
	return x;
}

STACK_PROGRAM_MAIN(recurse_round)

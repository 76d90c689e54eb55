/* Runs a demo guest program's main() as a normal host process and prints its
 * rate, so tests can compare native speed with speed inside a demo VM. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int guest_main(unsigned long a, unsigned long b, unsigned long c, unsigned long d);

int main(int argc, char **argv)
{
	unsigned long rounds = argc > 1 ? strtoul(argv[1], NULL, 0) : 500;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	guest_main(0, rounds, 0, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("%f\n", (double)rounds / s);
	return 0;
}

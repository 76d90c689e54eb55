/* shor: Shor's factoring with libquantum (libquantum-dev's libquantum.a), the papers' workload
 * (SPEC 462.libquantum runs the same library), repeated for the given seconds.
 * Arguments: [N to factor, default 143] [seconds, default 0: until stopped; -N: N attempts]. */
#include <quantum.h>
#include <stdio.h>
#include <stdlib.h>
#include "common.h"

/* Debian builds libquantum with OpenMP; these three calls are all it uses of it.  A serial runtime of our
 * own runs each parallel region in the calling thread, as libgomp does with one thread, so the program stays
 * single-threaded (the guest kernel runs no threads) and natively it runs the same code. */
int omp_get_num_threads(void)
{
	return 1;
}

int omp_get_thread_num(void)
{
	return 0;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
{
	(void)num_threads;
	(void)flags;
	fn(data);
}

/* One attempt: a period of x mod n from the quantum register, then factors from it; 0 if it failed. */
static int attempt(int n, int x)
{
	int width = quantum_getwidth(n * n), swidth = quantum_getwidth(n);
	quantum_reg reg = quantum_new_qureg(0, width);
	for (int i = 0; i < width; i++)
		quantum_hadamard(i, &reg);
	quantum_addscratch(3 * swidth + 2, &reg);
	quantum_exp_mod_n(n, x, width, swidth, &reg);
	for (int i = 0; i < 3 * swidth + 2; i++)
		quantum_bmeasure(0, &reg);
	quantum_qft(width, &reg);
	for (int i = 0; i < width / 2; i++) {
		quantum_cnot(i, width - i - 1, &reg);
		quantum_cnot(width - i - 1, i, &reg);
		quantum_cnot(i, width - i - 1, &reg);
	}
	long long c = (long long)quantum_measure(reg);
	quantum_delete_qureg(&reg);
	if (c <= 0)
		return 0;
	int q = 1 << width, a = (int)c;
	quantum_frac_approx(&a, &q, width);
	if (q % 2 == 1 && 2 * q < (1 << width))
		q *= 2;
	if (q % 2 == 1)
		return 0;
	long long p = 1;
	for (int i = 0; i < q / 2; i++)  /* x^(q/2) mod n */
		p = p * x % n;
	int f = quantum_gcd(n, (int)((p + 1) % n));
	if (f <= 1 || f >= n)
		f = quantum_gcd(n, (int)((p + n - 1) % n));
	return f > 1 && f < n ? f : 0;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 143;
	double seconds = argc > 2 ? atof(argv[2]) : 0;
	if (n < 15) {
		fprintf(stderr, "shor: N must be at least 15\n");
		return 2;
	}
	srand(1);
	int attempts = 0, found = 0;
	double end = now() + seconds;
	while (more(seconds, end, attempts)) {
		int x;
		do
			x = rand() % n;
		while (x < 2 || quantum_gcd(n, x) != 1);
		int f = attempt(n, x);
		attempts++;
		if (f) {
			found++;
			if (found == 1)
				printf("shor: %d = %d * %d\n", n, f, n / f);
		}
	}
	printf("shor: %d attempts, %d factorisations\n", attempts, found);
	return 0;
}

/* jacobi: a Himeno-like Jacobi stencil on a small 3-D grid, the papers'
 * memory-bound benchmark.  Parameters: a = iterations per progress report
 * (0: default), b = reports (0: forever).
 */
#include "guest_rt.h"

#define NX 33
#define NY 33
#define NZ 65

static float p[NX][NY][NZ], wrk[NX][NY][NZ];

__attribute__((noinline)) void init_grid(void)
{
	for (int i = 0; i < NX; i++)
		for (int j = 0; j < NY; j++)
			for (int k = 0; k < NZ; k++)
				p[i][j][k] = (float)(i * i) / (float)((NX - 1) * (NX - 1));
}

__attribute__((noinline)) float jacobi_sweep(void)
{
	float gosa = 0.0f;
	for (int i = 1; i < NX - 1; i++)
		for (int j = 1; j < NY - 1; j++)
			for (int k = 1; k < NZ - 1; k++) {
				float s0 = (p[i + 1][j][k] + p[i - 1][j][k] + p[i][j + 1][k] +
					    p[i][j - 1][k] + p[i][j][k + 1] + p[i][j][k - 1]) * (1.0f / 6.0f);
				float ss = s0 - p[i][j][k];
				gosa += ss * ss;
				wrk[i][j][k] = p[i][j][k] + 0.8f * ss;
			}
	return gosa;
}

__attribute__((noinline)) void copy_back(void)
{
	for (int i = 1; i < NX - 1; i++)
		for (int j = 1; j < NY - 1; j++)
			for (int k = 1; k < NZ - 1; k++)
				p[i][j][k] = wrk[i][j][k];
}

int main(unsigned long iters, unsigned long reports, unsigned long c, unsigned long d)
{
	(void)c; (void)d;
	if (iters == 0)
		iters = 100;
	init_grid();
	for (unsigned long r = 0; reports == 0 || r < reports; r++) {
		for (unsigned long n = 0; n < iters; n++) {
			jacobi_sweep();
			copy_back();
		}
		port_out(PORT_PROGRESS, (unsigned int)iters);
	}
	return 0;
}

/* xz: LZMA2 compression with liblzma (liblzma-dev's liblzma.a) of generated text and its decompression,
 * in memory, repeated for the given seconds.  Arguments: [seconds, default 0: until stopped; -N: N rounds] [MiB of text, default 2]. */
#include <lzma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 0;
	size_t size = (size_t)(argc > 2 ? atoi(argv[2]) : 2) << 20, cap = size + size / 2 + 4096;
	unsigned char *text = malloc(size), *packed = malloc(cap), *back = malloc(size);
	if (!text || !packed || !back)
		return 1;
	make_text(text, size);
	int rounds = 0;
	double end = now() + seconds;
	do {
		size_t n = 0, in = 0, m = 0;
		uint64_t limit = UINT64_MAX;
		if (lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, NULL, text, size, packed, &n, cap) != LZMA_OK ||
		    lzma_stream_buffer_decode(&limit, 0, NULL, packed, &in, n, back, &m, size) != LZMA_OK ||
		    m != size || memcmp(text, back, size) != 0) {
			fprintf(stderr, "xz: the round trip failed\n");
			return 1;
		}
		rounds++;
	} while (more(seconds, end, rounds));
	printf("xz: %d rounds of %zu bytes\n", rounds, size);
	return 0;
}

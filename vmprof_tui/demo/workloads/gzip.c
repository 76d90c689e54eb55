/* gzip: deflate with zlib (zlib1g-dev's libz.a) of generated text, written to out.gz in the program's
 * directory with gzwrite and read back with gzread, repeated for the given seconds.
 * Arguments: [seconds, default 0: until stopped; -N: N rounds] [MiB of text, default 4]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "common.h"

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 0;
	size_t size = (size_t)(argc > 2 ? atoi(argv[2]) : 4) << 20;
	unsigned char *text = malloc(size), *back = malloc(size);
	if (!text || !back)
		return 1;
	make_text(text, size);
	int rounds = 0;
	double end = now() + seconds;
	do {
		gzFile out = gzopen("out.gz", "wb6");
		if (!out) {
			perror("gzip: out.gz");
			return 1;
		}
		for (size_t off = 0; off < size; off += 65536)
			gzwrite(out, text + off, (unsigned)(size - off < 65536 ? size - off : 65536));
		gzclose(out);
		gzFile in = gzopen("out.gz", "rb");
		if (!in || gzread(in, back, (unsigned)size) != (int)size || memcmp(text, back, size) != 0) {
			fprintf(stderr, "gzip: the round trip failed\n");
			return 1;
		}
		gzclose(in);
		rounds++;
	} while (more(seconds, end, rounds));
	printf("gzip: %d rounds of %zu bytes\n", rounds, size);
	return 0;
}

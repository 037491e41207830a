// SPDX-License-Identifier: MIT
/*
 * An application outside the tree: built against an installed libhyb with
 * `cc app.c $(pkg-config --cflags --libs hyb)` (tests/unit/test_api.c).
 * It reads a GGUF through the public API only and prints what it found.
 */
#include <errno.h>
#include <stdio.h>

#include <hyb/hyb.h>

int main(int argc, char **argv)
{
	struct hyb_gguf_file *f;
	char err[256];

	if (argc != 2) {
		fprintf(stderr, "usage: app MODEL.gguf\n");
		return 2;
	}
	if (hyb_gguf_open(argv[1], &f, err, sizeof(err))) {
		fprintf(stderr, "app: %s\n", err);
		return 1;
	}
	printf("tensors %llu kernels %s\n", (unsigned long long)f->n_tensors, hyb_roofline_isa());
	hyb_gguf_close(f);
	return 0;
}

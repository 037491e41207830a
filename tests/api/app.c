// SPDX-License-Identifier: MIT
/*
 * An application outside the tree: built against an installed libhyb with
 * `cc app.c $(pkg-config --cflags --libs hyb)` (tests/unit/test_api.c).
 * It reads a GGUF through the public API only and prints what it found.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <hyb/hyb.h>

int main(int argc, char **argv)
{
	struct hyb_gguf_file *f;
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: app MODEL.gguf\n");
		return 2;
	}
	rc = hyb_gguf_open(argv[1], &f);
	if (rc) {
		/* the convention (hyb/error.h): a negative errno and a message naming the file */
		fprintf(stderr, "app: %s\n", hyb_last_error());
		return rc < 0 && rc != -1 && strstr(hyb_last_error(), argv[1]) ? 1 : 3;
	}
	printf("tensors %llu kernels %s\n", (unsigned long long)f->n_tensors, hyb_roofline_isa());
	hyb_gguf_close(f);
	return 0;
}

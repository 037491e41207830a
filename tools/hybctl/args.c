// SPDX-License-Identifier: MIT
/* Option values for hybctl's subcommands: checked, or exit 2 with one line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "hybctl.h"

uint32_t ctl_u32(const char *cmd, const char *opt, const char *s, uint32_t lo, uint32_t hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "hybctl %s: bad value '%s' for %s (%u..%u)\n", cmd, s, opt, lo, hi);
		exit(2);
	}
	return (uint32_t)v;
}

// SPDX-License-Identifier: MIT
/* The monotonic clock every timing in hyb reads (hyb/clock.h). */
#include <time.h>

#include "hyb/clock.h"

double hyb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

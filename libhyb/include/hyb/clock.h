/* SPDX-License-Identifier: MIT */
/* Wall time for measurements: CLOCK_MONOTONIC in seconds. */
#ifndef HYB_CLOCK_H
#define HYB_CLOCK_H

double hyb_now(void);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * DRAM read bandwidth as the forward pass sees it: n_threads threads each
 * stream their share of a buffer much larger than the last-level cache.
 * This is the denominator of every decode roofline hyb prints.
 */
#ifndef HYB_MEMBW_H
#define HYB_MEMBW_H

#include <stddef.h>

/* Median of reps passes over bytes, in bytes/second; < 0 on allocation failure. */
double hyb_measure_read_bw(int n_threads, size_t bytes, int reps);

#endif

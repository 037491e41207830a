/* SPDX-License-Identifier: MIT */
/*
 * The CPU side of the rooflines hyb prints, measured in the same run: which
 * kernels this process computes with, their instruction peak, and the GEMM
 * ceiling of one weight matrix. DRAM bandwidth is hyb/membw.h.
 */
#ifndef HYB_ROOFLINE_H
#define HYB_ROOFLINE_H

#include <stdint.h>

struct hyb_weight;

/* The instruction set of the CPU kernels picked at start ("avx2", ...; HYB_ISA may force one). */
const char *hyb_roofline_isa(void);
/* One thread's multiply-add peak of the dot kernel for weights of this type, MAC/s. */
double hyb_roofline_peak_macs(uint32_t weight_type);
/*
 * The GEMM ceiling: w times n_cols activations, w's rows split over nth
 * threads in 16-row tiles as the forward pass does, nothing else running;
 * median of reps, MAC/s. < 0 when out of memory.
 */
double hyb_roofline_gemm_macs(const struct hyb_weight *w, int nth, int n_cols, int reps);

#endif

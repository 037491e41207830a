// SPDX-License-Identifier: MIT
/*
 * Kernel tables per ISA level and the choice among them. A level is offered
 * only when cpuid reports its instructions and xgetbv says the OS saves the
 * registers they use (YMM for AVX2, opmask + ZMM for AVX-512).
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

static const char *const isa_names[HYB_ISA_COUNT] = {
	[HYB_ISA_SCALAR] = "scalar",
	[HYB_ISA_AVX2] = "avx2",
	[HYB_ISA_AVX512] = "avx512",
	[HYB_ISA_AVX512_VNNI] = "avx512vnni",
	[HYB_ISA_AMX] = "amx",
};

static struct hyb_cpu_kernels tables[HYB_ISA_COUNT];
static int supported[HYB_ISA_COUNT];
static int has_gfni; /* with AVX-512: vgf2p8affineqb on zmm */
static const struct hyb_cpu_kernels *best;
static pthread_once_t once = PTHREAD_ONCE_INIT;

const char *hyb_isa_name(enum hyb_isa isa)
{
	return (unsigned)isa < HYB_ISA_COUNT ? isa_names[isa] : "unknown";
}

uint32_t hyb_vec_dot_type(uint32_t weight_type)
{
	switch (weight_type) {
	case HYB_TYPE_Q4_0:
	case HYB_TYPE_Q5_0:
	case HYB_TYPE_Q8_0:
	case HYB_TYPE_IQ4_NL:
	case HYB_TYPE_MXFP4:
		return HYB_TYPE_Q8_0;
	case HYB_TYPE_Q4_1:
	case HYB_TYPE_Q5_1:
		return HYB_TYPE_Q8_1;
	case HYB_TYPE_Q2_K:
	case HYB_TYPE_Q3_K:
	case HYB_TYPE_Q4_K:
	case HYB_TYPE_Q5_K:
	case HYB_TYPE_Q6_K:
	case HYB_TYPE_IQ4_XS:
		return HYB_TYPE_Q8_K;
	default:
		return weight_type; /* F32, F16, BF16 multiply in their own format */
	}
}

static uint64_t xgetbv0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

static void detect(void)
{
	unsigned a, b, c, d, b7 = 0, c7 = 0;
	uint64_t xcr0 = 0;

	supported[HYB_ISA_SCALAR] = 1;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return;
	const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
	const int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, popcnt = (c >> 23) & 1;

	if (!osxsave || !avx)
		return;
	xcr0 = xgetbv0();
	if (__get_cpuid_max(0, NULL) >= 7)
		__get_cpuid_count(7, 0, &a, &b7, &c7, &d);
	const int os_ymm = (xcr0 & 0x6) == 0x6;
	const int os_zmm = (xcr0 & 0xe6) == 0xe6;
	const int avx2 = (b7 >> 5) & 1;
	const int avx512 = ((b7 >> 16) & 1) && ((b7 >> 17) & 1) && ((b7 >> 30) & 1) &&
			   ((b7 >> 31) & 1); /* F, DQ, BW, VL */
	const int vnni = (c7 >> 11) & 1;

	supported[HYB_ISA_AVX2] = os_ymm && avx2 && fma && f16c && popcnt;
	supported[HYB_ISA_AVX512] = supported[HYB_ISA_AVX2] && os_zmm && avx512;
	supported[HYB_ISA_AVX512_VNNI] = supported[HYB_ISA_AVX512] && vnni;
	supported[HYB_ISA_AMX] = supported[HYB_ISA_AVX512_VNNI] && hyb_cpu_amx_usable();
	has_gfni = supported[HYB_ISA_AVX512] && ((c7 >> 8) & 1);
}


static void fill_scalar(struct hyb_cpu_kernels *k)
{
	memset(k, 0, sizeof(*k));
	k->isa = HYB_ISA_SCALAR;
	hyb_set_gemm(k, HYB_TYPE_F32, hyb_gemm_f32_scalar);
	hyb_set_gemm(k, HYB_TYPE_F16, hyb_gemm_f16_scalar);
	hyb_set_gemm(k, HYB_TYPE_BF16, hyb_gemm_bf16_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q4_0, hyb_gemm_q4_0_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q8_0, hyb_gemm_q8_0_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q4_1, hyb_gemm_q4_1_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q5_0, hyb_gemm_q5_0_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q5_1, hyb_gemm_q5_1_scalar);
	hyb_set_gemm(k, HYB_TYPE_IQ4_NL, hyb_gemm_iq4_nl_scalar);
	hyb_set_gemm(k, HYB_TYPE_MXFP4, hyb_gemm_mxfp4_vecdot_scalar);
	k->gemm[HYB_TYPE_MXFP4] = hyb_gemm_mxfp4_chain_scalar; /* rows % 8 == 0: repacked */
	hyb_set_gemm(k, HYB_TYPE_Q4_K, hyb_gemm_q4_k_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q6_K, hyb_gemm_q6_k_scalar);
	k->quantize_act[HYB_TYPE_F32] = hyb_quantize_f32_scalar;
	k->quantize_act[HYB_TYPE_F16] = hyb_quantize_f16_scalar;
	k->quantize_act[HYB_TYPE_BF16] = hyb_quantize_bf16_scalar;
	k->quantize_act[HYB_TYPE_Q8_0] = hyb_quantize_q8_0_scalar;
	k->quantize_act[HYB_TYPE_Q8_1] = hyb_quantize_q8_1_scalar;
	k->quantize_act[HYB_TYPE_Q8_K] = hyb_quantize_q8_k_scalar;
	k->dequantize[HYB_TYPE_F32] = hyb_dequantize_f32;
	k->dequantize[HYB_TYPE_F16] = hyb_dequantize_f16;
	k->dequantize[HYB_TYPE_BF16] = hyb_dequantize_bf16;
	k->dequantize[HYB_TYPE_Q4_0] = hyb_dequantize_q4_0;
	k->dequantize[HYB_TYPE_Q8_0] = hyb_dequantize_q8_0;
	k->dequantize[HYB_TYPE_Q4_1] = hyb_dequantize_q4_1;
	k->dequantize[HYB_TYPE_Q5_0] = hyb_dequantize_q5_0;
	k->dequantize[HYB_TYPE_Q5_1] = hyb_dequantize_q5_1;
	k->dequantize[HYB_TYPE_IQ4_NL] = hyb_dequantize_iq4_nl;
	k->dequantize[HYB_TYPE_MXFP4] = hyb_dequantize_mxfp4;
	k->dequantize[HYB_TYPE_Q8_1] = hyb_dequantize_q8_1;
	k->dequantize[HYB_TYPE_Q4_K] = hyb_dequantize_q4_k;
	k->dequantize[HYB_TYPE_Q6_K] = hyb_dequantize_q6_k;
	k->dequantize[HYB_TYPE_Q8_K] = hyb_dequantize_q8_k;
	hyb_fill_k_extra_scalar(k);
	hyb_fill_vec_ref(k);
	hyb_fill_pred_ref(k);
	hyb_fill_popcount_ref(k);
	hyb_fill_select_ref(k);
}

static int isa_from_name(const char *s)
{
	for (int i = 0; i < HYB_ISA_COUNT; i++)
		if (!strcmp(s, isa_names[i]))
			return i;
	return -1;
}

static void init(void)
{
	detect();
	fill_scalar(&tables[HYB_ISA_SCALAR]);
	/* each level starts as a copy of the one below: unspecialised entries fall back */
	for (int i = 1; i < HYB_ISA_COUNT; i++) {
		tables[i] = tables[i - 1];
		tables[i].isa = (enum hyb_isa)i;
		if (!supported[i])
			continue;
		if (i == HYB_ISA_AVX2) {
			hyb_cpu_fill_avx2(&tables[i]);
			hyb_fill_mxfp4_avx2(&tables[i]);
			hyb_fill_k_extra_avx2(&tables[i]);
		} else if (i == HYB_ISA_AVX512) {
			hyb_cpu_fill_avx512(&tables[i]);
			hyb_fill_k_extra_avx512(&tables[i]);
		} else if (i == HYB_ISA_AVX512_VNNI) {
			hyb_cpu_fill_avx512vnni(&tables[i]);
			hyb_fill_mxfp4_avx512vnni(&tables[i]);
			hyb_fill_k_extra_avx512vnni(&tables[i]);
		} else {
			hyb_cpu_fill_amx(&tables[i]);
			hyb_fill_k_extra_amx(&tables[i]);
		}
	}
	for (int i = 0; i < HYB_ISA_COUNT; i++)
		tables[i].name = isa_names[i];

	int pick = HYB_ISA_SCALAR;

	for (int i = 0; i < HYB_ISA_COUNT; i++)
		if (supported[i])
			pick = i;
	const char *env = getenv("HYB_ISA");

	if (env && *env) {
		int want = isa_from_name(env);

		if (want < 0) {
			fprintf(stderr, "hyb: HYB_ISA=%s is not one of scalar|avx2|avx512|avx512vnni|amx;"
				" using %s\n", env, isa_names[pick]);
		} else if (!supported[want]) {
			fprintf(stderr, "hyb: HYB_ISA=%s: this CPU lacks it; using %s\n", env,
				isa_names[pick]);
		} else {
			pick = want;
		}
	}
	best = &tables[pick];
}

int hyb_cpu_gfni(void)
{
	pthread_once(&once, init);
	return has_gfni;
}

const struct hyb_cpu_kernels *hyb_cpu_kernels(enum hyb_isa isa)
{
	pthread_once(&once, init);
	if ((unsigned)isa >= HYB_ISA_COUNT || !supported[isa])
		return NULL;
	return &tables[isa];
}

const struct hyb_cpu_kernels *hyb_cpu_best(void)
{
	pthread_once(&once, init);
	return best;
}

double hyb_cpu_peak_macs(const struct hyb_cpu_kernels *k, uint32_t weight_type)
{
	const struct hyb_type_info *ti = hyb_type_info(weight_type);
	enum hyb_peak_kind kind;

	if (!k || !ti)
		return 0;
	/* blocked types multiply in int8; float types with FMA */
	kind = ti->blck > 1 ? HYB_PEAK_INT8 : HYB_PEAK_FMA;
	switch (k->isa) {
	case HYB_ISA_AVX2:
		return hyb_peak_avx2(kind);
	case HYB_ISA_AVX512:
		return hyb_peak_avx512(kind);
	case HYB_ISA_AVX512_VNNI:
	case HYB_ISA_AMX: /* the roofline of its vector units: tile peaks unmeasured (docs/PERFORMANCE.md) */
		return hyb_peak_avx512vnni(kind);
	default:
		return hyb_peak_scalar(kind);
	}
}

uint32_t hyb_gemm_invariant_cols(const struct hyb_cpu_kernels *k, uint32_t type, uint64_t ne1,
				 bool flat)
{
	/* which of gemm[], gemm_m4[], gemm_m1[] runs (hyb_gemm_pick) */
	const int cls = !flat && ne1 % 8 == 0 ? 0 : ne1 % 4 == 0 ? 1 : 2;
	const bool is_float = type == HYB_TYPE_F32 || type == HYB_TYPE_F16 ||
			      type == HYB_TYPE_BF16;

	switch (k->isa) {
	case HYB_ISA_SCALAR:
		return 0; /* one order for every column count */
	case HYB_ISA_AVX2:
		/* tinyBLAS tiles float columns by 4 and sums a tile in its own order;
		 * IQ4_NL's unrepacked GEMM is not its GEMV */
		if (is_float)
			return 3;
		return type == HYB_TYPE_IQ4_NL && cls ? 1 : 0;
	default:
		/* AVX-512: tinyBLAS's float tiles (rows % 4 == 0), the repacked
		 * Q4_K/Q2_K GEMM from 4 columns, the tiled K-quants from 8 */
		switch (type) {
		case HYB_TYPE_F32:
		case HYB_TYPE_F16:
		case HYB_TYPE_BF16:
			return cls < 2 ? 1 : 0;
		case HYB_TYPE_Q4_K:
		case HYB_TYPE_Q2_K:
			return cls == 0 ? 3 : 7;
		case HYB_TYPE_Q3_K:
		case HYB_TYPE_Q5_K:
		case HYB_TYPE_Q6_K:
		case HYB_TYPE_IQ4_XS:
			return 7;
		case HYB_TYPE_IQ4_NL:
			return cls ? 1 : 0;
		default:
			return 0;
		}
	}
}

// SPDX-License-Identifier: MIT
/*
 * CPU kernel tests. Golden values come from llama.cpp itself: the build in
 * the shared tree (libggml-base quantize_row_*_ref / dequantize_row_*,
 * libggml-cpu quantize_row_q8_0 / q8_K / ggml_vec_dot_*) was run once on the
 * gen_data() input below and its outputs hashed (FNV-1a 64) and partly
 * copied here. Every ISA level this CPU has is compared with the scalar
 * reference, and the scalar reference with a double-precision computation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "cpu_kernels.h"
#include "test.h"

/* ---- deterministic data (the same generator produced the golden values) ---- */

static uint64_t g_rng;

static uint32_t rnd(void)
{
	g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(g_rng >> 33);
}

/* uniform in [-1, 1), multiples of 2^-22: exact in float */
static float urand(void)
{
	return (float)(rnd() >> 8) * 0x1p-22f - 1.0f;
}

/*
 * n floats in 16 segments of different shapes: uniform, bell, tiny and large
 * scales, sparse outliers, zeros, constants, one-sided, 2^-30 tiny, ramp,
 * alternating, cubed, block-leading outliers, offset, sparse zeros, x1000.
 */
static void gen_data(float *x, int64_t n, uint64_t seed)
{
	const int64_t seg = n / 16;

	g_rng = seed;
	for (int64_t i = 0; i < n; i++) {
		const int s = (int)(i / seg) % 16;
		const float u = urand();
		float v;

		switch (s) {
		case 0: v = u; break;
		case 1: v = (u + urand() + urand() + urand()) * 0.25f; break;
		case 2: v = u * 0x1p-12f; break;
		case 3: v = u * 0x1p9f; break;
		case 4: v = (i % 37 == 0) ? u * 16.0f : u * 0.0625f; break;
		case 5: v = 0.0f; break;
		case 6: v = 0.375f; break;
		case 7: v = u < 0 ? -u : u; break;
		case 8: v = u * 0x1p-30f; break;
		case 9: v = (float)(i % 64) * 0.03125f - 1.0f; break;
		case 10: v = (i % 2) ? u : -u * 0.5f; break;
		case 11: v = u * u * u; break;
		case 12: v = (i % 256 < 16) ? u * 8 : u; break;
		case 13: v = -0.75f + u * 0x1p-8f; break;
		case 14: v = (i % 5 == 0) ? 0.0f : u; break;
		default: v = u * 1000.0f; break;
		}
		x[i] = v;
	}
}

static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	CHECK_MSG(p, "out of memory (%zu bytes)", n);
	return p;
}

/* ---- golden values from llama.cpp (see the top of the file) ---- */

#define G_Q4_0_HASH 0xa33097353e2cfc71ULL
static const uint8_t g_q4_0_first[18] = {
	0xd7, 0xaf, 0x5e, 0xac, 0xa2, 0xa3, 0xfb, 0xf7, 0xd3, 0x7a, 0x53, 0x8d,
	0x20, 0xc0, 0xbe, 0x93, 0x18, 0xfb,
};
#define G_DEQ_Q4_0_HASH 0x175531de9f0ecc7bULL
#define G_Q8_0_HASH 0x53c02662b3947eb2ULL
static const uint8_t g_q8_0_first[34] = {
	0xe7, 0x1f, 0x9b, 0xc3, 0x64, 0x57, 0xd3, 0x10, 0x4c, 0xe4, 0x52, 0xaf,
	0x7f, 0x7d, 0xa8, 0x55, 0xfa, 0xd5, 0x2a, 0xdf, 0xe1, 0xdc, 0x86, 0x96,
	0xb8, 0x0b, 0x28, 0x04, 0x5c, 0xc1, 0xca, 0xf4, 0x75, 0x87,
};
#define G_DEQ_Q8_0_HASH 0x14f0432abfd2ff44ULL
#define G_Q4_K_HASH 0xaa248889d20553b9ULL
static const uint8_t g_q4_K_first[144] = {
	0x63, 0x18, 0x2f, 0x24, 0xfa, 0xfc, 0xff, 0xff, 0xfa, 0xfc, 0xfa, 0xfa,
	0x9c, 0xed, 0xff, 0x27, 0x11, 0xe4, 0xce, 0x4d, 0x75, 0x39, 0x3c, 0x16,
	0xdd, 0x43, 0x2f, 0x1f, 0xc2, 0x5d, 0xd7, 0x05, 0x8a, 0xb6, 0xe6, 0xc5,
	0x30, 0x91, 0x53, 0x08, 0x7a, 0x38, 0x5d, 0xc4, 0x24, 0x27, 0xef, 0xd0,
	0xa8, 0x2a, 0xb7, 0xb8, 0x91, 0xba, 0xae, 0x21, 0xbc, 0xa4, 0x26, 0xda,
	0xed, 0x7c, 0x09, 0x02, 0x44, 0xa1, 0xb6, 0x99, 0x7a, 0x31, 0x57, 0x1c,
	0x4e, 0x2a, 0xce, 0x8e, 0x53, 0x6d, 0xdc, 0x20, 0x0c, 0x1b, 0x90, 0x47,
	0xff, 0xbb, 0x54, 0x21, 0x58, 0xd7, 0x88, 0x09, 0xa9, 0xa9, 0xf1, 0x58,
	0x63, 0x27, 0xa9, 0x61, 0xf9, 0x7e, 0x1a, 0x22, 0xda, 0x73, 0xa7, 0x8a,
	0x22, 0xed, 0x25, 0xc8, 0x3a, 0x57, 0xa7, 0x6f, 0x53, 0x74, 0x67, 0x56,
	0x1f, 0x14, 0x08, 0x80, 0x32, 0x7a, 0xb2, 0xbd, 0xf4, 0x3f, 0x2e, 0x09,
	0x2f, 0xeb, 0x62, 0xa6, 0x2c, 0xd8, 0x03, 0x81, 0x4c, 0xfe, 0x2e, 0x1c,
};
#define G_DEQ_Q4_K_HASH 0xad48bfc50429d3eeULL
#define G_Q6_K_HASH 0xd40de1881bbb750aULL
static const uint8_t g_q6_K_first[210] = {
	0xd9, 0x3f, 0xf7, 0xba, 0xbb, 0x2c, 0x0d, 0x97, 0x8c, 0xe4, 0x70, 0x31,
	0x56, 0xbb, 0x81, 0x6b, 0xfb, 0xb7, 0x58, 0x97, 0x40, 0xa4, 0xfd, 0xa3,
	0x0b, 0x31, 0x18, 0x1f, 0x22, 0x5d, 0xaf, 0xf0, 0xd3, 0xaa, 0x31, 0x12,
	0x8f, 0x0d, 0xeb, 0x94, 0x26, 0xc2, 0xaa, 0x93, 0xf3, 0x25, 0x17, 0x10,
	0xf1, 0x1f, 0xac, 0x61, 0xed, 0x44, 0xd6, 0xe0, 0xef, 0xbd, 0x54, 0xc4,
	0x99, 0x37, 0x1b, 0xb8, 0x7c, 0x3f, 0x3e, 0x10, 0x40, 0xe0, 0x3d, 0x6b,
	0x3e, 0xe1, 0xdc, 0xf8, 0x7a, 0x6a, 0x89, 0x8e, 0x12, 0x23, 0x38, 0xbd,
	0x18, 0x20, 0x94, 0x69, 0xd2, 0x05, 0x50, 0xd2, 0xe8, 0x45, 0x69, 0xce,
	0xf1, 0x63, 0xd5, 0xc0, 0x6e, 0xef, 0xd4, 0x99, 0x53, 0x56, 0x00, 0x71,
	0xf9, 0x0b, 0x4d, 0x55, 0x16, 0xfa, 0x34, 0xc9, 0x20, 0x53, 0x3c, 0x5b,
	0x4a, 0x72, 0xa7, 0xbd, 0xd8, 0x02, 0x2a, 0x9c, 0x93, 0x1e, 0xdc, 0xd4,
	0xb6, 0xd1, 0x80, 0x32, 0xcc, 0xa7, 0x20, 0xd0, 0xcf, 0x84, 0x1e, 0x32,
	0xaa, 0x79, 0x2d, 0x5d, 0x50, 0xf8, 0x94, 0xc2, 0x86, 0xd2, 0x07, 0x4c,
	0xb1, 0x81, 0x0f, 0xfc, 0x10, 0x60, 0xab, 0x46, 0x7c, 0x69, 0x66, 0x63,
	0x05, 0x2e, 0x19, 0xb1, 0x39, 0x99, 0xff, 0xc5, 0x3b, 0x8e, 0xc5, 0xdb,
	0xc1, 0x18, 0xbd, 0x6f, 0xc1, 0x2b, 0xf6, 0x75, 0x8f, 0x00, 0xce, 0xc1,
	0x85, 0x74, 0x7a, 0x78, 0x8a, 0x88, 0x78, 0x97, 0x87, 0x91, 0x7e, 0x8b,
	0x80, 0x83, 0x65, 0x88, 0x22, 0x0c,
};
#define G_DEQ_Q6_K_HASH 0x9b1d7224b820c251ULL
#define G_F16_HASH 0x24ecf7cf8e4285a0ULL
static const uint8_t g_f16_first[16] = {
	0x3f, 0xba, 0x82, 0xb7, 0x2c, 0x3a, 0x5f, 0x39, 0x94, 0xb5, 0xbe, 0x2f,
	0xb4, 0x38, 0xf2, 0xb2,
};
#define G_BF16_HASH 0x7025a8a6efdfdbacULL
static const uint8_t g_bf16_first[16] = {
	0x48, 0xbf, 0xf0, 0xbe, 0x45, 0x3f, 0x2c, 0x3f, 0xb3, 0xbe, 0xf8, 0x3d,
	0x16, 0x3f, 0x5e, 0xbe,
};
#define G_ACT_Q8_0_HASH 0x53c02662b3947eb2ULL
/* llama.cpp leaves bsums of an all-zero block unwritten: its output buffer was zeroed */
#define G_ACT_Q8_K_HASH 0x392ba8b103e0eb68ULL
static const uint8_t g_act_q8_K_first[16] = {
	0x6d, 0xeb, 0x00, 0xbc, 0x63, 0x3c, 0x9e, 0xab, 0x2c, 0xf1, 0xb5, 0x1c,
	0xb0, 0x4f, 0x83, 0x85,
};
/* Q4_1, Q5_0, Q5_1, IQ4_NL (quantize_row_*_ref; IQ4_NL's is ntry -1) */
#define G_Q4_1_HASH 0xa66e4776dd156bf2ULL
static const uint8_t g_q4_1_first[20] = {
	0x1a, 0x30, 0x89, 0xbb, 0xa1, 0x54, 0x5d, 0x5d, 0x05, 0x18, 0x3c, 0x86,
	0xac, 0x82, 0xdf, 0x4f, 0x42, 0x7c, 0xe7, 0x05,
};
#define G_DEQ_Q4_1_HASH 0x14a991c4c3b7649bULL
#define G_Q5_0_HASH 0x969e820b5b302c1cULL
static const uint8_t g_q5_0_first[22] = {
	0xd7, 0xab, 0x93, 0xd2, 0x7e, 0xba, 0xbd, 0x48, 0x43, 0x45, 0xf6, 0xde,
	0x96, 0xf4, 0xb6, 0x0a, 0x40, 0x80, 0x7b, 0x25, 0x11, 0xf5,
};
#define G_DEQ_Q5_0_HASH 0xbfc9421a22c09defULL
#define G_Q5_1_HASH 0xdc7b91beebc3f206ULL
static const uint8_t g_q5_1_first[24] = {
	0xef, 0x2b, 0x89, 0xbb, 0x6c, 0x2d, 0x81, 0x47, 0x43, 0xb8, 0xbc, 0xba,
	0x0a, 0x21, 0x69, 0x1c, 0x49, 0x05, 0xbf, 0x7f, 0x94, 0xea, 0xee, 0x0a,
};
#define G_DEQ_Q5_1_HASH 0xa0cd1fdb9cf6c4a8ULL
#define G_IQ4_NL_HASH 0x346d3e37f1e2b92bULL
static const uint8_t g_iq4_nl_first[18] = {
	0xd5, 0x9f, 0x5f, 0xbc, 0xa1, 0xb2, 0xfb, 0xf7, 0xd2, 0x7a, 0x52, 0x8e,
	0x20, 0xd0, 0xce, 0x92, 0x08, 0xfb,
};
#define G_DEQ_IQ4_NL_HASH 0xd16b4104b30b7715ULL
/* x86 quantize_row_q8_1, s included */
#define G_ACT_Q8_1_HASH 0x4ef870179f61d78aULL
#define G_DOT_Q4_1 -1760496.0
#define G_DOT_Q5_0 -1831874.0
#define G_DOT_Q5_1 -1641296.0
#define G_DOT_IQ4_NL -1482299.75
#define G_Q2_K_HASH 0x378615d57df1ae82ULL
static const uint8_t g_q2_K_first[16] = {
	0xab, 0xee, 0xec, 0xdc, 0xbc, 0xdd, 0xcd, 0xcc, 0xde, 0xac, 0xff, 0xcd,
	0xdd, 0xbd, 0xb9, 0xac,
};
#define G_DEQ_Q2_K_HASH 0x06e62ee1a6e3be43ULL
#define G_Q3_K_HASH 0x57c5508faed653faULL
static const uint8_t g_q3_K_first[16] = {
	0x0d, 0x43, 0xfe, 0x18, 0x6f, 0xe9, 0xd8, 0x55, 0x1a, 0x7d, 0x74, 0xc8,
	0x6b, 0xa8, 0xf3, 0x95,
};
#define G_DEQ_Q3_K_HASH 0xff3fdcdff740a39fULL
#define G_Q5_K_HASH 0x729aa39ee84393dfULL
static const uint8_t g_q5_K_first[16] = {
	0x32, 0x14, 0x06, 0x24, 0xfc, 0xf9, 0xfb, 0xfb, 0xfc, 0xfe, 0xfc, 0xfc,
	0xab, 0xfd, 0xef, 0x59,
};
#define G_DEQ_Q5_K_HASH 0x2f58c7a865c8707fULL
#define G_IQ4_XS_HASH 0xa7cee6167bc500b1ULL
static const uint8_t g_iq4_xs_first[16] = {
	0x24, 0x8c, 0x33, 0xc3, 0x3f, 0x1e, 0x0d, 0xd0, 0x5e, 0xbc, 0xa1, 0xb2,
	0xfb, 0xf7, 0xd2, 0x7a,
};
#define G_DEQ_IQ4_XS_HASH 0x3a94fa8bffbed372ULL
#define G_DOT_Q4_0 -1842475.0
#define G_DOT_Q8_0 -1576551.75
#define G_DOT_Q4_K -1513541.0
#define G_DOT_Q6_K -1448687.0
#define G_DOT_Q2_K -2340809.5
#define G_DOT_Q3_K -282660.75
#define G_DOT_Q5_K -1611757.0
#define G_DOT_IQ4_XS -1236772.25

#define NGOLD 4096

/* ---- conversions ---- */

TEST(kern_f16_roundtrip_all_halves)
{
	for (uint32_t h = 0; h < 65536; h++) {
		const float f = hyb_f16_to_f32((uint16_t)h);
		const uint16_t back = hyb_f32_to_f16(f);

		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
			CHECK_MSG(isnan(f), "half 0x%04x should be NaN", h);
			CHECK_MSG((back & 0x7fff) == 0x7e00 && (back & 0x8000) == (h & 0x8000),
				  "NaN 0x%04x -> 0x%04x", h, back);
		} else {
			CHECK_MSG(back == h, "half 0x%04x -> %g -> 0x%04x", h, f, back);
		}
	}
	/* values of the decoder, spot checks */
	CHECK(hyb_f16_to_f32(0x0001) == 0x1p-24f);
	CHECK(hyb_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
	CHECK(hyb_f16_to_f32(0x0400) == 0x1p-14f);
	CHECK(hyb_f16_to_f32(0x7bff) == 65504.0f);
	CHECK(isinf(hyb_f16_to_f32(0xfc00)) && hyb_f16_to_f32(0xfc00) < 0);
	CHECK(signbit(hyb_f16_to_f32(0x8000)) && hyb_f16_to_f32(0x8000) == 0);
}

/* nearest half by double arithmetic, ties to even: an independent reference */
static double f16_nearest(double v)
{
	double a = fabs(v), ulp, q, r;
	int e;

	if (a >= 65520.0)
		return copysign(INFINITY, v);
	frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	ulp = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 11);
	q = a / ulp;
	r = floor(q);
	if (q - r > 0.5 || (q - r == 0.5 && fmod(r, 2.0) != 0))
		r += 1;
	return copysign(r * ulp, v);
}

TEST(kern_f16_rounding)
{
	static const struct { float f; uint16_t h; } cases[] = {
		{ 65504.0f, 0x7bff }, { 65519.99f, 0x7bff }, { 65520.0f, 0x7c00 },
		{ 1e30f, 0x7c00 }, { -1e30f, 0xfc00 }, { 0x1p-24f, 0x0001 },
		{ 0x1p-25f, 0x0000 },          /* tie between 0 and 2^-24: even */
		{ 0x1.8p-25f, 0x0001 },        /* above the tie */
		{ 0x1.8p-24f, 0x0002 },        /* 1.5 ulp: tie, to even 2 */
		{ 0x1.4p-24f, 0x0001 },
		{ 1.0f + 0x1p-11f, 0x3c00 },   /* tie, even */
		{ 1.0f + 0x1.8p-10f, 0x3c02 }, /* 1.5 ulp: tie, even */
		{ 1.0f + 0x1.2p-11f, 0x3c01 },     /* just above the tie */
		{ 0x1.ffcp-15f, 0x0400 },      /* rounds up into the smallest normal */
		{ -0.0f, 0x8000 }, { 0x1p-149f, 0x0000 }, { -0x1p-140f, 0x8000 },
		{ INFINITY, 0x7c00 }, { -INFINITY, 0xfc00 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		CHECK_MSG(hyb_f32_to_f16(cases[i].f) == cases[i].h, "%a -> 0x%04x, want 0x%04x",
			  cases[i].f, hyb_f32_to_f16(cases[i].f), cases[i].h);
	CHECK(hyb_f32_to_f16(NAN) == 0x7e00);
	CHECK(hyb_f32_to_f16(-NAN) == 0xfe00);

	/* random floats over the whole half range and beyond, vs the reference */
	g_rng = 99;
	for (int i = 0; i < 2000000; i++) {
		uint32_t bits = rnd() << 1 ^ rnd();
		float f;

		/* exponents around the half range, uniformly */
		bits = (bits & 0x807fffff) | ((uint32_t)(90 + rnd() % 60) << 23);
		memcpy(&f, &bits, 4);
		const double want = f16_nearest(f);
		const float got = hyb_f16_to_f32(hyb_f32_to_f16(f));

		CHECK_MSG(got == want || (isinf(got) && isinf(want) && (got > 0) == (want > 0)),
			  "%a -> %a, want %a", f, got, want);
	}
}

static double bf16_nearest(double v)
{
	double a = fabs(v), ulp, q, r;
	int e;

	frexp(a, &e);
	ulp = a < 0x1p-126 ? 0x1p-133 : ldexp(1.0, e - 8);
	q = a / ulp;
	r = floor(q);
	if (q - r > 0.5 || (q - r == 0.5 && fmod(r, 2.0) != 0))
		r += 1;
	return copysign(r * ulp, v);
}

TEST(kern_bf16_rounding)
{
	for (uint32_t h = 0; h < 65536; h++) {
		const float f = hyb_bf16_to_f32((uint16_t)h);

		if (isnan(f))
			CHECK(isnan(hyb_bf16_to_f32(hyb_f32_to_bf16(f))));
		else
			CHECK_MSG(hyb_f32_to_bf16(f) == h, "bf16 0x%04x round trip", h);
	}
	CHECK(hyb_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);  /* tie, even */
	CHECK(hyb_f32_to_bf16(1.0f + 0x1.8p-7f) == 0x3f82); /* tie, even */
	CHECK(hyb_f32_to_bf16(0x1p-133f) == 0x0001); /* denormals are kept */
	CHECK(hyb_f32_to_bf16(3.4e38f) == 0x7f80);      /* rounds up to inf */
	{
		uint32_t qnan = 0x7f800001; /* signalling NaN, payload in the low bits */
		float f;

		memcpy(&f, &qnan, 4);
		CHECK(hyb_f32_to_bf16(f) == 0x7fc0); /* forced quiet */
	}
	g_rng = 7;
	for (int i = 0; i < 2000000; i++) {
		uint32_t bits = rnd() << 1 ^ rnd();
		float f;

		memcpy(&f, &bits, 4);
		if (isnan(f) || isinf(f) || fabsf(f) > 3.38e38f)
			continue;
		const double want = bf16_nearest(f);
		const float got = hyb_bf16_to_f32(hyb_f32_to_bf16(f));

		CHECK_MSG(got == want, "%a -> %a, want %a", f, got, want);
	}
}

/* ---- reference quantizers: bit-identical to llama.cpp ---- */

struct golden {
	uint32_t type;
	uint64_t hash;
	const uint8_t *first;
	size_t first_len;
	uint64_t deq_hash;
};

static const struct golden goldens[] = {
	{ HYB_TYPE_Q4_0, G_Q4_0_HASH, g_q4_0_first, sizeof(g_q4_0_first), G_DEQ_Q4_0_HASH },
	{ HYB_TYPE_Q4_1, G_Q4_1_HASH, g_q4_1_first, sizeof(g_q4_1_first), G_DEQ_Q4_1_HASH },
	{ HYB_TYPE_Q5_0, G_Q5_0_HASH, g_q5_0_first, sizeof(g_q5_0_first), G_DEQ_Q5_0_HASH },
	{ HYB_TYPE_Q5_1, G_Q5_1_HASH, g_q5_1_first, sizeof(g_q5_1_first), G_DEQ_Q5_1_HASH },
	{ HYB_TYPE_IQ4_NL, G_IQ4_NL_HASH, g_iq4_nl_first, sizeof(g_iq4_nl_first),
	  G_DEQ_IQ4_NL_HASH },
	{ HYB_TYPE_Q8_0, G_Q8_0_HASH, g_q8_0_first, sizeof(g_q8_0_first), G_DEQ_Q8_0_HASH },
	{ HYB_TYPE_Q4_K, G_Q4_K_HASH, g_q4_K_first, sizeof(g_q4_K_first), G_DEQ_Q4_K_HASH },
	{ HYB_TYPE_Q6_K, G_Q6_K_HASH, g_q6_K_first, sizeof(g_q6_K_first), G_DEQ_Q6_K_HASH },
	{ HYB_TYPE_Q2_K, G_Q2_K_HASH, g_q2_K_first, sizeof(g_q2_K_first), G_DEQ_Q2_K_HASH },
	{ HYB_TYPE_Q3_K, G_Q3_K_HASH, g_q3_K_first, sizeof(g_q3_K_first), G_DEQ_Q3_K_HASH },
	{ HYB_TYPE_Q5_K, G_Q5_K_HASH, g_q5_K_first, sizeof(g_q5_K_first), G_DEQ_Q5_K_HASH },
	{ HYB_TYPE_IQ4_XS, G_IQ4_XS_HASH, g_iq4_xs_first, sizeof(g_iq4_xs_first),
	  G_DEQ_IQ4_XS_HASH },
	{ HYB_TYPE_F16, G_F16_HASH, g_f16_first, sizeof(g_f16_first), 0 },
	{ HYB_TYPE_BF16, G_BF16_HASH, g_bf16_first, sizeof(g_bf16_first), 0 },
};

TEST(kern_quantize_ref_matches_llama)
{
	float *x = xmalloc(NGOLD * sizeof(float)), *y = xmalloc(NGOLD * sizeof(float));
	uint8_t *q = xmalloc(NGOLD * 4);
	const struct hyb_cpu_kernels *k = hyb_cpu_kernels(HYB_ISA_SCALAR);

	gen_data(x, NGOLD, 12345);
	for (size_t i = 0; i < sizeof(goldens) / sizeof(goldens[0]); i++) {
		const struct golden *g = &goldens[i];
		const size_t bytes = hyb_row_bytes(g->type, NGOLD);

		CHECK_EQ_INT(hyb_quantize_row_ref(g->type, x, q, NGOLD), 0);
		CHECK_MSG(!memcmp(q, g->first, g->first_len), "%s: first block differs",
			  hyb_type_name(g->type));
		CHECK_MSG(fnv(q, bytes) == g->hash, "%s: hash %016llx, llama.cpp %016llx",
			  hyb_type_name(g->type), (unsigned long long)fnv(q, bytes),
			  (unsigned long long)g->hash);
		if (g->deq_hash) {
			k->dequantize[g->type](q, y, NGOLD);
			CHECK_MSG(fnv(y, NGOLD * sizeof(float)) == g->deq_hash,
				  "%s: dequantized values differ from llama.cpp",
				  hyb_type_name(g->type));
		}
	}
	/* F32 is a copy */
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_F32, x, q, NGOLD), 0);
	CHECK(!memcmp(q, x, NGOLD * sizeof(float)));
	free(x);
	free(y);
	free(q);
}

TEST(kern_quantize_ref_ties_and_errors)
{
	float x[32];
	struct hyb_block_q8_0 b8;
	struct hyb_block_q4_0 b4;
	/* llama.cpp: quantize_row_q8_0_ref rounds half away from zero */
	static const int8_t want8[32] = {
		127, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1,
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
	};
	static const uint8_t want4[18] = {
		0x00, 0x3c, 0x00, 0x22, 0x22, 0x44, 0x44, 0x66, 0x66, 0x88, 0x88, 0xaa,
		0xaa, 0xcc, 0xcc, 0xee, 0xee, 0xff,
	};

	for (int i = 0; i < 32; i++)
		x[i] = i == 0 ? 127.0f : (float)(i - 16) + 0.5f;
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q8_0, x, &b8, 32), 0);
	CHECK(!memcmp(b8.qs, want8, 32));
	CHECK_EQ_INT(b8.d, 0x3c00);
	for (int i = 0; i < 32; i++)
		x[i] = i == 0 ? -8.0f : (float)((i % 16) - 8) + ((i & 1) ? 0.5f : 0.25f);
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q4_0, x, &b4, 32), 0);
	CHECK(!memcmp(&b4, want4, 18));

	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q4_0, x, &b4, 31), -1);
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q4_K, x, &b4, 32), -1);
	CHECK_EQ_INT(hyb_quantize_row_ref(16 /* IQ2_XXS */, x, &b4, 256), -1);
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q8_1, x, &b4, 32), -1); /* activations only */
	CHECK_EQ_INT(hyb_quantize_row_ref(HYB_TYPE_Q8_K, x, &b4, 256), -1); /* activations only */
	CHECK_EQ_INT(hyb_quantize_row_ref(1000, x, &b4, 32), -1);
}

/* ---- activation quantizers ---- */

TEST(kern_quantize_act_matches_llama)
{
	float *x = xmalloc(NGOLD * sizeof(float));
	uint8_t *q = xmalloc(NGOLD * 4);
	struct hyb_block_q8_0 b;
	float t[32];
	/* llama.cpp's x86 quantize_row_q8_0: 127/amax and round-half-even */
	static const int8_t want[32] = {
		127, -14, -14, -12, -12, -10, -10, -8, -8, -6, -6, -4, -4, -2, -2, 0,
		0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14, 16,
	};

	gen_data(x, NGOLD, 12345);
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!k)
			continue;
		k->quantize_act[HYB_TYPE_Q8_0](x, q, NGOLD);
		CHECK_MSG(fnv(q, hyb_row_bytes(HYB_TYPE_Q8_0, NGOLD)) == G_ACT_Q8_0_HASH,
			  "%s: Q8_0 activations differ from llama.cpp", k->name);
		k->quantize_act[HYB_TYPE_Q8_1](x, q, NGOLD);
		CHECK_MSG(fnv(q, hyb_row_bytes(HYB_TYPE_Q8_1, NGOLD)) == G_ACT_Q8_1_HASH,
			  "%s: Q8_1 activations differ from llama.cpp", k->name);
		k->quantize_act[HYB_TYPE_Q8_K](x, q, NGOLD);
		CHECK_MSG(!memcmp(q, g_act_q8_K_first, sizeof(g_act_q8_K_first)) &&
			  fnv(q, hyb_row_bytes(HYB_TYPE_Q8_K, NGOLD)) == G_ACT_Q8_K_HASH,
			  "%s: Q8_K activations differ from llama.cpp", k->name);
		for (int i = 0; i < 32; i++)
			t[i] = i == 0 ? 127.0f : (float)(i - 16) + 0.5f;
		k->quantize_act[HYB_TYPE_Q8_0](t, &b, 32);
		CHECK_MSG(!memcmp(b.qs, want, 32) && b.d == 0x3c00, "%s: Q8_0 ties", k->name);
	}
	free(x);
	free(q);
}

TEST(kern_isa_converters_match_scalar)
{
	const int64_t n = 2048 + 256;
	float *x = xmalloc(n * sizeof(float)), *a = xmalloc(n * sizeof(float));
	float *b = xmalloc(n * sizeof(float));
	uint8_t *qa = xmalloc(n * 4 + 64), *qb = xmalloc(n * 4 + 64), *w = xmalloc(n * 4);
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	static const uint32_t act[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_BF16, HYB_TYPE_Q8_0,
					HYB_TYPE_Q8_1, HYB_TYPE_Q8_K };
	static const uint32_t wt[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_BF16, HYB_TYPE_Q4_0,
				       HYB_TYPE_Q4_1, HYB_TYPE_Q5_0, HYB_TYPE_Q5_1, HYB_TYPE_IQ4_NL,
				       HYB_TYPE_Q8_0, HYB_TYPE_Q4_K, HYB_TYPE_Q6_K };

	for (int seed = 1; seed <= 3; seed++) {
		gen_data(x, n, (uint64_t)seed);
		for (int i = 0; i < n; i += 97)
			x[i] *= seed == 3 ? 1e-38f : 1.0f; /* some float denormals too */
		for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
			const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

			if (!k)
				continue;
			for (size_t i = 0; i < sizeof(act) / sizeof(act[0]); i++) {
				/* odd lengths for the per-element types */
				const int64_t m = act[i] == HYB_TYPE_F32 || act[i] == HYB_TYPE_F16 ||
						  act[i] == HYB_TYPE_BF16 ? n - 7 : n;
				const size_t bytes = hyb_row_bytes(act[i], (uint64_t)m);

				memset(qa, 0xA5, bytes + 64);
				memset(qb, 0xA5, bytes + 64);
				s->quantize_act[act[i]](x, qa, m);
				k->quantize_act[act[i]](x, qb, m);
				CHECK_MSG(!memcmp(qa, qb, bytes + 64), "%s: quantize_act %s differs",
					  k->name, hyb_type_name(act[i]));
			}
			for (size_t i = 0; i < sizeof(wt) / sizeof(wt[0]); i++) {
				CHECK_EQ_INT(hyb_quantize_row_ref(wt[i], x, w, n), 0);
				s->dequantize[wt[i]](w, a, n);
				k->dequantize[wt[i]](w, b, n);
				CHECK_MSG(!memcmp(a, b, n * sizeof(float)), "%s: dequantize %s differs",
					  k->name, hyb_type_name(wt[i]));
			}
		}
	}
	free(x);
	free(a);
	free(b);
	free(qa);
	free(qb);
	free(w);
}

/* worst error of quantize_ref -> dequantize, relative to each block's max |x| */
TEST(kern_quantize_roundtrip_error)
{
	static const struct { uint32_t type; double bound; } fmt[] = {
		/* Q8_0: half a step of amax/127, plus the step's own f16 rounding */
		{ HYB_TYPE_Q8_0, 0.5 / 127 + 127.0 / 127 * 0x1p-11 },
		/* Q4_0: levels -8..7 of amax/8: the +amax end clamps to 7, one full step */
		{ HYB_TYPE_Q4_0, 1.0 / 8 + 8 * 0x1p-11 },
		/* Q5_0: levels -16..15 of amax/16, the same clamp */
		{ HYB_TYPE_Q5_0, 1.0 / 16 + 16 * 0x1p-11 },
		/* Q4_1/Q5_1: half a step of (max - min) <= 2 amax, plus f16 d and m */
		{ HYB_TYPE_Q4_1, 1.0 / 15 + 18 * 0x1p-11 },
		{ HYB_TYPE_Q5_1, 1.0 / 31 + 34 * 0x1p-11 },
		/* IQ4_NL: fitted non-linear levels; worst seen 0.096, with margin */
		{ HYB_TYPE_IQ4_NL, 0.12 },
		/* K-quants: fitted, not max-scaled; worst seen 0.073 / 0.016, with margin */
		{ HYB_TYPE_Q4_K, 0.1 },
		{ HYB_TYPE_Q6_K, 0.025 },
		/* worst seen 0.33 / 0.24 / 0.045 / 0.11 */
		{ HYB_TYPE_Q2_K, 0.4 },
		{ HYB_TYPE_Q3_K, 0.3 },
		{ HYB_TYPE_Q5_K, 0.06 },
		{ HYB_TYPE_IQ4_XS, 0.15 },
		{ HYB_TYPE_F16, 0x1p-11 },
		{ HYB_TYPE_BF16, 0x1p-8 },
	};
	const int64_t n = 256 * 64;
	float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
	uint8_t *q = xmalloc(n * 4);
	const struct hyb_cpu_kernels *k = hyb_cpu_kernels(HYB_ISA_SCALAR);

	gen_data(x, n, 4242);
	for (size_t t = 0; t < sizeof(fmt) / sizeof(fmt[0]); t++) {
		const int64_t blk = hyb_type_info(fmt[t].type)->blck;
		double worst = 0;

		CHECK_EQ_INT(hyb_quantize_row_ref(fmt[t].type, x, q, n), 0);
		k->dequantize[fmt[t].type](q, y, n);
		for (int64_t b = 0; b < n; b += blk) {
			double amax = 0, err = 0;

			for (int64_t i = b; i < b + blk; i++) {
				amax = fmax(amax, fabs(x[i]));
				err = fmax(err, fabs((double)x[i] - y[i]));
			}
			/*
			 * below ~2^-10 the half-precision block scales lose precision
			 * and underflow (gen_data has a 2^-30 segment): exempt there,
			 * as in llama.cpp; only exactness of zero blocks is checked
			 */
			if (blk == 1) /* per element; f16 subnormals have a fixed 2^-25 step */
				worst = fmax(worst, err / fmax(amax, 0x1p-14));
			else if (amax >= 0x1p-10)
				worst = fmax(worst, err / amax);
			else if (amax == 0)
				CHECK_MSG(err == 0, "%s: zero block not exact", hyb_type_name(fmt[t].type));
		}
		CHECK_MSG(worst <= fmt[t].bound, "%s: worst relative error %g > %g",
			  hyb_type_name(fmt[t].type), worst, fmt[t].bound);
	}
	free(x);
	free(y);
	free(q);
}

/* ---- matrix kernels ---- */

enum wmode { W_QUANT, W_RAW, W_ZERO, W_EQUAL, W_HUGE, W_TINY };

static uint16_t rnd_f16_scale(void)
{
	/* positive or negative halves between 2^-10 and 2 */
	return (uint16_t)(((5 + rnd() % 11) << 10) | (rnd() & 0x3ff) | (rnd() & 1) << 15);
}

/* one weight row of k elements of `type` */
static void make_wrow(uint32_t type, int64_t k, enum wmode mode, uint8_t *out)
{
	float *f = xmalloc(k * sizeof(float));
	const size_t bytes = hyb_row_bytes(type, (uint64_t)k);

	if (mode == W_EQUAL) {
		for (int64_t i = 0; i < k; i++)
			f[i] = 0.5f;
	} else {
		for (int64_t i = 0; i < k; i++)
			f[i] = mode == W_ZERO ? 0.0f : urand();
	}
	CHECK_EQ_INT(hyb_quantize_row_ref(type, f, out, k), 0);
	free(f);
	if (mode != W_RAW && mode != W_HUGE && mode != W_TINY)
		return;
	switch (type) {
	case HYB_TYPE_F32:
		for (int64_t i = 0; i < k; i++) {
			float v = urand() * (mode == W_HUGE ? 1e15f : mode == W_TINY ? 1e-30f : 1.0f);

			memcpy(out + 4 * i, &v, 4);
		}
		break;
	case HYB_TYPE_F16:
	case HYB_TYPE_BF16:
		for (int64_t i = 0; i < k; i++) {
			uint16_t h = (uint16_t)rnd();

			if (type == HYB_TYPE_F16)
				h = mode == W_TINY ? (h & 0x83ff)              /* denormals */
				    : mode == W_HUGE ? (h & 0x83ff) | 0x7800   /* 2^15.. */
				    : (h & 0xbfff);                            /* < 2 */
			else
				h = mode == W_TINY ? (h & 0x80ff) | 0x0100 : (h & 0xbfff) | 0x0800;
			memcpy(out + 2 * i, &h, 2);
		}
		break;
	default:
		/* random codes everywhere, then sane block scales */
		for (size_t i = 0; i < bytes; i++)
			out[i] = (uint8_t)rnd();
		for (size_t off = 0; off < bytes;) {
			uint16_t d = mode == W_HUGE ? 0x7bff : mode == W_TINY ? 0x0001 : rnd_f16_scale();

			if (type == HYB_TYPE_MXFP4) {
				/* a byte exponent: 2^-10 .. 2^2, 2^100 or 2^-127 */
				out[off] = (uint8_t)(mode == W_HUGE ? 228 : mode == W_TINY ? 1 :
						     118 + rnd() % 13);
				off += 17;
			} else if (hyb_type_info(type)->blck == 32) {
				/* Q4_1/Q5_1: the min after d */
				uint16_t m = mode == W_RAW ? rnd_f16_scale() : d;

				memcpy(out + off, &d, 2);
				if (type == HYB_TYPE_Q4_1 || type == HYB_TYPE_Q5_1)
					memcpy(out + off + 2, &m, 2);
				off += hyb_type_info(type)->size;
			} else if (type == HYB_TYPE_Q4_K || type == HYB_TYPE_Q5_K) {
				uint16_t dm = mode == W_RAW ? rnd_f16_scale() : d;

				memcpy(out + off, &d, 2);
				memcpy(out + off + 2, &dm, 2);
				off += type == HYB_TYPE_Q4_K ? 144 : 176;
			} else if (type == HYB_TYPE_Q2_K) {
				uint16_t dm = mode == W_RAW ? rnd_f16_scale() : d;

				memcpy(out + off + 80, &d, 2);
				memcpy(out + off + 82, &dm, 2);
				off += 84;
			} else if (type == HYB_TYPE_Q3_K) {
				memcpy(out + off + 108, &d, 2);
				off += 110;
			} else if (type == HYB_TYPE_IQ4_XS) {
				memcpy(out + off, &d, 2);
				off += 136;
			} else {
				memcpy(out + off + 208, &d, 2);
				off += 210;
			}
		}
		if (type == HYB_TYPE_Q8_0 && mode == W_HUGE)
			for (size_t off = 0; off < bytes; off += 34)
				for (int i = 0; i < 32; i++)
					out[off + 2 + i] = (i & 1) ? 0x80 : 0x7f; /* -128, 127 */
		break;
	}
}

/* one activation column: quantized by the scalar converter, or raw codes */
static void make_xcol(uint32_t wtype, int64_t k, enum wmode mode, uint8_t *out)
{
	const uint32_t at = hyb_vec_dot_type(wtype);
	float *f = xmalloc(k * sizeof(float));

	for (int64_t i = 0; i < k; i++)
		f[i] = mode == W_ZERO ? 0.0f : mode == W_EQUAL ? 0.25f : urand();
	hyb_cpu_kernels(HYB_ISA_SCALAR)->quantize_act[at](f, out, k);
	free(f);
	if (mode != W_HUGE && mode != W_RAW)
		return;
	if (at == HYB_TYPE_Q8_0 || at == HYB_TYPE_Q8_1) {
		const size_t bs = hyb_row_bytes(at, 32), qo = at == HYB_TYPE_Q8_1 ? 4 : 2;

		for (int64_t b = 0; b < k / 32; b++) {
			uint8_t *blk = out + b * bs;
			/* huge: for Q8_1 small enough that s = d * sum stays finite */
			uint16_t d = mode != W_HUGE ? rnd_f16_scale() : at == HYB_TYPE_Q8_1 ? 0x4bff : 0x7bff;
			int sum = 0;

			memcpy(blk, &d, 2);
			for (int i = 0; i < 32; i++) {
				const int8_t q = mode == W_HUGE ? ((i & 2) ? 127 : -127)
								: (int8_t)(rnd() % 255 - 127);

				blk[qo + i] = (uint8_t)q;
				sum += q;
			}
			if (at == HYB_TYPE_Q8_1) {
				/* s = d * sum, as the quantizer makes it */
				const uint16_t sh = hyb_f32_to_f16(hyb_f16_to_f32(d) * (float)sum);

				memcpy(blk + 2, &sh, 2);
			}
		}
	} else if (at == HYB_TYPE_Q8_K) {
		for (int64_t b = 0; b < k / 256; b++) {
			struct hyb_block_q8_k *blk = (struct hyb_block_q8_k *)out + b;

			for (int i = 0; i < 256; i++)
				blk->qs[i] = mode == W_HUGE ? ((i & 2) ? 127 : -127)
							    : (int8_t)(rnd() % 255 - 127);
			for (int j = 0; j < 16; j++) {
				int s = 0;

				for (int i = 0; i < 16; i++)
					s += blk->qs[16 * j + i];
				blk->bsums[j] = (int16_t)s;
			}
			blk->d = mode == W_HUGE ? 1e10f : urand();
		}
	}
}

struct mat {
	int64_t k, nrows, ncols;
	size_t ws, xs, ys;
	uint8_t *w, *x;
	float *wf, *xf; /* dequantized, row/column major */
	/*
	 * Q4_1/Q5_1: what the f16 s of Q8_1 adds to an output's error beyond
	 * its dequantized values: m * s stands for m * d * sum(q) with s
	 * rounded to half and d unrounded, 2^-11 each, sum over blocks of
	 * |m s| 2^-10 (NULL for the other types)
	 */
	double *slack;
};

static void mat_make(struct mat *m, uint32_t type, int64_t k, int64_t nrows, int64_t ncols,
		     enum wmode mode, uint64_t seed)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const uint32_t at = hyb_vec_dot_type(type);

	g_rng = seed;
	m->k = k;
	m->nrows = nrows;
	m->ncols = ncols;
	/* strides with slack, odd where the format allows */
	m->ws = hyb_row_bytes(type, (uint64_t)k) + (type == HYB_TYPE_F32 ? 4 : 2) * (seed % 3);
	m->xs = hyb_row_bytes(at, (uint64_t)k) + (at == HYB_TYPE_F32 || at == HYB_TYPE_Q8_K ? 4 : 2);
	m->ys = (size_t)nrows + 3;
	m->w = xmalloc(m->ws * nrows);
	m->x = xmalloc(m->xs * ncols);
	m->wf = xmalloc((size_t)k * nrows * sizeof(float));
	m->xf = xmalloc((size_t)k * ncols * sizeof(float));
	for (int64_t r = 0; r < nrows; r++) {
		make_wrow(type, k, mode, m->w + r * m->ws);
		s->dequantize[type](m->w + r * m->ws, m->wf + r * k, k);
	}
	for (int64_t c = 0; c < ncols; c++) {
		make_xcol(type, k, mode, m->x + c * m->xs);
		s->dequantize[at](m->x + c * m->xs, m->xf + c * k, k);
	}
	m->slack = NULL;
	if (at != HYB_TYPE_Q8_1)
		return;
	m->slack = xmalloc((size_t)(nrows * ncols) * sizeof(double));
	for (int64_t c = 0; c < ncols; c++)
		for (int64_t r = 0; r < nrows; r++) {
			const struct hyb_block_q8_1 *xb = (const void *)(m->x + c * m->xs);
			double e = 0;

			for (int64_t b = 0; b < k / 32; b++) {
				uint16_t mh;

				/* m follows d in both Q4_1 and Q5_1 blocks */
				memcpy(&mh, m->w + r * m->ws + b * hyb_type_info(type)->size + 2, 2);
				e += fabs((double)hyb_f16_to_f32(mh) * hyb_f16_to_f32(xb[b].s)) * 0x1p-10;
			}
			m->slack[c * nrows + r] = e;
		}
}

static void mat_free(struct mat *m)
{
	free(m->w);
	free(m->x);
	free(m->wf);
	free(m->xf);
	free(m->slack);
}

static float *run_gemm(const struct hyb_cpu_kernels *kt, uint32_t type, const struct mat *m)
{
	float *y = xmalloc(m->ys * m->ncols * sizeof(float));

	for (size_t i = 0; i < m->ys * m->ncols; i++)
		y[i] = -12345.0f; /* the padding must stay untouched */
	kt->gemm[type](m->k, m->w, m->ws, m->nrows, m->x, m->xs, m->ncols, y, m->ys);
	for (int64_t c = 0; c < m->ncols; c++)
		for (size_t r = (size_t)m->nrows; r < m->ys; r++)
			CHECK_MSG(y[c * m->ys + r] == -12345.0f, "%s %s: wrote past row %lld",
				  kt->name, hyb_type_name(type), (long long)m->nrows);
	return y;
}

/* sum |w||x| of (r, c): the scale of the rounding error of a dot product */
static double absdot(const struct mat *m, int64_t r, int64_t c, double *exact)
{
	double s = 0, e = 0;

	for (int64_t i = 0; i < m->k; i++) {
		const double a = m->wf[r * m->k + i], b = m->xf[c * m->k + i];

		s += fabs(a * b);
		e += a * b;
	}
	if (exact)
		*exact = e;
	return s;
}

static void check_close(const char *what, const struct mat *m, const float *y, const float *ref,
			double rel)
{
	for (int64_t c = 0; c < m->ncols; c++) {
		for (int64_t r = 0; r < m->nrows; r++) {
			double exact;
			const double scale = absdot(m, r, c, &exact);
			const double want = ref ? ref[c * m->ys + r] : exact;
			const double got = y[c * m->ys + r];

			const double slack = m->slack && !ref ? m->slack[c * m->nrows + r] : 0;

			CHECK_MSG(fabs(got - want) <= rel * scale + slack, "%s: k %lld rows %lld cols %lld:"
				  " y[%lld][%lld] = %.9g, want %.9g (scale %g)", what,
				  (long long)m->k, (long long)m->nrows, (long long)m->ncols,
				  (long long)c, (long long)r, got, want, scale);
		}
	}
}

static const uint32_t all_wtypes[] = {
	HYB_TYPE_F32,  HYB_TYPE_F16,  HYB_TYPE_BF16, HYB_TYPE_Q4_0, HYB_TYPE_Q4_1,   HYB_TYPE_Q5_0,
	HYB_TYPE_Q5_1, HYB_TYPE_Q8_0, HYB_TYPE_Q4_K, HYB_TYPE_Q6_K, HYB_TYPE_IQ4_NL, HYB_TYPE_Q2_K,
	HYB_TYPE_Q3_K, HYB_TYPE_Q5_K, HYB_TYPE_IQ4_XS,
};

static void test_gemm_type(uint32_t type)
{
	const int64_t blk = hyb_type_info(type)->blck;
	const int64_t ks_q[] = { 32, 96, 160, 768 }, ks_k[] = { 256, 768 };
	const int64_t ks_f[] = { 1, 17, 100, 768 };
	const int64_t *ks = blk == 1 ? ks_f : blk == 32 ? ks_q : ks_k;
	const int nk = blk == 256 ? 2 : 4;
	const int64_t rows[] = { 1, 5, 33, 70 }, cols[] = { 1, 3, 7, 64 };
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	int levels = 0;

	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);
		uint64_t seed = 1;

		if (!kt)
			continue;
		levels++;
		for (int ik = 0; ik < nk; ik++)
			for (int ir = 0; ir < 4; ir++)
				for (int ic = 0; ic < 4; ic++) {
					struct mat m;
					enum wmode mode = (seed % 2) ? W_QUANT : W_RAW;

					mat_make(&m, type, ks[ik], rows[ir], cols[ic], mode, seed++);
					float *ya = run_gemm(s, type, &m), *yb = run_gemm(kt, type, &m);

					check_close(kt->name, &m, yb, ya, 1e-5);
					free(ya);
					free(yb);
					mat_free(&m);
				}
		/* several panels, k chunks and column tiles, partial ones too */
		{
			struct mat m;

			mat_make(&m, type, blk == 256 ? 1280 : blk == 32 ? 1312 : 333, 100, 13,
				 W_RAW, 4711);
			float *ya = run_gemm(s, type, &m), *yb = run_gemm(kt, type, &m);

			check_close(kt->name, &m, yb, ya, 1e-5);
			free(ya);
			free(yb);
			mat_free(&m);
		}
	}
	if (!levels)
		SKIP("this CPU has no SIMD level to compare");
}

TEST(kern_gemm_f32_vs_scalar) { test_gemm_type(HYB_TYPE_F32); }
TEST(kern_gemm_f16_vs_scalar) { test_gemm_type(HYB_TYPE_F16); }
TEST(kern_gemm_bf16_vs_scalar) { test_gemm_type(HYB_TYPE_BF16); }
TEST(kern_gemm_q4_0_vs_scalar) { test_gemm_type(HYB_TYPE_Q4_0); }
TEST(kern_gemm_q8_0_vs_scalar) { test_gemm_type(HYB_TYPE_Q8_0); }
TEST(kern_gemm_q4_1_vs_scalar) { test_gemm_type(HYB_TYPE_Q4_1); }
TEST(kern_gemm_q5_0_vs_scalar) { test_gemm_type(HYB_TYPE_Q5_0); }
TEST(kern_gemm_q5_1_vs_scalar) { test_gemm_type(HYB_TYPE_Q5_1); }
TEST(kern_gemm_iq4_nl_vs_scalar) { test_gemm_type(HYB_TYPE_IQ4_NL); }
TEST(kern_gemm_mxfp4_vs_scalar) { test_gemm_type(HYB_TYPE_MXFP4); }
TEST(kern_gemm_q4_k_vs_scalar) { test_gemm_type(HYB_TYPE_Q4_K); }
TEST(kern_gemm_q6_k_vs_scalar) { test_gemm_type(HYB_TYPE_Q6_K); }
TEST(kern_gemm_q2_k_vs_scalar) { test_gemm_type(HYB_TYPE_Q2_K); }
TEST(kern_gemm_q3_k_vs_scalar) { test_gemm_type(HYB_TYPE_Q3_K); }
TEST(kern_gemm_q5_k_vs_scalar) { test_gemm_type(HYB_TYPE_Q5_K); }
TEST(kern_gemm_iq4_xs_vs_scalar) { test_gemm_type(HYB_TYPE_IQ4_XS); }

/* the reference itself against double precision on the dequantized values */
TEST(kern_gemm_scalar_vs_f64)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);

	for (size_t t = 0; t < sizeof(all_wtypes) / sizeof(all_wtypes[0]); t++) {
		const uint32_t type = all_wtypes[t];
		const int64_t blk = hyb_type_info(type)->blck;
		struct mat m;

		for (int mode = W_QUANT; mode <= W_RAW; mode++) {
			mat_make(&m, type, blk == 1 ? 999 : blk == 32 ? 1024 : 1536, 9, 4,
				 (enum wmode)mode, 77);
			float *y = run_gemm(s, type, &m);

			check_close("scalar vs f64", &m, y, NULL, 1e-5);
			free(y);
			mat_free(&m);
		}
	}
}

/* zeros, constants, huge and tiny scales, f16 denormals: every level */
TEST(kern_gemm_edge_cases)
{
	static const enum wmode modes[] = { W_ZERO, W_EQUAL, W_HUGE, W_TINY };

	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		for (size_t t = 0; t < sizeof(all_wtypes) / sizeof(all_wtypes[0]); t++) {
			const uint32_t type = all_wtypes[t];
			const int64_t k = hyb_type_info(type)->blck == 256 ? 512 : 256;

			for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); mi++) {
				for (int nc = 1; nc <= 8; nc += 7) {
					struct mat m;

					mat_make(&m, type, k, 34, nc, modes[mi], 5 + mi);
					float *y = run_gemm(kt, type, &m);

					for (int64_t i = 0; modes[mi] == W_ZERO && i < m.nrows; i++)
						CHECK_MSG(y[i] == 0.0f, "%s %s: zeros give %g", kt->name,
							  hyb_type_name(type), y[i]);
					for (int64_t i = 0; i < m.nrows * nc; i++)
						CHECK_MSG(isfinite(y[(i / m.nrows) * m.ys + i % m.nrows]),
							  "%s %s: not finite", kt->name,
							  hyb_type_name(type));
					check_close(kt->name, &m, y, NULL, 2e-5);
					free(y);
					mat_free(&m);
				}
			}
		}
	}
}

/* no rows, no columns: nothing written; every level, both the direct and packed paths */
TEST(kern_gemm_empty_shapes)
{
	float y[64];
	uint8_t w[256 * 4] = { 0 }, x[292 * 8] = { 0 };

	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		for (size_t t = 0; t < sizeof(all_wtypes) / sizeof(all_wtypes[0]); t++) {
			const uint32_t type = all_wtypes[t];
			const int64_t k = hyb_type_info(type)->blck == 1 ? 8 : hyb_type_info(type)->blck;
			const size_t ws = hyb_row_bytes(type, (uint64_t)k);
			const size_t xs = hyb_row_bytes(hyb_vec_dot_type(type), (uint64_t)k);

			for (int i = 0; i < 64; i++)
				y[i] = 7.0f;
			kt->gemm[type](k, w, ws, 0, x, xs, 8, y, 1);
			kt->gemm[type](k, w, ws, 1, x, xs, 0, y, 1);
			for (int i = 0; i < 64; i++)
				CHECK_MSG(y[i] == 7.0f, "%s %s: empty product wrote y", kt->name,
					  hyb_type_name(type));
			/* all-zero blocks (zero scales) give exact zeros, 1 and 8 columns */
			kt->gemm[type](k, w, ws, 1, x, xs, 8, y, 1);
			for (int i = 0; i < 8; i++)
				CHECK_MSG(y[i] == 0.0f, "%s %s: zero blocks give %g", kt->name,
					  hyb_type_name(type), y[i]);
		}
	}
}

/* llama.cpp's ggml_vec_dot_* (AVX-512 build) on the golden data */
TEST(kern_gemm_matches_llama_dot)
{
	/* relative: Q4_1/Q5_1's sum(d dx dot) and sum(m s) cancel to 1/20 of their size,
	 * Q3_K's terms are ~10x its sum */
	static const struct { uint32_t type; double want, rel; } dots[] = {
		{ HYB_TYPE_Q4_0, G_DOT_Q4_0, 1e-6 }, { HYB_TYPE_Q8_0, G_DOT_Q8_0, 1e-6 },
		{ HYB_TYPE_Q4_1, G_DOT_Q4_1, 1e-5 }, { HYB_TYPE_Q5_0, G_DOT_Q5_0, 1e-6 },
		{ HYB_TYPE_Q5_1, G_DOT_Q5_1, 1e-5 }, { HYB_TYPE_IQ4_NL, G_DOT_IQ4_NL, 1e-6 },
		{ HYB_TYPE_Q4_K, G_DOT_Q4_K, 1e-6 }, { HYB_TYPE_Q6_K, G_DOT_Q6_K, 1e-6 },
		{ HYB_TYPE_Q2_K, G_DOT_Q2_K, 1e-6 }, { HYB_TYPE_Q3_K, G_DOT_Q3_K, 1e-5 },
		{ HYB_TYPE_Q5_K, G_DOT_Q5_K, 1e-6 }, { HYB_TYPE_IQ4_XS, G_DOT_IQ4_XS, 1e-6 },
	};
	float *w = xmalloc(NGOLD * sizeof(float)), *a = xmalloc(NGOLD * sizeof(float));
	uint8_t *qw = xmalloc(NGOLD * 2), *qa = xmalloc(NGOLD * 2);

	gen_data(w, NGOLD, 12345);
	gen_data(a, NGOLD, 777);
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		for (size_t i = 0; i < sizeof(dots) / sizeof(dots[0]); i++) {
			float y;

			CHECK_EQ_INT(hyb_quantize_row_ref(dots[i].type, w, qw, NGOLD), 0);
			kt->quantize_act[hyb_vec_dot_type(dots[i].type)](a, qa, NGOLD);
			kt->gemm[dots[i].type](NGOLD, qw, 0, 1, qa, 0, 1, &y, 1);
			/* the integer parts are exact; float sums differ by a few ulps */
			CHECK_MSG(fabs(y - dots[i].want) <= dots[i].rel * fabs(dots[i].want),
				  "%s %s: %.9g, llama.cpp %.9g", kt->name,
				  hyb_type_name(dots[i].type), y, dots[i].want);
		}
	}
	free(w);
	free(a);
	free(qw);
	free(qa);
}

/*
 * llama.cpp's whole matmul (ggml_mul_mat on its CPU backend, 1 thread, the
 * weight in the CPU_REPACK buffer where llama.cpp's loader puts it: IQ4_NL
 * with rows % 8 == 0 runs as iq4_nl_8x8) on gen_data weights through
 * quantize_row_*_ref and gen_data activations, k 416 (13 blocks: IQ4_NL's
 * vec_dot leftover block), rows for each of gemm / gemm_m4 / gemm_m1,
 * columns for vec_dot, tinyBLAS_Q0_AVX and the repacked GEMM: FNV-1a of
 * its output, bit for bit on the AVX-512 levels, and on AVX2: for these
 * types llama.cpp's AVX2 build adds what its AVX-512 build does (the same
 * __AVX2__ vec_dot branches and 256-bit tinyBLAS_Q0_AVX, whole-block dots
 * in the repacked kernels; see gemm_q0_extra_avx2.c). Checked against an
 * AVX2-only build (-mavx2 -mfma -mf16c, no AVX-512): all 36 equal when GCC
 * tunes for Zen (-mtune=znver3, what -march=native picks on Zen 2/3); with
 * generic tuning GCC fuses the add of IQ4_NL's vec_dot odd last block
 * (sumf += d * sumi) into an fma, which changes IQ4_NL rows 36 and 33 at
 * 1 column (0x96dec346b238b37e, 0x30eae01c8c1d4944 there).
 */
static const struct {
	uint32_t type;
	int64_t rows, cols;
	uint64_t hash;
} g_matmul[] = {
	{ HYB_TYPE_Q4_1, 64, 1, 0x56b31b8e204e6b61ull },
	{ HYB_TYPE_Q4_1, 64, 3, 0xa6db6a2cfa1243b8ull },
	{ HYB_TYPE_Q4_1, 64, 8, 0xba728c7b9bc63243ull },
	{ HYB_TYPE_Q4_1, 36, 1, 0x25da490b88f30862ull },
	{ HYB_TYPE_Q4_1, 36, 3, 0xfff1d8b97d3ecb12ull },
	{ HYB_TYPE_Q4_1, 36, 8, 0xfb25c1cc6c5538a9ull },
	{ HYB_TYPE_Q4_1, 33, 1, 0x7ec56cdbc19976d9ull },
	{ HYB_TYPE_Q4_1, 33, 3, 0xc6b1c8a8f97480dfull },
	{ HYB_TYPE_Q4_1, 33, 8, 0x48a8959e382f248cull },
	{ HYB_TYPE_Q5_0, 64, 1, 0x401e91a5b47a1e29ull },
	{ HYB_TYPE_Q5_0, 64, 3, 0x17aa2b6c2150a384ull },
	{ HYB_TYPE_Q5_0, 64, 8, 0x1663483e37219a87ull },
	{ HYB_TYPE_Q5_0, 36, 1, 0x4bbb29ec1b5d5484ull },
	{ HYB_TYPE_Q5_0, 36, 3, 0x6e24d0485a00a30full },
	{ HYB_TYPE_Q5_0, 36, 8, 0x326291f7c72999caull },
	{ HYB_TYPE_Q5_0, 33, 1, 0x03cf7c9e18634d70ull },
	{ HYB_TYPE_Q5_0, 33, 3, 0x0c9f5a2b58da08ceull },
	{ HYB_TYPE_Q5_0, 33, 8, 0xe35cd09be7ee9a6bull },
	{ HYB_TYPE_Q5_1, 64, 1, 0x018b632e46885889ull },
	{ HYB_TYPE_Q5_1, 64, 3, 0xe9591f9cc1285975ull },
	{ HYB_TYPE_Q5_1, 64, 8, 0x37e70d861ecd2ba7ull },
	{ HYB_TYPE_Q5_1, 36, 1, 0x20e28266bd503fa2ull },
	{ HYB_TYPE_Q5_1, 36, 3, 0x65c864962de3b17eull },
	{ HYB_TYPE_Q5_1, 36, 8, 0xed30f62ecfa587a9ull },
	{ HYB_TYPE_Q5_1, 33, 1, 0x15ceec557c2b0f3bull },
	{ HYB_TYPE_Q5_1, 33, 3, 0x0c3bc88b45a9293dull },
	{ HYB_TYPE_Q5_1, 33, 8, 0x0e17e7c2eae5466bull },
	{ HYB_TYPE_IQ4_NL, 64, 1, 0x1c4300c8f17eb4b9ull },
	{ HYB_TYPE_IQ4_NL, 64, 3, 0x9ebfab7951b2b224ull },
	{ HYB_TYPE_IQ4_NL, 64, 8, 0xabcc2ce7beacc01bull },
	{ HYB_TYPE_IQ4_NL, 36, 1, 0x7edd557d5351f479ull },
	{ HYB_TYPE_IQ4_NL, 36, 3, 0x11d0c4e8971d707eull },
	{ HYB_TYPE_IQ4_NL, 36, 8, 0x37c971ceff8503c5ull },
	{ HYB_TYPE_IQ4_NL, 33, 1, 0x6efadc5c60756755ull },
	{ HYB_TYPE_IQ4_NL, 33, 3, 0xb06f5e92121b4a4bull },
	{ HYB_TYPE_IQ4_NL, 33, 8, 0x2386116adaf4600aull },
};

TEST(kern_gemm_matches_llama_matmul)
{
	const int64_t k = 416;
	int exact_levels = 0;

	for (size_t g = 0; g < sizeof(g_matmul) / sizeof(g_matmul[0]); g++) {
		const uint32_t type = g_matmul[g].type, at = hyb_vec_dot_type(type);
		const int64_t nr = g_matmul[g].rows, nc = g_matmul[g].cols;
		const int ir = nr == 64 ? 0 : nr == 36 ? 1 : 2, ic = nc == 1 ? 0 : nc == 3 ? 1 : 2;
		const size_t ws = hyb_row_bytes(type, (uint64_t)k), xs = hyb_row_bytes(at, (uint64_t)k);
		float *wf = xmalloc((size_t)(k * nr) * sizeof(float));
		float *xf = xmalloc((size_t)(k * nc) * sizeof(float));
		float *y = xmalloc((size_t)(nr * nc) * sizeof(float));
		uint8_t *w = xmalloc(ws * nr), *x = xmalloc(xs * nc);

		gen_data(wf, k * nr, (uint64_t)(1000 + 10 * ir + ic));
		gen_data(xf, k * nc, (uint64_t)(2000 + 10 * ir + ic));
		CHECK_EQ_INT(hyb_quantize_row_ref(type, wf, w, k * nr), 0);
		for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
			const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

			if (!kt)
				continue;
			for (int64_t c = 0; c < nc; c++)
				kt->quantize_act[at](xf + c * k, x + c * xs, k);
			hyb_gemm_pick(kt, type, (uint64_t)nr)(k, w, ws, nr, x, xs, nc, y, (size_t)nr);
			if (isa < HYB_ISA_AVX2)
				continue; /* other orders: kern_gemm_*_vs_scalar */
			exact_levels += g == 0;
			CHECK_MSG(fnv(y, (size_t)(nr * nc) * sizeof(float)) == g_matmul[g].hash,
				  "%s %s rows %lld cols %lld: not llama.cpp's bits", kt->name,
				  hyb_type_name(type), (long long)nr, (long long)nc);
		}
		free(wf);
		free(xf);
		free(y);
		free(w);
		free(x);
	}
	if (!exact_levels)
		SKIP("no AVX-512 level on this CPU: only closeness to the scalar reference checked");
}

/*
 * Q4_1, Q5_0, Q5_1, IQ4_NL: the AVX2 level adds what the AVX-512 levels add
 * (llama.cpp's orders are the same on both builds, see above), over shapes
 * the goldens leave out: partial row and column tiles, odd block counts,
 * wide batches, each of gemm / gemm_m4 / gemm_m1.
 */
TEST(kern_gemm_q0_extra_avx2_bits_as_avx512)
{
	static const uint32_t types[] = { HYB_TYPE_Q4_1, HYB_TYPE_Q5_0, HYB_TYPE_Q5_1,
					  HYB_TYPE_IQ4_NL };
	static const int64_t ks[] = { 32, 96, 1312 }, rows[] = { 1, 5, 36, 64 };
	static const int64_t cols[] = { 1, 2, 3, 13 };
	const struct hyb_cpu_kernels *a2 = hyb_cpu_kernels(HYB_ISA_AVX2);
	const struct hyb_cpu_kernels *a5 = hyb_cpu_kernels(HYB_ISA_AVX512);
	uint64_t seed = 1;

	if (!a2 || !a5)
		SKIP("needs AVX2 and AVX-512");
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
		for (int ik = 0; ik < 3; ik++)
			for (int ir = 0; ir < 4; ir++)
				for (int ic = 0; ic < 4; ic++) {
					const uint32_t type = types[t];
					struct mat m;

					mat_make(&m, type, ks[ik], rows[ir], cols[ic], W_RAW, seed++);
					for (int tab = 0; tab < 3; tab++) {
						const size_t n = m.ys * (size_t)m.ncols;
						float *ya = xmalloc(n * sizeof(float));
						float *yb = xmalloc(n * sizeof(float));
						const hyb_gemm_fn fa = tab == 0 ? a2->gemm[type] : tab == 1 ?
							a2->gemm_m4[type] : a2->gemm_m1[type];
						const hyb_gemm_fn fb = tab == 0 ? a5->gemm[type] : tab == 1 ?
							a5->gemm_m4[type] : a5->gemm_m1[type];

						memset(ya, 0, n * sizeof(float));
						memset(yb, 0, n * sizeof(float));
						fa(m.k, m.w, m.ws, m.nrows, m.x, m.xs, m.ncols, ya, m.ys);
						fb(m.k, m.w, m.ws, m.nrows, m.x, m.xs, m.ncols, yb, m.ys);
						CHECK_MSG(!memcmp(ya, yb, n * sizeof(float)),
							  "%s k %lld rows %lld cols %lld table %d: avx2 != avx512",
							  hyb_type_name(type), (long long)m.k,
							  (long long)m.nrows, (long long)m.ncols, tab);
						free(ya);
						free(yb);
					}
					mat_free(&m);
				}
}

/*
 * Q2_K, Q3_K, Q5_K, IQ4_XS bit for bit: FNV-1a of the outputs of llama.cpp's
 * CPU backend (AVX-512 VNNI build, one thread) for ggml_mul_mat of a
 * k = 1024 weight of 64 rows (Q2_K repacked to q2_K_8x8) and of 36 rows
 * (not repacked), times 1, 7 (ggml_vec_dot; repacked Q2_K: gemm on 4
 * columns, gemv on 3) and 70 columns (the tiled K-quant matmul; repacked
 * Q2_K: gemm on 68, gemv on 2). Weights quantized by the reference
 * quantizer, activations F32 (gen_data seeds 1000 + rows, 2000 + columns).
 */
static const struct {
	uint32_t type;
	uint64_t hash[6]; /* rows 64, 36 x columns 1, 7, 70 */
} g_mm_bits[] = {
	{ HYB_TYPE_Q2_K, {
		0x4d66802746a5d730ULL, 0x875845aecc6c12caULL,
		0x8983deb521272f41ULL, 0xea370a24ddb01a30ULL,
		0x97e32ca0f28c004dULL, 0xa9ced728caffc862ULL, } },
	{ HYB_TYPE_Q3_K, {
		0x858467006a9f864aULL, 0x3dab16e57e0995e3ULL,
		0x7be1773bd34666d0ULL, 0x14cbcf0f7fb6a5ebULL,
		0x58f384cf08c0a200ULL, 0x36f6ac2b882a0831ULL, } },
	{ HYB_TYPE_Q5_K, {
		0xca036ed34bc86ea5ULL, 0x4991692d0ed7e285ULL,
		0x2f683f3f3cbd4b38ULL, 0x3a95a0dcc7365e7aULL,
		0xd6258ffa7ac65e98ULL, 0x20f8730d9d110fc9ULL, } },
	{ HYB_TYPE_IQ4_XS, {
		0xf7d8acb5f2b8cc9eULL, 0xfd8cf6b9df8ab574ULL,
		0x4503ebe555838499ULL, 0x05f5204e4ff5fdb9ULL,
		0xf1cc86c352e3260eULL, 0x05791dd4bf76b39eULL, } },
};

TEST(kern_gemm_k_extra_bits_match_llama)
{
	static const int64_t rows[] = { 64, 36 }, cols[] = { 1, 7, 70 };
	const int64_t k = 1024;
	int levels = 0;

	for (int isa = HYB_ISA_AVX512; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		levels++;
		for (size_t t = 0; t < sizeof(g_mm_bits) / sizeof(g_mm_bits[0]); t++) {
			const uint32_t type = g_mm_bits[t].type;
			const size_t rb = hyb_row_bytes(type, k), xb = hyb_row_bytes(HYB_TYPE_Q8_K, k);

			for (int ir = 0; ir < 2; ir++)
				for (int ic = 0; ic < 3; ic++) {
					const int64_t nr = rows[ir], nc = cols[ic];
					float *wf = xmalloc(k * nr * sizeof(float));
					float *xf = xmalloc(k * nc * sizeof(float));
					float *y = xmalloc(nr * nc * sizeof(float));
					uint8_t *wq = xmalloc(rb * nr), *xq = xmalloc(xb * nc);

					gen_data(wf, k * nr, 1000 + (uint64_t)nr);
					gen_data(xf, k * nc, 2000 + (uint64_t)nc);
					for (int64_t r = 0; r < nr; r++)
						CHECK_EQ_INT(hyb_quantize_row_ref(type, wf + r * k,
										  wq + r * rb, k), 0);
					for (int64_t c = 0; c < nc; c++)
						kt->quantize_act[HYB_TYPE_Q8_K](xf + c * k, xq + c * xb, k);
					hyb_gemm_pick(kt, type, (uint64_t)nr)(k, wq, rb, nr, xq, xb, nc, y,
									      (size_t)nr);
					CHECK_MSG(fnv(y, nr * nc * sizeof(float)) == g_mm_bits[t].hash[ir * 3 + ic],
						  "%s %s: rows %lld cols %lld differ from llama.cpp",
						  kt->name, hyb_type_name(type), (long long)nr,
						  (long long)nc);
					free(wf);
					free(xf);
					free(y);
					free(wq);
					free(xq);
				}
		}
	}
	if (!levels)
		SKIP("this CPU has no AVX-512");
}

/*
 * The packed prefill kernels (K-quants from 4 or 8 columns) sum each output
 * as llama.cpp does, whatever panel, k chunk or column tile it falls in:
 * a window of rows and columns gives the bits of the whole product, and
 * the AVX-512 levels agree (IQ4_XS without VNNI takes the direct kernel).
 * Raw random blocks with every other row at its largest codes, times
 * every other column at 127 (126 once per 32), reach the sums the exactness
 * bounds of gemm_q_avx512_packed.h are written for.
 */
static void k_extremes(struct mat *m, uint32_t type)
{
	/* the codes of a block: offset, length, the byte of the largest magnitude */
	static const struct { uint32_t type; int off, len, byte; } ext[] = {
		{ HYB_TYPE_Q2_K, 16, 64, 0xFF }, { HYB_TYPE_Q3_K, 0, 96, 0x00 },
		{ HYB_TYPE_Q4_K, 16, 128, 0xFF }, { HYB_TYPE_Q5_K, 16, 160, 0xFF },
		{ HYB_TYPE_Q6_K, 0, 192, 0x00 }, { HYB_TYPE_IQ4_XS, 8, 128, 0x00 },
	};
	const size_t bs = hyb_type_info(type)->size;

	for (size_t e = 0; e < sizeof(ext) / sizeof(ext[0]); e++)
		for (int64_t r = 0; r < m->nrows && ext[e].type == type; r += 2)
			for (int64_t b = 0; b < m->k / 256; b++)
				memset(m->w + r * m->ws + b * bs + ext[e].off, ext[e].byte,
				       (size_t)ext[e].len);
	for (int64_t c = 0; c < m->ncols; c += 2)
		for (int64_t b = 0; b < m->k / 256; b++) {
			struct hyb_block_q8_k *xb = (struct hyb_block_q8_k *)(m->x + c * m->xs) + b;

			/* odd sums of 32: products rounded in float if summed beyond 2^24 */
			memset(xb->qs, 127, 256);
			for (int j = 0; j < 16; j++) {
				xb->qs[16 * j] = (int8_t)(j % 2 ? 127 : 126);
				xb->bsums[j] = (int16_t)(16 * 127 - (j % 2 ? 0 : 1));
			}
		}
}
TEST(kern_gemm_k_packed_windows_same_bits)
{
	static const uint32_t types[] = { HYB_TYPE_Q2_K, HYB_TYPE_Q3_K, HYB_TYPE_Q4_K,
					  HYB_TYPE_Q5_K, HYB_TYPE_Q6_K, HYB_TYPE_IQ4_XS };
	static const int64_t win[][4] = { /* first row, rows, first column, columns */
		{ 0, 104, 0, 16 }, { 16, 88, 3, 8 }, { 5, 99, 8, 8 }, { 40, 64, 0, 12 },
	};
	int levels = 0;

	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		struct mat m;
		float *ref = NULL;

		mat_make(&m, types[t], 1280, 104, 16, W_RAW, 77 + t);
		k_extremes(&m, types[t]);
		for (int isa = HYB_ISA_AVX512; isa < HYB_ISA_COUNT; isa++) {
			const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);
			const hyb_gemm_fn f = kt ? hyb_gemm_pick(kt, types[t], 104) : NULL;

			if (!kt)
				continue;
			levels += t == 0;
			for (size_t wi = 0; wi < sizeof(win) / sizeof(win[0]); wi++) {
				const int64_t r0 = win[wi][0], nr = win[wi][1];
				const int64_t c0 = win[wi][2], nc = win[wi][3];
				float *y = xmalloc((size_t)(nr * nc) * sizeof(float));
				int bad = 0;

				f(m.k, m.w + r0 * m.ws, m.ws, nr, m.x + c0 * m.xs, m.xs, nc, y,
				  (size_t)nr);
				if (!ref) {
					ref = y; /* the whole product, first level */
					continue;
				}
				for (int64_t c = 0; c < nc && !bad; c++)
					for (int64_t r = 0; r < nr && !bad; r++)
						bad = memcmp(&y[c * nr + r], &ref[(c0 + c) * 104 + r0 + r],
							     sizeof(float)) != 0;
				CHECK_MSG(!bad, "%s %s rows %lld+%lld cols %lld+%lld: bits differ from "
					  "the whole product", kt->name, hyb_type_name(types[t]),
					  (long long)r0, (long long)nr, (long long)c0, (long long)nc);
				free(y);
			}
		}
		free(ref);
		mat_free(&m);
	}
	if (!levels)
		SKIP("this CPU has no AVX-512");
}

/* ---- dispatch ---- */

TEST(kern_dispatch_tables)
{
	CHECK(hyb_cpu_kernels(HYB_ISA_SCALAR) != NULL);
	CHECK(hyb_cpu_kernels(HYB_ISA_COUNT) == NULL);
	CHECK(hyb_cpu_kernels((enum hyb_isa)-1) == NULL);
	CHECK(!strcmp(hyb_isa_name(HYB_ISA_AVX512_VNNI), "avx512vnni"));
	CHECK(!strcmp(hyb_isa_name(HYB_ISA_COUNT), "unknown"));
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q4_0), HYB_TYPE_Q8_0);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q8_0), HYB_TYPE_Q8_0);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q5_0), HYB_TYPE_Q8_0);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_IQ4_NL), HYB_TYPE_Q8_0);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q4_1), HYB_TYPE_Q8_1);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q5_1), HYB_TYPE_Q8_1);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q4_K), HYB_TYPE_Q8_K);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_Q6_K), HYB_TYPE_Q8_K);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_F16), HYB_TYPE_F16);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_BF16), HYB_TYPE_BF16);
	CHECK_EQ_INT(hyb_vec_dot_type(HYB_TYPE_F32), HYB_TYPE_F32);
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		CHECK_EQ_INT(kt->isa, isa);
		CHECK(!strcmp(kt->name, hyb_isa_name((enum hyb_isa)isa)));
		for (size_t t = 0; t < sizeof(all_wtypes) / sizeof(all_wtypes[0]); t++) {
			const uint32_t wt = all_wtypes[t];

			CHECK(kt->gemm[wt] && kt->gemm_m4[wt] && kt->gemm_m1[wt]);
			CHECK(kt->dequantize[wt] && kt->quantize_act[hyb_vec_dot_type(wt)]);
			/* the pick follows the whole weight's rows */
			CHECK(hyb_gemm_pick(kt, wt, 4096) == kt->gemm[wt]);
			CHECK(hyb_gemm_pick(kt, wt, 32004) == kt->gemm_m4[wt]);
			CHECK(hyb_gemm_pick(kt, wt, 32001) == kt->gemm_m1[wt]);
		}
		CHECK(kt->dot_f16 && kt->mad_f16 && kt->scale_f16 && kt->gemm_acc && kt->soft_max &&
		      kt->swiglu);
		CHECK(kt->gemm[HYB_TYPE_Q8_K] == NULL && kt->gemm[HYB_TYPE_Q8_1] == NULL &&
		      kt->gemm[16 /* IQ2_XXS */] == NULL);
	}
	/* best is the highest supported level when HYB_ISA is unset */
	unsetenv("HYB_ISA");
	for (int isa = HYB_ISA_COUNT - 1; isa >= 0; isa--)
		if (hyb_cpu_kernels((enum hyb_isa)isa)) {
			CHECK_EQ_INT(hyb_cpu_best()->isa, isa);
			break;
		}
}

TEST(kern_dispatch_env)
{
	/* each test runs in a fresh process: the choice is made on first use */
	setenv("HYB_ISA", "scalar", 1);
	CHECK_EQ_INT(hyb_cpu_best()->isa, HYB_ISA_SCALAR);
}

TEST(kern_dispatch_env_bad_name)
{
	setenv("HYB_ISA", "sse9", 1);
	CHECK(hyb_cpu_best() != NULL);
	CHECK(hyb_cpu_best()->isa != HYB_ISA_SCALAR || !hyb_cpu_kernels(HYB_ISA_AVX2));
}

TEST(kern_peak_rates)
{
	CHECK(hyb_cpu_peak_macs(NULL, HYB_TYPE_Q8_0) == 0);
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *kt = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!kt)
			continue;
		const double i8 = hyb_cpu_peak_macs(kt, HYB_TYPE_Q8_0);
		const double f = hyb_cpu_peak_macs(kt, HYB_TYPE_F16);

		CHECK_MSG(i8 > 1e7 && f > 1e7, "%s: peak int8 %g, float %g", kt->name, i8, f);
		/* cached: the second call is the same number */
		CHECK(hyb_cpu_peak_macs(kt, HYB_TYPE_Q4_K) == i8);
	}
	CHECK(hyb_cpu_peak_macs(hyb_cpu_kernels(HYB_ISA_SCALAR), 1000) == 0);
}

/*
 * Batch invariance (hyb_gemm_invariant_cols): a call of up to the declared
 * number of columns (any number: up to 24 here) sums every output exactly as
 * a call of that column alone does, on every level this CPU runs, for every
 * weight type, each row-count class and a flat weight, at two depths.
 */
TEST(kern_gemm_invariant_cols_hold)
{
	static const uint32_t types[] = {
		HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_BF16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0,
		HYB_TYPE_Q4_1, HYB_TYPE_Q5_0, HYB_TYPE_Q5_1, HYB_TYPE_IQ4_NL, HYB_TYPE_Q2_K,
		HYB_TYPE_Q3_K, HYB_TYPE_Q4_K, HYB_TYPE_Q5_K, HYB_TYPE_Q6_K, HYB_TYPE_IQ4_XS,
	};
	enum { NC = 24, RMAX = 72 };
	static const int64_t rows[] = { 64, 68, 66 }, depth[] = { 256, 2048 };
	float *wf = malloc(sizeof(float) * 2048 * RMAX), *xf = malloc(sizeof(float) * 2048 * NC);
	float *y1 = malloc(sizeof(float) * RMAX * NC), *yn = malloc(sizeof(float) * RMAX * NC);
	char *w = malloc(2048 * 4 * RMAX), *xq = malloc(2048 * 4 * NC + 4096);
	uint32_t seed = 5, checked = 0;

	CHECK(wf && xf && y1 && yn && w && xq);
	for (int i = 0; i < 2048 * RMAX; i++) {
		seed = seed * 1664525u + 1013904223u;
		wf[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
	}
	for (int i = 0; i < 2048 * NC; i++) {
		seed = seed * 1664525u + 1013904223u;
		xf[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
	}
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels(isa);

		if (!k)
			continue;
		for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
		for (int di = 0; di < 2; di++)
		for (int ri = 0; ri < 4; ri++) {
			const uint32_t t = types[ti], vt = hyb_vec_dot_type(t);
			const int64_t K = depth[di], R = rows[ri < 3 ? ri : 0];
			const bool flat = ri == 3;
			const size_t rb = hyb_row_bytes(t, K), xs = hyb_row_bytes(vt, K);
			const hyb_gemm_fn fn = flat ? hyb_gemm_pick_flat(k, t, R) : hyb_gemm_pick(k, t, R);
			const uint32_t g = hyb_gemm_invariant_cols(k, t, R, flat);
			const int n = g ? (int)g : NC;

			for (int64_t r = 0; r < R; r++)
				CHECK_EQ_INT(hyb_quantize_row_ref(t, wf + r * K, w + r * rb, K), 0);
			for (int c = 0; c < n; c++) {
				k->quantize_act[vt](xf + (size_t)c * K, xq + (size_t)c * xs, K);
				fn(K, w, rb, R, xq + (size_t)c * xs, xs, 1, y1 + (size_t)c * R, R);
			}
			for (int nc = 2; nc <= n; nc++) {
				fn(K, w, rb, R, xq, xs, nc, yn, R);
				CHECK_MSG(!memcmp(y1, yn, sizeof(float) * R * nc),
					  "%s %s rows %lld%s k %lld: %d columns are not summed as one "
					  "(declared %u)", k->name, hyb_type_name(t), (long long)R,
					  flat ? " flat" : "", (long long)K, nc, g);
				checked++;
			}
		}
	}
	CHECK(checked > 1000);
	free(wf);
	free(xf);
	free(y1);
	free(yn);
	free(w);
	free(xq);
}

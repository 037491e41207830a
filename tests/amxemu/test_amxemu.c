// SPDX-License-Identifier: MIT
/*
 * amxemu's own tests (docs/AMXEMU.md): the four dot-product instructions
 * read their bytes as the SDM says (signed or unsigned by the name's two
 * letters: src1's, then src2's), and a use the hardware refuses ends the
 * process with the reason. Only in build/amxemu/hyb-tests.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/hyb.h"
#include "tests/amxemu/amxemu.h"
#include "test.h"

struct cfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

/* tmm0: A, M x K bytes; tmm1: B, K/4 rows of 4N bytes; tmm2: C, M rows of 4N bytes */
static void config(int m, int k, int n)
{
	struct cfg c;

	memset(&c, 0, sizeof(c));
	c.palette = 1;
	c.rows[0] = (uint8_t)m;
	c.colsb[0] = (uint16_t)k;
	c.rows[1] = (uint8_t)(k / 4);
	c.colsb[1] = (uint16_t)(4 * n);
	c.rows[2] = (uint8_t)m;
	c.colsb[2] = (uint16_t)(4 * n);
	_tile_loadconfig(&c);
}

TEST(amxemu_dot_products_read_signs_as_named)
{
	uint8_t a[2][8], b[2][12];
	int32_t c[2][3];

	config(2, 8, 3);
	/* every byte 0xFF: -1 read signed, 255 unsigned; 8 products per output */
	memset(a, 0xFF, sizeof(a));
	memset(b, 0xFF, sizeof(b));
	_tile_loadd(0, a, 8);
	_tile_loadd(1, b, 12);
	_tile_zero(2);
	_tile_dpbssd(2, 0, 1);
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[1][2], 8);
	_tile_zero(2);
	_tile_dpbsud(2, 0, 1);
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[0][0], -8 * 255);
	_tile_zero(2);
	_tile_dpbusd(2, 0, 1);
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[1][1], -8 * 255);
	_tile_zero(2);
	_tile_dpbuud(2, 0, 1);
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[0][2], 8 * 255 * 255);
	/* accumulates; B's row k holds k..k+3 of each column, A's row m its k in order */
	for (int m = 0; m < 2; m++)
		for (int i = 0; i < 8; i++)
			a[m][i] = (uint8_t)(int8_t)(m ? -(i + 1) : i + 1);
	for (int r = 0; r < 2; r++)
		for (int n = 0; n < 3; n++)
			for (int i = 0; i < 4; i++)
				b[r][4 * n + i] = (uint8_t)(n == 1 && 4 * r + i == 6 ? 200 : n == 2);
	_tile_loadd(0, a, 8);
	_tile_loadd(1, b, 12);
	_tile_dpbsud(2, 0, 1); /* onto dpbuud's 8 * 255 * 255 */
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[0][0], 8 * 255 * 255);
	CHECK_EQ_INT(c[0][1], 8 * 255 * 255 + 7 * 200);    /* a[0][6] = 7 */
	CHECK_EQ_INT(c[1][1], 8 * 255 * 255 - 7 * 200);    /* a[1][6] = -7 */
	CHECK_EQ_INT(c[0][2], 8 * 255 * 255 + 36);          /* 1 + ... + 8 */
	CHECK_EQ_INT(c[1][2], 8 * 255 * 255 - 36);
	/* a stride: rows from every other 8 bytes */
	uint8_t a2[4][8];

	memset(a2, 0, sizeof(a2));
	a2[2][0] = 3;
	_tile_loadd(0, a2, 16); /* rows 0 and 2 */
	_tile_zero(2);
	_tile_dpbssd(2, 0, 1);
	_tile_stored(2, c, 12);
	CHECK_EQ_INT(c[1][2], 3);
	CHECK_EQ_INT(c[0][2], 0);
	_tile_release();
}

/* runs fn in a child; it must die of SIGABRT saying `want` */
static void expect_fault(void (*fn)(void), const char *want)
{
	char path[512], msg[512] = "";
	int st;

	snprintf(path, sizeof(path), "%s/amxemu_fault.txt", hyb_test_tmpdir());
	fflush(NULL);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd < 0 || dup2(fd, 2) < 0)
			_exit(3);
		fn();
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	FILE *f = fopen(path, "r");

	CHECK(f);
	if (!fgets(msg, sizeof(msg), f))
		msg[0] = 0;
	fclose(f);
	CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %#x, said: %s", st, msg);
	CHECK_MSG(strstr(msg, want), "said: %s (want %s)", msg, want);
}

static void use_unconfigured(void)
{
	_tile_release();
	_tile_zero(0);
}

static void shapes_disagree(void)
{
	config(2, 16, 3);
	_tile_dpbsud(1, 0, 2); /* tmm1 as C: 4 rows, but A (tmm0) has 2 */
}

static void same_tile_twice(void)
{
	config(2, 8, 3);
	_tile_dpbssd(2, 0, 0);
}

static void rows_too_many(void)
{
	config(17, 8, 3);
}

static void reserved_set(void)
{
	struct cfg c;

	memset(&c, 0, sizeof(c));
	c.palette = 1;
	c.rows[0] = 1;
	c.colsb[0] = 4;
	c.reserved[3] = 1;
	_tile_loadconfig(&c);
}

TEST(amxemu_refuses_what_the_hardware_refuses)
{
	expect_fault(use_unconfigured, "TILEZERO raises #UD: the tiles are not configured");
	expect_fault(shapes_disagree, "TDPBSUD raises #UD");
	expect_fault(same_tile_twice, "the three tiles must differ");
	expect_fault(rows_too_many, "LDTILECFG raises #GP");
	expect_fault(reserved_set, "reserved byte 5");
}

/*
 * The level is what this binary's models run on: AMX is the best level
 * amxemu offers, so a prompt's matrix products go through the tiles (the
 * golden-logit tests of tests/unit then hold the AMX level to llama.cpp's
 * bits) while one-column decode stays on the VNNI GEMV.
 */
TEST(amxemu_models_prefill_on_the_tiles)
{
	static const char *const types[] = { "Q4_0", "Q4_K", "Q6_K", "IQ4_XS", "Q8_0" };
	const struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .n_batch = 64 };
	int32_t toks[16];
	float lg[300];

	CHECK(hyb_cpu_best()->isa == HYB_ISA_AMX || getenv("HYB_ISA"));
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		char args[256], name[32];

		snprintf(args, sizeof(args), "--hidden 256 --ffn 512 --layers 1 --heads 4 "
			 "--kv-heads 2 --vocab 300 --type %s --seed 3", types[t]);
		snprintf(name, sizeof(name), "amxemu_%s", types[t]);
		struct hyb_model *m = hyb_model_load(hyb_test_synth(name, args));

		CHECK_MSG(m, "%s", hyb_last_error());
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);

		CHECK_MSG(c, "%s", hyb_last_error());
		for (int i = 0; i < 16; i++)
			toks[i] = 1 + (i * 37) % 290;
		const unsigned long before = hyb_amxemu_dp_count();

		CHECK(!hyb_ctx_eval(c, toks, 16, lg, false));
		const unsigned long prompt = hyb_amxemu_dp_count() - before;

		CHECK(!hyb_ctx_eval(c, toks, 1, lg, false));
		const unsigned long decode = hyb_amxemu_dp_count() - before - prompt;

		if (hyb_cpu_best()->isa == HYB_ISA_AMX && strcmp(types[t], "Q8_0"))
			CHECK_MSG(prompt > 0, "%s: a 16-token prompt ran no tile dot product", types[t]);
		else
			CHECK_MSG(prompt == 0, "%s: %lu tile dot products", types[t], prompt);
		CHECK_MSG(decode == 0, "%s: decoding one token ran %lu tile dot products", types[t],
			  decode);
		hyb_ctx_free(c);
		hyb_model_free(m);
	}
}

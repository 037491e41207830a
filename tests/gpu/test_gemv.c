// SPDX-License-Identifier: MIT
/* CUDA GEMV against the CPU reference kernels, on random quantized weights. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "test.h"

static void check_type(uint32_t type, int64_t k, int64_t rows)
{
	const struct hyb_cpu_kernels *ref = hyb_cpu_kernels(HYB_ISA_SCALAR);
	size_t rb = hyb_row_bytes(type, (uint64_t)k);
	uint32_t vt = hyb_vec_dot_type(type);
	float *wf = malloc(sizeof(float) * k), *x = malloc(sizeof(float) * k);
	float *y_gpu = malloc(sizeof(float) * rows), *y_ref = malloc(sizeof(float) * rows);
	float *row = malloc(sizeof(float) * k);
	char *w = malloc(rb * rows), *xq = malloc(hyb_row_bytes(vt, (uint64_t)k));
	void *dw, *dx, *dy;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	srand(42);
	for (int64_t i = 0; i < k; i++)
		x[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t i = 0; i < k; i++)
			wf[i] = (float)rand() / RAND_MAX * 2 - 1;
		CHECK(!hyb_quantize_row_ref(type, wf, w + r * rb, k));
	}
	/* Reference in float from dequantized weights (the GPU keeps x in float). */
	for (int64_t r = 0; r < rows; r++) {
		double s = 0;

		ref->dequantize[type](w + r * rb, row, k);
		for (int64_t i = 0; i < k; i++)
			s += (double)row[i] * x[i];
		y_ref[r] = (float)s;
	}
	CHECK(cudaMalloc(&dw, rb * rows) == cudaSuccess);
	CHECK(cudaMalloc(&dx, sizeof(float) * k) == cudaSuccess);
	CHECK(cudaMalloc(&dy, sizeof(float) * rows) == cudaSuccess);
	CHECK(cudaMemcpy(dw, w, rb * rows, cudaMemcpyHostToDevice) == cudaSuccess);
	CHECK(cudaMemcpy(dx, x, sizeof(float) * k, cudaMemcpyHostToDevice) == cudaSuccess);
	CHECK_EQ_INT(hyb_cuda_gemv(type, dw, rb, k, rows, dx, dy, NULL), 0);
	CHECK(cudaMemcpy(y_gpu, dy, sizeof(float) * rows, cudaMemcpyDeviceToHost) == cudaSuccess);
	for (int64_t r = 0; r < rows; r++)
		CHECK_NEAR(y_gpu[r], y_ref[r], 1e-3 * (1 + fabs(y_ref[r])));
	CHECK(hyb_cuda_gemv(type, dw, rb + 1, k, rows, dx, dy, NULL) == -1);
	cudaFree(dw);
	cudaFree(dx);
	cudaFree(dy);
	(void)xq;
	free(wf); free(x); free(y_gpu); free(y_ref); free(row); free(w); free(xq);
}

TEST(gpu_gemv_q8_0) { check_type(HYB_TYPE_Q8_0, 4096, 1000); }
TEST(gpu_gemv_q4_0) { check_type(HYB_TYPE_Q4_0, 4096, 1000); }
TEST(gpu_gemv_f16) { check_type(HYB_TYPE_F16, 4000, 777); }

/* SPDX-License-Identifier: MIT */
/*
 * The CUDA dense kernels of a decode step (kernels/cuda/dense.cu):
 * RMSNorm, the matrix-vector product over GGUF weights and one token's
 * self-attention over an F16 KV cache, callable from C. The device layer
 * (libhyb/device/device_cuda.cu) checks the arguments (hyb/device.h) and
 * owns the workspace; these functions only size and launch. Every pointer
 * is device memory unless said otherwise. Streams are void * to keep this
 * header C. Launchers return 0, -EINVAL for a type or shape the kernels do
 * not take (a bug of the caller: the device layer checks first), or a
 * (positive) cudaError_t of the launch.
 */
#ifndef HYB_DENSE_CUDA_H
#define HYB_DENSE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Each of rows rows of n: y = x / rms(x) * w (hyb_rmsnorm's arithmetic), a
 * block a row; y may equal x.
 */
int hyb_cuda_rmsnorm(float *y, const float *x, const float *w, uint32_t n, uint32_t rows,
		     float eps, void *stream);

/* y (= or +=) W x, W n_out rows of n_in elements of type, rows contiguous. */
struct hyb_cuda_matvec {
	uint32_t type;           /* HYB_TYPE_F32, F16, Q8_0, Q4_0, Q4_K, Q6_K */
	uint32_t n_in, n_out;    /* n_in a multiple of the type's block (K-quants: 256) */
	const void *w;           /* F32: 4-byte aligned; others: 2-byte aligned */
	const float *x;          /* [n_in] */
	float *y;                /* [n_out], disjoint from x */
	bool accumulate;
	int n_sm;                /* multiprocessors of the device (grid size) */
};

/* Dynamic shared memory a matvec of this type and n_in needs (0: unsupported type). */
uint32_t hyb_cuda_matvec_smem(uint32_t type, uint32_t n_in);

/* Allow the matvec kernels smem_max bytes of dynamic shared memory; 0 or a cudaError_t. */
int hyb_cuda_dense_setup(int smem_max);

int hyb_cuda_matvec(const struct hyb_cuda_matvec *m, void *stream);
/*
 * n matvecs of m[0]'s type, n_in, n_out and accumulate, each its own w, x,
 * y (disjoint outputs), in one launch per 32: each output that of
 * hyb_cuda_matvec on its item, bit for bit.
 */
int hyb_cuda_matvec_group(const struct hyb_cuda_matvec *m, uint32_t n, void *stream);
/*
 * hyb/device.h's hyb_dev_matvec_table: m is slot 0 and row 0 (its w, x, y);
 * item i of the list at items (read when the kernel runs) is hyb_cuda_matvec
 * over w + slot * w_stride, x + row * n_in, y + row * n_out. A bad list sets
 * bad[0] = 3, bad[1] = the item (bad may be NULL).
 */
struct hyb_cuda_matvec_table {
	struct hyb_cuda_matvec m;
	uint64_t w_stride;       /* a multiple of 16 */
	uint32_t n_w, n_x, n_y, max;
	const uint32_t *items;
	uint32_t *bad;
};
int hyb_cuda_matvec_table(const struct hyb_cuda_matvec_table *t, void *stream);

/*
 * RoPE's cos and sin for one position (host memory), which the caller
 * computes on the host with the CPU's own arithmetic (libhyb's
 * hyb_rope_table: libm's powf, cosf and sinf), so the device rotates q and
 * k to the CPU's bits.
 */
#define HYB_CUDA_ROPE_MAX 128 /* n_rot / 2 for head_dim <= 256 */
struct hyb_cuda_rope {
	float cs[HYB_CUDA_ROPE_MAX], sn[HYB_CUDA_ROPE_MAX];
};

/* One decode token's attention (hyb/device.h struct hyb_dev_attn, checks done). */
struct hyb_cuda_attn {
	uint32_t n_head, n_head_kv, head_dim, n_rot;  /* head_dim even, <= 256 */
	bool neox;
	uint32_t pos;
	const struct hyb_cuda_rope *rope;  /* host memory, the table for n_rot and pos */
	float *q, *k;                      /* roped in place */
	const float *v;
	uint16_t *kcache, *vcache;         /* F16 [n_ctx][n_head_kv * head_dim], 2-byte aligned */
	float *out;                        /* [n_head * head_dim] */
	float q_scale;                     /* 0: none; else q *= it after RoPE, scores unscaled */
	uint32_t first;                    /* rows first..pos attended (a sliding window) */
	void *work;                        /* hyb_cuda_attn_work_bytes() */
	int n_sm;
	/*
	 * A graph's step (hyb/device.h pos_at): the position is read from
	 * device memory when the kernels run, and pos, first and rope above are
	 * ignored. The kernels make attn_plan's split for it themselves (the
	 * launch covers the most chunks any position takes), so the results
	 * are the by-value call's bits. rope_tab: row p of [n_ctx][n_rot] holds
	 * position p's cos (n_rot / 2), then its sin (hyb_rope_table's).
	 * A position >= n_ctx does nothing but set bad[0] = 2, bad[1] = it
	 * (bad: mapped host memory, may be NULL).
	 */
	const uint32_t *pos_at;
	const float *rope_tab;
	uint32_t n_ctx, n_swa;
	uint32_t *bad;
};

/*
 * Workspace bytes an attention of this shape needs at any position (the
 * partial results of the split positions): n_head * chunks * (head_dim + 2)
 * floats, chunks <= 4 * n_sm / (n_head_kv * head slices) + 1 whatever the
 * context length, so at most 32 * n_sm * (head_dim + 2) * 4 bytes plus
 * n_head * (head_dim + 2) * 4 (4.4 MB on a 132-SM H100 at head_dim 256).
 */
uint64_t hyb_cuda_attn_work_bytes(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim,
				  int n_sm);

int hyb_cuda_attention(const struct hyb_cuda_attn *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif

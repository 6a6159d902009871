/*
 * internal.h: what the C core shares between its files and with kernels/ but not with users:
 * the context struct, error reporting, argument checks, the workspace and the device interface
 * (host/device memory moves), which kernels/device.cu implements with CUDA and
 * core/device_none.c implements for a CPU-only build.
 */
#ifndef QGRU_INTERNAL_H
#define QGRU_INTERNAL_H

#include "qgru.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA context's streams beyond the main and aux ones (kernels/device.cu): one, the side
 * stream of the STE backward's per-step loop (kernels/int_gru_bwd_loop.cuh, step_loop). */
enum { QG_EXT_STREAMS = 1 };

struct qg_ctx {
  int device;                 /* qg_device of this context (where new work goes by default) */
  int device_index;
  void *stream;               /* cudaStream_t, NULL = default stream (CPU: unused) */
  void *cublas;               /* cublasHandle_t, created lazily by the CUDA backend */
  void *workspace;            /* host workspace, grow-only */
  int64_t workspace_bytes;
  void *dev_workspace;        /* device workspace, grow-only */
  int64_t dev_workspace_bytes;
  void *aux_stream;           /* CUDA: a second stream and cuBLAS handle, created with the context, on */
  void *aux_cublas;           /* which a bidirectional layer's second direction runs at the same time */
  void *ev_fork, *ev_join;    /* events (timing off) that order the aux stream after / before the main one */
  void *ext_stream[QG_EXT_STREAMS];   /* CUDA: more streams, each with a cuBLAS handle, created with the */
  void *ext_cublas[QG_EXT_STREAMS];   /* context (the last one at the device's least priority) */
  void *ev_mark[2 + QG_EXT_STREAMS];  /* one event (timing off) per stream: main, aux, ext[0..]: cross-stream orders */
  void *ev_timer[2];          /* CUDA: the events of qg_ctx_timer_start / _stop (timing on) */
  int timer_started;          /* qg_ctx_timer_start was called since the last stop */
  double timer_t0;            /* CPU: the wall clock at qg_ctx_timer_start */
  void *blas_ws[2 + QG_EXT_STREAMS];   /* the cuBLAS workspaces of the main, aux and ext handles */
  void *gru_graphs;           /* CUDA: the float GRU's cache of captured fallback loops (kernels/gru.cu) */
  void *lt_plans;             /* CUDA: the integer GRU's cuBLASLt W x plans by size (kernels/int_gru_wx_lt.cuh) */
  int sm_count;               /* CUDA: multiprocessors of the device, and the opt-in shared memory per */
  int smem_optin;             /* block in bytes (read once at context creation) */
  int math;                   /* qg_math: QG_MATH_STRICT (fp32) or QG_MATH_TF32 for the float GEMMs */
  int kernel_path;            /* qg_kernel_path: which GPU recurrence the GRUs run */
  int exact_split;            /* qg_exact_split: the strict STE backward's int8 split products */
  int persist_cluster;        /* forced shape of the persistent GRU kernels (0, 0, 0: chosen per */
  int persist_rows;           /* call); qg_ctx_set_persist_shape */
  int persist_splits;
  int persist_storage;
  struct qg_ctx *peer;        /* CUDA: the second context on the same device on which a quantized
                               * bidirectional layer's direction 1 runs (kernels/int_gru_bidir.cu);
                               * created by the first such call, destroyed with this one */
  void *dev_spare;            /* CUDA: a second grow-only device buffer (qg_dev_spare) */
  int64_t dev_spare_bytes;
  uint64_t rng[4];            /* xoshiro256** */
  char error[1024];
};

/* Sets ctx->error to "fn: message" and returns status. Always returns status, so callers write
 * `return qg_fail(ctx, QG_ERR_ARG, __func__, "...", ...)`. */
qg_status qg_fail(qg_ctx *ctx, qg_status status, const char *fn, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 4, 5)))
#endif
  ;

/* Formats a shape as "[2, 3, 4]" into buf (returns buf). */
const char *qg_shape_str(char *buf, size_t n, int ndim, const int64_t *dims);

/* Argument checks; each returns QG_OK or fails with a message naming fn and the argument. A NULL
 * expected dim (-1) matches anything. */
qg_status qg_check_tensor(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t,
                          int dtype, int ndim, const int64_t *dims);

/* Host scratch of at least nbytes (64-byte aligned), valid until the next call. Grow-only. */
qg_status qg_workspace(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out);

uint64_t qg_rng_next(uint64_t s[4]);
double qg_rng_uniform01(uint64_t s[4]);  /* [0, 1) with 53 random bits */
void qg_rng_seed_state(uint64_t s[4], uint64_t seed);

int64_t qg_tensor_bytes(const qg_tensor *t);

/* The GRU's arguments x [T, N, C], W [3H, C], R [3H, H]: f32 (any device); fills T, N, C, H.
 * Defined in core/gru.c. */
qg_status qg_check_gru_args(qg_ctx *ctx, const char *fn, const qg_tensor *x, const qg_tensor *W,
                            const qg_tensor *R, int64_t *T, int64_t *N, int64_t *C, int64_t *H);
/* lengths: NULL, or i64 [N] whose values (when on the host) are in 1..T; the error names the row.
 * Defined in core/gru.c. */
qg_status qg_check_gru_lengths(qg_ctx *ctx, const char *fn, const qg_tensor *lengths, int64_t T, int64_t N);
/* stats NULL, or the observer of the GRU forwards: range f64 [QG_Q_NUM_ACT, 4], counts i64 [QG_Q_NUM_ACT, QG_STATS_BINS]. */
qg_status qg_check_gru_stats(qg_ctx *ctx, const char *fn, const qg_stats *stats);

/* Validates one quantizer: bitwidth 1..32, |e| <= 31, zero point on the grid. */
qg_status qg_check_qspec(qg_ctx *ctx, const char *fn, const char *what, int bitwidth, int is_unsigned, int e, int z);

/* ---- device interface (kernels/device.cu or core/device_none.c) ---- */
int qg_dev_available(void);               /* built with CUDA */
int qg_dev_count(void);
qg_status qg_dev_ctx_init(qg_ctx *ctx);   /* selects the device, creates stream + cuBLAS */
void qg_dev_ctx_fini(qg_ctx *ctx);
qg_status qg_dev_malloc(qg_ctx *ctx, void **ptr, int64_t nbytes);
void qg_dev_free(void *ptr);
/* kind: 0 h2d, 1 d2h, 2 d2d. Synchronous with respect to the host for d2h. */
qg_status qg_dev_memcpy(qg_ctx *ctx, void *dst, const void *src, int64_t nbytes, int kind);
qg_status qg_dev_memset0(qg_ctx *ctx, void *ptr, int64_t nbytes);
qg_status qg_dev_synchronize(qg_ctx *ctx);
/* Records the timer's start (which = 0) or stop (1) event on the stream; after a stop, waits for
 * it and writes the milliseconds between the two to *ms. */
qg_status qg_dev_timer(qg_ctx *ctx, int which, double *ms);
/* Device scratch of at least nbytes (256-byte aligned) on the context's device, valid until the
 * next call; grow-only. Growing synchronizes the stream first (the old buffer may be in use), so
 * call it before enqueuing work, never while a graph is being captured. */
qg_status qg_dev_workspace(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out);
/* A second device buffer like qg_dev_workspace, for what must outlive the workspace's users within
 * one call (a bidirectional layer's direction-1 dx, kernels/int_gru_bidir.cu). */
qg_status qg_dev_spare(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out);
/* Applies ctx->math to the context's cuBLAS handle (TF32 tensor-op math or strict fp32). */
qg_status qg_dev_set_math(qg_ctx *ctx);
/* Releases the float GRU's captured CUDA graphs (kernels/gru.cu; called by qg_dev_ctx_fini). */
void qg_cuda_gru_release(qg_ctx *ctx);
/* Releases the integer GRU's cuBLASLt plans (kernels/int_gru_wx_lt.cuh; called by qg_dev_ctx_fini). */
void qg_cuda_int_gru_release(qg_ctx *ctx);

#define QG_CHECK(expr) do { qg_status s_ = (expr); if (s_ != QG_OK) return s_; } while (0)

#ifdef __cplusplus
}
#endif
#endif

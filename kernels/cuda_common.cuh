/*
 * cuda_common.cuh: what every kernels/<op>.cu file shares: the context's stream and cuBLAS handle,
 * CUDA error to qg_status conversion (nothing raises or exits; the message names the call), the
 * device workspace, and launch-size helpers. Backend functions (qg_cuda_<op>, declared by
 * core/backend.h) trust their arguments: the front door in core/<op>.c has validated them.
 *
 * Rules for kernels (see README "Adding a backend function"):
 *  - everything runs on the context's stream; nothing is allocated or created per call (scratch
 *    comes from qg_dev_workspace, sized before any work is enqueued), so a call can be captured in
 *    a CUDA graph;
 *  - deterministic: no float atomics; reductions run in a fixed order (results may differ from the
 *    CPU's order by rounding, never from run to run);
 *  - files whose float math feeds an integer decision (quantizers, the integer GRU) are compiled
 *    with --fmad=false (CMakeLists.txt) so that nvcc does not contract a*b+c differently from the
 *    host compiler.
 */
#ifndef QGRU_CUDA_COMMON_CUH
#define QGRU_CUDA_COMMON_CUH

#include "../core/backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* 1: the context's streams at the device's greatest priority but the last ext stream (work
 * overlapped with the critical path: the STE backward's dx chunks) at its least, and captured loops
 * instantiated with their nodes' priorities; 0: every stream at the default priority. */
#ifndef QGRU_STREAM_PRIORITY
#define QGRU_STREAM_PRIORITY 1
#endif

static inline cudaStream_t qg_cuda_stream(const qg_ctx *ctx) { return (cudaStream_t)ctx->stream; }
static inline cublasHandle_t qg_cuda_blas(const qg_ctx *ctx) { return (cublasHandle_t)ctx->cublas; }

/* QG_OK for cudaSuccess, else a QG_ERR_DEVICE (QG_ERR_MEMORY for allocation) failure naming fn. */
static inline qg_status qg_cuda_status(qg_ctx *ctx, const char *fn, cudaError_t e) {
  if (e == cudaSuccess) return QG_OK;
  return qg_fail(ctx, e == cudaErrorMemoryAllocation ? QG_ERR_MEMORY : QG_ERR_DEVICE, fn, "CUDA error %s: %s",
                 cudaGetErrorName(e), cudaGetErrorString(e));
}

/* After a kernel launch: the launch error (bad configuration, too much shared memory), if any. */
static inline qg_status qg_cuda_launched(qg_ctx *ctx, const char *fn) {
  return qg_cuda_status(ctx, fn, cudaGetLastError());
}

static inline qg_status qg_cublas_status(qg_ctx *ctx, const char *fn, cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return QG_OK;
  return qg_fail(ctx, s == CUBLAS_STATUS_ALLOC_FAILED ? QG_ERR_MEMORY : QG_ERR_DEVICE, fn, "cuBLAS error %s: %s",
                 cublasGetStatusName(s), cublasGetStatusString(s));
}

/* The compute type of a float GEMM under the context's math mode. */
static inline cublasComputeType_t qg_cuda_f32_compute(const qg_ctx *ctx) {
  return ctx->math == QG_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* ceil(n / d) as a launch dimension. */
static inline unsigned qg_cuda_blocks(int64_t n, int d) { return (unsigned)((n + d - 1) / d); }

/* The float GRU's cache of captured per-step loops (kernels/gru.cu), shared: body(arg) enqueues a
 * loop on st; the first call with a key runs it directly, the second captures it into a CUDA graph
 * and launches that, later ones launch the graph. The key (at most QG_CUDA_GRAPH_KEY bytes, else
 * the body always runs directly) must hold everything the captured work depends on: every pointer,
 * size and kernel argument, the math mode; a caller's keys begin with a tag of its own. */
enum { QG_CUDA_GRAPH_KEY = 2048 };
extern "C" qg_status qg_cuda_graphed(qg_ctx *ctx, cudaStream_t st, const void *key, size_t keylen, qg_status (*body)(void *),
                                     void *arg);

#define QG_CUDA_CHECK(ctx, fn, expr) QG_CHECK(qg_cuda_status((ctx), (fn), (expr)))
#define QG_CUBLAS_CHECK(ctx, fn, expr) QG_CHECK(qg_cublas_status((ctx), (fn), (expr)))

/* Fork and join of the aux stream around work that runs beside the main stream's (inside a
 * captured graph too): after qg_cuda_fork_aux the aux stream waits for everything queued on the
 * main stream so far; after qg_cuda_join_aux the main stream waits for everything queued on the
 * aux stream so far. */
static inline qg_status qg_cuda_fork_aux(qg_ctx *ctx, const char *fn) {
  QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)ctx->ev_fork, qg_cuda_stream(ctx)));
  return qg_cuda_status(ctx, fn, cudaStreamWaitEvent((cudaStream_t)ctx->aux_stream, (cudaEvent_t)ctx->ev_fork, 0));
}
static inline qg_status qg_cuda_join_aux(qg_ctx *ctx, const char *fn) {
  QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)ctx->ev_join, (cudaStream_t)ctx->aux_stream));
  return qg_cuda_status(ctx, fn, cudaStreamWaitEvent(qg_cuda_stream(ctx), (cudaEvent_t)ctx->ev_join, 0));
}

#endif

/*
 * device.cu: the CUDA side of the device interface (core/internal.h): device selection, the
 * context's stream and cuBLAS handle, device memory and copies. The GRU, loss and optimizer
 * kernels arrive in their own files; this one only moves memory and owns handles.
 * The context's stream is a non-blocking stream created once per context; every copy is ordered
 * on it, and device-to-host copies synchronize it so the host sees the data on return. A second
 * (aux) stream with its own cuBLAS handle and two events, also created once per context, let a
 * bidirectional GRU layer run its two directions at the same time (kernels/gru.cu): the aux
 * stream waits for the main one (ev_fork) and the main one for the aux one (ev_join) within one
 * call, so callers only ever see the main stream. QG_EXT_STREAMS more (with handles, and an event
 * per stream, ev_mark) serve the integer GRU's STE backward (kernels/int_gru_backward.cu). Two more events (timing on) serve
 * qg_ctx_timer_start / _stop.
 */
#include "cuda_common.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* cuBLAS workspace per handle (what cuBLAS itself takes by default on Hopper). */
#define QG_BLAS_WORKSPACE ((size_t)32 << 20)

static qg_status cuda_fail(qg_ctx *ctx, const char *fn, cudaError_t e) {
  return qg_fail(ctx, e == cudaErrorMemoryAllocation ? QG_ERR_MEMORY : QG_ERR_DEVICE, fn, "CUDA error %s: %s",
                 cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" int qg_dev_available(void) { return 1; }

extern "C" int qg_dev_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
  return n;
}

extern "C" qg_status qg_dev_ctx_init(qg_ctx *ctx) {
  int n = qg_dev_count();
  if (n == 0) return qg_fail(ctx, QG_ERR_NO_CUDA, "qg_ctx_create", "no CUDA device is visible");
  if (ctx->device_index < 0 || ctx->device_index >= n)
    return qg_fail(ctx, QG_ERR_ARG, "qg_ctx_create", "device index %d out of range [0, %d)", ctx->device_index, n);
  cudaError_t e = cudaSetDevice(ctx->device_index);
  if (e != cudaSuccess) return cuda_fail(ctx, "qg_ctx_create", e);
  /* The streams: main (every call's), aux (a bidirectional layer's second direction, the STE
   * backward's second row group), ext[0..] (the STE backward's work beside its recurrence), each
   * with a cuBLAS handle and its own workspace, all created now so that nothing is created per call
   * (a call may be captured into a CUDA graph, where allocation is not allowed). Priorities
   * (QGRU_STREAM_PRIORITY, cuda_common.cuh): the last ext stream carries work off the critical path,
   * at the device's least priority; the others at its greatest, so that the block scheduler serves
   * the recurrence's kernels first (H200, large strict STE backward: 4.92 -> 4.74 ms with the side
   * stream; bench/cuda_int_gru.md, session 21). */
  int prio_lo = 0, prio_hi = 0;
  if (QGRU_STREAM_PRIORITY && cudaDeviceGetStreamPriorityRange(&prio_lo, &prio_hi) != cudaSuccess) {
    (void)cudaGetLastError();
    prio_lo = prio_hi = 0;
  }
  void **streams[2 + QG_EXT_STREAMS] = {&ctx->stream, &ctx->aux_stream}, **handles[2 + QG_EXT_STREAMS] = {&ctx->cublas, &ctx->aux_cublas};
  for (int i = 0; i < QG_EXT_STREAMS; i++) { streams[2 + i] = &ctx->ext_stream[i]; handles[2 + i] = &ctx->ext_cublas[i]; }
  for (int i = 0; i < 2 + QG_EXT_STREAMS; i++) {
    cudaStream_t s;
    e = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, i == 1 + QG_EXT_STREAMS ? prio_lo : prio_hi);
    if (e != cudaSuccess) { qg_dev_ctx_fini(ctx); return cuda_fail(ctx, "qg_ctx_create", e); }
    *streams[i] = s;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      qg_dev_ctx_fini(ctx);
      return qg_fail(ctx, QG_ERR_DEVICE, "qg_ctx_create", "cublasCreate failed (handle %d)", i);
    }
    *handles[i] = h;
    cublasSetStream(h, s);
    cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
    e = cudaMalloc(&ctx->blas_ws[i], QG_BLAS_WORKSPACE);
    if (e != cudaSuccess || cublasSetWorkspace(h, ctx->blas_ws[i], QG_BLAS_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
      if (e != cudaSuccess) ctx->blas_ws[i] = NULL;
      qg_dev_ctx_fini(ctx);
      return e != cudaSuccess ? cuda_fail(ctx, "qg_ctx_create", e) : qg_fail(ctx, QG_ERR_DEVICE, "qg_ctx_create", "cublasSetWorkspace failed");
    }
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) { qg_dev_ctx_fini(ctx); return cuda_fail(ctx, "qg_ctx_create", e); }
    ctx->ev_mark[i] = ev;
  }
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; i++) {
    e = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) { if (i) cudaEventDestroy(ev[0]); qg_dev_ctx_fini(ctx); return cuda_fail(ctx, "qg_ctx_create", e); }
  }
  ctx->ev_fork = ev[0];
  ctx->ev_join = ev[1];
  for (int i = 0; i < 2; i++) {   /* qg_ctx_timer_start / _stop */
    cudaEvent_t t;
    e = cudaEventCreate(&t);
    if (e != cudaSuccess) { qg_dev_ctx_fini(ctx); return cuda_fail(ctx, "qg_ctx_create", e); }
    ctx->ev_timer[i] = t;
  }
  int v = 0;
  e = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, ctx->device_index);
  ctx->sm_count = e == cudaSuccess ? v : 1;
  e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device_index);
  ctx->smem_optin = e == cudaSuccess ? v : 48 * 1024;
  return qg_dev_set_math(ctx);
}

extern "C" void qg_dev_ctx_fini(qg_ctx *ctx) {
  void **streams[2 + QG_EXT_STREAMS] = {&ctx->stream, &ctx->aux_stream}, **handles[2 + QG_EXT_STREAMS] = {&ctx->cublas, &ctx->aux_cublas};
  for (int i = 0; i < QG_EXT_STREAMS; i++) { streams[2 + i] = &ctx->ext_stream[i]; handles[2 + i] = &ctx->ext_cublas[i]; }
  for (int i = 0; i < 2 + QG_EXT_STREAMS; i++)
    if (*streams[i]) cudaStreamSynchronize((cudaStream_t)*streams[i]);
  qg_cuda_gru_release(ctx);
  qg_cuda_int_gru_release(ctx);
  for (int i = 0; i < 2 + QG_EXT_STREAMS; i++) {
    if (*handles[i]) cublasDestroy((cublasHandle_t)*handles[i]);
    if (ctx->blas_ws[i]) cudaFree(ctx->blas_ws[i]);
    if (*streams[i]) cudaStreamDestroy((cudaStream_t)*streams[i]);
    if (ctx->ev_mark[i]) cudaEventDestroy((cudaEvent_t)ctx->ev_mark[i]);
    *handles[i] = *streams[i] = ctx->blas_ws[i] = ctx->ev_mark[i] = NULL;
  }
  if (ctx->ev_fork) cudaEventDestroy((cudaEvent_t)ctx->ev_fork);
  if (ctx->ev_join) cudaEventDestroy((cudaEvent_t)ctx->ev_join);
  for (int i = 0; i < 2; i++)
    if (ctx->ev_timer[i]) { cudaEventDestroy((cudaEvent_t)ctx->ev_timer[i]); ctx->ev_timer[i] = NULL; }
  if (ctx->dev_workspace) cudaFree(ctx->dev_workspace);
  if (ctx->dev_spare) cudaFree(ctx->dev_spare);
  ctx->dev_spare = NULL;
  ctx->dev_workspace = NULL;
  ctx->ev_fork = ctx->ev_join = NULL;
}

extern "C" qg_status qg_dev_malloc(qg_ctx *ctx, void **ptr, int64_t nbytes) {
  cudaError_t e = cudaMalloc(ptr, (size_t)nbytes);
  if (e != cudaSuccess) { *ptr = NULL; return cuda_fail(ctx, "qg_dev_malloc", e); }
  return QG_OK;
}

extern "C" void qg_dev_free(void *ptr) {
  if (ptr) cudaFree(ptr);
}

extern "C" qg_status qg_dev_memcpy(qg_ctx *ctx, void *dst, const void *src, int64_t nbytes, int kind) {
  static const cudaMemcpyKind kinds[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
  if (kind < 0 || kind > 2) return qg_fail(ctx, QG_ERR_ARG, "qg_dev_memcpy", "bad copy kind %d", kind);
  cudaStream_t s = (cudaStream_t)ctx->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)nbytes, kinds[kind], s);
  /* Host buffers may be pageable or reused right after the call: finish the copy before return. */
  if (e == cudaSuccess && kind != 2) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? QG_OK : cuda_fail(ctx, "qg_dev_memcpy", e);
}

extern "C" qg_status qg_dev_memset0(qg_ctx *ctx, void *ptr, int64_t nbytes) {
  cudaError_t e = cudaMemsetAsync(ptr, 0, (size_t)nbytes, (cudaStream_t)ctx->stream);
  return e == cudaSuccess ? QG_OK : cuda_fail(ctx, "qg_dev_memset0", e);
}

extern "C" qg_status qg_dev_synchronize(qg_ctx *ctx) {
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)ctx->stream);
  return e == cudaSuccess ? QG_OK : cuda_fail(ctx, "qg_ctx_synchronize", e);
}

extern "C" qg_status qg_dev_timer(qg_ctx *ctx, int which, double *ms) {
  cudaError_t e = cudaEventRecord((cudaEvent_t)ctx->ev_timer[which], (cudaStream_t)ctx->stream);
  if (e == cudaSuccess && which == 1) e = cudaEventSynchronize((cudaEvent_t)ctx->ev_timer[1]);
  float f = 0.0f;
  if (e == cudaSuccess && which == 1) e = cudaEventElapsedTime(&f, (cudaEvent_t)ctx->ev_timer[0], (cudaEvent_t)ctx->ev_timer[1]);
  if (e != cudaSuccess) return cuda_fail(ctx, which ? "qg_ctx_timer_stop" : "qg_ctx_timer_start", e);
  if (ms) *ms = (double)f;
  return QG_OK;
}

extern "C" qg_status qg_dev_set_math(qg_ctx *ctx) {
  if (!ctx->cublas) return QG_OK;
  /* Strict: cuBLAS default math, fp32 GEMMs without TF32 (what PyTorch runs with allow_tf32 off). */
  cublasMath_t m = ctx->math == QG_MATH_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
  const void *handles[2 + QG_EXT_STREAMS] = {ctx->cublas, ctx->aux_cublas};
  for (int i = 0; i < QG_EXT_STREAMS; i++) handles[2 + i] = ctx->ext_cublas[i];
  for (int i = 0; i < 2 + QG_EXT_STREAMS; i++)
    if (handles[i] && cublasSetMathMode((cublasHandle_t)handles[i], m) != CUBLAS_STATUS_SUCCESS)
      return qg_fail(ctx, QG_ERR_DEVICE, "qg_ctx_set_math", "cublasSetMathMode failed (handle %d)", i);
  return QG_OK;
}

/* Grows *buf (of *have bytes) to at least nbytes: qg_dev_workspace's and qg_dev_spare's rule. */
static qg_status grow_buffer(qg_ctx *ctx, const char *fn, void **buf, int64_t *have, int64_t nbytes, void **out) {
  if (nbytes < 0) return qg_fail(ctx, QG_ERR_ARG, fn, "negative device workspace size %lld", (long long)nbytes);
  if (nbytes > *have || !*buf) {
    int64_t want = nbytes + nbytes / 4 + 256;
    want = (want + 255) & ~(int64_t)255;
    /* The old buffer may still be read by queued kernels: let them finish before freeing it. */
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)ctx->stream);
    if (e != cudaSuccess) return cuda_fail(ctx, fn, e);
    if (*buf) cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    e = cudaMalloc(buf, (size_t)want);
    if (e != cudaSuccess) { *buf = NULL; return cuda_fail(ctx, fn, e); }
    *have = want;
  }
  *out = *buf;
  return QG_OK;
}

extern "C" qg_status qg_dev_workspace(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out) {
  return grow_buffer(ctx, fn, &ctx->dev_workspace, &ctx->dev_workspace_bytes, nbytes, out);
}

extern "C" qg_status qg_dev_spare(qg_ctx *ctx, const char *fn, int64_t nbytes, void **out) {
  return grow_buffer(ctx, fn, &ctx->dev_spare, &ctx->dev_spare_bytes, nbytes, out);
}

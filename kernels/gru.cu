/*
 * gru.cu: the CUDA backend of the float GRU (qg_gru_forward / qg_gru_backward and their
 * two-direction forms, core/gru.c): same formulation, shapes, variable-length rules and saved
 * state as core/gru_cpu.c, so the CPU and the GPU give the same results up to float rounding.
 *
 * Both passes start (forward) or end (backward) with the big GEMMs through cuBLAS in the
 * context's math mode (qg_cuda_f32_compute: strict fp32 or TF32):
 *   forward:  Wx [T*N, 3H] = x W^T for every step at once;
 *   backward: dx += dp W, dW += dp^T x, dR += dq^T hs[0:T], and dbx, dbr as column sums of dp and
 *             dq in a fixed order (two-stage reduction, no atomics: the same bits every run).
 * The recurrence in between runs one of two ways (ctx->kernel_path; AUTO picks by the estimates
 * of pick_persist):
 *   - persistent (kernels/gru_persist.cuh): one launch for all T steps; R on chip in the shared
 *     memory of a thread-block cluster, h (forward) or dq (backward) exchanged through distributed
 *     shared memory with one cluster barrier per step; independent clusters for groups of batch
 *     rows. Used where a cluster of up to 16 blocks can hold the shape; forcing it elsewhere is a
 *     QG_ERR_UNSUPPORTED error naming the limit.
 *   - fallback: per step one cuBLAS GEMM (R h, or dq R) and one fused pointwise kernel.
 * Bidirectional layers (the _bidir entry points) run both directions at the same time: the
 * persistent path covers both in one launch (blockIdx.y is the direction); the fallback path runs
 * direction 1 on the context's aux stream and cuBLAS handle, forked from and joined back to the
 * main stream with the context's two events (kernels/device.cu), so the call is ordered on the main
 * stream like every other. dx, shared by both directions, gets direction 0's product and then
 * direction 1's on the main stream (a fixed order).
 * Nothing is allocated per call (scratch from qg_dev_workspace, grown before any work is queued),
 * everything is on the context's streams, and no float atomics are used except the statistics
 * observer's order-independent min/max and integer counts (kernels/stats.cuh).
 * Device-side lengths are clamped to 0..T (the front door checks host-side values; a device
 * tensor's values cannot be read without a synchronisation).
 */
#include "cuda_common.cuh"
#include "gru_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------------------ */

static qg_status gemm(qg_ctx *ctx, cublasHandle_t h, const char *fn, cublasOperation_t ta, cublasOperation_t tb, int m,
                      int n, int k, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  const float one = 1.0f;
  return qg_cublas_status(ctx, fn,
                          cublasGemmEx(h, ta, tb, m, n, k, &one, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C,
                                       CUDA_R_32F, ldc, qg_cuda_f32_compute(ctx), CUBLAS_GEMM_DEFAULT));
}

/* Wx [T*N, 3H] (row-major) = x [T*N, C] W^T (W [3H, C]); zeros when C == 0. */
static qg_status gemm_wx(qg_ctx *ctx, cublasHandle_t h, cudaStream_t st, const char *fn, float *Wx, const float *x,
                         const float *W, int64_t TN, int64_t C, int64_t H) {
  if (TN == 0) return QG_OK;
  if (C == 0) return qg_cuda_status(ctx, fn, cudaMemsetAsync(Wx, 0, (size_t)(TN * 3 * H) * sizeof(float), st));
  return gemm(ctx, h, fn, CUBLAS_OP_T, CUBLAS_OP_N, (int)(3 * H), (int)TN, (int)C, W, (int)C, x, (int)C, 0.0f, Wx,
              (int)(3 * H));
}

static int64_t align_floats(int64_t n) { return (n + 63) & ~(int64_t)63; }   /* 256-byte pieces */

/* The streams and cuBLAS handles of direction d (1 runs on the aux stream when two directions run
 * on the fallback path). */
static cudaStream_t dir_stream(const qg_ctx *ctx, int d) { return d ? (cudaStream_t)ctx->aux_stream : qg_cuda_stream(ctx); }
static cublasHandle_t dir_blas(const qg_ctx *ctx, int d) { return d ? (cublasHandle_t)ctx->aux_cublas : qg_cuda_blas(ctx); }

/* ---- captured fallback loops ------------------------------------------------------------------------
 * The fallback's per-step launches (a cuBLAS GEMM and a pointwise kernel per step) are host-bound
 * when launched one by one. A loop whose arguments (every pointer and size, the math mode; the key)
 * were seen in an earlier call is captured into a CUDA graph on its stream and replayed; from then
 * on an identical call is one graph launch. A loop seen once runs directly (a one-off call does not
 * pay for the capture), and a capture that fails for any reason falls back to direct launches. */
enum { GRAPH_SLOTS = 24, GRAPH_KEY = QG_CUDA_GRAPH_KEY };
struct GraphSlot {
  unsigned char key[GRAPH_KEY];
  size_t keylen;
  cudaGraphExec_t exec;
  int state;   /* 0 empty, 1 seen once, 2 captured, 3 capture failed (run directly) */
  uint64_t used;
};
struct GraphCache {
  GraphSlot slot[GRAPH_SLOTS];
  uint64_t tick;
};

extern "C" void qg_cuda_gru_release(qg_ctx *ctx) {
  GraphCache *gc = (GraphCache *)ctx->gru_graphs;
  if (!gc) return;
  for (int i = 0; i < GRAPH_SLOTS; i++)
    if (gc->slot[i].state == 2) cudaGraphExecDestroy(gc->slot[i].exec);
  free(gc);
  ctx->gru_graphs = NULL;
}

template <typename F>
static qg_status graphed(qg_ctx *ctx, cudaStream_t st, const void *key, size_t keylen, F &&body) {
  if (keylen > GRAPH_KEY) return body();
  GraphCache *gc = (GraphCache *)ctx->gru_graphs;
  if (!gc) {
    gc = (GraphCache *)calloc(1, sizeof *gc);
    if (!gc) return body();
    ctx->gru_graphs = gc;
  }
  gc->tick++;
  GraphSlot *hit = NULL, *victim = &gc->slot[0];
  for (int i = 0; i < GRAPH_SLOTS; i++) {
    GraphSlot *g = &gc->slot[i];
    if (g->state && g->keylen == keylen && memcmp(g->key, key, keylen) == 0) { hit = g; break; }
    if (!g->state || (victim->state && g->used < victim->used)) victim = g;
  }
  if (!hit) {   /* first sight: remember it, run directly */
    if (victim->state == 2) cudaGraphExecDestroy(victim->exec);
    memcpy(victim->key, key, keylen);
    victim->keylen = keylen;
    victim->state = 1;
    victim->used = gc->tick;
    return body();
  }
  hit->used = gc->tick;
  if (hit->state == 3) return body();
  if (hit->state == 1) {   /* second sight: capture */
    cudaGraph_t graph = NULL;
    hit->state = 3;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      return body();
    }
    const qg_status bs = body();
    const cudaError_t ce = cudaStreamEndCapture(st, &graph);
    cudaGraphExec_t exec = NULL;
    /* with stream priorities (QGRU_STREAM_PRIORITY), each kernel node keeps its capturing stream's:
     * the STE backward's side stream runs below its recurrence (kernels/int_gru_backward.cu) */
    const unsigned long long flags = QGRU_STREAM_PRIORITY ? cudaGraphInstantiateFlagUseNodePriority : 0;
    if (bs != QG_OK || ce != cudaSuccess || !graph || cudaGraphInstantiateWithFlags(&exec, graph, flags) != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return body();
    }
    cudaGraphDestroy(graph);
    hit->exec = exec;
    hit->state = 2;
  }
  return qg_cuda_status(ctx, "qg_gru (graph launch)", cudaGraphLaunch(hit->exec, st));
}

/* The same cache for other files' per-step loops (cuda_common.cuh; the integer GRU's STE backward):
 * keys must not collide with this file's (they start with a tag of their own). */
extern "C" qg_status qg_cuda_graphed(qg_ctx *ctx, cudaStream_t st, const void *key, size_t keylen, qg_status (*body)(void *),
                                     void *arg) {
  return graphed(ctx, st, key, keylen, [&]() -> qg_status { return body(arg); });
}

/* ---- fallback pointwise kernels (one thread per (row, unit)) ----------------------------------- */

template <bool OBS, bool TRAIN>
__global__ void fwd_point_kernel(FwdArgs a, int dir, int s, const float *__restrict__ Rh) {
  const FwdDir D = dir ? a.d1 : a.d0;
  const int H = a.H, N = a.N;
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (int64_t)N * H) return;
  const int n = (int)(idx / H), j = (int)(idx % H);
  const int L = gru_row_len(a.len, n, a.T);
  const float hp = D.hs[((int64_t)s * N + n) * H + j];
  float *hn = D.hs + ((int64_t)(s + 1) * N + n) * H + j;
  if (s >= L) {   /* padded: the state stays, y at time index s is 0 */
    *hn = hp;
    D.y[((int64_t)s * N + n) * a.Hy + D.y_offset + j] = 0.0f;
    if (TRAIN) {
      float *g = D.gates + ((int64_t)s * N + n) * 4 * H + j;
      g[0] = 0.0f; g[H] = 0.0f; g[2 * H] = 0.0f; g[3 * H] = 0.0f;
    }
    return;
  }
  const int t = D.reverse ? L - 1 - s : s;
  const float *wx = D.Wx + ((int64_t)t * N + n) * 3 * H + j;
  const float *rh = Rh + (int64_t)n * 3 * H + j;
  float z, r, g, q;
  const float h = gru_cell<OBS>(wx[0], wx[H], wx[2 * H], rh[0], rh[H], rh[2 * H], D.bx[j], D.bx[H + j], D.bx[2 * H + j],
                                D.br[j], D.br[H + j], D.br[2 * H + j], hp, z, r, g, q, a.range, a.counts);
  *hn = h;
  D.y[((int64_t)t * N + n) * a.Hy + D.y_offset + j] = h;
  if (TRAIN) {
    float *gr = D.gates + ((int64_t)s * N + n) * 4 * H + j;
    gr[0] = z; gr[H] = r; gr[2 * H] = g; gr[3 * H] = q;
  }
}

/* One backward step: dp (time index order), dq (step order) and dh_next = z dht (or dh for a
 * padded step); the GEMM dh_next += dq R follows. */
__global__ void bwd_point_kernel(BwdArgs a, int dir, int s, const float *__restrict__ dh, float *__restrict__ dh_next) {
  const BwdDir D = dir ? a.d1 : a.d0;
  const int H = a.H, N = a.N;
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (int64_t)N * H) return;
  const int n = (int)(idx / H), j = (int)(idx % H);
  const int L = gru_row_len(a.len, n, a.T);
  const int64_t H3 = 3 * (int64_t)H;
  float *dq = D.dq + ((int64_t)s * N + n) * H3 + j;
  if (s >= L) {   /* padded: the state gradient passes through; no gate gradients */
    dh_next[idx] = dh[idx];
    float *dp = D.dp + ((int64_t)s * N + n) * H3 + j;
    dp[0] = 0.0f; dp[H] = 0.0f; dp[2 * H] = 0.0f;
    dq[0] = 0.0f; dq[H] = 0.0f; dq[2 * H] = 0.0f;
    return;
  }
  const int t = D.reverse ? L - 1 - s : s;
  const float *gr = D.gates + ((int64_t)s * N + n) * 4 * H + j;
  const float hp = D.hs[((int64_t)s * N + n) * H + j];
  const float dht = D.dy ? dh[idx] + D.dy[((int64_t)t * N + n) * a.Hy + D.y_offset + j] : dh[idx];
  float dz, dr, dg, keep;
  gru_cell_backward(gr[0], gr[H], gr[2 * H], gr[3 * H], hp, dht, dz, dr, dg, keep);
  float *dp = D.dp + ((int64_t)t * N + n) * H3 + j;
  dp[0] = dz; dp[H] = dr; dp[2 * H] = dg;
  dq[0] = dz; dq[H] = dr; dq[2 * H] = dg * gr[H];
  dh_next[idx] = keep;
}

/* Statistics of the inputs (QUANT_SPEC.md section 5, as core/gru_cpu.c observe_inputs): x and
 * x W^T at each row's valid time indices, and h0. */
__global__ void observe_inputs_kernel(const float *__restrict__ x, const float *__restrict__ Wx, const float *__restrict__ h0,
                                      const int64_t *__restrict__ len, int T, int N, int C, int H, double *range,
                                      int64_t *counts) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nx = (int64_t)T * N * C, nw = (int64_t)T * N * 3 * H, nh = h0 ? (int64_t)N * H : 0;
  for (int64_t i = i0; i < nx; i += stride) {
    const int64_t row = i / C;   /* t * N + n */
    if ((int)(row / N) < gru_row_len(len, (int)(row % N), T))
      qg_stats_observe_dev(range + 4 * QG_Q_INPUT_X, counts + (int64_t)QG_Q_INPUT_X * QG_STATS_BINS, (double)x[i]);
  }
  for (int64_t i = i0; i < nw; i += stride) {
    const int64_t row = i / (3 * H);
    if ((int)(row / N) < gru_row_len(len, (int)(row % N), T))
      qg_stats_observe_dev(range + 4 * QG_Q_MATMUL_WX, counts + (int64_t)QG_Q_MATMUL_WX * QG_STATS_BINS, (double)Wx[i]);
  }
  for (int64_t i = i0; i < nh; i += stride)
    qg_stats_observe_dev(range + 4 * QG_Q_OUTPUT_H, counts + (int64_t)QG_Q_OUTPUT_H * QG_STATS_BINS, (double)h0[i]);
}

/* ---- bias gradients: column sums in a fixed order -------------------------------------------------
 * out[c] += sum over rows r of src[r, c] for up to 4 jobs at once (blockIdx.z): stage 1 sums chunks
 * of rows (8 row lanes, then the lanes in order), stage 2 adds the chunks in order. */
struct ColJob {
  const float *src;   /* [M, cols] */
  float *out;         /* [cols], accumulated */
  float *part;        /* [chunks, cols] scratch */
};
struct ColJobs {
  ColJob j[4];
  int M, cols, chunks, rows_per_chunk;
};

__global__ void colsum_partial_kernel(ColJobs J) {
  const ColJob jb = blockIdx.z == 0 ? J.j[0] : blockIdx.z == 1 ? J.j[1] : blockIdx.z == 2 ? J.j[2] : J.j[3];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * J.rows_per_chunk;
  const int r1 = min(J.M, r0 + J.rows_per_chunk);
  float s = 0.0f;
  if (col < J.cols)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) s += jb.src[(int64_t)r * J.cols + col];
  __shared__ float sh[8][33];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < J.cols) {
    float t = 0.0f;
    for (int q = 0; q < 8; q++) t += sh[q][threadIdx.x];
    jb.part[(int64_t)blockIdx.y * J.cols + col] = t;
  }
}

__global__ void colsum_final_kernel(ColJobs J) {
  const ColJob jb = blockIdx.z == 0 ? J.j[0] : blockIdx.z == 1 ? J.j[1] : blockIdx.z == 2 ? J.j[2] : J.j[3];
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= J.cols) return;
  float t = 0.0f;
  for (int c = 0; c < J.chunks; c++) t += jb.part[(int64_t)c * J.cols + col];
  jb.out[col] += t;
}

static void colsum_shape(int64_t M, int *chunks, int *rows_per_chunk) {
  int c = (int)((M + 255) / 256);
  c = c < 1 ? 1 : (c > 128 ? 128 : c);
  *chunks = c;
  *rows_per_chunk = (int)((M + c - 1) / c);
}

static qg_status colsum(qg_ctx *ctx, cudaStream_t st, const char *fn, ColJobs J, int njobs) {
  if (J.M == 0 || J.cols == 0 || njobs == 0) return QG_OK;
  colsum_partial_kernel<<<dim3(qg_cuda_blocks(J.cols, 32), J.chunks, njobs), dim3(32, 8), 0, st>>>(J);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  colsum_final_kernel<<<dim3(qg_cuda_blocks(J.cols, 256), 1, njobs), 256, 0, st>>>(J);
  return qg_cuda_launched(ctx, fn);
}

/* ---- which recurrence ----------------------------------------------------------------------------- */

/* Cost of the fallback recurrence per step (us), fitted to H100 timings of the captured loop
 * (bench/gpu.md: about 3.7 us at long-kws, 13 at medium, 54 at large in fp32): a fixed cost for
 * the two graph nodes and the small GEMM's latency, plus its arithmetic at the rate of the math
 * mode. */
static double fallback_step_us(const qg_ctx *ctx, int64_t N, int64_t H) {
  const double flops = 2.0 * (double)N * 3.0 * (double)H * (double)H;
  return 5.0 + flops / (ctx->math == QG_MATH_TF32 ? 100e6 : 25e6);
}

/* Chooses the persistent configuration for the recurrence (or none: returns 0 and fills why). */
static int choose_persist(qg_ctx *ctx, int bwd, int64_t T, int64_t N, int64_t H, int ndirs, int observe, PCfg *out,
                          double *est_us, char *why, size_t why_n) {
  int ok = persist_pick(ctx, bwd, (int)T, (int)N, (int)H, ndirs, observe, out, est_us);
  if (!ok && ctx->persist_cluster > 0)
    snprintf(why, why_n,
             "the persistent recurrent kernel cannot run H = %lld with the forced shape of %d blocks per cluster and %d "
             "rows (qg_ctx_set_persist_shape; shared memory per block: %d bytes)",
             (long long)H, ctx->persist_cluster, ctx->persist_rows, ctx->smem_optin);
  else if (!ok)
    snprintf(why, why_n,
             "the persistent recurrent kernel cannot hold H = %lld: R's share of a block in a cluster of up to %d blocks "
             "(%lld bytes with 16) plus the exchanged state exceeds the %d bytes of shared memory per block",
             (long long)H, PERSIST_MAX_CLUSTER, (long long)(3 * H * ((H + 15) / 16) * 4), ctx->smem_optin);
  return ok;
}

/* Whether this call runs the persistent recurrence (1), the fallback (0), or fails (-1). */
static int use_persistent(qg_ctx *ctx, const char *fn, int bwd, int64_t T, int64_t N, int64_t H, int ndirs, int observe,
                          PCfg *cfg, qg_status *st) {
  *st = QG_OK;
  if (ctx->kernel_path == QG_PATH_FALLBACK || T == 0) return 0;
  char why[256];
  double est = 0;
  const int fits = choose_persist(ctx, bwd, T, N, H, ndirs, observe, cfg, &est, why, sizeof why);
  if (ctx->kernel_path == QG_PATH_PERSISTENT) {
    if (!fits) { *st = qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%s (use kernel path 'auto' or 'fallback')", why); return -1; }
    return 1;
  }
  if (!fits) return 0;
  if (ctx->persist_cluster > 0) return 1;   /* a forced shape that fits */
  /* the fallback runs the directions on two streams at the same time */
  const double fb = (double)T * fallback_step_us(ctx, N, H) * (bwd ? 1.1 : 1.0);
  return est <= fb ? 1 : 0;
}

/* ---- forward ----------------------------------------------------------------------------------------- */

/* Fallback recurrence of direction dir on its stream (the aux one for direction 1: only
 * bidirectional calls have one). */
static qg_status fwd_fallback(qg_ctx *ctx, const char *fn, const FwdArgs &a, int dir, float *Rh, int observe, int train) {
  const FwdDir D = dir ? a.d1 : a.d0;
  cudaStream_t st = dir_stream(ctx, dir);
  cublasHandle_t hb = dir_blas(ctx, dir);
  const int64_t N = a.N, H = a.H, NH = N * H;
  const unsigned blocks = qg_cuda_blocks(NH, 256);
  auto body = [&]() -> qg_status {
    for (int s = 0; s < a.T; s++) {
      QG_CHECK(gemm(ctx, hb, fn, CUBLAS_OP_T, CUBLAS_OP_N, (int)(3 * H), (int)N, (int)H, D.R, (int)H,
                    D.hs + (int64_t)s * NH, (int)H, 0.0f, Rh, (int)(3 * H)));
      if (observe)
        train ? fwd_point_kernel<true, true><<<blocks, 256, 0, st>>>(a, dir, s, Rh)
              : fwd_point_kernel<true, false><<<blocks, 256, 0, st>>>(a, dir, s, Rh);
      else
        train ? fwd_point_kernel<false, true><<<blocks, 256, 0, st>>>(a, dir, s, Rh)
              : fwd_point_kernel<false, false><<<blocks, 256, 0, st>>>(a, dir, s, Rh);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    return QG_OK;
  };
  struct { FwdArgs a; const float *Rh; int dir, observe, train, math, kind; } key;
  memset(&key, 0, sizeof key);
  key.a = a; key.Rh = Rh; key.dir = dir; key.observe = observe; key.train = train; key.math = ctx->math; key.kind = 1;
  return graphed(ctx, st, &key, sizeof key, body);
}

/* The forward of ndirs directions (1, or 2 = a bidirectional layer). dirs[d] holds direction d's
 * tensors; x, lengths and y are shared. */
typedef struct {
  qg_tensor *hs, *gates;
  const qg_tensor *W, *R, *bx, *br, *h0;
  int y_offset, reverse;
} fwd_dir_in;

static qg_status gru_forward_dirs(qg_ctx *ctx, const char *fn, int ndirs, qg_tensor *y, const fwd_dir_in *dirs,
                                  const qg_stats *stats, const qg_tensor *x, const qg_tensor *lengths) {
  const int64_t T = x->dims[0], N = x->dims[1], C = x->dims[2], H = dirs[0].R->dims[1];
  if (N == 0 || H == 0) return QG_OK;
  const int train = dirs[0].gates != NULL, observe = stats != NULL;
  const int64_t TN = T * N, H3 = 3 * H;
  const int64_t wx_f = align_floats(TN * H3), rh_f = align_floats(N * H3);
  PCfg cfg;
  qg_status st;
  const int persist = use_persistent(ctx, fn, 0, T, N, H, ndirs, observe, &cfg, &st);
  if (persist < 0) return st;
  float *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, (int64_t)ndirs * (wx_f + rh_f) * (int64_t)sizeof(float), (void **)&ws));

  FwdArgs a;
  memset(&a, 0, sizeof a);
  a.T = (int)T; a.N = (int)N; a.H = (int)H; a.Hy = (int)y->dims[2];
  a.len = lengths ? (const int64_t *)lengths->data : NULL;
  a.range = observe ? (double *)stats->range->data : NULL;
  a.counts = observe ? (int64_t *)stats->counts->data : NULL;
  for (int d = 0; d < ndirs; d++) {
    FwdDir &D = d ? a.d1 : a.d0;
    D.Wx = ws + d * wx_f;
    D.R = (const float *)dirs[d].R->data;
    D.bx = (const float *)dirs[d].bx->data;
    D.br = (const float *)dirs[d].br->data;
    D.h0 = dirs[d].h0 ? (const float *)dirs[d].h0->data : NULL;
    D.y = (float *)y->data;
    D.hs = (float *)dirs[d].hs->data;
    D.gates = train ? (float *)dirs[d].gates->data : NULL;
    D.y_offset = dirs[d].y_offset;
    D.reverse = dirs[d].reverse;
  }
  const float *xp = (const float *)x->data;
  const int two_streams = ndirs == 2 && !persist;
  if (two_streams) QG_CHECK(qg_cuda_fork_aux(ctx, fn));
  for (int d = 0; d < ndirs; d++) {
    const int sd = two_streams ? d : 0;
    const FwdDir &D = d ? a.d1 : a.d0;
    QG_CHECK(gemm_wx(ctx, dir_blas(ctx, sd), dir_stream(ctx, sd), fn, (float *)D.Wx, xp, (const float *)dirs[d].W->data,
                     TN, C, H));
    if (observe) {
      const int64_t work = TN * (C + H3) + N * H;
      const unsigned blocks = qg_cuda_blocks(work, 256) < 1024 ? qg_cuda_blocks(work, 256) : 1024;
      observe_inputs_kernel<<<blocks, 256, 0, dir_stream(ctx, sd)>>>(xp, D.Wx, D.h0, a.len, (int)T, (int)N, (int)C, (int)H,
                                                                      a.range, a.counts);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    if (!persist) {   /* hs[0] = h0, then the per-step recurrence on this direction's stream */
      cudaStream_t s = dir_stream(ctx, sd);
      if (D.h0) QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(D.hs, D.h0, (size_t)(N * H) * sizeof(float), cudaMemcpyDeviceToDevice, s));
      else QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(D.hs, 0, (size_t)(N * H) * sizeof(float), s));
      QG_CHECK(fwd_fallback(ctx, fn, a, d, ws + ndirs * wx_f + d * rh_f, observe, train));
    }
  }
  if (two_streams) QG_CHECK(qg_cuda_join_aux(ctx, fn));
  if (persist) return persist_forward(ctx, fn, a, cfg, ndirs, observe, train);
  return QG_OK;
}

extern "C" qg_status qg_cuda_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates,
                                         const qg_stats *stats, const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                                         const qg_tensor *bx, const qg_tensor *br, const qg_tensor *h0,
                                         const qg_tensor *lengths, int reverse) {
  fwd_dir_in d = {hs, gates, W, R, bx, br, h0, y_offset, reverse};
  return gru_forward_dirs(ctx, "qg_gru_forward", 1, y, &d, stats, x, lengths);
}

extern "C" qg_status qg_cuda_gru_forward_bidir(qg_ctx *ctx, qg_tensor *y, qg_tensor *const *hs, qg_tensor *const *gates,
                                               const qg_tensor *x, const qg_tensor *const *W, const qg_tensor *const *R,
                                               const qg_tensor *const *bx, const qg_tensor *const *br,
                                               const qg_tensor *const *h0, const qg_tensor *lengths) {
  const int H = (int)R[0]->dims[1];
  fwd_dir_in d[2];
  for (int k = 0; k < 2; k++)
    d[k] = (fwd_dir_in){hs[k], gates ? gates[k] : NULL, W[k], R[k], bx[k], br[k], h0 ? h0[k] : NULL, k * H, k};
  return gru_forward_dirs(ctx, "qg_gru_forward_bidir", 2, y, d, NULL, x, lengths);
}

/* ---- backward --------------------------------------------------------------------------------------- */

typedef struct {
  qg_tensor *dW, *dR, *dbx, *dbr, *dh0;
  const qg_tensor *dhn, *W, *R, *hs, *gates;
  int y_offset, reverse;
} bwd_dir_in;

/* Fallback recurrence of direction dir (on stream sd): dh ping-pongs between dh_a and dh_b. */
static qg_status bwd_fallback(qg_ctx *ctx, const char *fn, const BwdArgs &a, int dir, int sd, float *dh_a, float *dh_b) {
  const BwdDir D = dir ? a.d1 : a.d0;
  cudaStream_t st = dir_stream(ctx, sd);
  cublasHandle_t hb = dir_blas(ctx, sd);
  const int64_t N = a.N, H = a.H, NH = N * H, H3 = 3 * H;
  const unsigned blocks = qg_cuda_blocks(NH, 256);
  if (D.dhn) QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(dh_a, D.dhn, (size_t)NH * sizeof(float), cudaMemcpyDeviceToDevice, st));
  else QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dh_a, 0, (size_t)NH * sizeof(float), st));
  auto body = [&]() -> qg_status {
    float *dh = dh_a, *dn = dh_b;
    for (int s = a.T - 1; s >= 0; s--) {
      bwd_point_kernel<<<blocks, 256, 0, st>>>(a, dir, s, dh, dn);
      QG_CHECK(qg_cuda_launched(ctx, fn));
      /* dn [N, H] += dq_s [N, 3H] R [3H, H] */
      QG_CHECK(gemm(ctx, hb, fn, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)N, (int)H3, D.R, (int)H, D.dq + (int64_t)s * N * H3,
                    (int)H3, 1.0f, dn, (int)H));
      float *tmp = dh; dh = dn; dn = tmp;
    }
    return QG_OK;
  };
  struct { BwdArgs a; const float *dh_a, *dh_b; int dir, math, kind; } key;
  memset(&key, 0, sizeof key);
  key.a = a; key.dh_a = dh_a; key.dh_b = dh_b; key.dir = dir; key.math = ctx->math; key.kind = 2;
  QG_CHECK(graphed(ctx, st, &key, sizeof key, body));
  /* after T steps (an even or odd number of swaps) the gradient of h0 is in dh_a or dh_b */
  float *dh = (a.T % 2 == 0) ? dh_a : dh_b;
  if (D.dh0) QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(D.dh0, dh, (size_t)NH * sizeof(float), cudaMemcpyDeviceToDevice, st));
  return QG_OK;
}

static qg_status gru_backward_dirs(qg_ctx *ctx, const char *fn, int ndirs, qg_tensor *dx, const bwd_dir_in *dirs,
                                   const qg_tensor *dy, const qg_tensor *x, const qg_tensor *lengths) {
  const int64_t T = x->dims[0], N = x->dims[1], C = x->dims[2], H = dirs[0].R->dims[1];
  if (N == 0 || H == 0) return QG_OK;
  const int64_t TN = T * N, H3 = 3 * H, NH = N * H;
  if (T == 0) {   /* dh0 = dhn (or zeros); nothing else */
    for (int d = 0; d < ndirs; d++) {
      if (!dirs[d].dh0) continue;
      if (dirs[d].dhn)
        QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(dirs[d].dh0->data, dirs[d].dhn->data, (size_t)NH * sizeof(float),
                                               cudaMemcpyDeviceToDevice, qg_cuda_stream(ctx)));
      else QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dirs[d].dh0->data, 0, (size_t)NH * sizeof(float), qg_cuda_stream(ctx)));
    }
    return QG_OK;
  }
  PCfg cfg;
  qg_status st;
  const int persist = use_persistent(ctx, fn, 1, T, N, H, ndirs, 0, &cfg, &st);
  if (persist < 0) return st;
  int chunks, rpc;
  colsum_shape(TN, &chunks, &rpc);
  const int64_t big = align_floats(TN * H3), dh_f = align_floats(NH), part_f = align_floats((int64_t)chunks * H3);
  const int64_t per_dir = 2 * big + 2 * dh_f + 2 * part_f;
  float *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, (int64_t)ndirs * per_dir * (int64_t)sizeof(float), (void **)&ws));

  BwdArgs a;
  memset(&a, 0, sizeof a);
  a.T = (int)T; a.N = (int)N; a.H = (int)H; a.Hy = dy ? (int)dy->dims[2] : 0;
  a.len = lengths ? (const int64_t *)lengths->data : NULL;
  for (int d = 0; d < ndirs; d++) {
    BwdDir &D = d ? a.d1 : a.d0;
    float *w = ws + d * per_dir;
    D.R = (const float *)dirs[d].R->data;
    D.hs = (const float *)dirs[d].hs->data;
    D.gates = (const float *)dirs[d].gates->data;
    D.dy = dy ? (const float *)dy->data : NULL;
    D.dhn = dirs[d].dhn ? (const float *)dirs[d].dhn->data : NULL;
    D.dp = w;
    D.dq = w + big;
    D.dh0 = dirs[d].dh0 ? (float *)dirs[d].dh0->data : NULL;
    D.y_offset = dirs[d].y_offset;
    D.reverse = dirs[d].reverse;
  }
  const int two_streams = ndirs == 2 && !persist;
  if (persist) QG_CHECK(persist_backward(ctx, fn, a, cfg, ndirs));
  else if (two_streams) QG_CHECK(qg_cuda_fork_aux(ctx, fn));
  const float *xp = (const float *)x->data;
  for (int d = 0; d < ndirs; d++) {
    const int sd = two_streams ? d : 0;
    const BwdDir &D = d ? a.d1 : a.d0;
    float *w = ws + d * per_dir;
    if (!persist) QG_CHECK(bwd_fallback(ctx, fn, a, d, sd, w + 2 * big, w + 2 * big + dh_f));
    cublasHandle_t hb = dir_blas(ctx, sd);
    /* dW [3H, C] += dp^T x  (column-major: dW^T [C, 3H] = x^T dp) */
    if (C > 0)
      QG_CHECK(gemm(ctx, hb, fn, CUBLAS_OP_N, CUBLAS_OP_T, (int)C, (int)H3, (int)TN, xp, (int)C, D.dp, (int)H3, 1.0f,
                    (float *)dirs[d].dW->data, (int)C));
    /* dR [3H, H] += dq^T hs[0:T] */
    QG_CHECK(gemm(ctx, hb, fn, CUBLAS_OP_N, CUBLAS_OP_T, (int)H, (int)H3, (int)TN, D.hs, (int)H, D.dq, (int)H3, 1.0f,
                  (float *)dirs[d].dR->data, (int)H));
    ColJobs J;
    memset(&J, 0, sizeof J);
    J.M = (int)TN; J.cols = (int)H3; J.chunks = chunks; J.rows_per_chunk = rpc;
    J.j[0] = (ColJob){D.dp, (float *)dirs[d].dbx->data, w + 2 * big + 2 * dh_f};
    J.j[1] = (ColJob){D.dq, (float *)dirs[d].dbr->data, w + 2 * big + 2 * dh_f + part_f};
    QG_CHECK(colsum(ctx, dir_stream(ctx, sd), fn, J, 2));
  }
  if (two_streams) QG_CHECK(qg_cuda_join_aux(ctx, fn));
  /* dx [T*N, C] += dp W, direction 0 first, on the main stream */
  if (dx && C > 0)
    for (int d = 0; d < ndirs; d++) {
      const BwdDir &D = d ? a.d1 : a.d0;
      QG_CHECK(gemm(ctx, qg_cuda_blas(ctx), fn, CUBLAS_OP_N, CUBLAS_OP_N, (int)C, (int)TN, (int)H3,
                    (const float *)dirs[d].W->data, (int)C, D.dp, (int)H3, 1.0f, (float *)dx->data, (int)C));
    }
  return QG_OK;
}

extern "C" qg_status qg_cuda_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx,
                                          qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                                          const qg_tensor *dhn, const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                                          const qg_tensor *hs, const qg_tensor *gates, const qg_tensor *lengths,
                                          int reverse) {
  bwd_dir_in d = {dW, dR, dbx, dbr, dh0, dhn, W, R, hs, gates, y_offset, reverse};
  return gru_backward_dirs(ctx, "qg_gru_backward", 1, dx, &d, dy, x, lengths);
}

extern "C" qg_status qg_cuda_gru_backward_bidir(qg_ctx *ctx, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR,
                                                qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0,
                                                const qg_tensor *dy, const qg_tensor *const *dhn, const qg_tensor *x,
                                                const qg_tensor *const *W, const qg_tensor *const *R,
                                                const qg_tensor *const *hs, const qg_tensor *const *gates,
                                                const qg_tensor *lengths) {
  const int H = (int)R[0]->dims[1];
  bwd_dir_in d[2];
  for (int k = 0; k < 2; k++)
    d[k] = (bwd_dir_in){dW[k], dR[k], dbx[k], dbr[k], dh0 ? dh0[k] : NULL, dhn ? dhn[k] : NULL, W[k], R[k], hs[k], gates[k],
                        k * H, k};
  return gru_backward_dirs(ctx, "qg_gru_backward_bidir", 2, dx, d, dy, x, lengths);
}

/*
 * stats.cu: qg_cuda_stats_add, the CUDA backend of qg_stats_add (core/calib.c): every value of a
 * device tensor (f32 or f64) enters one statistics row through the shared observer of stats.cuh.
 * Min/max are first reduced within each warp (order-independent), so one compare-and-swap per warp
 * reaches global memory; histogram counts are integer atomics.
 * Also the per-row reductions of per-channel weight calibration: qg_cuda_channel_minmax (min and
 * max of each row, brought to the host) and qg_cuda_channel_minmax_quant (the minmax rule applied
 * on the device, (e, z) written to device memory: the tracked weight quantizers of an integer GRU
 * layer without a host synchronisation).
 */
#include "cuda_common.cuh"
#include "stats.cuh"

#include <string.h>

template <typename T>
__global__ void stats_add_kernel(double *range, int64_t *counts, const T *values, int64_t n) {
  const double lo = range[2], hi = range[3];
  double mn = INFINITY, mx = -INFINITY;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double v = (double)values[i];
    if (v != v) continue;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    if (hi > lo) atomicAdd((unsigned long long *)(counts + qg_stats_bin(lo, hi, v)), 1ull);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const double a = __shfl_down_sync(0xffffffffu, mn, o), b = __shfl_down_sync(0xffffffffu, mx, o);
    mn = a < mn ? a : mn;
    mx = b > mx ? b : mx;
  }
  if ((threadIdx.x & 31) == 0) {
    if (mn <= mx) { qg_atomic_min_f64(range, mn); qg_atomic_max_f64(range + 1, mx); }
  }
}

extern "C" qg_status qg_cuda_stats_add(qg_ctx *ctx, const qg_stats *stats, int row, const qg_tensor *values) {
  double *range = (double *)stats->range->data + 4 * (int64_t)row;
  int64_t *counts = (int64_t *)stats->counts->data + (int64_t)QG_STATS_BINS * row;
  const int64_t n = values->numel;
  if (n == 0) return QG_OK;
  const int threads = 256;
  const unsigned blocks = (unsigned)(n / threads + 1 < 1024 ? n / threads + 1 : 1024);
  if (values->dtype == QG_F32)
    stats_add_kernel<float><<<blocks, threads, 0, qg_cuda_stream(ctx)>>>(range, counts, (const float *)values->data, n);
  else
    stats_add_kernel<double><<<blocks, threads, 0, qg_cuda_stream(ctx)>>>(range, counts, (const double *)values->data, n);
  return qg_cuda_launched(ctx, "qg_stats_add");
}

/* One block per row of w [rows, cols]: min and max of the row (NaN ignored), exact in any order. */
__global__ void channel_minmax_kernel(double *range, const float *w, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  double mn = INFINITY, mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const double v = (double)w[r * cols + c];
    if (v < mn) mn = v;
    if (v > mx) mx = v;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const double a = __shfl_down_sync(0xffffffffu, mn, o), b = __shfl_down_sync(0xffffffffu, mx, o);
    mn = a < mn ? a : mn;
    mx = b > mx ? b : mx;
  }
  __shared__ double smn[32], smx[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { smn[warp] = mn; smx[warp] = mx; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) {
      mn = smn[i] < mn ? smn[i] : mn;
      mx = smx[i] > mx ? smx[i] : mx;
    }
    range[2 * r] = mn;
    range[2 * r + 1] = mx;
  }
}

extern "C" qg_status qg_cuda_channel_minmax(qg_ctx *ctx, double *range, const qg_tensor *w) {
  const char *fn = "qg_calibrate_channels";
  const int64_t rows = w->dims[0], cols = w->ndim == 2 ? w->dims[1] : 1;
  if (rows == 0) return QG_OK;
  void *dev;
  QG_CHECK(qg_dev_workspace(ctx, fn, 2 * rows * (int64_t)sizeof(double), &dev));
  const int threads = cols >= 256 ? 256 : (cols > 32 ? (int)((cols + 31) / 32 * 32) : 32);
  channel_minmax_kernel<<<(unsigned)rows, threads, 0, qg_cuda_stream(ctx)>>>((double *)dev, (const float *)w->data, rows, cols);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  return qg_dev_memcpy(ctx, range, dev, 2 * rows * (int64_t)sizeof(double), 1);
}

/* Up to QG_W_NUM jobs of qg_cuda_channel_minmax_quant, by value; row0[i] = rows of jobs before i. */
struct minmax_quant_jobs {
  int32_t *exps[QG_W_NUM], *zps[QG_W_NUM];
  const float *w[QG_W_NUM];
  int64_t rows[QG_W_NUM], cols[QG_W_NUM], row0[QG_W_NUM + 1];
  int bits[QG_W_NUM], sym[QG_W_NUM], uns[QG_W_NUM];
  int n;
};

/* A warp per row (all jobs' rows in a row): min and max of the row (NaN ignored, exact in any
 * order), then lane 0 applies the shared minmax rule (quant_math.h) and writes (e, z) of the row. */
__global__ void channel_minmax_quant_kernel(const __grid_constant__ minmax_quant_jobs p) {
  const int lane = threadIdx.x & 31;
  const int64_t gr = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (gr >= p.row0[p.n]) return;   /* whole warps leave together */
  int j = 0;
  while (gr >= p.row0[j + 1]) j++;
  const int64_t r = gr - p.row0[j], cols = p.cols[j];
  const float *w = p.w[j] + r * cols;
  /* min and max in float (exact, and float to double is monotonic: the same values as in double),
   * comparisons that skip NaN; where the row is 16-byte aligned and cols % 4 == 0 (weights of
   * the benchmarks), four 16-byte loads per lane in flight at once (a 4-byte load per trip took
   * 10.7 us for a large layer's W and R, H200) */
  float mn = INFINITY, mx = -INFINITY;
  auto take = [&](float v) {
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  };
  if (cols % 4 == 0 && ((uintptr_t)w & 15) == 0) {
    const int64_t c4 = cols / 4;
    const float4 *w4 = (const float4 *)w;
    for (int64_t c = lane; c < c4; c += 4 * 32) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) v[u] = c + u * 32 < c4 ? w4[c + u * 32] : make_float4(NAN, NAN, NAN, NAN);
#pragma unroll
      for (int u = 0; u < 4; u++) { take(v[u].x); take(v[u].y); take(v[u].z); take(v[u].w); }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) take(w[c]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float a = __shfl_down_sync(0xffffffffu, mn, o), b = __shfl_down_sync(0xffffffffu, mx, o);
    mn = a < mn ? a : mn;
    mx = b > mx ? b : mx;
  }
  if (lane == 0) {
    if (!(mn <= mx)) mn = mx = 0;   /* a row of NaNs: degenerate */
    qg_minmax_rule((double)mn, (double)mx, p.bits[j], p.sym[j], p.uns[j], p.exps[j] + r, p.zps[j] + r);
  }
}

extern "C" qg_status qg_cuda_channel_minmax_quant(qg_ctx *ctx, int n, int32_t *const *exps, int32_t *const *zps,
                                                  const qg_tensor *const *w, const int *bitwidth, const int *is_symmetric,
                                                  const int *is_unsigned) {
  const char *fn = "qg_int_gru_calibrate_weights";
  if (n < 1 || n > QG_W_NUM) return qg_fail(ctx, QG_ERR_ARG, fn, "%d jobs, expected 1..%d", n, QG_W_NUM);
  minmax_quant_jobs p;
  memset(&p, 0, sizeof p);
  p.n = n;
  for (int i = 0; i < n; i++) {
    p.exps[i] = exps[i]; p.zps[i] = zps[i]; p.w[i] = (const float *)w[i]->data;
    p.rows[i] = w[i]->dims[0]; p.cols[i] = w[i]->ndim == 2 ? w[i]->dims[1] : 1;
    p.row0[i + 1] = p.row0[i] + p.rows[i];
    p.bits[i] = bitwidth[i]; p.sym[i] = is_symmetric[i]; p.uns[i] = is_unsigned[i];
  }
  if (p.row0[n] == 0) return QG_OK;
  const int threads = 256;
  channel_minmax_quant_kernel<<<qg_cuda_blocks(p.row0[n] * 32, threads), threads, 0, qg_cuda_stream(ctx)>>>(p);
  return qg_cuda_launched(ctx, fn);
}

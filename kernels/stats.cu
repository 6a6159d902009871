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

/* A warp per row of w [rows, cols]: min and max of the row (NaN ignored, exact in any order), then
 * lane 0 applies the shared minmax rule (quant_math.h) and writes (e, z) of the row. */
__global__ void channel_minmax_quant_kernel(int32_t *exps, int32_t *zps, const float *w, int64_t rows, int64_t cols, int bitwidth,
                                            int is_symmetric, int is_unsigned) {
  const int lane = threadIdx.x & 31;
  const int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (r >= rows) return;   /* whole warps leave together */
  double mn = INFINITY, mx = -INFINITY;
  for (int64_t c = lane; c < cols; c += 32) {
    const double v = (double)w[r * cols + c];
    if (v < mn) mn = v;
    if (v > mx) mx = v;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const double a = __shfl_down_sync(0xffffffffu, mn, o), b = __shfl_down_sync(0xffffffffu, mx, o);
    mn = a < mn ? a : mn;
    mx = b > mx ? b : mx;
  }
  if (lane == 0) {
    if (!(mn <= mx)) mn = mx = 0;   /* a row of NaNs: degenerate */
    qg_minmax_rule(mn, mx, bitwidth, is_symmetric, is_unsigned, exps + r, zps + r);
  }
}

extern "C" qg_status qg_cuda_channel_minmax_quant(qg_ctx *ctx, int32_t *exps, int32_t *zps, const qg_tensor *w, int bitwidth,
                                                  int is_symmetric, int is_unsigned) {
  const int64_t rows = w->dims[0], cols = w->ndim == 2 ? w->dims[1] : 1;
  if (rows == 0) return QG_OK;
  const int threads = 256;
  channel_minmax_quant_kernel<<<qg_cuda_blocks(rows * 32, threads), threads, 0, qg_cuda_stream(ctx)>>>(
      exps, zps, (const float *)w->data, rows, cols, bitwidth, is_symmetric, is_unsigned);
  return qg_cuda_launched(ctx, "qg_int_gru_calibrate_weight");
}

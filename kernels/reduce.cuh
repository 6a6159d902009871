/*
 * reduce.cuh: launch shapes and deterministic reductions shared by the small CUDA backends
 * (tensor.cu, linear.cu, loss.cu, optim.cu).
 *
 * Determinism: a sum of doubles is formed in a fixed order that depends only on the launch shape
 * and the data, never on which thread arrives first: each thread adds its grid-stride elements in
 * index order, a warp adds its lanes with a fixed shuffle tree, a block adds its warps in warp
 * order, and a grid's per-block partial sums are added by one block in the same way. The launch
 * shape is a function of the element count only (never of the GPU's SM count), so a result is
 * bit-identical from run to run and between an H100 and an H200. No float atomics anywhere;
 * integer atomics (counts, first indices) are order-independent.
 */
#ifndef QGRU_REDUCE_CUH
#define QGRU_REDUCE_CUH

#include "cuda_common.cuh"

enum { QG_THREADS = 256,          /* threads per block of every kernel here */
       QG_MAX_BLOCKS = 1024 };    /* grid-stride kernels use at most this many blocks */

/* Blocks of QG_THREADS threads for a grid-stride loop over n elements (at least 1). */
static inline unsigned qg_grid(int64_t n) {
  const int64_t b = (n + QG_THREADS - 1) / QG_THREADS, most = QG_MAX_BLOCKS;
  return (unsigned)(b < 1 ? 1 : (b > most ? most : b));
}

__device__ __forceinline__ double qg_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

/* The sum of v over the block (blockDim.x a multiple of 32), returned to EVERY thread.
 * shared: 32 doubles of shared memory. Every thread of the block must call it. */
__device__ __forceinline__ double qg_block_sum(double v, double *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = qg_warp_sum(v);
  __syncthreads();                       /* shared may still be read by a previous call */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : 0.0;
  v = qg_warp_sum(v);                    /* every warp adds the warp sums in the same order */
  return __shfl_sync(0xffffffffu, v, 0);
}

/* partials[blockIdx.x] = this block's share of sum_i x[i]^2 (double; grid-stride, then qg_block_sum). */
template <typename T>
__global__ void sum_squares_partial_kernel(double *partials, const T *x, int64_t n) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double v = (double)x[i];
    s += v * v;
  }
  s = qg_block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

/* The index of the largest value of the row x[0..K) (K >= 1), found by one warp and returned to
 * every lane; the CPU's scan (best = 0; best = k when x[k] > x[best]) gives the same index: the
 * first maximum among the non-NaN values, and 0 when x[0] is NaN (nothing compares greater). */
__device__ __forceinline__ int64_t qg_warp_argmax(const float *x, int64_t K) {
  const int lane = threadIdx.x & 31;
  float bv = 0.0f;
  int64_t bi = -1;                       /* -1: this lane has no candidate */
  for (int64_t k = lane; k < K; k += 32) {
    const float v = x[k];
    if (v == v && (bi < 0 || v > bv)) { bv = v; bi = k; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_down_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
  }
  bi = __shfl_sync(0xffffffffu, bi, 0);
  const float x0 = x[0];
  return (x0 != x0 || bi < 0) ? 0 : bi;
}

/* out[0] = partials[0] + ... + partials[n-1] in the fixed order above (launch: 1 block of
 * QG_THREADS threads). */
static __global__ void sum_partials_kernel(double *out, const double *partials, int n) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  s = qg_block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

#endif

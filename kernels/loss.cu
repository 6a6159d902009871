/*
 * loss.cu: the CUDA backends of the losses (front doors in core/loss.c, CPU backends in
 * core/loss_cpu.c): cross-entropy with logits, mean squared error, and the count of rows whose
 * argmax is the target class.
 *
 * As on the CPU, the math is in double: per row, the max, the sum of exp and the log-sum-exp (one
 * warp per row), the loss summed over rows in a fixed order (reduce.cuh), the gradient written in
 * f32. The mean loss and the count come back to the host with one small copy (the call
 * synchronizes the context's stream). Class indices are values on the device: a bad one is found
 * there, reported by row, and then no gradient is written (dlogits is left as it was).
 */
#include "cuda_common.cuh"
#include "reduce.cuh"

#include <string.h>

/* One warp per row n: lse[n] = log(sum_k exp(x_k)) (max-shifted); row_loss[n] = lse - x[target];
 * a target outside [0, K) sets bad[0] to max(bad[0], N - n) (so the first bad row is N - bad[0]). */
__global__ void cross_entropy_forward_kernel(double *row_loss, double *lse, unsigned long long *bad, const float *logits,
                                             const int64_t *target, int64_t N, int64_t K) {
  const int64_t n = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (n >= N) return;                    /* whole warps leave together */
  const int lane = threadIdx.x & 31;
  const float *row = logits + n * K;
  double mx = -INFINITY;
  for (int64_t k = lane; k < K; k += 32) mx = fmax(mx, (double)row[k]);
  for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double se = 0;
  for (int64_t k = lane; k < K; k += 32) se += exp((double)row[k] - mx);
  se = qg_warp_sum(se);
  if (lane == 0) {
    const double l = mx + log(se);
    const int64_t t = target[n];
    lse[n] = l;
    if (t < 0 || t >= K) {
      atomicMax(bad, (unsigned long long)(N - n));
      row_loss[n] = 0;
    } else {
      row_loss[n] = l - (double)row[t];
    }
  }
}

/* dlogits [N, K] = scale * (softmax - onehot(target)) / N, unless a target was bad. */
__global__ void cross_entropy_backward_kernel(float *dlogits, const double *lse, const unsigned long long *bad,
                                              const float *logits, const int64_t *target, int64_t N, int64_t K, double scale) {
  if (*bad) return;
  const int64_t total = N * K;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t n = i / K, k = i - n * K;
    const double p = exp((double)logits[i] - lse[n]);
    dlogits[i] = (float)(scale * (p - (k == target[n] ? 1.0 : 0.0)) / (double)N);
  }
}

extern "C" qg_status qg_cuda_cross_entropy(qg_ctx *ctx, double *loss, qg_tensor *dlogits, const qg_tensor *logits,
                                           const qg_tensor *target, double scale) {
  const char *fn = "qg_cross_entropy";
  const int64_t N = logits->dims[0], K = logits->dims[1];
  if (N > INT32_MAX) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%lld rows are more than this backend takes", (long long)N);
  /* workspace: {loss, bad} (read back together), then row_loss [N], lse [N] */
  double *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, (2 + 2 * N) * (int64_t)sizeof(double), (void **)&ws));
  unsigned long long *bad = (unsigned long long *)(ws + 1);
  double *row_loss = ws + 2, *lse = ws + 2 + N;
  cudaStream_t s = qg_cuda_stream(ctx);
  QG_CHECK(qg_dev_memset0(ctx, bad, sizeof *bad));
  const float *lp = (const float *)logits->data;
  const int64_t *tp = (const int64_t *)target->data;
  cross_entropy_forward_kernel<<<qg_cuda_blocks(N * 32, QG_THREADS), QG_THREADS, 0, s>>>(row_loss, lse, bad, lp, tp, N, K);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  sum_partials_kernel<<<1, QG_THREADS, 0, s>>>(ws, row_loss, (int)N);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  if (dlogits) {
    cross_entropy_backward_kernel<<<qg_grid(N * K), QG_THREADS, 0, s>>>((float *)dlogits->data, lse, bad, lp, tp, N, K, scale);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  double back[2];
  QG_CHECK(qg_dev_memcpy(ctx, back, ws, sizeof back, 1));
  unsigned long long hbad;
  memcpy(&hbad, &back[1], sizeof hbad);
  if (hbad) {
    const int64_t n = N - (int64_t)hbad;
    int64_t t = 0;
    QG_CHECK(qg_dev_memcpy(ctx, &t, tp + n, sizeof t, 1));
    return qg_fail(ctx, QG_ERR_ARG, fn, "target[%lld] = %lld is not a class index in [0, %lld)", (long long)n, (long long)t,
                   (long long)K);
  }
  *loss = back[0] / (double)N;
  return QG_OK;
}

/* One warp per row: count[0] += 1 when the row's argmax (as qg_argmax_rows) is its target. */
__global__ void count_correct_kernel(unsigned long long *count, const float *logits, const int64_t *target, int64_t N, int64_t K) {
  const int64_t n = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (n >= N) return;
  const int64_t best = qg_warp_argmax(logits + n * K, K);
  if ((threadIdx.x & 31) == 0 && best == target[n]) atomicAdd(count, 1ull);
}

extern "C" qg_status qg_cuda_count_correct(qg_ctx *ctx, int64_t *correct, const qg_tensor *logits, const qg_tensor *target) {
  const char *fn = "qg_count_correct";
  const int64_t N = logits->dims[0], K = logits->dims[1];
  unsigned long long *count, h = 0;
  QG_CHECK(qg_dev_workspace(ctx, fn, sizeof *count, (void **)&count));
  QG_CHECK(qg_dev_memset0(ctx, count, sizeof *count));
  count_correct_kernel<<<qg_cuda_blocks(N * 32, QG_THREADS), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      count, (const float *)logits->data, (const int64_t *)target->data, N, K);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  QG_CHECK(qg_dev_memcpy(ctx, &h, count, sizeof h, 1));
  *correct = (int64_t)h;
  return QG_OK;
}

/* Per-block partial sums of (pred - target)^2 in double; dpred = scale * 2 (pred - target) / n. */
__global__ void mse_forward_kernel(double *partials, float *dpred, const float *pred, const float *target, int64_t n,
                                   double scale, double inv) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double d = (double)pred[i] - (double)target[i];
    s += d * d;
    if (dpred) dpred[i] = (float)(scale * 2.0 * d * inv);
  }
  s = qg_block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

extern "C" qg_status qg_cuda_mse(qg_ctx *ctx, double *loss, qg_tensor *dpred, const qg_tensor *pred, const qg_tensor *target,
                                 double scale) {
  const char *fn = "qg_mse";
  const int64_t n = pred->numel;
  const double inv = 1.0 / (double)n;
  const unsigned blocks = qg_grid(n);
  double *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, (1 + (int64_t)blocks) * (int64_t)sizeof(double), (void **)&ws));
  cudaStream_t s = qg_cuda_stream(ctx);
  mse_forward_kernel<<<blocks, QG_THREADS, 0, s>>>(ws + 1, dpred ? (float *)dpred->data : NULL, (const float *)pred->data,
                                                  (const float *)target->data, n, scale, inv);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  sum_partials_kernel<<<1, QG_THREADS, 0, s>>>(ws, ws + 1, (int)blocks);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  double total;
  QG_CHECK(qg_dev_memcpy(ctx, &total, ws, sizeof total, 1));
  *loss = total * inv;
  return QG_OK;
}

/*
 * tensor.cu: the CUDA backends of the small tensor operations (front doors in core/tensor.c and
 * core/tensor_checks.c, CPU backends in core/tensor_cpu.c): axpy, scale, sum of squares, argmax
 * of rows, index_select along dim 0, the dim-0/1 transpose, fill, dtype conversion and the count
 * of non-finite values.
 *
 * Results equal the CPU's: the elementwise ops do the same float operations (this file is in the
 * --fmad=false list, so y + a * x is not contracted into an FMA the host does not form), argmax
 * and the conversions follow the CPU's scan and C casts, and the sum of squares is a double sum
 * in a fixed order (reduce.cuh), equal to the CPU's up to the rounding of the order.
 * Values the host must see (a sum, a count, a bad index) come back with one small device-to-host
 * copy, which synchronizes the context's stream.
 */
#include "cuda_common.cuh"
#include "reduce.cuh"

#include <string.h>

/* ---- axpy, scale ---------------------------------------------------------------------------- */

template <typename T>
__global__ void axpy_forward_kernel(T *y, T alpha, const T *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += alpha * x[i];
}

template <typename T>
__global__ void scale_forward_kernel(T *t, T alpha, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    t[i] *= alpha;
}

extern "C" qg_status qg_cuda_axpy(qg_ctx *ctx, qg_tensor *y, double alpha, const qg_tensor *x) {
  const int64_t n = y->numel;
  if (n == 0) return QG_OK;
  if (y->dtype == QG_F32)
    axpy_forward_kernel<float><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>((float *)y->data, (float)alpha,
                                                                                  (const float *)x->data, n);
  else
    axpy_forward_kernel<double><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>((double *)y->data, alpha,
                                                                                   (const double *)x->data, n);
  return qg_cuda_launched(ctx, "qg_axpy");
}

extern "C" qg_status qg_cuda_scale(qg_ctx *ctx, qg_tensor *t, double alpha) {
  const int64_t n = t->numel;
  if (n == 0) return QG_OK;
  if (t->dtype == QG_F32)
    scale_forward_kernel<float><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>((float *)t->data, (float)alpha, n);
  else
    scale_forward_kernel<double><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>((double *)t->data, alpha, n);
  return qg_cuda_launched(ctx, "qg_scale");
}

/* ---- sum of squares: per-block partial sums, then one block adds them ------------------------- */

extern "C" qg_status qg_cuda_sum_squares(qg_ctx *ctx, double *out, const qg_tensor *t) {
  const char *fn = "qg_sum_squares";
  const int64_t n = t->numel;
  if (n == 0) { *out = 0; return QG_OK; }
  const unsigned blocks = qg_grid(n);
  double *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, (int64_t)(blocks + 1) * sizeof(double), (void **)&ws));
  cudaStream_t s = qg_cuda_stream(ctx);
  if (t->dtype == QG_F32)
    sum_squares_partial_kernel<float><<<blocks, QG_THREADS, 0, s>>>(ws + 1, (const float *)t->data, n);
  else
    sum_squares_partial_kernel<double><<<blocks, QG_THREADS, 0, s>>>(ws + 1, (const double *)t->data, n);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  sum_partials_kernel<<<1, QG_THREADS, 0, s>>>(ws, ws + 1, (int)blocks);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  return qg_dev_memcpy(ctx, out, ws, sizeof(double), 1);
}

/* ---- argmax of rows: one warp per row --------------------------------------------------------- */

__global__ void argmax_rows_forward_kernel(int64_t *out, const float *x, int64_t N, int64_t K) {
  const int64_t n = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (n >= N) return;                    /* whole warps leave together */
  const int64_t best = qg_warp_argmax(x + n * K, K);
  if ((threadIdx.x & 31) == 0) out[n] = best;
}

extern "C" qg_status qg_cuda_argmax_rows(qg_ctx *ctx, qg_tensor *out, const qg_tensor *x) {
  const int64_t N = x->dims[0], K = x->dims[1];
  if (N == 0) return QG_OK;
  if (K == 0) return qg_dev_memset0(ctx, out->data, N * (int64_t)sizeof(int64_t));   /* the CPU's answer: 0 */
  const unsigned blocks = qg_cuda_blocks(N * 32, QG_THREADS);
  argmax_rows_forward_kernel<<<blocks, QG_THREADS, 0, qg_cuda_stream(ctx)>>>((int64_t *)out->data,
                                                                              (const float *)x->data, N, K);
  return qg_cuda_launched(ctx, "qg_argmax_rows");
}

/* ---- moves of whole elements: index_select and transpose01 copy words of w bytes ------------- */

/* The widest word (8, 4, 2 or 1 bytes) that divides nbytes and both addresses. */
static int word_bytes(int64_t nbytes, const void *a, const void *b) {
  const uint64_t m = (uint64_t)nbytes | (uint64_t)(uintptr_t)a | (uint64_t)(uintptr_t)b;
  return (m & 7) == 0 ? 8 : (m & 3) == 0 ? 4 : (m & 1) == 0 ? 2 : 1;
}

/* bad[0] = max over bad positions i of (k - i): the first bad position is k - bad[0]. */
__global__ void index_select_check_kernel(unsigned long long *bad, const int64_t *idx, int64_t k, int64_t rows) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k; i += (int64_t)gridDim.x * blockDim.x)
    if (idx[i] < 0 || idx[i] >= rows) atomicMax(bad, (unsigned long long)(k - i));
}

template <typename U>
__global__ void index_select_forward_kernel(U *out, const U *src, const int64_t *idx, int64_t k, int64_t row) {
  const int64_t n = k * row;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / row, c = i - r * row;
    out[i] = src[idx[r] * row + c];
  }
}

template <typename U>
static void index_select_launch(cudaStream_t s, void *out, const void *src, const int64_t *idx, int64_t k, int64_t row_bytes) {
  const int64_t row = row_bytes / (int64_t)sizeof(U);
  index_select_forward_kernel<U><<<qg_grid(k * row), QG_THREADS, 0, s>>>((U *)out, (const U *)src, idx, k, row);
}

extern "C" qg_status qg_cuda_index_select(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src, const qg_tensor *index) {
  const char *fn = "qg_index_select";
  const int64_t k = index->numel, rows = src->dims[0];
  if (k == 0) return QG_OK;
  const int64_t *idx = (const int64_t *)index->data;
  cudaStream_t s = qg_cuda_stream(ctx);
  /* The indices are values on the device: check them first (one flag back to the host), so a bad
   * index leaves out untouched, as on the CPU. */
  unsigned long long *bad, hbad = 0;
  QG_CHECK(qg_dev_workspace(ctx, fn, sizeof *bad, (void **)&bad));
  QG_CHECK(qg_dev_memset0(ctx, bad, sizeof *bad));
  index_select_check_kernel<<<qg_grid(k), QG_THREADS, 0, s>>>(bad, idx, k, rows);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  QG_CHECK(qg_dev_memcpy(ctx, &hbad, bad, sizeof hbad, 1));
  if (hbad) {
    const int64_t i = k - (int64_t)hbad;
    int64_t v = 0;
    QG_CHECK(qg_dev_memcpy(ctx, &v, idx + i, sizeof v, 1));
    return qg_fail(ctx, QG_ERR_ARG, fn, "index[%lld] = %lld is outside [0, %lld)", (long long)i, (long long)v, (long long)rows);
  }
  const int64_t row_bytes = qg_tensor_bytes(src) / rows;
  if (row_bytes == 0) return QG_OK;
  switch (word_bytes(row_bytes, out->data, src->data)) {
    case 8: index_select_launch<uint64_t>(s, out->data, src->data, idx, k, row_bytes); break;
    case 4: index_select_launch<uint32_t>(s, out->data, src->data, idx, k, row_bytes); break;
    case 2: index_select_launch<uint16_t>(s, out->data, src->data, idx, k, row_bytes); break;
    default: index_select_launch<uint8_t>(s, out->data, src->data, idx, k, row_bytes); break;
  }
  return qg_cuda_launched(ctx, fn);
}

/* out [B, A, inner] = src [A, B, inner] (inner counted in words U). */
template <typename U>
__global__ void transpose01_forward_kernel(U *out, const U *src, int64_t A, int64_t B, int64_t inner) {
  const int64_t n = A * B * inner;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t ba = i / inner, k = i - ba * inner;
    const int64_t b = ba / A, a = ba - b * A;
    out[i] = src[(a * B + b) * inner + k];
  }
}

template <typename U>
static void transpose01_launch(cudaStream_t s, void *out, const void *src, int64_t A, int64_t B, int64_t inner_bytes) {
  const int64_t inner = inner_bytes / (int64_t)sizeof(U);
  transpose01_forward_kernel<U><<<qg_grid(A * B * inner), QG_THREADS, 0, s>>>((U *)out, (const U *)src, A, B, inner);
}

extern "C" qg_status qg_cuda_transpose01(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src) {
  const int64_t A = src->dims[0], B = src->dims[1];
  if (A == 0 || B == 0) return QG_OK;
  const int64_t inner_bytes = qg_tensor_bytes(src) / (A * B);
  if (inner_bytes == 0) return QG_OK;
  cudaStream_t s = qg_cuda_stream(ctx);
  switch (word_bytes(inner_bytes, out->data, src->data)) {
    case 8: transpose01_launch<uint64_t>(s, out->data, src->data, A, B, inner_bytes); break;
    case 4: transpose01_launch<uint32_t>(s, out->data, src->data, A, B, inner_bytes); break;
    case 2: transpose01_launch<uint16_t>(s, out->data, src->data, A, B, inner_bytes); break;
    default: transpose01_launch<uint8_t>(s, out->data, src->data, A, B, inner_bytes); break;
  }
  return qg_cuda_launched(ctx, "qg_transpose01");
}

/* ---- fill: the element's bytes are made on the host by the CPU's C cast ---------------------- */

template <typename U>
__global__ void fill_forward_kernel(U *t, U v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) t[i] = v;
}

extern "C" qg_status qg_cuda_fill(qg_ctx *ctx, qg_tensor *t, double value) {
  const int64_t n = t->numel;
  if (n == 0) return QG_OK;
  if (value == 0.0) return qg_dev_memset0(ctx, t->data, qg_tensor_bytes(t));   /* as the CPU: -0.0 fills +0.0 */
  cudaStream_t s = qg_cuda_stream(ctx);
  const unsigned g = qg_grid(n);
  switch (t->dtype) {
    case QG_F32: { const float v = (float)value; uint32_t u; memcpy(&u, &v, 4);
                   fill_forward_kernel<uint32_t><<<g, QG_THREADS, 0, s>>>((uint32_t *)t->data, u, n); break; }
    case QG_F64: { uint64_t u; memcpy(&u, &value, 8);
                   fill_forward_kernel<uint64_t><<<g, QG_THREADS, 0, s>>>((uint64_t *)t->data, u, n); break; }
    case QG_I8: fill_forward_kernel<int8_t><<<g, QG_THREADS, 0, s>>>((int8_t *)t->data, (int8_t)value, n); break;
    case QG_U8: fill_forward_kernel<uint8_t><<<g, QG_THREADS, 0, s>>>((uint8_t *)t->data, (uint8_t)value, n); break;
    case QG_I16: fill_forward_kernel<int16_t><<<g, QG_THREADS, 0, s>>>((int16_t *)t->data, (int16_t)value, n); break;
    case QG_I32: fill_forward_kernel<int32_t><<<g, QG_THREADS, 0, s>>>((int32_t *)t->data, (int32_t)value, n); break;
    default: fill_forward_kernel<int64_t><<<g, QG_THREADS, 0, s>>>((int64_t *)t->data, (int64_t)value, n); break;
  }
  return qg_cuda_launched(ctx, "qg_fill");
}

/* ---- dtype conversion: through double, as the CPU's get_as_double / set_from_double ----------- */

__device__ __forceinline__ double load_as_double(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case QG_F32: return ((const float *)p)[i];
    case QG_F64: return ((const double *)p)[i];
    case QG_I8: return ((const int8_t *)p)[i];
    case QG_U8: return ((const uint8_t *)p)[i];
    case QG_I16: return ((const int16_t *)p)[i];
    case QG_I32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
  }
}

__device__ __forceinline__ void store_from_double(void *p, int dtype, int64_t i, double v) {
  switch (dtype) {
    case QG_F32: ((float *)p)[i] = (float)v; break;
    case QG_F64: ((double *)p)[i] = v; break;
    case QG_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case QG_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case QG_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case QG_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: ((int64_t *)p)[i] = (int64_t)v; break;
  }
}

__global__ void convert_forward_kernel(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    store_from_double(dst, dst_dtype, i, load_as_double(src, src_dtype, i));
}

extern "C" qg_status qg_cuda_convert(qg_ctx *ctx, qg_tensor *dst, const qg_tensor *src) {
  const int64_t n = src->numel;
  if (n == 0) return QG_OK;
  convert_forward_kernel<<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(dst->data, dst->dtype, src->data, src->dtype, n);
  return qg_cuda_launched(ctx, "qg_copy");
}

/* ---- non-finite values: an integer count and the first index (integer atomics) --------------- */

/* res[0] += the count; res[1] = max over non-finite i of (n - i), so the first index is n - res[1]. */
template <typename T>
__global__ void count_nonfinite_kernel(unsigned long long *res, const T *x, int64_t n) {
  unsigned long long count = 0, first = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (!isfinite(x[i])) { if (!count) first = (unsigned long long)(n - i); count++; }
  for (int o = 16; o > 0; o >>= 1) {
    count += __shfl_down_sync(0xffffffffu, count, o);
    const unsigned long long f = __shfl_down_sync(0xffffffffu, first, o);
    first = f > first ? f : first;
  }
  if ((threadIdx.x & 31) == 0 && count) { atomicAdd(res, count); atomicMax(res + 1, first); }
}

extern "C" qg_status qg_cuda_count_nonfinite(qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t) {
  const char *fn = "qg_count_nonfinite";
  const int64_t n = t->numel;
  *count = 0;
  *first_index = -1;
  if (n == 0 || (t->dtype != QG_F32 && t->dtype != QG_F64)) return QG_OK;
  unsigned long long *res, h[2];
  QG_CHECK(qg_dev_workspace(ctx, fn, sizeof h, (void **)&res));
  QG_CHECK(qg_dev_memset0(ctx, res, sizeof h));
  if (t->dtype == QG_F32)
    count_nonfinite_kernel<float><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(res, (const float *)t->data, n);
  else
    count_nonfinite_kernel<double><<<qg_grid(n), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(res, (const double *)t->data, n);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  QG_CHECK(qg_dev_memcpy(ctx, h, res, sizeof h, 1));
  *count = (int64_t)h[0];
  *first_index = h[0] ? n - (int64_t)h[1] : -1;
  return QG_OK;
}

/*
 * linear.cu: the CUDA backend of the fully connected layer y = x W^T + b and its backward (front
 * doors in core/linear.c, CPU backend in core/linear_cpu.c). The products are cuBLAS GEMMs
 * (cublasGemmEx with the context's compute type: strict fp32, or TF32 under qgru.setMath("tf32"));
 * the bias gradient is a fixed-order reduction over the rows (no atomics), so a call gives the same
 * bits every time.
 *
 * Row-major [rows, cols] is column-major [cols, rows] to cuBLAS, so every product is written for the
 * transposes: y^T = W x^T, dx^T = W^T dy^T, dW^T += x^T dy.
 */
#include "cuda_common.cuh"
#include "reduce.cuh"

#include <limits.h>

/* y [N, O] = b broadcast over the rows (the GEMM then adds x W^T with beta = 1, as the CPU does). */
__global__ void linear_bias_forward_kernel(float *y, const float *b, int64_t N, int64_t O) {
  const int64_t n = N * O;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = b[i % O];
}

/* Bias gradient, stage 1: rows are cut into chunks of LINEAR_DB_CHUNK; block (column tile, chunk)
 * sums its chunk's rows for 32 columns in double, 8 row lanes per column, the lanes added in lane
 * order. With one chunk the sum goes straight into db; otherwise into partials [chunks, O]. */
enum { LINEAR_DB_CHUNK = 512 };

__global__ void linear_bias_backward_kernel(float *db, double *partials, const float *dy, int64_t N, int64_t O) {
  __shared__ double lanes[8][33];
  const int64_t o = blockIdx.x * 32 + threadIdx.x;
  const int64_t n0 = (int64_t)blockIdx.y * LINEAR_DB_CHUNK;
  const int64_t n1 = n0 + LINEAR_DB_CHUNK < N ? n0 + LINEAR_DB_CHUNK : N;
  double s = 0;
  if (o < O)
    for (int64_t n = n0 + threadIdx.y; n < n1; n += 8) s += (double)dy[n * O + o];
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < O) {
    double t = 0;
    for (int k = 0; k < 8; k++) t += lanes[k][threadIdx.x];
    if (gridDim.y == 1) db[o] = (float)((double)db[o] + t);
    else partials[blockIdx.y * O + o] = t;
  }
}

/* Bias gradient, stage 2 (more than one chunk): db[o] += the chunks' sums, in chunk order. */
__global__ void linear_bias_sum_kernel(float *db, const double *partials, int64_t chunks, int64_t O) {
  const int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (o >= O) return;
  double t = 0;
  for (int64_t c = 0; c < chunks; c++) t += partials[c * O + o];
  db[o] = (float)((double)db[o] + t);
}

static qg_status check_int_dims(qg_ctx *ctx, const char *fn, int64_t N, int64_t O, int64_t In) {
  if (N > INT_MAX || O > INT_MAX || In > INT_MAX)
    return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "sizes N=%lld, O=%lld, In=%lld exceed cuBLAS's int dimensions", (long long)N,
                   (long long)O, (long long)In);
  return QG_OK;
}

/* C (m x n, ld ldc) = alpha op(A) op(B) + beta C, column-major, f32 data, the context's compute type. */
static qg_status gemm(qg_ctx *ctx, const char *fn, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  const float alpha = 1.0f;
  QG_CUBLAS_CHECK(ctx, fn, cublasGemmEx(qg_cuda_blas(ctx), ta, tb, (int)m, (int)n, (int)k, &alpha, A, CUDA_R_32F, (int)lda, B,
                                        CUDA_R_32F, (int)ldb, &beta, C, CUDA_R_32F, (int)ldc, qg_cuda_f32_compute(ctx),
                                        CUBLAS_GEMM_DEFAULT));
  return QG_OK;
}

extern "C" qg_status qg_cuda_linear_forward(qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b) {
  const char *fn = "qg_linear_forward";
  const int64_t N = x->dims[0], O = W->dims[0], In = W->dims[1];
  QG_CHECK(check_int_dims(ctx, fn, N, O, In));
  if (N == 0 || O == 0) return QG_OK;
  float *yp = (float *)y->data;
  if (b) {
    linear_bias_forward_kernel<<<qg_grid(N * O), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(yp, (const float *)b->data, N, O);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (In == 0) return b ? QG_OK : qg_dev_memset0(ctx, yp, N * O * (int64_t)sizeof(float));
  /* y^T [O, N] = W [O, In] (column-major In x O, transposed) times x^T (column-major In x N) */
  return gemm(ctx, fn, CUBLAS_OP_T, CUBLAS_OP_N, O, N, In, (const float *)W->data, In, (const float *)x->data, In,
              b ? 1.0f : 0.0f, yp, O);
}

extern "C" qg_status qg_cuda_linear_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db, const qg_tensor *dy,
                                             const qg_tensor *x, const qg_tensor *W) {
  const char *fn = "qg_linear_backward";
  const int64_t N = x->dims[0], O = W->dims[0], In = W->dims[1];
  QG_CHECK(check_int_dims(ctx, fn, N, O, In));
  const float *dyp = (const float *)dy->data;
  if (dx && N > 0 && In > 0) {
    if (O == 0) QG_CHECK(qg_dev_memset0(ctx, dx->data, N * In * (int64_t)sizeof(float)));
    /* dx^T [In, N] = W^T (column-major In x O) times dy^T (column-major O x N); overwritten */
    else QG_CHECK(gemm(ctx, fn, CUBLAS_OP_N, CUBLAS_OP_N, In, N, O, (const float *)W->data, In, dyp, O, 0.0f,
                       (float *)dx->data, In));
  }
  if (dW && N > 0 && O > 0 && In > 0)
    /* dW^T [In, O] += x^T (column-major In x N) times dy (column-major O x N, transposed); accumulated */
    QG_CHECK(gemm(ctx, fn, CUBLAS_OP_N, CUBLAS_OP_T, In, O, N, (const float *)x->data, In, dyp, O, 1.0f, (float *)dW->data, In));
  if (db && N > 0 && O > 0) {
    const int64_t chunks = (N + LINEAR_DB_CHUNK - 1) / LINEAR_DB_CHUNK;
    if (chunks > 65535) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%lld rows are more than the bias reduction takes", (long long)N);
    double *partials = NULL;
    if (chunks > 1) QG_CHECK(qg_dev_workspace(ctx, fn, chunks * O * (int64_t)sizeof(double), (void **)&partials));
    const dim3 grid((unsigned)((O + 31) / 32), (unsigned)chunks), block(32, 8);
    linear_bias_backward_kernel<<<grid, block, 0, qg_cuda_stream(ctx)>>>((float *)db->data, partials, dyp, N, O);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (chunks > 1) {
      linear_bias_sum_kernel<<<qg_cuda_blocks(O, QG_THREADS), QG_THREADS, 0, qg_cuda_stream(ctx)>>>((float *)db->data, partials,
                                                                                                   chunks, O);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
  }
  return QG_OK;
}

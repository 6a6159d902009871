/*
 * int_gru_bwd_after.cuh: the integer GRU STE backward's work after its recurrence (either path):
 * the bias sums in a fixed order, dequantization and bf16 conversions of the GEMMs' operands, the
 * masked adds of the pieces' products, dh0, and the GEMM wrappers (SGEMM / TF32 on a given
 * handle, the exact split's int8 GEMM).
 * Included once by kernels/int_gru_backward.cu, after its includes.
 */

/* ---- after the loop ----------------------------------------------------------------------------------- */

/* Bias sums in a fixed order: the CPU's sequence (steps descending, rows ascending) cut into
 * chunks of BIAS_CHUNK (row, step) pairs summed in double, then the chunks in order. A thread walks
 * its chunk's pairs q = s N + n (row (T - 1 - s) N + n) with one division, and issues BIAS_U pairs'
 * loads before adding them in order (a 64-bit division and one load in flight per pair made it
 * latency-bound: 23 us at seed-qat, H200, ncu, session 50). */
enum { BIAS_CHUNK = 64, BIAS_U = 8 };

__global__ void bias_partial_kernel(const float *bcx, const float *bcr, int64_t T, int64_t N, int64_t H3, double *part) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, c = blockIdx.y, TN = T * N;
  if (j >= H3) return;
  const int64_t q0 = c * BIAS_CHUNK, q1 = q0 + BIAS_CHUNK < TN ? q0 + BIAS_CHUNK : TN;
  int64_t s = q0 / N, n = q0 % N;
  double sx = 0, sr = 0;
  for (int64_t q = q0; q < q1; q += BIAS_U) {
    const int m = q1 - q < BIAS_U ? (int)(q1 - q) : BIAS_U;
    float vx[BIAS_U], vr[BIAS_U];
#pragma unroll
    for (int u = 0; u < BIAS_U; u++)
      if (u < m) {
        const int64_t e = ((T - 1 - s) * N + n) * H3 + j;
        vx[u] = bcx[e];
        vr[u] = bcr[e];
        if (++n == N) { n = 0; s++; }
      }
#pragma unroll
    for (int u = 0; u < BIAS_U; u++)
      if (u < m) { sx += vx[u]; sr += vr[u]; }
  }
  part[(2 * c) * H3 + j] = sx;
  part[(2 * c + 1) * H3 + j] = sr;
}

__global__ void bias_final_kernel(const double *part, int64_t chunks, int64_t H3, const uint8_t *mbx, const uint8_t *mbr,
                                  float *dbx, float *dbr) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= H3) return;
  double sx = 0, sr = 0;
  for (int64_t c = 0; c < chunks; c++) { sx += part[(2 * c) * H3 + j]; sr += part[(2 * c + 1) * H3 + j]; }
  dbx[j] += mbx[j] ? (float)sx : 0.0f;
  dbr[j] += mbr[j] ? (float)sr : 0.0f;
}

/* bwd_ws_kernel's bias sums: bsum [N][4][H] (per row and unit over the steps: dzpre, drpre, dgpre,
 * drhb) added over the rows in order; dbx's rows z, r, g take sums 0, 1, 2, dbr's 0, 1, 3. */
__global__ void bias_rows_kernel(const double *bsum, int64_t N, int64_t H, const uint8_t *mbx, const uint8_t *mbr, float *dbx,
                                 float *dbr) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= 3 * H) return;
  const int64_t k = j / H, i = j % H, kr = k == 2 ? 3 : k;
  double sx = 0, sr = 0;
  for (int64_t n = 0; n < N; n++) { sx += bsum[(n * 4 + k) * H + i]; sr += bsum[(n * 4 + kr) * H + i]; }
  dbx[j] += mbx[j] ? (float)sx : 0.0f;
  dbr[j] += mbr[j] ? (float)sr : 0.0f;
}

/* out = deq(codes) as float. */
__global__ void deq_kernel(const int32_t *codes, int64_t n, qg_qp q, float *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = (float)qg_deq(codes[i], q);
}

/* out = deq(codes) in bf16 (exact where the host's split condition holds: |q - z| <= 256). */
__global__ void deq_bf16_kernel(const int32_t *codes, int64_t n, qg_qp q, __nv_bfloat16 *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn((float)qg_deq(codes[i], q));
}

/* out = bf16(v) (a fake-quantized weight: exact where the host's split condition holds). */
__global__ void to_bf16_kernel(const float *v, int64_t n, __nv_bfloat16 *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(v[i]);
}

/* out[e] += mask[e] ? v[a] + v[a + ps] : 0 with a = (e / len) rs + e % len: the two pieces' GEMM
 * results of element e (hi's first), as the split after-loop GEMMs leave them. */
__global__ void masked_add2_kernel(float *out, const float *v, const uint8_t *mask, int64_t n, int64_t len, int64_t rs,
                                   int64_t ps) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t a = (e / len) * rs + e % len;
  out[e] += mask[e] ? v[a] + v[a + ps] : 0.0f;
}

/* out += mask ? v : 0 */
__global__ void masked_add_kernel(float *out, const float *v, const uint8_t *mask, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] += mask[i] ? v[i] : 0.0f;
}

/* dh0 = dh * M(h0) (1 when h0 is NULL). */
__global__ void dh0_kernel(const float *dh, const float *h0, qg_qp QH, int64_t n, float *dh0) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  int m = 1;
  if (h0) qg_quant_real((double)h0[i], QH, &m);
  dh0[i] = dh[i] * (float)m;
}

/* Row-major C [m, n] = op(A) op(B) + beta C through cuBLAS (column-major: C^T = op(B)^T op(A)^T),
 * in the context's float math (strict fp32 or TF32). ta/tb: A is [k, m] / B is [n, k] (transposed). */
static qg_status sgemm_rm_on(qg_ctx *ctx, cublasHandle_t hb, const char *fn, int ta, int tb, int64_t m, int64_t n, int64_t k,
                             const float *A, const float *B, float beta, float *Cm) {
  if (m <= 0 || n <= 0) return QG_OK;
  const float one = 1.0f;
  const int lda = (int)(ta ? m : k), ldb = (int)(tb ? k : n);
  return qg_cublas_status(ctx, fn, cublasGemmEx(hb, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                (int)n, (int)m, (int)k, &one, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, Cm,
                                                CUDA_R_32F, (int)n, qg_cuda_f32_compute(ctx), CUBLAS_GEMM_DEFAULT));
}

static qg_status sgemm_rm(qg_ctx *ctx, const char *fn, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A,
                          const float *B, float beta, float *Cm) {
  return sgemm_rm_on(ctx, qg_cuda_blas(ctx), fn, ta, tb, m, n, k, A, B, beta, Cm);
}

/* Row-major C [m, n] = op(A) op(B) with bf16 A and B (lda, ldb as given), fp32 accumulation and
 * output: the split GEMMs of the TF32 mode (see int_gru_backward.cu's header). */
static qg_status gemm_bf16_rm_on(qg_ctx *ctx, cublasHandle_t hb, const char *fn, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                 const void *A, int64_t lda, const void *B, int64_t ldb, float *Cm) {
  if (m <= 0 || n <= 0) return QG_OK;
  const float one = 1.0f, zero = 0.0f;
  return qg_cublas_status(ctx, fn, cublasGemmEx(hb, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
                                                (int)k, &one, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda, &zero, Cm,
                                                CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The exact split's int8 GEMM (exact_split.cuh's xs_gemm) with the context's error report. */
static qg_status xs_gemm_on(qg_ctx *ctx, cublasHandle_t hb, const char *fn, int32_t *C, const int8_t *D, const int8_t *Y, int64_t M,
                            int64_t Nc, int64_t Kp, int S) {
  return qg_cublas_status(ctx, fn, xs_gemm(hb, C, D, Y, M, Nc, Kp, S));
}

/*
 * int_gru_backward.cu: the straight-through backward of the integer GRU layer on CUDA
 * (qg_int_gru_backward of core/qgru.h, QUANT_SPEC.md section 4). The per-unit work is the shared
 * STE cell qg_cell_backward of core/int_gru_cell.h, the function the CPU backend
 * (core/int_gru_cpu.c) calls; this file arranges the recurrence and the GEMMs around it. It is a
 * file of its own (the forward and the weight quantization are kernels/int_gru.cu) because its
 * recurrence has two paths of its own. Built with --fmad=false (CMakeLists.txt) like int_gru.cu:
 * the cell's float math must round as the CPU's (built with -ffp-contract=off).
 *
 * The recurrence, steps s = T-1 down to 0, one of two paths (ctx->kernel_path; AUTO takes the
 * persistent one where it fits and its estimate beats the fallback's, a forced PERSISTENT on a
 * shape it cannot hold is QG_ERR_UNSUPPORTED naming the limit, a forced FALLBACK runs the
 * per-step launches):
 *   - persistent (kernels/int_gru_bwd_persist.cu: bwd_persist_kernel, R~ in shared memory, and
 *     its register variants bwd_reg_kernel, bwd_ws_kernel, bwd_ws3_kernel for small H): one
 *     launch for all T steps, thread-block clusters holding R~ on chip; that file says how.
 *   - fallback: per step a cell kernel (bwd_step1_kernel where the step's indices fit 32 bits and
 *     the saved records are 4-byte aligned, else bwd_step_kernel; the same per-unit code) and the cuBLAS
 *     GEMM dq_s R~ in the context's math mode (in strict mode below QGRU_OWN_STEP_FLOPS a step, our
 *     step_product_kernel instead, into the same K-slice partials): where the output's tiles do not fill the device
 *     (large: N 256, H 1024), one strided-batched GEMM over S slices of K = 3H into S partial
 *     products that the next step kernel adds in order (step_gemm_slices), else one GEMM adding
 *     into the direct part. The step kernel also writes Hf (the dR GEMM's
 *     dequantized h) and, instead of the bias contributions bcx, bcr, each block's double sums of
 *     the four distinct bias gradients over its rows (bias_steps_kernel adds those after the
 *     loop in a fixed order): a third fewer bytes per step and no [T N, 3H] re-read. The loop is
 *     captured into a CUDA graph on the second identical call and replayed after (the context's
 *     cache of captured loops in kernels/gru.cu, keyed by every pointer, size, kernel argument and
 *     the math mode; a changed pointer or shape is a new key).
 * Padded steps (s >= lengths[n]) pass dh through and write zero dq, bcx, bcr (dp of padded time
 * rows is cleared before the loop); time t = reverse ? lengths[n] - 1 - s : s.
 * The TF32 mode's bf16 split (per-step path with bwd_step1_kernel; pieces = 2): every float GEMM
 * of this backward multiplies a float gradient (dq or dp) by a fake-quantized tensor (R~, W~, x~,
 * h~). Where those are at most 8-bit grids, (q - z) 2^-e with |q - z| <= 256, they are exact in
 * bf16, and the step kernel writes each gradient as two bf16 pieces, hi = bf16(v) and
 * lo = bf16(v - hi) ([T N][2][3H]: 16 significant bits, TF32 keeps 11). Then every product of a
 * bf16 GEMM is exact and only fp32 accumulation rounds: more accurate than TF32 (bench/
 * bf16_split_gemm.cu: 12-70x smaller errors at the large shape) and faster (half the bytes of the
 * weight operand, bf16 tensor cores at twice TF32's rate). The pieces are extra rows of the
 * product (the per-step GEMM's 2N columns, dW's and dR's 6H rows, dx's 2 T N rows), added after
 * it in a fixed order (hi first): by the step kernel, add_parts_kernel and masked_add2_kernel.
 * The strict mode's exact int8 split (exact_split.cuh; qg_ctx_set_exact_split, auto where the
 * SGEMMs it replaces are large): the same observation, with exact integer sums instead of bf16
 * pieces. Per step (bwd_step1_kernel<4>, the per-step path): the step kernel writes dq in fp32,
 * xs_rows_kernel turns dq_s into digit planes (R's per-row exponents folded in), one int8 GEMM
 * (two K slices where the output leaves the device idle) by R's codes, and the next step kernel
 * adds the digit products (xs_element: int64, one rounding). Where a thread-block cluster holds a
 * row's units (H <= 1024), bwd_step1_xs_kernel is the step kernel and the split in one launch
 * (the same bits) and also gathers the after-loop split's column maxima of dq and dp; its product
 * is then igemm's (igemm.cuh: wgmma, a programmatic dependent of the step kernel, R's codes loaded
 * before its wait; cuBLAS where the device is not sm_90). Beside the loop (per-step path, both
 * splits), a side stream at the device's least priority prepares what the after-loop products
 * need and computes dx chunk by chunk (step_loop; bench/cuda_int_gru.md, session 21: large strict
 * backward 4.92 -> 4.74 ms; the last chunk's dx after the loop, beside the after-loop work, and
 * joined at the end: QGRU_SIDE_DEFER_LAST). After the loop (either path): the
 * codes of h and x as K = T N contiguous rows, dq's and dp's columns as digit planes (a shift per
 * column from its largest value), dp's rows for dx; dR, dW, dx as int8 GEMMs and combines that
 * add the masked results. More accurate than SGEMM (bench/xs_gemm.cu) and 1.9x faster for the
 * large strict train step (bench/gpu.md, run 16).
 * After the loop: dx, dW, dR by GEMMs (qg_cuda_f32_compute: strict fp32 or TF32; dW on the
 * context's aux stream beside the other two, forked and joined with its events) and the bias sums
 * in a fixed order in double (persistent: chunks of (step, row) pairs, then the chunks in order;
 * per-step: the step kernel's row sums, then those in order), dh0 = dh M(h0).
 */
#include "int_gru_bwd.cuh"   /* bwd_params, the per-(row, unit) step, the persistent path */
#include "gru_persist.cuh"   /* cluster_barrier, sum_partials, ptx.cuh */
#include "exact_split.cuh"   /* the strict mode's exact int8 split products */
#include "igemm.cuh"         /* the split loop's per-step product as a programmatic dependent (sm_90a) */
#include "ktrace.cuh"        /* QG_KTRACE builds only: the split loop's kernel trace */

#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

/* The per-step fallback's cost per step (us): two launches (about 4 us each at small shapes, the
 * QAT step timings of bench/gpu.md) plus the GEMM's arithmetic. */
static double fallback_step_us(const qg_ctx *ctx, int64_t N, int64_t H) {
  const double flops = 2.0 * (double)N * 3.0 * (double)H * (double)H;
  return 8.0 + flops / (ctx->math == QG_MATH_TF32 ? 100e6 : 25e6);
}

/* ---- after the loop ----------------------------------------------------------------------------------- */

/* Bias sums in a fixed order: the CPU's sequence (steps descending, rows ascending) cut into
 * chunks of BIAS_CHUNK (row, step) pairs summed in double, then the chunks in order. */
enum { BIAS_CHUNK = 64 };

__global__ void bias_partial_kernel(const float *bcx, const float *bcr, int64_t T, int64_t N, int64_t H3, double *part) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, c = blockIdx.y, TN = T * N;
  if (j >= H3) return;
  const int64_t q1 = (c + 1) * BIAS_CHUNK < TN ? (c + 1) * BIAS_CHUNK : TN;
  double sx = 0, sr = 0;
  for (int64_t q = c * BIAS_CHUNK; q < q1; q++) {
    const int64_t r = (T - 1 - q / N) * N + q % N;
    sx += bcx[r * H3 + j];
    sr += bcr[r * H3 + j];
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
 * output: the split GEMMs of the TF32 mode (see the top of the file). */
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

/* ---- the per-step path ----------------------------------------------------------------------------
 * bwd_step_kernel: step s for every (row, unit): blocks of BS_X units x BS_Y row lanes, each thread
 * `rpt` rows (n = chunk BS_Y rpt + lane + BS_Y k). dL/dh_{s+1} of (n, i) is dd[e] (the direct part
 * the previous step wrote) plus, in order, the nparts split-K partial products P[k][e] of the
 * previous step's GEMM (dq_{s+1} R~ over K slices; nparts = 0 when cuBLAS added its product into
 * dd itself, and at the first step). It writes dp, dq and dn (the direct part of dL/dh_s),
 * Hf[s] = deq(h code) (the dR GEMM's operand, for padded steps too), and instead of the [T N, 3H]
 * bias contributions the block's sums over its rows of the four distinct bias gradients (dzpre,
 * drpre, dgpre, drhb: dbx = (z, r, g), dbr = (z, r, Rh_g + br_g)), in double: each lane its rows in
 * order, then the lanes in order, into sp[s][chunk][4][H] (every entry written every step, 0 for
 * padded rows). bias_steps_kernel adds those in a fixed order.
 * ONE: rpt = 1 as a constant (40 registers against 80 for the loop at sm_90: 6 blocks per
 * multiprocessor instead of 3); MB: the blocks per multiprocessor asked of ptxas (8: 32
 * registers, a 16-byte stack, so that a step of large, 1024 blocks, is one wave on 132
 * multiprocessors instead of 1.29). WORDS: the saved records read as 32-bit words (load_step / prepare_step, as the persistent
 * kernels; the host checks the base's alignment) instead of qg_cell_unpack's byte copies; every
 * load of a row is issued before its stores. */
enum { BS_X = 32, BS_Y = 8 };

/* The step kernels' bias sums: the block's four sums (a0..a3 of each thread) over its BS_Y row
 * lanes, in order, in double, into sp[((s chunks + chunk) 4 + k) H + i] (thread row k < 4). I: the
 * kernel's index type (int64_t, or int where the step's indices fit 32 bits). */
template <typename I, int BX = BS_X>
__device__ __forceinline__ void block_bias_sums(double (&sh)[4][BS_Y][BX], double a0, double a1, double a2, double a3, I s,
                                                I H, I i, double *__restrict__ sp, I chunk, I chunks) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  sh[0][ty][tx] = a0; sh[1][ty][tx] = a1; sh[2][ty][tx] = a2; sh[3][ty][tx] = a3;
  __syncthreads();
  if (ty < 4 && i < H) {
    double v = 0;
    for (int y = 0; y < BS_Y; y++) v += sh[ty][y][tx];
    sp[((s * chunks + chunk) * 4 + ty) * H + i] = v;
  }
}

template <bool WORDS, bool ONE, int MB>
__global__ void __launch_bounds__(BS_X * BS_Y, MB) bwd_step_kernel(const __grid_constant__ bwd_params p, int64_t s, int rpt,
                                                                const float *__restrict__ dd, const float *__restrict__ P,
                                                                int nparts, float *__restrict__ dn, float *__restrict__ Hf,
                                                                double *__restrict__ sp) {
  __shared__ double sh[4][BS_Y][BS_X];
  const int64_t H = p.H, N = p.N, NH = N * H, H3 = 3 * H, i = blockIdx.x * (int64_t)BS_X + threadIdx.x;
  const qg_qp QH = p.cell.a[QG_Q_OUTPUT_H];
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  if (i < H)
    for (int k = 0; k < (ONE ? 1 : rpt); k++) {
      const int64_t n = blockIdx.y * (int64_t)(BS_Y * rpt) + threadIdx.y + (int64_t)k * BS_Y;
      if (n >= N) break;
      const int64_t e = n * H + i, Ln = length_at(p.L, n, p.T);
      float dh = dd[e];
      for (int j = 0; j < nparts; j++) dh += P[j * NH + e];
      float *dqr = p.dq + (s * N + n) * H3;
      if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
        const int32_t hp = p.hq[s * NH + e];
        dqr[i] = dqr[H + i] = dqr[2 * H + i] = 0.0f;
        dn[e] = dh;
        Hf[s * NH + e] = (float)qg_deq(hp, QH);
        continue;
      }
      const int64_t t = p.reverse ? Ln - 1 - s : s;
      qg_cell_grad gr;
      int32_t hp;
      if (WORDS) {
        step_in in;
        load_step(p, s, n, i, Ln, in);
        hp = in.hp;
        step_vals v;
        prepare_step(p, s, Ln, in, v);
        qg_cell_backward_values(v.v.mask, v.v.z, v.v.rr, v.v.g, v.v.dsz, v.v.dsr, v.v.dtg, v.v.hp, v.v.rhb, dh + v.dy, &gr);
      } else {
        hp = p.hq[s * NH + e];
        const float dH = dh + (p.dy ? p.dy[(t * N + n) * p.Hy + p.y_offset + i] : 0.0f);
        qg_cell_out su;
        qg_cell_unpack(p.cellp + ((s * N + n) * H + i) * p.cb, &p.cell, &su);
        qg_cell_backward(&p.cell, &p.tb, &su, hp, dH, &gr);
      }
      float *dpr = p.dp + (t * N + n) * H3;
      dpr[i] = gr.dp[0]; dpr[H + i] = gr.dp[1]; dpr[2 * H + i] = gr.dp[2];
      dqr[i] = gr.dq[0]; dqr[H + i] = gr.dq[1]; dqr[2 * H + i] = gr.dq[2];
      a0 += (double)gr.dbx[0]; a1 += (double)gr.dbx[1]; a2 += (double)gr.dbx[2]; a3 += (double)gr.dbr[2];
      dn[e] = gr.dhprev;
      Hf[s * NH + e] = (float)qg_deq(hp, QH);
    }
  block_bias_sums<int64_t>(sh, a0, a1, a2, a3, s, H, i, sp, (int64_t)blockIdx.y, (int64_t)gridDim.y);
}

/* v = hi + lo + r as bf16 pieces, hi = bf16(v), lo = bf16(v - hi) (v - hi is exact in fp32): 16
 * significant bits of v (TF32 keeps 11), r at most 2^-17 |v| */
__device__ __forceinline__ void split_bf16(float v, __nv_bfloat16 *hi, __nv_bfloat16 *lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  *hi = h;
  *lo = __float2bfloat16_rn(__fsub_rn(v, __bfloat162float(h)));
}

/* 2^-e as a double without ldexp's general path (exact: e in [-1022, 1022] builds the bits). */
__device__ __forceinline__ double pow2_neg(int e) {
  return e >= -1022 && e <= 1022 ? __longlong_as_double((long long)(1023 - e) << 52) : ldexp(1.0, -e);
}

/* bwd_step1_kernel: bwd_step_kernel's step for one row per thread where every index of the step
 * fits 32 bits (step_fits32; every shape of the benchmarks) and the saved records are read as
 * words: 32-bit index math; every load of the thread (dd, the nparts partial products, unrolled
 * up to STEP_MAX_SLICES so that they are in flight together, the saved record, the h code, dy)
 * issued before any use; with the cell's tables (tb.val[0] set) the unpack
 * and qg_cell_backward_prepare inline: table index = the stored offset from qmin, the
 * dequantizations (double, as qg_cell_backward_prepare and qg_deq) with 2^-e built from its bits;
 * hp of the cell and Hf are the same value (qg_deq of the h code), computed once. Without tables,
 * prepare_step. Same values and sums in the same order as bwd_step_kernel: bit-identical results.
 * (Tried in round 3, bench/cuda_int_gru.md: launching it with programmatic dependent launch after
 * the step's GEMM, the dh-independent part before griddepcontrol.wait: no gain at large, and the
 * wait's serialization of the partial products' loads cost 0.09 ms at medium.)
 * 8 blocks per multiprocessor asked of ptxas: 32 registers (16 bytes of stack), one wave at large;
 * the 40-register build (6 blocks, no stack) ran the same (bench/cuda_int_gru.md, round 3).
 * A launch runs the rows [n0, n0 + nr) (n0 a multiple of BS_Y; the two row groups of
 * step_loop_body), its blocks' bias sums are chunks n0 / BS_Y + blockIdx.y of `chunks`, and P
 * holds the products of those rows only: planes of nr rows. */
enum { STEP_MAX_SLICES = 8 };   /* step_gemm_slices' cap */

/* Where bwd_step1_xs_kernel stores a thread's dq, dp and dL/dh_{s-1} (after its cluster barrier, so
 * that the barrier's release does not wait on them): step1_unit leaves them to the caller when
 * given one of these. dp_row < 0: a padded step (no dp written). */
struct step1_defer { int q_row, p_row; float dn; };

/* The work of bwd_step1_kernel's thread (n, i) (i < H, n in [n0, n0 + nr)): its four bias terms
 * into a (0 for a padded step) and its three dq and dp values into dq3 and dp3 (as written to
 * p.dq and p.dp; a padded step writes no dp and leaves dp3 as it was; PC = 2 leaves both unset). */
template <int PC, int MS = XS_MAX_SLICES>
__device__ __forceinline__ void step1_unit(const bwd_params &p, int s, const float *__restrict__ dd, const float *__restrict__ P,
                                           int nparts, float *__restrict__ dn, void *__restrict__ Hf, const int *__restrict__ xsh,
                                           const long long *__restrict__ xcorr, int n0, int nr, int i, int n, double (&a)[4],
                                           float (&dq3)[3], float (&dp3)[3], step1_defer *df = nullptr) {
  const int H = (int)p.H, N = (int)p.N, NH = N * H, H3 = 3 * H;
  const int e = n * H + i, se = s * NH + e;
  const int Ln = (int)length_at(p.L, n, p.T);
  const qg_qp QH = p.cell.a[QG_Q_OUTPUT_H];
  const int32_t hq = p.hq[se];
  float dh = dd[e];
  if (PC == 4) {   /* the exact int8 split's product (strict mode): [nparts K slices][4 digits][nr][H] int32 */
    if (MS == 1) {   /* at most one slice: 32-bit offsets (P is read from the second step on, T >= 2, so 4 nr H < 3 T N H < 2^31: step_fits32) */
      if (nparts) dh += xs_element1((const int32_t *)P, (unsigned)(nr * H), (unsigned)((n - n0) * H + i), xcorr[n], xsh[n]);
    } else if (nparts) {
      dh += xs_element<MS>((const int32_t *)P, nparts, (int64_t)nr * H, (n - n0) * H + i, xcorr[n], xsh[n]);
    }
  } else {
    /* the partial products: slice j, piece c of (n, i) at P[j PC nr H + ((n - n0) PC + c) H + i]
     * (PC = 1: P[j nr H + (n - n0) H + i]); added slice by slice, pieces in order */
    const int pr = nr * H, nl = n - n0;
    float pv[STEP_MAX_SLICES];
#pragma unroll
    for (int j = 0; j < STEP_MAX_SLICES; j++)   /* all in flight at once */
      pv[j] = j < nparts * PC ? P[(j / PC) * PC * pr + (nl * PC + j % PC) * H + i] : 0.0f;
#pragma unroll
    for (int j = 0; j < STEP_MAX_SLICES; j++)
      if (j < nparts * PC) dh += pv[j];
  }
  constexpr int PW = PC == 2 ? 2 : 1;             /* dq and dp rows as written: PC = 2 as bf16 pieces hi, lo */
  const int qrow = (s * N + n) * PW * H3 + i;   /* the row of dq */
  if (s >= Ln) {   /* padded step: the gradient passes through, nothing else */
    const float hf = (float)((double)(hq - QH.z) * pow2_neg(QH.e));
    if (PC != 2) {
      if (!df) {
        float *dqr = p.dq + qrow;
        dqr[0] = dqr[H] = dqr[2 * H] = 0.0f;
      }
      dq3[0] = dq3[1] = dq3[2] = 0.0f;
      if (PC != 4 || Hf) ((float *)Hf)[se] = hf;
    } else {
      __nv_bfloat16 *dqr = (__nv_bfloat16 *)p.dq + qrow;
      const __nv_bfloat16 z = __float2bfloat16_rn(0.0f);
      dqr[0] = dqr[H] = dqr[2 * H] = dqr[H3] = dqr[H3 + H] = dqr[H3 + 2 * H] = z;
      ((__nv_bfloat16 *)Hf)[se] = __float2bfloat16_rn(hf);   /* exact: the host's split condition */
    }
    if (df) *df = step1_defer{qrow, -1, dh};
    else dn[e] = dh;
  } else {
    const int t = p.reverse ? Ln - 1 - s : s;
    const uint32_t *src = (const uint32_t *)(p.cellp + (unsigned)se * (unsigned)p.cb);
    step_in in;
    const int nw = p.cb / 4;
#pragma unroll
    for (int k = 0; k < BP_MAX_WORDS; k++)
      if (k < nw) in.w[k] = src[k];
    in.hp = hq;
    in.dy = p.dy ? p.dy[(t * N + n) * (int)p.Hy + p.y_offset + i] : 0.0f;
    step_vals v;
    if (p.tb.val[0]) {
      const qg_cell_q &q = p.cell;
      const qg_qp QRH = q.a[QG_Q_MATMUL_RH];
      int iz, ir, ig, rhb;
      if (q.narrow) {
        iz = (int)(in.w[0] & 0xffffu); ir = (int)(in.w[0] >> 16); ig = (int)(in.w[1] & 0xffffu);
        rhb = (int)(in.w[1] >> 16) + (int)QRH.qmin;
        v.v.mask = in.w[2];
      } else {
        iz = (int)((int32_t)in.w[0] - q.a[QG_Q_Z_PRE].qmin); ir = (int)((int32_t)in.w[1] - q.a[QG_Q_R_PRE].qmin);
        ig = (int)((int32_t)in.w[2] - q.a[QG_Q_G_PRE].qmin);
        rhb = (int32_t)in.w[3];
        v.v.mask = in.w[4];
      }
      v.v.z = p.tb.val[0][iz]; v.v.rr = p.tb.val[1][ir]; v.v.g = p.tb.val[2][ig];
      v.v.dsz = p.tb.der[0][iz]; v.v.dsr = p.tb.der[1][ir]; v.v.dtg = p.tb.der[2][ig];
      v.v.hp = (float)((double)((int64_t)hq - QH.z) * pow2_neg(QH.e));
      v.v.rhb = (float)((double)((int64_t)rhb - QRH.z) * pow2_neg(QRH.e));
      v.dy = in.dy;
    } else {
      prepare_step(p, s, Ln, in, v);
    }
    qg_cell_grad gr;
    qg_cell_backward_values(v.v.mask, v.v.z, v.v.rr, v.v.g, v.v.dsz, v.v.dsr, v.v.dtg, v.v.hp, v.v.rhb, dh + v.dy, &gr);
    const int prow = (t * N + n) * PW * H3 + i;
    if (PC != 2) {
      if (PC != 4 || Hf) ((float *)Hf)[se] = v.v.hp;   /* PC = 4: NULL where the after-loop GEMMs split too */
      if (!df) {
        float *dpr = p.dp + prow, *dqr = p.dq + qrow;
        dpr[0] = gr.dp[0]; dpr[H] = gr.dp[1]; dpr[2 * H] = gr.dp[2];
        dqr[0] = gr.dq[0]; dqr[H] = gr.dq[1]; dqr[2 * H] = gr.dq[2];
      }
      dq3[0] = gr.dq[0]; dq3[1] = gr.dq[1]; dq3[2] = gr.dq[2];
      dp3[0] = gr.dp[0]; dp3[1] = gr.dp[1]; dp3[2] = gr.dp[2];
    } else {
      ((__nv_bfloat16 *)Hf)[se] = __float2bfloat16_rn(v.v.hp);
      __nv_bfloat16 *dpr = (__nv_bfloat16 *)p.dp + prow, *dqr = (__nv_bfloat16 *)p.dq + qrow;
#pragma unroll
      for (int k = 0; k < 3; k++) {
        split_bf16(gr.dp[k], dpr + k * H, dpr + H3 + k * H);
        split_bf16(gr.dq[k], dqr + k * H, dqr + H3 + k * H);
      }
    }
    a[0] = (double)gr.dbx[0]; a[1] = (double)gr.dbx[1]; a[2] = (double)gr.dbx[2]; a[3] = (double)gr.dbr[2];
    if (df) *df = step1_defer{qrow, prow, gr.dhprev};
    else dn[e] = gr.dhprev;
  }
}

template <int PC>
__global__ void __launch_bounds__(BS_X * BS_Y, 8) bwd_step1_kernel(const __grid_constant__ bwd_params p, int s,
                                                                 const float *__restrict__ dd, const float *__restrict__ P,
                                                                 int nparts, float *__restrict__ dn, void *__restrict__ Hf,
                                                                 double *__restrict__ sp, const int *__restrict__ xsh,
                                                                 const long long *__restrict__ xcorr, int n0, int nr, int chunks) {
  __shared__ double sh[4][BS_Y][BS_X];
  const int H = (int)p.H;
  const int i = blockIdx.x * BS_X + threadIdx.x, n = n0 + blockIdx.y * BS_Y + threadIdx.y;
  double a[4] = {0, 0, 0, 0};
  float dq3[3], dp3[3];
  if (i < H && n < n0 + nr) step1_unit<PC>(p, s, dd, P, nparts, dn, Hf, xsh, xcorr, n0, nr, i, n, a, dq3, dp3);
  block_bias_sums<int>(sh, a[0], a[1], a[2], a[3], s, H, i, sp, (int)(n0 / BS_Y + blockIdx.y), chunks);
}

/* bwd_step1_xs_kernel: bwd_step1_kernel<4> (the strict mode's exact split) with xs_rows_kernel's
 * work on dq_s fused in, so that the per-step chain is this kernel and the int8 GEMM (the split
 * was a kernel of its own, 5 us a step at large, and a launch more in the chain). A block is
 * XF_X units x BS_Y rows; a thread-block cluster of ceil(H / XF_X) blocks holds every unit of its
 * BS_Y rows, so each row's largest |dq 2^-ke| (the split's shift) is a cluster reduction: each
 * block pushes its row maxima into every peer's shared memory (distributed shared memory), one
 * cluster barrier, each block reduces its copies. Then each thread writes its three dq values as
 * digits into the planes D [4][nr][Kp] (the threads of units i < Kp - 3H also zero the row's
 * padding), and block 0 of the cluster writes the row's shift xsh[n] and correction xcorr[n]
 * (sum of Xi (zoff - kz): with zero-point terms (zc_any) the blocks' int64 sums pushed to block 0
 * and added in rank order after a second barrier; else 0). The same integers, shifts and
 * corrections as xs_rows_kernel (the same xs_fixed of the same floats, exact integer sums): the
 * same bits. The bias sums are bwd_step1_kernel's (each unit's BS_Y rows in order). R's exponents
 * (and zero points) of the block's columns arrive by cp.async during the cell. With kmx (the
 * after-loop split's column maxima of dq and dp, [2][3H] float bits, zeroed before the loop) each
 * block adds its rows' |dq| and |dp| by integer atomicMax, as xs_colmax_kernel would from the
 * stored rows (the same maxima: max is order-free), so neither the side stream nor the after-loop
 * work reads them again. Clusters of up to XF_MAX_CLUSTER blocks: H <= XF_X XF_MAX_CLUSTER.
 * Launched as a programmatic dependent of the GEMM before it (xs_fused_config): it reads nothing
 * the previous kernels wrote before griddep_wait. MS = 1 (one K slice, the two row groups' form)
 * reads P with 32-bit offsets and no predicated slices (session 30: the general form's slice
 * addressing was ~100 of ~820 instructions a warp; large strict backward 4.36-4.41 -> 4.24-4.26 ms).
 * (Measured and not kept, session 30: two units a thread at 64 registers, within noise; the same at
 * 40 registers and 3 blocks a multiprocessor, 0.15 ms slower.) */
#if QG_KTRACE   /* the split loop's trace (ktrace.cuh): records [KT_MAX_T steps][2 row groups][step kernel, product]; with
                   more than the default two row groups, the groups after the first share the second's records */
enum { KT_MAX_T = 4096 };
__device__ kt_rec *kt_loop;
#define KT_STEP_REC(s, n0) (kt_loop && (s) < KT_MAX_T ? kt_loop + 2 * (2 * (s) + ((n0) > 0)) : (kt_rec *)0)
#else
#define KT_STEP_REC(s, n0) ((kt_rec *)0)
#endif
/* 1: bwd_step1_xs_kernel lets its programmatic dependent (the step's igemm product) launch once
 * every block is past its cluster barriers, so that the product's launch and R's first loads
 * overlap the step kernel's tail (the digits and the stores). H200, large strict backward: 3.87-3.88
 * ms against 3.94-4.00 (bench/cuda_int_gru.md, session 37). Session 36's trigger right after the
 * wait was slower: the product's blocks then held multiprocessors for the whole step kernel. */
#ifndef QGRU_XS_STEP_TRIGGER
#define QGRU_XS_STEP_TRIGGER 1
#endif
enum { XF_X = 128, XF_MAX_CLUSTER = 8 };
template <int MS>   /* the most K slices of P: 1 (the two row groups' products) or XS_MAX_SLICES */
__global__ void __launch_bounds__(XF_X * BS_Y, 2) bwd_step1_xs_kernel(const __grid_constant__ bwd_params p, int s,
                                                                    const float *__restrict__ dd, const int32_t *__restrict__ P,
                                                                    int nparts, float *__restrict__ dn, void *__restrict__ Hf,
                                                                    double *__restrict__ sp, int *__restrict__ xsh,
                                                                    long long *__restrict__ xcorr, int n0, int nr, int chunks,
                                                                    int8_t *__restrict__ D, int Kp, const int32_t *__restrict__ ke,
                                                                    const int32_t *__restrict__ kz, int zoff, int zc_any,
                                                                    unsigned *__restrict__ kmx) {
  __shared__ double sh[4][BS_Y][XF_X];
  __shared__ float wmax[BS_Y][XF_X / 32];
  __shared__ float rmax[XF_MAX_CLUSTER][BS_Y];       /* the cluster's blocks' row maxima, pushed by each */
  __shared__ long long wsum[BS_Y][XF_X / 32];
  __shared__ long long csum[XF_MAX_CLUSTER][BS_Y];   /* block 0's: the blocks' correction sums */
  __shared__ int32_t kes[3][XF_X], kzs[3][XF_X];     /* R's exponents and zero points of the block's columns */
  cg::cluster_group cl = cg::this_cluster();
  const int K = (int)cl.num_blocks(), rank = (int)cl.block_rank();
  const int H = (int)p.H, H3 = 3 * H, tx = threadIdx.x, ty = threadIdx.y, lane = tx & 31, w = tx >> 5;
  const int i = blockIdx.x * XF_X + tx, n = n0 + blockIdx.y * BS_Y + ty;
  const bool valid = i < H && n < n0 + nr;
  kt_rec *const kr = KT_STEP_REC(s, n0);
  (void)kr;
  KT_START(kr, ty * XF_X + tx);
  cluster_arrive_relaxed();   /* this block has started: peers may write its shared memory after their wait */
  if (ty < 3 && i < H) {
    if (ke) cp_async4(&kes[ty][tx], ke + ty * H + i);
    if (zc_any && kz) cp_async4(&kzs[ty][tx], kz + ty * H + i);
  }
  cp_async_commit();
  /* launched as a programmatic dependent of the step's GEMM (xs_fused_config): what it wrote (P)
   * and the previous step kernel's dd, xsh, xcorr are visible from here on; R's exponents and zero
   * points above are the weights' (unchanged in the backward) */
  griddep_wait();
  KT_WAITED(kr, ty * XF_X + tx);
  double a[4] = {0, 0, 0, 0};
  float dq3[3] = {0.0f, 0.0f, 0.0f}, dp3[3] = {0.0f, 0.0f, 0.0f};
  step1_defer df{0, -1, 0.0f};
  if (valid) step1_unit<4, MS>(p, s, dd, (const float *)P, nparts, dn, Hf, xsh, xcorr, n0, nr, i, n, a, dq3, dp3, &df);
  cp_async_wait_all();
  block_bias_sums<int, XF_X>(sh, a[0], a[1], a[2], a[3], s, H, i, sp, (int)(n0 / BS_Y + blockIdx.y), chunks);   /* a block barrier */
  /* the row maxima of |dq 2^-ke| (xs_rows_kernel's m): the warp (one row), the block, the cluster */
  float m = 0.0f;
  if (valid)
#pragma unroll
    for (int k = 0; k < 3; k++) m = fmaxf(m, xs_mag(dq3[k]) * xs_pow2_neg(ke ? kes[k][tx] : 0));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) wmax[ty][w] = m;
  __syncthreads();   /* (and the bias sums are done with sh) */
  float *cm = (float *)&sh[0][0][0];   /* kmx: [6][BS_Y][XF_X], |dq| then |dp| of each (row, column) */
  if (kmx)
#pragma unroll
    for (int k = 0; k < 3; k++) {
      cm[(k * BS_Y + ty) * XF_X + tx] = xs_mag(dq3[k]);
      cm[((3 + k) * BS_Y + ty) * XF_X + tx] = xs_mag(dp3[k]);
    }
  cluster_wait();   /* every block of the cluster has started */
  if (ty == 0 && tx < BS_Y * K) {   /* thread (row r, peer q): the block's maximum of row r into q's rmax[rank][r] */
    const int r = tx % BS_Y, q = tx / BS_Y;
    float b = wmax[r][0];
#pragma unroll
    for (int k = 1; k < XF_X / 32; k++) b = fmaxf(b, wmax[r][k]);
    st_cluster_f32(mapa_shared(smem_addr(&rmax[rank][r]), (uint32_t)q), b);
  }
  cluster_arrive();
  cluster_wait();   /* every block's maxima are here (and cm is complete) */
#if QGRU_XS_STEP_TRIGGER
  griddep_launch();   /* the product may launch: what is left is the digits' and stores' tail */
#endif
  if (valid) {   /* dq, dp and dL/dh_{s-1}, stored after the barrier (step1_defer) */
    float *dqr = p.dq + (unsigned)df.q_row;
    dqr[0] = dq3[0]; dqr[H] = dq3[1]; dqr[2 * H] = dq3[2];
    if (df.p_row >= 0) {
      float *dpr = p.dp + (unsigned)df.p_row;
      dpr[0] = dp3[0]; dpr[H] = dp3[1]; dpr[2 * H] = dp3[2];
    }
    dn[(unsigned)(n * H + i)] = df.dn;
  }
  if (kmx && ty < 6 && i < H) {   /* the block's column maxima over its rows, by integer atomicMax (order-free) */
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < BS_Y; r++) v = fmaxf(v, cm[(ty * BS_Y + r) * XF_X + tx]);
    if (v > 0.0f) atomicMax(kmx + (ty / 3) * H3 + (ty % 3) * H + i, __float_as_uint(v));
  }
  float rm = 0.0f;
  for (int q = 0; q < K; q++) rm = fmaxf(rm, rmax[q][ty]);
  const int sft = xs_shift((double)rm);
  /* the digits of the thread's three values, and their correction terms */
  long long c = 0;
  const unsigned plane = (unsigned)(nr * Kp);
  int8_t *drow = D + (unsigned)((n - n0) * Kp);   /* (32-bit offsets from one pointer: 4 nr Kp < 2^31, the host's check) */
  if (valid) {
#pragma unroll
    for (int k = 0; k < 3; k++) {
      const int xi = xs_fixed(dq3[k], sft - (ke ? kes[k][tx] : 0));
      int8_t dg[XS_DIGITS];
      xs_digits(xi, dg);
      if (zc_any) c += xi * (long long)(zoff - (kz ? kzs[k][tx] : 0));
      int8_t *q = drow + (unsigned)(k * H + i);
#pragma unroll
      for (int d = 0; d < XS_DIGITS; d++, q += plane) *q = dg[d];
    }
  }
  if (n < n0 + nr && i < Kp - H3) {   /* the row's padding columns [3H, Kp) */
    int8_t *q = drow + (unsigned)(H3 + i);
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++, q += plane) *q = 0;
  }
  if (zc_any) {   /* the row's correction: warps, blocks (pushed to block 0), in rank order */
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0) wsum[ty][w] = c;
    __syncthreads();
    if (ty == 0 && tx < BS_Y) {
      long long b = 0;
#pragma unroll
      for (int k = 0; k < XF_X / 32; k++) b += wsum[tx][k];
      st_cluster_s64(mapa_shared(smem_addr(&csum[rank][tx]), 0), b);
    }
    cluster_arrive();
    cluster_wait();
  }
  if (rank == 0 && tx == 0 && n < n0 + nr) {
    long long b = 0;
    if (zc_any)
      for (int q = 0; q < K; q++) b += csum[q][ty];
    xsh[n] = sft;
    xcorr[n] = b;
  }
  KT_END(kr, ty * XF_X + tx);
}

/* out[e] = dd[e] + the nparts slices' partial products of e = (n, i), pieces in order within a
 * slice, as bwd_step1_kernel adds them (dL/dh_0 after the split-K loop); pc pieces, NH = N H. */
__global__ void add_parts_kernel(const float *dd, const float *P, int nparts, int pc, int64_t NH, int64_t H, float *out) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= NH) return;
  const int64_t n = e / H, i = e - n * H;
  float v = dd[e];
  for (int j = 0; j < nparts; j++)
    for (int c = 0; c < pc; c++) v += P[j * pc * NH + (n * pc + c) * H + i];
  out[e] = v;
}

/* out[e] = dd[e] + the exact split's product of e = (n, i) (dL/dh_0 after the loop): P
 * [slices][4][N][H], the shifts and corrections of row n. */
__global__ void add_xs_kernel(const float *dd, const int32_t *P, int slices, const int *sh, const long long *corr, int64_t NH, int64_t H,
                              float *out) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= NH) return;
  const int64_t n = e / H;
  out[e] = dd[e] + xs_element<XS_MAX_SLICES>(P, slices, NH, e, corr[n], sh[n]);
}

/* The bias gradients from the step sums sp [T][chunks][4][H]: column c of 4H sums its T chunks
 * entries, numbered q = 0, 1, ... (s = T - 1 - q / chunks, chunk q % chunks: the CPU's
 * steps-descending order), over BF_Y lanes (lane l: q = l, l + BF_Y, ..., in order), then the
 * lanes in order, in double; dbx += M_bx (z, r, g sums), dbr += M_br (z, r, Rh_g + br_g sums).
 * Each lane issues BF_U loads before adding them (in order); the index arithmetic in U: unsigned
 * where T chunks 4 H < 2^32 (the host's choice), else 64-bit. (One 64-bit division a load and one
 * load in flight a lane made it latency-bound: 64 us for the 105 MB of the large shape's sums,
 * H200, ncu, session 27.) */
enum { BF_X = 32, BF_Y = 32, BF_U = 8 };

template <typename U>
__global__ void __launch_bounds__(BF_X * BF_Y) bias_steps_kernel(const double *__restrict__ sp, int64_t T, int64_t chunks, int64_t H,
                                                                  const uint8_t *mbx, const uint8_t *mbr, float *dbx, float *dbr) {
  __shared__ double sh[BF_Y][BF_X + 1];
  const int64_t c = blockIdx.x * (int64_t)BF_X + threadIdx.x, H4 = 4 * H;
  const U Q = (U)(T * chunks), uc = (U)chunks, uT = (U)T, uH = (U)H;
  double v = 0;
  if (c < H4) {
    const U k = (U)(c / H), i = (U)c - k * uH;
    for (U q0 = threadIdx.y; q0 < Q; q0 += BF_Y * BF_U) {
      double w[BF_U];
#pragma unroll
      for (int u = 0; u < BF_U; u++) {
        const U q = q0 + (U)(u * BF_Y), s = uT - 1 - q / uc, ch = q % uc;
        w[u] = q < Q ? sp[((s * uc + ch) * 4 + k) * uH + i] : 0.0;
      }
#pragma unroll
      for (int u = 0; u < BF_U; u++)
        if (q0 + (U)(u * BF_Y) < Q) v += w[u];
    }
  }
  sh[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y != 0 || c >= H4) return;
  double t = 0;
  for (int y = 0; y < BF_Y; y++) t += sh[y][threadIdx.x];
  const int64_t k = c / H, i = c - k * H;
  const float f = (float)t;
  if (k < 3) dbx[k * H + i] += mbx[k * H + i] ? f : 0.0f;
  if (k < 2) dbr[k * H + i] += mbr[k * H + i] ? f : 0.0f;
  if (k == 3) dbr[2 * H + i] += mbr[2 * H + i] ? f : 0.0f;
}

/* dbx, dbr += the bias gradients from the step sums sp [T][chunks][4][H] (bias_steps_kernel), on st. */
static qg_status bias_steps(qg_ctx *ctx, const char *fn, cudaStream_t st, const double *sp, int64_t T, int64_t chunks, int64_t H,
                            const qg_int_gru *g, qg_tensor *dbx, qg_tensor *dbr) {
  const auto f = T * chunks * 4 * H < ((int64_t)1 << 32) ? bias_steps_kernel<unsigned> : bias_steps_kernel<uint64_t>;
  f<<<qg_cuda_blocks(4 * H, BF_X), dim3(BF_X, BF_Y), 0, st>>>(sp, T, chunks, H, g->mask[QG_W_BX], g->mask[QG_W_BR], (float *)dbx->data,
                                                             (float *)dbr->data);
  return qg_cuda_launched(ctx, fn);
}

/* Rows per thread of bwd_step_kernel: one (two rows per thread, 512 blocks at large, ran 12.2 us
 * a step against 8.4 for one, bench/gpu_runs/large_bwd_ncu_tf32.log: a thread's second row waited
 * for its first's stores), more only where the row chunks would pass the grid's y limit. A
 * function of the shape only, so the summation order is fixed. */
static int step_rows_per_thread(int64_t N) {
  const int64_t r = (N + (int64_t)BS_Y * 65535 - 1) / ((int64_t)BS_Y * 65535);
  return r < 1 ? 1 : (int)r;
}

/* K slices of the per-step GEMM dq_s [N, 3H] R~ [3H, H]: 0 (one cublasGemmEx adding into the
 * direct part, beta 1: cuBLAS's own choice, at large a split-K 8 kernel plus its reduction
 * kernel, bench/cuda_int_gru.md) when the output's 128 x 128 tiles fill the device, else S: one
 * strided-batched GEMM of S slices of 3H / S (S divides 3H) into S partial products that the next
 * step kernel adds in order (no reduction kernel, no atomics). pieces = 2 (the bf16 split): the
 * output has 2N rows, and a slice costs the step kernel two loads (at most STEP_MAX_SLICES in all).
 * A function of the shape, the math mode and the device's multiprocessor count, so the summation
 * order is fixed. */
static int step_gemm_slices(const qg_ctx *ctx, int64_t N, int64_t H, int pieces) {
  const int64_t tiles = ((N * pieces + 127) / 128) * ((H + 127) / 128), H3 = 3 * H;
  int64_t S = (ctx->sm_count + tiles - 1) / tiles;
  if (S > STEP_MAX_SLICES / pieces) S = STEP_MAX_SLICES / pieces;   /* the step kernel's loads */
  while (S > 1 && (H3 % S != 0 || H3 / S < 128)) S--;
  return S > 1 ? (int)S : 0;
}

/* step_product_kernel: the strict mode's per-step product where the exact split does not run
 * (shapes below QGRU_OWN_STEP_FLOPS): P[k][n][i] = sum over j of slice k (j = k Kc ..
 * min(3H, k Kc + Kc) - 1, ascending) of dq_s[n][j] R~[j][i], one fp32 FMA chain per output, the S
 * slices added in order by the next step kernel. The order depends only on the shape
 * (deterministic), and the accuracy is SGEMM's (a chain of at most Kc FMAs, then S adds).
 * Why not cuBLAS: at medium (N 64, H 512) cublasGemmStridedBatchedEx runs its 8 slices of
 * 64 x 512 x 192 as 32 x 32 SIMT tiles of 64 threads, 7.9 us a step under ncu (caches kept) against
 * 7.0 here, and the strict backward went 1.39-1.42 -> 1.31-1.32 ms (bench/cuda_int_gru.md,
 * session 25; the step is bound by latency at 4 warps a multiprocessor, not by its FMAs).
 * A CTA of 8 TR / RT threads computes a tile of TR rows x SP_TU units (thread t: units
 * 4 (t % 8) .. + 3 of rows t / 8 + (TR / RT) q, q < RT) over its slice in chunks of SP_KB columns,
 * streamed into a ring of SP_STAGES shared-memory stages by cp.async, SP_STAGES - 1 chunks ahead of
 * the FMAs: dq's rows as [row][k] (rows SP_QP words apart, so the four rows a warp reads at once
 * are on distinct banks), R~'s rows as [k][unit]. RT = 4 (16 outputs a thread); 2 (256 threads) and
 * 8 (64) ran slower. VEC (H % 4 == 0): 16-byte copies, each wholly inside or outside the operands
 * (zero-filled outside); else 4-byte copies and zeros stored outside. */
enum { SP_KB = 32, SP_TU = 32, SP_STAGES = 3, SP_QP = SP_KB + 4, SP_RT = 4 };

template <int TR, int RT, bool VEC>
__global__ void __launch_bounds__(8 * TR / RT) step_product_kernel(float *__restrict__ P, const float *__restrict__ dq,
                                                                   const float *__restrict__ R, int N, int H, int Kc) {
  constexpr int NT = 8 * TR / RT, RS = TR / RT;   /* threads; the rows of a thread are RS apart */
  __shared__ __align__(16) float qs[SP_STAGES][TR][SP_QP];
  __shared__ __align__(16) float rs[SP_STAGES][SP_KB][SP_TU];
  const int tid = threadIdx.x, tu = tid & 7, tr = tid >> 3;
  const int i0 = blockIdx.x * SP_TU, n0 = blockIdx.y * TR, H3 = 3 * H;
  const int j0 = blockIdx.z * Kc, j1 = min(H3, j0 + Kc), nch = (j1 - j0 + SP_KB - 1) / SP_KB;
  /* chunk c into stage b: the thread's share of the TR x SP_KB dq values and SP_KB x SP_TU R~ values */
  auto issue = [&](int c, int b) {
    if (c < nch) {
      const int j = j0 + c * SP_KB;
      if (VEC) {
#pragma unroll
        for (int m = 0; m < TR * SP_KB / 4 / NT; m++) {   /* 16-byte pieces: row pr, columns pc .. pc + 3 */
          const int q = tid + m * NT, pr = q >> 3, pc = 4 * (q & 7), n = n0 + pr;
          const bool ok = n < N && j + pc < j1;
          cp_async16_zfill(&qs[b][pr][pc], ok ? dq + (int64_t)n * H3 + j + pc : dq, ok ? 16 : 0);
        }
#pragma unroll
        for (int m = 0; m < SP_KB * SP_TU / 4 / NT; m++) {   /* R~: row kr, units uc .. uc + 3 */
          const int q = tid + m * NT, kr = q >> 3, uc = 4 * (q & 7);
          const bool ok = j + kr < j1 && i0 + uc < H;
          cp_async16_zfill(&rs[b][kr][uc], ok ? R + (int64_t)(j + kr) * H + i0 + uc : R, ok ? 16 : 0);
        }
      } else {
#pragma unroll 4
        for (int m = 0; m < TR * SP_KB / NT; m++) {   /* one value: row pr, column pc */
          const int q = tid + m * NT, pr = q / SP_KB, pc = q % SP_KB, n = n0 + pr;
          if (n < N && j + pc < j1) cp_async4(&qs[b][pr][pc], dq + (int64_t)n * H3 + j + pc);
          else qs[b][pr][pc] = 0.0f;
        }
#pragma unroll 4
        for (int m = 0; m < SP_KB * SP_TU / NT; m++) {
          const int q = tid + m * NT, kr = q / SP_TU, uc = q % SP_TU;
          if (j + kr < j1 && i0 + uc < H) cp_async4(&rs[b][kr][uc], R + (int64_t)(j + kr) * H + i0 + uc);
          else rs[b][kr][uc] = 0.0f;
        }
      }
    }
    cp_async_commit();   /* a group every call, empty past the slice: the waits count SP_STAGES - 2 */
  };
  float acc[RT][4];
#pragma unroll
  for (int q = 0; q < RT; q++)
#pragma unroll
    for (int u = 0; u < 4; u++) acc[q][u] = 0.0f;
#pragma unroll
  for (int c = 0; c < SP_STAGES - 1; c++) issue(c, c);
  for (int c = 0; c < nch; c++) {
    const int b = c % SP_STAGES;
    cp_async_wait<SP_STAGES - 2>();   /* this thread's copies of chunk c have landed */
    __syncthreads();                  /* everyone's; and every read of chunk c - 1's stage is done */
    issue(c + SP_STAGES - 1, (c + SP_STAGES - 1) % SP_STAGES);
#pragma unroll 2
    for (int k4 = 0; k4 < SP_KB; k4 += 4) {
      float4 a[RT];
#pragma unroll
      for (int q = 0; q < RT; q++) a[q] = *reinterpret_cast<const float4 *>(&qs[b][tr + RS * q][k4]);
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const float4 r4 = *reinterpret_cast<const float4 *>(&rs[b][k4 + kk][4 * tu]);
#pragma unroll
        for (int q = 0; q < RT; q++) {
          const float av = kk == 0 ? a[q].x : kk == 1 ? a[q].y : kk == 2 ? a[q].z : a[q].w;
          acc[q][0] = fmaf(av, r4.x, acc[q][0]);
          acc[q][1] = fmaf(av, r4.y, acc[q][1]);
          acc[q][2] = fmaf(av, r4.z, acc[q][2]);
          acc[q][3] = fmaf(av, r4.w, acc[q][3]);
        }
      }
    }
  }
  cp_async_wait_all();
  float *Pk = P + (int64_t)blockIdx.z * N * H;
#pragma unroll
  for (int q = 0; q < RT; q++) {
    const int n = n0 + tr + RS * q;
    if (n >= N) continue;
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (i0 + 4 * tu + u < H) Pk[(int64_t)n * H + i0 + 4 * tu + u] = acc[q][u];
  }
}

/* step_product_kernel's launch shape for dq_s [N, 3H] R~ [3H, H]: the tile's rows (64 from 33
 * rows on, else 32), and K slices of Kc columns (a multiple of SP_KB), as many as bring the CTAs to about
 * one per multiprocessor, at most STEP_MAX_SLICES (the step kernel's loads). A function of the
 * shape and the device's multiprocessor count, so the summation order is fixed. */
struct sp_shape {
  int rows, slices, Kc;
};
static sp_shape step_product_shape(const qg_ctx *ctx, int64_t N, int64_t H) {
  sp_shape o;
  o.rows = N > 32 ? 64 : 32;
  const int64_t H3 = 3 * H, tiles = ((H + SP_TU - 1) / SP_TU) * ((N + o.rows - 1) / o.rows);
  int64_t S = (ctx->sm_count + tiles - 1) / tiles;
  if (S > STEP_MAX_SLICES) S = STEP_MAX_SLICES;
  if (S < 1) S = 1;
  const int64_t Kc = round_up((H3 + S - 1) / S, SP_KB);
  o.Kc = (int)Kc;
  o.slices = H3 > 0 ? (int)((H3 + Kc - 1) / Kc) : 0;
  return o;
}

/* The TF32 mode's bf16 split (top of the file) needs every value of the fake-quantized operands
 * exact in bf16: (q - z) 2^-e with |q - z| <= 256 (bf16 carries 8 significant bits; |e| <= 31
 * always, QUANT_SPEC.md section 1) for every code q of the grid. */
static int grid_bf16_exact(int64_t qmin, int64_t qmax, int64_t z) { return qmin - z >= -256 && qmax - z <= 256; }

/* The same for every row (channel) of weight w: its zero points from the host copy (current:
 * device-derived quantizers are symmetric, their host zero points 0). */
static int weight_bf16_exact(const qg_int_gru *g, int w) {
  const int b = g->w_bits[w];
  if (!g->w_set[w] || b < 1 || b > 8) return 0;
  const int64_t qmin = g->w_unsigned[w] ? 0 : -(1LL << (b - 1)), qmax = g->w_unsigned[w] ? (1LL << b) - 1 : (1LL << (b - 1)) - 1;
  for (int64_t j = 0; j < 3 * g->H; j++)
    if (!grid_bf16_exact(qmin, qmax, g->w_zp_host[w][j])) return 0;
  return 1;
}

/* The exact int8 split's codes of a grid [qmin, qmax] (at most 256 codes): c = q - off within
 * [-128, 127] with off = 0 where the grid is int8's, else qmin + 128 (exact_split.cuh). */
static int xs_offset(int64_t qmin, int64_t qmax) { return qmin >= -128 && qmax <= 127 ? 0 : (int)(qmin + 128); }

/* Whether weight w's codes can be the exact split's integer operand: at most 8 bits, and every
 * row's |off - z| <= 2^15 (so that the corrections' int64 sums cannot overflow); off in *off. */
static int weight_xs(const qg_int_gru *g, int w, int *off) {
  const int b = g->w_bits[w];
  if (!g->w_set[w] || b < 1 || b > 8 || !g->codes[w]) return 0;
  const int64_t qmin = g->w_unsigned[w] ? 0 : -(1LL << (b - 1)), qmax = g->w_unsigned[w] ? (1LL << b) - 1 : (1LL << (b - 1)) - 1;
  const int o = xs_offset(qmin, qmax);
  for (int64_t j = 0; j < 3 * g->H; j++)
    if (llabs((long long)o - g->w_zp_host[w][j]) > (1LL << 15)) return 0;
  *off = o;
  return 1;
}

/* The same for a per-tensor activation quantizer (input.x, output.h). */
static int act_xs(qg_qp q, int *off) {
  if (q.qmax - q.qmin > 255) return 0;
  const int o = xs_offset(q.qmin, q.qmax);
  if (llabs((long long)o - q.z) > (1LL << 15)) return 0;
  *off = o;
  return 1;
}

/* dx rows [r0, r0 + rows) (time rows (t, n), dx [T N, C] += masked dp W~) on stream st with handle
 * hb, by the strict split: dp's rows as digit planes Dp [4][rows][Kp] (W's exponents wke and zero
 * points wkz folded in, shifts rsh and corrections rco per row), the int8 GEMM by W~'s codes WT
 * [C][Kp] into PX [4][rows][C], the combine adding the masked results. Per-row values and integer
 * sums: the same bits for any split of the rows (the loop's side chunks, or all rows after it). */
static qg_status xs_dx_rows(qg_ctx *ctx, const char *fn, cudaStream_t st, cublasHandle_t hb, float *dx, const float *dp,
                            const uint8_t *xmask, int8_t *Dp, int *rsh, long long *rco, int32_t *PX, const int8_t *WT,
                            const int32_t *wke, const int32_t *wkz, int offW, int64_t H3, int64_t Kp, int64_t C, int64_t r0,
                            int64_t rows) {
  int8_t *D = Dp + XS_DIGITS * r0 * Kp;
  int32_t *P = PX + XS_DIGITS * r0 * C;
  xs_rows_kernel<<<(unsigned)rows, XS_THREADS, 0, st>>>(D, rsh + r0, rco + r0, dp + r0 * H3, H3, rows, H3, Kp, wke, wkz, offW);
  QG_CHECK(qg_cuda_launched(ctx, fn));
  QG_CHECK(xs_gemm_on(ctx, hb, fn, P, D, WT, XS_DIGITS * rows, C, Kp, 1));
  xs_combine_kernel<<<qg_cuda_blocks(rows * C, 256), 256, 0, st>>>(dx + r0 * C, P, 1, rsh + r0, rco + r0, xmask + r0 * C, rows, C, 0, 1);
  return qg_cuda_launched(ctx, fn);
}

/* The same rows by the bf16 split: tX [rows][2][C] = dp's rows (bf16 pieces [T N][2][3H], as
 * [2 rows, 3H]) W~ (bf16 Wb [3H, C]), the two pieces added into dx (hi first), masked. */
static qg_status bf16_dx_rows(qg_ctx *ctx, const char *fn, cudaStream_t st, cublasHandle_t hb, float *dx, const __nv_bfloat16 *dp,
                              const uint8_t *xmask, const __nv_bfloat16 *Wb, float *tX, int64_t H3, int64_t C, int64_t r0, int64_t rows) {
  QG_CHECK(gemm_bf16_rm_on(ctx, hb, fn, 0, 0, 2 * rows, C, H3, dp + r0 * 2 * H3, H3, Wb, C, tX + r0 * 2 * C));
  masked_add2_kernel<<<qg_cuda_blocks(rows * C, 256), 256, 0, st>>>(dx + r0 * C, tX + r0 * 2 * C, xmask + r0 * C, rows * C, C, 2 * C, C);
  return qg_cuda_launched(ctx, fn);
}

/* K slices of the exact split's per-step product [4N, H] (K = 3H): up to XS_STEP_SLICES while the
 * output's 256 x 128 tiles leave multiprocessors idle and every slice keeps at least 256 bytes of
 * K (in XS_KPAD units). A function of the shape and the device, like step_gemm_slices; the
 * slices' integer sums are exact in any order anyway, so the results do not depend on it. */
#ifndef QGRU_XS_STEP_SLICES
#define QGRU_XS_STEP_SLICES 2
#endif
static_assert(QGRU_XS_STEP_SLICES >= 1 && QGRU_XS_STEP_SLICES <= XS_MAX_SLICES, "xs_element adds at most XS_MAX_SLICES slices");
static int xs_step_slices(const qg_ctx *ctx, int64_t N, int64_t H) {   /* N: the rows of one product */
  const int64_t tiles = ((4 * N + 255) / 256) * ((H + 127) / 128), units = xs_kpad(3 * H) / XS_KPAD;
  int S = 1;
  while (S < QGRU_XS_STEP_SLICES && tiles * 2 * S <= ctx->sm_count && units % (2 * S) == 0 && units / (2 * S) >= 16) S *= 2;
  return S;
}

/* 1: the strict split's per-step chain fuses dq_s's split into the step kernel (bwd_step1_xs_kernel)
 * where H allows; 0: xs_rows_kernel after bwd_step1_kernel everywhere (the same bits). */
#ifndef QGRU_XS_FUSED_STEP
#define QGRU_XS_FUSED_STEP 1
#endif

/* bwd_step1_xs_kernel's launch: clusters of ceil(H / XF_X) blocks of XF_X x BS_Y threads along
 * the units, ceil(nr / BS_Y) of them along the rows; at: the attributes' storage (2). pdl: as a
 * programmatic dependent launch, so that the kernel is launched while the stream's previous kernel
 * (the step's GEMM) drains and waits for it in griddep_wait (H200, large strict backward 4.24-4.26
 * -> 4.12-4.14 ms; bench/cuda_int_gru.md, session 30). */
static cudaLaunchConfig_t xs_fused_config(int64_t H, int64_t nr, cudaStream_t st, int pdl, cudaLaunchAttribute *at) {
  const unsigned K = (unsigned)((H + XF_X - 1) / XF_X);
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(K, (unsigned)((nr + BS_Y - 1) / BS_Y));
  lc.blockDim = dim3(XF_X, BS_Y);
  lc.stream = st;
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = K; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
  lc.attrs = at;
  lc.numAttrs = 1;
  if (pdl) {
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    lc.numAttrs = 2;
  }
  return lc;
}

/* bwd_step1_xs_kernel's variant for the loop's K slices of P (1: the single-slice form). */
typedef void (*xs_step_kernel_t)(bwd_params, int, const float *, const int32_t *, int, float *, void *, double *, int *, long long *, int,
                                 int, int, int8_t *, int, const int32_t *, const int32_t *, int, int, unsigned *);
static xs_step_kernel_t xs_step_kernel_for(int slices) {
  return slices <= 1 ? bwd_step1_xs_kernel<1> : bwd_step1_xs_kernel<XS_MAX_SLICES>;
}

/* Whether the device runs bwd_step1_xs_kernel's clusters for H units (ceil(H / XF_X) blocks of
 * XF_X x BS_Y threads: at least one such cluster resident at once; not on every partition of a
 * GPU), in the variant for `slices`. Memoized per device ordinal, cluster size and variant (an
 * occupancy query). */
static int xs_fused_fits(int64_t H, int slices) {
  enum { DEVS = 64 };
  static signed char memo[DEVS][XF_MAX_CLUSTER + 1][2];   /* 0 unknown, 1 no, 2 yes */
  const int K = (int)((H + XF_X - 1) / XF_X), v = slices <= 1 ? 0 : 1;
  int dev = 0;
  if (K < 1 || K > XF_MAX_CLUSTER || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DEVS) { (void)cudaGetLastError(); return 0; }
  if (!memo[dev][K][v]) {
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t lc = xs_fused_config(H, BS_Y, 0, 0, at);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, xs_step_kernel_for(slices), &lc) != cudaSuccess) { n = 0; (void)cudaGetLastError(); }
    memo[dev][K][v] = n > 0 ? 2 : 1;
  }
  return memo[dev][K][v] == 2;
}

/* The strict split's per-step chain (the step kernel, xs_rows_kernel, the int8 GEMM) runs as two
 * independent chains of half the batch rows each, on the main and the aux stream, from this many
 * rows (N) on: each chain's latency-bound kernels then overlap the other's GEMM (H200, large:
 * backward 5.20-5.24 -> 4.97-5.03 ms; bench/cuda_int_gru.md, session 19). Every row's values and
 * sums are those of one chain: the same bits. step_loop_body runs the TF32 split's chain the same
 * way, but there (no split kernel between the step kernel and its GEMM) two groups were slower
 * (2.64 -> 2.86 ms), so it keeps one. */
#ifndef QGRU_ROW_GROUP_ROWS
#define QGRU_ROW_GROUP_ROWS 128
#endif
/* How many row groups from QGRU_ROW_GROUP_ROWS rows on: at most XG_MAX, one stream each (the main
 * and aux streams, then ext[0], ...; the context's last ext stream is the side stream). Four groups
 * (with QG_EXT_STREAMS = 3) were slower than two: large strict backward 5.02-5.05 ms against
 * 4.85-4.90 (H200, session 21). */
#ifndef QGRU_ROW_GROUPS
#define QGRU_ROW_GROUPS 2
#endif
enum { XG_MAX = 2 };
static_assert(QGRU_ROW_GROUPS >= 2 && QGRU_ROW_GROUPS <= XG_MAX && XG_MAX <= 2 + QG_EXT_STREAMS - 1,
              "row groups on the main, aux and ext streams, the last ext stream left for the side stream");
static_assert(QGRU_ROW_GROUP_ROWS >= 2 * XG_MAX * BS_Y, "every row group keeps at least one block row of the step kernel");

/* The fused split loop's per-step product P = Dq RT^T by igemm (kernels/igemm.cuh: wgmma and TMA,
 * a programmatic dependent of the step kernel, R's codes loaded before its wait) where the device
 * runs it (1), or by cuBLAS (0: the same integers). H200, large strict backward: 4.08-4.10 ms with
 * cuBLAS, 3.94-3.99 with igemm (bench/cuda_int_gru.md, session 36). QGRU_XS_OWN_BN: igemm's block
 * tile columns (64; 128 was slower there: 4.03-4.04). */
#ifndef QGRU_XS_OWN_PRODUCT
#define QGRU_XS_OWN_PRODUCT 1
#endif
#ifndef QGRU_XS_OWN_BN
#define QGRU_XS_OWN_BN 64
#endif

/* The splits' work beside the per-step loop (step_loop: column maxima, dx) in chunks of about this
 * many (t, n) rows, on the context's last ext stream, where the loop has at least two chunks; 0:
 * all of it after the loop. */
#ifndef QGRU_SIDE_CHUNK_ROWS
#define QGRU_SIDE_CHUNK_ROWS 2048
#endif
/* 1: the side stream's dx for the loop's last chunk of steps (queued only once the loop's last step
 * is) runs after the loop, beside the after-loop work, instead of at the loop's end, and the main
 * stream joins the side stream at the end of the backward (nothing after the loop reads dx). The
 * side stream runs behind the loop: at the large shape its work ended 0.07-0.12 ms after the main
 * stream's last step. H200, large strict backward: 3.661-3.671 ms against 3.670-3.724
 * (bench/cuda_int_gru.md, session 40; the same bits). */
#ifndef QGRU_SIDE_DEFER_LAST
#define QGRU_SIDE_DEFER_LAST 1
#endif

/* Where QG_SPLIT_AUTO takes the exact split: the float GEMMs it replaces at least this many flops
 * (2^28 a step: an SGEMM of ~10 us against the split's extra launch; 2^32 after the loop: ~0.1 ms
 * against its ~15 launches). */
#define XS_MIN_STEP_FLOPS 268435456.0
#define XS_MIN_AFTER_FLOPS 4294967296.0
#ifndef QGRU_OWN_STEP_FLOPS
#define QGRU_OWN_STEP_FLOPS XS_MIN_STEP_FLOPS
#endif

/* Whether every index of a step of bwd_step1_kernel fits 32 bits: the dp / dq rows [T N, 3H], the
 * saved records [T N H] of cb bytes, dy [T N, Hy] (and so the h codes, Hf and the step sums). */
static int step_fits32(int64_t T, int64_t N, int64_t H, int cb, int64_t Hy) {
  const int64_t TN = T * N, lim = (int64_t)1 << 31;
  return TN < lim && TN * 3 * H < lim && TN * H * cb < lim && TN * (Hy + 1) < lim;
}

/* QG_KTRACE builds (ktrace.cuh): the split loop's records, reset before each call's loop and
 * summarized on stderr after the call (the call then waits for its work). */
#if QG_KTRACE
static kt_rec *kt_dev;   /* [KT_MAX_T][2][2] */
__global__ void kt_reset_kernel(kt_rec *r, int n) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) r[k] = kt_rec{~0ull, ~0ull, 0ull, 0ull};
}
static void kt_prepare(int64_t T, cudaStream_t st) {
  if (!kt_dev) {
    cudaMalloc(&kt_dev, sizeof(kt_rec) * KT_MAX_T * 4);
    cudaMemcpyToSymbol(kt_loop, &kt_dev, sizeof kt_dev);
  }
  if (T <= KT_MAX_T) kt_reset_kernel<<<(unsigned)((T * 4 + 255) / 256), 256, 0, st>>>(kt_dev, (int)(T * 4));
}
static kt_rec *kt_product_rec(int64_t s, int gi) { return kt_dev && s < KT_MAX_T ? kt_dev + 2 * (2 * s + (gi > 0)) + 1 : NULL; }
static double kt_median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { const double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
  return n ? v[n / 2] : 0.0;
}
/* per group, medians over the middle steps (us): the step kernel's first-block wait to last end
 * (run), the product's (run), the edges (step end -> product's first wait; product end -> the next
 * step kernel's first wait), the period (one step kernel's first wait to the next's); then the
 * raw records of three middle steps, us from the first one's t0 */
static void kt_print(int64_t T, int groups) {
  if (!kt_dev || T > KT_MAX_T || T < 8) return;
  cudaDeviceSynchronize();
  static kt_rec h[KT_MAX_T * 4];
  cudaMemcpy(h, kt_dev, sizeof(kt_rec) * T * 4, cudaMemcpyDeviceToHost);
  static double v[6][KT_MAX_T];
  for (int g = 0; g < groups && g < 2; g++) {
    int n = 0;
    for (int64_t s = T - 3; s >= 2; s--, n++) {   /* processing order: s descending */
      const kt_rec S = h[2 * (2 * s + g)], P = h[2 * (2 * s + g) + 1], S2 = h[2 * (2 * (s - 1) + g)];
      v[0][n] = (S.t1 - S.w0) * 1e-3; v[1][n] = (P.t1 - P.w0) * 1e-3; v[2][n] = ((double)P.w0 - (double)S.t1) * 1e-3;
      v[3][n] = ((double)S2.w0 - (double)P.t1) * 1e-3; v[4][n] = ((double)S2.w0 - (double)S.w0) * 1e-3;
      v[5][n] = ((double)S.w1 - (double)S.w0) * 1e-3;
    }
    fprintf(stderr, "kt group %d (median of %d steps, us): step run %.2f (wait spread %.2f), product run %.2f, edge step->product %.2f, "
                    "edge product->step %.2f, period %.2f\n", g, n, kt_median(v[0], n), kt_median(v[5], n), kt_median(v[1], n),
            kt_median(v[2], n), kt_median(v[3], n), kt_median(v[4], n));
  }
  const int64_t sm = T / 2;
  const double base = (double)h[2 * (2 * sm)].t0;
  for (int64_t s = sm; s > sm - 3; s--)
    for (int g = 0; g < groups && g < 2; g++)
      for (int k = 0; k < 2; k++) {
        const kt_rec r = h[2 * (2 * s + g) + k];
        fprintf(stderr, "kt s %lld g %d %s t0 %8.2f w0 %8.2f w1 %8.2f t1 %8.2f\n", (long long)s, g, k ? "prod" : "step",
                ((double)r.t0 - base) * 1e-3, ((double)r.w0 - base) * 1e-3, ((double)r.w1 - base) * 1e-3, ((double)r.t1 - base) * 1e-3);
      }
}
#define KT_PREPARE(T, st) kt_prepare(T, st)
#define KT_PRINT(T, groups) kt_print(T, groups)
#define KT_PRODUCT(s, gi) ig_kt_set(kt_product_rec(s, gi))
#else
#define KT_PREPARE(T, st) ((void)0)
#define KT_PRINT(T, groups) ((void)0)
#define KT_PRODUCT(s, gi) ((void)0)
#endif

/* The per-step recurrence: arguments of the loop (also the graph cache's key, with a tag). */
struct step_loop {
  char tag[8];                 /* "qgIGRUb" */
  bwd_params bp;
  const void *R;               /* R~ [3H, H]: float, or bf16 when pieces = 2 */
  float *dh, *dh_next, *P;
  void *Hf;                    /* [T N, H]: float, or bf16 when pieces = 2 */
  double *sp;
  int64_t chunks;
  int rpt, math, slices, words;
  int fits32;                  /* bwd_step1_kernel (step_fits32) */
  int pieces;                  /* 2: the TF32 mode's bf16 split (dq, dp, Hf, R~ in bf16) */
  int own, own_rows, own_kc;   /* the strict product by step_product_kernel (its tile's rows, the slice width) instead of cuBLAS */
  /* the strict mode's exact int8 split of the step's product (xs = 1; exact_split.cuh): dq_s's
   * digit planes Dq [4][N][Kp], its shifts and corrections xsh, xcorr [N], R~'s codes RT [H][Kp],
   * R's per-row exponents ke and zero points kz, the codes' offset zoff; the products in P as
   * int32 [slices][4][N][H] */
  int xs, zoff;
  int fused, zc_any;           /* xs: bwd_step1_xs_kernel (the split fused into the step kernel; zc_any: R has zero-point terms) */
  int own_xs;                  /* fused: the product by igemm (a programmatic dependent) instead of cuBLAS */
  ig_plan xp[XG_MAX];          /* own_xs: each row group's product */
  unsigned *kmx;               /* fused: the after-loop split's column maxima of dq, dp [2][3H], by the step kernel (else NULL) */
  int64_t Kp;
  int8_t *Dq;
  const int8_t *RT;
  int *xsh;
  long long *xcorr;
  const int32_t *ke, *kz;
  /* the row groups (QGRU_ROW_GROUP_ROWS, QGRU_ROW_GROUPS; groups = 1: all rows): group g rows
   * [gstart[g], gstart[g + 1]) on stream gstream[g] (the main stream, the aux stream; their marks
   * gev[g]), each with its own products P + S pc
   * n0 H [S][pc][nr][H] (pc = 4 digits or 2 pieces) and (xs) digit planes Dq + 4 n0 Kp [4][nr][Kp] */
  int groups;
  int64_t gstart[XG_MAX + 1];
  void *gstream[XG_MAX], *gblas[XG_MAX], *gev[XG_MAX];
  /* work beside the recurrence, on side_stream (the context's last ext stream, at the device's
   * least priority, its own cuBLAS handle; mark side_ev), in chunks of sc steps (sc = 0: none;
   * QGRU_SIDE_CHUNK_ROWS): at the start the after-loop products' codes (split: h^T, x^T, W~^T;
   * bf16 split: x~, W~ in bf16), then for each chunk [s, s + sc), once the row groups' step kernels
   * of its step s (the loop's last of the chunk) are done, (split) the column maxima of its dq and
   * dp rows and (side_dx) dx of its time rows (defer_last: not the last chunk's dx, which the
   * caller queues after the loop). Each value is what the after-loop work computes from all rows
   * (per-row splits, integer sums, maxima by integer atomicMax): the same bits */
  int sc, side_dx, offW, offH, offX, reverse;
  int64_t C, TNp;
  qg_qp QX;
  void *side_stream, *side_blas, *side_ev;
  int8_t *Dp, *WT, *hT, *xT;   /* split: dp's row digits [4][T N][Kp], W~^T [C][Kp], h^T [H][TNp], x^T [C][TNp] */
  unsigned *mx;                /* split: column maxima of dq, dp [2][3H] */
  int *rsh;
  long long *rco;
  int32_t *PX;                 /* split: dx's products [4][T N][C] */
  const int32_t *Wcodes, *wke, *wkz, *xcodes;
  const float *Wq;             /* bf16 split: W~ (float) */
  void *Xb, *Wb;               /* bf16 split: x~ [T N, C], W~ [3H, C] in bf16 */
  float *tX;                   /* bf16 split: dx's two pieces [T N][2][C] */
  float *dx;
  const uint8_t *xmask;
  int defer_last;              /* the last chunk's dx is left to the caller (after the loop; QGRU_SIDE_DEFER_LAST) */
  qg_ctx *ctx;
};

typedef void (*step_kernel)(bwd_params, int64_t, int, const float *, const float *, int, float *, float *, double *);

/* The side stream's work before the loop (step_loop, "work beside the recurrence"). */
static qg_status side_start(qg_ctx *ctx, const char *fn, const step_loop &L) {
  const cudaStream_t ss = (cudaStream_t)L.side_stream;
  const int64_t T = L.bp.T, N = L.bp.N, H = L.bp.H, H3 = 3 * H, TN = T * N, C = L.C;
  const dim3 tb(XS_THREADS);
  if (L.xs) {   /* the after-loop products' operands */
    if (!L.kmx) QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(L.mx, 0, (size_t)2 * H3 * 4, ss));   /* (else zeroed before the loop) */
    xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.TNp, XS_TILE), qg_cuda_blocks(H, XS_TILE)), tb, 0, ss>>>(L.hT, L.bp.hq, TN, H, L.TNp, L.offH);
    xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.TNp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ss>>>(L.xT, L.xcodes, TN, C, L.TNp, L.offX);
    if (L.side_dx)
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(L.Kp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ss>>>(L.WT, L.Wcodes, H3, C, L.Kp, L.offW);
  } else {
    deq_bf16_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, ss>>>(L.xcodes, TN * C, L.QX, (__nv_bfloat16 *)L.Xb);
    if (L.side_dx) to_bf16_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ss>>>(L.Wq, H3 * C, (__nv_bfloat16 *)L.Wb);
  }
  return qg_cuda_launched(ctx, fn);
}

/* The side stream's work for the chunk of steps [s, se), whose dq rows (step-indexed) are
 * [s N, se N) and dp rows (time-indexed) [t0 N, t0 N + rows): the parts named by `parts`. */
enum { SIDE_COLMAX = 1,   /* the column maxima of its dq and dp rows (split, where the step kernels do not) */
       SIDE_DX = 2 };     /* dx of its rows (side_dx) */
static qg_status side_chunk(qg_ctx *ctx, const char *fn, const step_loop &L, int64_t s, int64_t se, int parts) {
  const cudaStream_t ss = (cudaStream_t)L.side_stream;
  const cublasHandle_t sb = (cublasHandle_t)L.side_blas;
  const int64_t T = L.bp.T, N = L.bp.N, H = L.bp.H, H3 = 3 * H, C = L.C;
  const int64_t t0 = L.reverse ? T - se : s, rows = (se - s) * N, r0 = t0 * N;
  if ((parts & SIDE_COLMAX) && L.xs && !L.kmx) {   /* (kmx: the step kernels' work) */
    const int64_t rpb = XS_COLMAX_ROWS;   /* rows per block of the column maxima, as after the loop */
    const dim3 mg(qg_cuda_blocks(H3, XS_THREADS), qg_cuda_blocks(rows, (int)rpb));
    xs_colmax_kernel<<<mg, XS_THREADS, 0, ss>>>(L.mx, L.bp.dq + s * N * H3, rows, H3, rpb);
    xs_colmax_kernel<<<mg, XS_THREADS, 0, ss>>>(L.mx + H3, L.bp.dp + r0 * H3, rows, H3, rpb);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (!L.side_dx || !(parts & SIDE_DX)) return QG_OK;
  if (L.xs) return xs_dx_rows(ctx, fn, ss, sb, L.dx, L.bp.dp, L.xmask, L.Dp, L.rsh, L.rco, L.PX, L.WT, L.wke, L.wkz, L.offW, H3, L.Kp, C, r0, rows);
  return bf16_dx_rows(ctx, fn, ss, sb, L.dx, (const __nv_bfloat16 *)L.bp.dp, L.xmask, (const __nv_bfloat16 *)L.Wb, L.tX, H3, C, r0, rows);
}

#if XS_TIMELINE
static void xs_tl(const char *name, cudaStream_t s);   /* the timing-only build's marks (below) */
#endif

static qg_status step_loop_body(void *arg) {
  const step_loop &L = *(const step_loop *)arg;
  qg_ctx *ctx = L.ctx;
  const char *fn = "qg_int_gru_backward";
  const int64_t N = L.bp.N, H = L.bp.H, H3 = 3 * H, S = L.slices, Kc = S ? H3 / S : 0;
  const dim3 grid((unsigned)((H + BS_X - 1) / BS_X), (unsigned)L.chunks), block(BS_X, BS_Y);
  float *dh = L.dh, *dn = L.dh_next;
  const int chunks = (int)L.chunks;
  if (L.xs || L.pieces == 2) {   /* the splits: their row groups, each a chain of its own (a stream and cuBLAS handle each) */
    const cudaStream_t st = (cudaStream_t)L.gstream[0], ss = (cudaStream_t)L.side_stream;
    const int64_t T = L.bp.T;
    if (L.groups > 1 || L.sc) {   /* fork: the other streams start after what the main one holds */
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[0], st));
      for (int gi = 1; gi < L.groups; gi++) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent((cudaStream_t)L.gstream[gi], (cudaEvent_t)L.gev[0], 0));
      if (L.sc) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)L.gev[0], 0));
    }
    if (L.sc) QG_CHECK(side_start(ctx, fn, L));
    for (int64_t s = T - 1; s >= 0; s--) {
      const int np = s == T - 1 ? 0 : (int)S;
      const int mark = L.sc && s % L.sc == 0;   /* a side chunk's lowest step: its dq and dp rows are final after the step kernels */
      for (int gi = 0; gi < L.groups; gi++) {
        const int64_t n0 = L.gstart[gi], nr = L.gstart[gi + 1] - n0;
        const cudaStream_t gs = (cudaStream_t)L.gstream[gi];
        const cublasHandle_t gb = (cublasHandle_t)L.gblas[gi];
        const dim3 gg((unsigned)((H + BS_X - 1) / BS_X), (unsigned)((nr + BS_Y - 1) / BS_Y));
        if (L.xs) {
          int32_t *Pg = (int32_t *)L.P + S * XS_DIGITS * n0 * H;
          int8_t *Dg = L.Dq + XS_DIGITS * n0 * L.Kp;
          if (L.fused) {   /* the step and dq_s's digit planes (R's exponents folded in) in one kernel */
            cudaLaunchAttribute at[2];
            const cudaLaunchConfig_t lc = xs_fused_config(H, nr, gs, 1, at);
            QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelEx(&lc, xs_step_kernel_for((int)S), L.bp, (int)s, (const float *)dh, (const int32_t *)Pg, np, dn,
                                                      L.Hf, L.sp, L.xsh, L.xcorr, (int)n0, (int)nr, chunks, Dg, (int)L.Kp, L.ke, L.kz,
                                                      L.zoff, L.zc_any, L.kmx));
            QG_CHECK(qg_cuda_launched(ctx, fn));
            if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
          } else {
            bwd_step1_kernel<4><<<gg, block, 0, gs>>>(L.bp, (int)s, dh, (const float *)Pg, np, dn, L.Hf, L.sp, L.xsh, L.xcorr, (int)n0,
                                                       (int)nr, chunks);
            QG_CHECK(qg_cuda_launched(ctx, fn));
            if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
            /* dq_s as digit planes (R's exponents folded in) */
            xs_rows_kernel<<<(unsigned)nr, XS_THREADS, 0, gs>>>(Dg, L.xsh + n0, L.xcorr + n0, L.bp.dq + (s * N + n0) * H3, H3, nr, H3, L.Kp,
                                                               L.ke, L.kz, L.zoff);
            QG_CHECK(qg_cuda_launched(ctx, fn));
          }
          /* P [S][4 nr, H] = Dq [4 nr, Kp] RT [H, Kp]^T */
          KT_PRODUCT(s, gi);
          if (L.own_xs) QG_CUDA_CHECK(ctx, fn, ig_launch(&L.xp[gi], Pg, gs, 1, 1));
          else QG_CHECK(xs_gemm_on(ctx, gb, fn, Pg, Dg, L.RT, XS_DIGITS * nr, H, L.Kp, (int)S));
        } else {
          float *Pg = L.P + S * 2 * n0 * H;
          bwd_step1_kernel<2><<<gg, block, 0, gs>>>(L.bp, (int)s, dh, Pg, np, dn, L.Hf, L.sp, NULL, NULL, (int)n0, (int)nr, chunks);
          QG_CHECK(qg_cuda_launched(ctx, fn));
          if (mark) QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], gs));
          /* P[k] [2 nr, H]: row l 2 + c = piece c of dq_s's row n0 + l (bf16 [N][2][3H]: column-major
           * [3H, 2 nr] with ld 3H) times R~'s slice k (bf16); every product exact, fp32 accumulation */
          const __nv_bfloat16 *dqs = (const __nv_bfloat16 *)L.bp.dq + (s * N + n0) * 2 * H3;
          const float one = 1.0f, zero = 0.0f;
          QG_CHECK(qg_cublas_status(ctx, fn, cublasGemmStridedBatchedEx(gb, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)(2 * nr), (int)Kc, &one, L.R,
                                                                        CUDA_R_16BF, (int)H, Kc * H, dqs, CUDA_R_16BF, (int)H3, Kc, &zero,
                                                                        Pg, CUDA_R_32F, (int)H, 2 * nr * H, (int)S, CUBLAS_COMPUTE_32F,
                                                                        CUBLAS_GEMM_DEFAULT)));
        }
      }
      if (mark) {   /* the chunk of steps [s, s + sc) */
        for (int gi = 0; gi < L.groups; gi++) QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)L.gev[gi], 0));
        QG_CHECK(side_chunk(ctx, fn, L, s, s + L.sc < T ? s + L.sc : T, L.defer_last && s == 0 ? SIDE_COLMAX : SIDE_COLMAX | SIDE_DX));
      }
      float *tmp = dh; dh = dn; dn = tmp;
    }
#if XS_TIMELINE   /* (the loop runs uncaptured in this build) the main stream's and the side stream's last work */
    xs_tl("loopmain", st);
    if (L.sc) xs_tl("loopside", ss);
#endif
    /* join: the main stream waits for the others */
    for (int gi = 1; gi < L.groups; gi++) {
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.gev[gi], (cudaStream_t)L.gstream[gi]));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, (cudaEvent_t)L.gev[gi], 0));
    }
    if (L.sc) {
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)L.side_ev, ss));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, (cudaEvent_t)L.side_ev, 0));
    }
    return QG_OK;
  }
  for (int64_t s = L.bp.T - 1; s >= 0; s--) {
    const int np = s == L.bp.T - 1 ? 0 : (int)S;
    if (L.fits32) {
      bwd_step1_kernel<1><<<grid, block, 0, (cudaStream_t)L.gstream[0]>>>(L.bp, (int)s, dh, L.P, np, dn, L.Hf, L.sp, NULL, NULL, 0, (int)N, chunks);
    } else {
    const step_kernel f = L.words ? (L.rpt == 1 ? bwd_step_kernel<true, true, 8> : bwd_step_kernel<true, false, 1>)
                                  : (L.rpt == 1 ? bwd_step_kernel<false, true, 8> : bwd_step_kernel<false, false, 1>);
    f<<<grid, block, 0, (cudaStream_t)L.gstream[0]>>>(L.bp, s, L.rpt, dh, L.P, np, dn, (float *)L.Hf, L.sp);
    }
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (L.own) {   /* P[k] = dq_s[:, slice k] R~[slice k, :] (step_product_kernel, strict fp32) */
      const dim3 pg((unsigned)((H + SP_TU - 1) / SP_TU), (unsigned)((N + L.own_rows - 1) / L.own_rows), (unsigned)S);
      const float *dqs = L.bp.dq + s * N * H3;
      const auto f = L.own_rows == 64 ? (H % 4 ? step_product_kernel<64, SP_RT, false> : step_product_kernel<64, SP_RT, true>)
                                      : (H % 4 ? step_product_kernel<32, SP_RT, false> : step_product_kernel<32, SP_RT, true>);
      f<<<pg, 8 * L.own_rows / SP_RT, 0, (cudaStream_t)L.gstream[0]>>>(L.P, dqs, (const float *)L.R, (int)N, (int)H, L.own_kc);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    } else if (!S) {
      const float *dqs = L.bp.dq + s * N * H3;
      QG_CHECK(sgemm_rm(ctx, fn, 0, 0, N, H, H3, dqs, (const float *)L.R, 1.0f, dn));   /* dn += dq_s R~ */
    } else {   /* P[k] = dq_s[:, k Kc : (k + 1) Kc] R~[k Kc : (k + 1) Kc, :] (column-major: P^T = R~^T dq^T) */
      const float *dqs = L.bp.dq + s * N * H3;
      const float one = 1.0f, zero = 0.0f;
      QG_CHECK(qg_cublas_status(ctx, fn, cublasGemmStridedBatchedEx(
                                             qg_cuda_blas(ctx), CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)N, (int)Kc, &one, L.R,
                                             CUDA_R_32F, (int)H, Kc * H, dqs, CUDA_R_32F, (int)H3, Kc, &zero, L.P, CUDA_R_32F,
                                             (int)H, N * H, (int)S, qg_cuda_f32_compute(ctx), CUBLAS_GEMM_DEFAULT)));
    }
    float *tmp = dh; dh = dn; dn = tmp;
  }
  return QG_OK;
}

/* A timing-only experiment build (-DXS_TIMELINE=1; never in normal builds): CUDA events at the
 * strict backward's phases on their streams, printed to stderr after each call as ms from the
 * call's start (the call then waits for its work). */
#if XS_TIMELINE
static cudaEvent_t xs_tl_ev[24];
static const char *xs_tl_name[24];
static int xs_tl_n;
static void xs_tl(const char *name, cudaStream_t s) {
  if (xs_tl_n >= 24) return;
  if (!xs_tl_ev[xs_tl_n]) cudaEventCreate(&xs_tl_ev[xs_tl_n]);
  xs_tl_name[xs_tl_n] = name;
  cudaEventRecord(xs_tl_ev[xs_tl_n++], s);
}
static void xs_tl_print(void) {
  if (xs_tl_n == 0) return;
  cudaEventSynchronize(xs_tl_ev[xs_tl_n - 1]);
  cudaDeviceSynchronize();
  fprintf(stderr, "xs_timeline");
  for (int k = 1; k < xs_tl_n; k++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, xs_tl_ev[0], xs_tl_ev[k]);
    fprintf(stderr, " %s %.3f", xs_tl_name[k], ms);
  }
  fprintf(stderr, "\n");
  xs_tl_n = 0;
}
#define XS_TL(name, s) xs_tl(name, s)
#define XS_TL_PRINT() xs_tl_print()
#else
#define XS_TL(name, s) ((void)0)
#define XS_TL_PRINT() ((void)0)
#endif

extern "C" qg_status qg_cuda_int_gru_backward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                                              qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                                              const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                                              const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_int_gru_backward";
  cudaStream_t st = qg_cuda_stream(ctx);
  const qg_tensor *xq = saved->xq;
  const int64_t T = xq->dims[0], N = xq->dims[1], C = g->C, H = g->H, H3 = 3 * H, TN = T * N, NH = N * H;
  const qg_cell_q *cq = &g->cell;
  const qg_qp QX = cq->a[QG_Q_INPUT_X], QH = cq->a[QG_Q_OUTPUT_H];
  const int64_t chunks = (TN + BIAS_CHUNK - 1) / BIAS_CHUNK;
  const int path = ctx->kernel_path;
  XS_TL("start", st);

  /* the recurrence's path (before any work is queued) */
  bp_plan pc;
  memset(&pc, 0, sizeof pc);
  int persistent = 0;
  if (path != QG_PATH_FALLBACK && TN > 0 && NH > 0) {
    char why[256];
    why[0] = 0;
    double step_us = 0;
    int found = 0;
    if (T >= (1LL << 31) || H > (1LL << 20) || N >= (1LL << 31))
      snprintf(why, sizeof why, "T, N below 2^31 and H at most 2^20 (got T = %lld, N = %lld, H = %lld)", (long long)T, (long long)N,
               (long long)H);
    else if (((uintptr_t)saved->cell->data & 3) != 0)
      snprintf(why, sizeof why, "the saved cell state 4-byte aligned (got address %p)", saved->cell->data);
    else {
      QG_CHECK(int_bwd_persist_choose(ctx, fn, N, H, &pc, &step_us, &found));
      if (!found && ctx->persist_cluster > 0)
        snprintf(why, sizeof why,
                 "a forced shape that holds H = %lld: %d CTAs per cluster, %d rows (qg_ctx_set_persist_shape; shared memory "
                 "per CTA: at most %d bytes)",
                 (long long)H, ctx->persist_cluster, ctx->persist_rows, ctx->smem_optin);
      else if (!found)
        snprintf(why, sizeof why,
                 "R~ (float [3H, H], H = %lld) split over the shared memory of a cluster of up to 16 CTAs: %lld bytes per CTA "
                 "with 16 plus the exchanged dq, at most %d",
                 (long long)H, (long long)(12 * H * ((H + 15) / 16)), ctx->smem_optin);
    }
    if (why[0]) {
      if (path == QG_PATH_PERSISTENT)
        return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "the persistent integer GRU backward needs %s; use kernel path 'auto' or 'fallback'", why);
    } else {
      persistent = path == QG_PATH_PERSISTENT || ctx->persist_cluster > 0 || step_us <= fallback_step_us(ctx, N, H);
    }
  }

  /* the per-step path's row chunks (bwd_step_kernel) */
  const int rpt = persistent ? 1 : step_rows_per_thread(N);
  const int64_t schunks = (N + (int64_t)BS_Y * rpt - 1) / ((int64_t)BS_Y * rpt);
  const int words = ((uintptr_t)saved->cell->data & 3) == 0, cb = qg_cell_bytes(cq->narrow);
  const int64_t Hy = dy ? dy->dims[2] : 0;
  const int fits32 = words && rpt == 1 && step_fits32(T, N, H, cb, Hy);
  /* the TF32 mode's bf16 split (top of the file): the per-step path with bwd_step1_kernel, every
   * fake-quantized operand exact in bf16 (R~, W~ where dx is asked, x, h) */
  const qg_qp QXg = cq->a[QG_Q_INPUT_X], QHg = cq->a[QG_Q_OUTPUT_H];
  const int pieces = !persistent && TN > 0 && NH > 0 && ctx->math == QG_MATH_TF32 && fits32 && TN * 6 * H < (1LL << 31) &&
                             weight_bf16_exact(g, QG_W_R) && (!dx || weight_bf16_exact(g, QG_W_W)) &&
                             grid_bf16_exact(QXg.qmin, QXg.qmax, QXg.z) && grid_bf16_exact(QHg.qmin, QHg.qmax, QHg.z)
                         ? 2
                         : 1;
  /* the strict mode's exact int8 split (exact_split.cuh): of the per-step product (xs_step: the
   * per-step path with bwd_step1_kernel, R's codes within int8 after an offset) and of the
   * after-loop GEMMs (xs_after: R, W where dx is asked, input.x and output.h grids of at most 256
   * codes, K = T N and 3H within the int32 accumulation's bound); under QG_SPLIT_AUTO only where
   * the float GEMMs are large enough for it to gain (below, the split's extra launches cost more
   * than the SGEMMs: H200, bench/gpu.md run 16, long-kws 1.37 ms against 1.22) */
  int offR = 0, offW = 0, offX = 0, offH = 0;
  const int strict = ctx->math == QG_MATH_STRICT && ctx->exact_split != QG_SPLIT_OFF, force = ctx->exact_split == QG_SPLIT_ON;
  const double step_flops = 2.0 * (double)N * (double)H3 * (double)H,
               after_flops = 2.0 * (double)TN * (double)H3 * (double)(H + C + (dx ? C : 0));
  const int xs_R = strict && weight_xs(g, QG_W_R, &offR);
  const int xs_step = xs_R && !persistent && TN > 0 && NH > 0 && fits32 && xs_kpad(H3) <= XS_MAX_K &&
                      (force || step_flops >= XS_MIN_STEP_FLOPS);
  const int xs_after = xs_R && TN > 0 && H > 0 && (!dx || weight_xs(g, QG_W_W, &offW)) && act_xs(QXg, &offX) && act_xs(QHg, &offH) &&
                       xs_kpad(TN) <= XS_MAX_K && xs_kpad(H3) <= XS_MAX_K && (force || after_flops >= XS_MIN_AFTER_FLOPS);
  /* the strict split's per-step chain in two row groups where the batch is large enough (QGRU_ROW_GROUP_ROWS) */
  const int groups = xs_step && N >= QGRU_ROW_GROUP_ROWS ? QGRU_ROW_GROUPS : 1;
  int64_t gstart[XG_MAX + 1];   /* group g: rows [gstart[g], gstart[g + 1]), block-row aligned */
  for (int gi = 0; gi <= groups; gi++) {
    const int64_t b = gi == groups ? N : round_up((gi * N + groups - 1) / groups, BS_Y);
    gstart[gi] = b < N ? b : N;
  }
  /* work beside the per-step loop in chunks of sc steps (QGRU_SIDE_CHUNK_ROWS; step_loop): the
   * split's loop with the split after it, or the bf16 split's loop where dx is asked; at least two
   * chunks; a chunk's time rows are a range (not with both reverse and lengths: there a step's
   * time rows differ per row) */
  const int64_t sc_want = QGRU_SIDE_CHUNK_ROWS > 0 && N > 0 ? (QGRU_SIDE_CHUNK_ROWS + N - 1) / N : 0;
  const int side_ok = (xs_step && xs_after) || (pieces == 2 && dx);
  const int sc = side_ok && C > 0 && sc_want > 0 && sc_want < T && !(reverse && lengths) ? (int)sc_want : 0;
  const int side_dx = sc && dx;
  /* K slices of the step's product: with two groups their two GEMMs fill the device together, and one slice each ran faster (H200,
   * large: backward 4.92-4.94 ms against 5.00-5.04 with two) */
  int slices = persistent || TN == 0 || NH == 0 ? 0 : (xs_step ? (groups == 2 ? 1 : xs_step_slices(ctx, N, H)) : step_gemm_slices(ctx, N, H, pieces));
  /* the strict product without the split: step_product_kernel where its shape is small (below
   * QGRU_OWN_STEP_FLOPS a step: cuBLAS's SGEMM runs small tiles there; bench/cuda_int_gru.md,
   * session 25), else cuBLAS */
  const int own = !persistent && TN > 0 && NH > 0 && !xs_step && pieces == 1 && ctx->math == QG_MATH_STRICT && fits32 &&
                  H3 * H < (1LL << 31) && step_flops < QGRU_OWN_STEP_FLOPS;
  const sp_shape osh = own ? step_product_shape(ctx, N, H) : sp_shape{0, 0, 0};
  if (own) slices = osh.slices;
  if (pieces == 2 && slices == 0) slices = 1;   /* the split's products always go to P (the step kernel adds the pieces) */
  /* the split of dq_s in the step kernel (bwd_step1_xs_kernel) where a cluster holds a row's units
   * and its digit planes' offsets fit 32 bits, else xs_rows_kernel after it */
  const int xs_fused = QGRU_XS_FUSED_STEP && xs_step && H <= (int64_t)XF_X * XF_MAX_CLUSTER &&
                       XS_DIGITS * N * xs_kpad(H3) < (1LL << 31) && xs_fused_fits(H, slices);
  /* workspace floats: dp, dq [TN, 3H], the persistent path's bcx, bcr [TN, 3H] (not bwd_ws_kernel's), dh, dh_next [N, H],
   * Xf [TN, C], Hf [TN, H], tmpX [TN, C], tmpW [3H, C], tmpR [3H, H]; doubles: the persistent path's
   * bias partial sums [chunks, 2, 3H] (bwd_ws_kernel: [N, 4, H]) or the per-step path's step sums [T, schunks, 4, H] */
  const int64_t nbc = persistent && !pc.WS ? TN * H3 * 4 : 0;
  const int64_t npart = persistent ? (pc.WS ? N * 4 * H : chunks * 2 * H3) : T * schunks * 4 * H;
  int64_t total = 0;
  /* the exact split's buffers (exact_split.cuh): per step dq_s's digits [4][N][3Hp], shifts and
   * corrections [N], R~'s codes [H][3Hp]; after the loop the digits of dq^T, dp^T [4][3H][TNp] and
   * of dp [4][TN][3Hp], their shifts and corrections, the codes h^T [H][TNp], x^T [C][TNp], W^T
   * [C][3Hp], the column maxima of dq and dp, and the int32 products [4][3H][H], [4][3H][C],
   * [4][TN][C] (the float SGEMM path's Xf, tX, tW, tR are not needed then) */
  const int64_t H3p = xs_kpad(H3), TNp = xs_kpad(TN), xa = xs_after ? 1 : 0, xd = xs_after && dx ? 1 : 0, xst = xs_step ? 1 : 0;
  const int64_t fpo = xs_after ? 0 : 1;   /* the float after-loop buffers */
  const int64_t o_dp = take(&total, TN * H3 * 4), o_dq = take(&total, TN * H3 * 4), o_bcx = take(&total, nbc),
                o_bcr = take(&total, nbc), o_dh = take(&total, NH * 4), o_dhn = take(&total, NH * 4),
                o_Xf = take(&total, fpo * TN * C * 4), o_Hf = take(&total, TN * H * 4), o_tX = take(&total, fpo * pieces * TN * C * 4),
                o_tW = take(&total, fpo * pieces * H3 * C * 4), o_tR = take(&total, fpo * pieces * H3 * H * 4),
                o_P = take(&total, slices * (xs_step ? XS_DIGITS : pieces) * NH * 4), o_part = take(&total, npart * 8),
                o_Rb = take(&total, pieces == 2 ? H3 * H * 2 : 0), o_Wb = take(&total, pieces == 2 && dx ? H3 * C * 2 : 0),
                o_sDq = take(&total, xst * XS_DIGITS * N * H3p), o_sSh = take(&total, xst * N * 4), o_sCo = take(&total, xst * N * 8),
                o_RT = take(&total, xst * H * H3p), o_DqT = take(&total, xa * XS_DIGITS * H3 * TNp),
                o_DpT = take(&total, xa * XS_DIGITS * H3 * TNp), o_Dp = take(&total, xd * XS_DIGITS * TN * H3p),
                o_hT = take(&total, xa * H * TNp), o_xT = take(&total, xa * C * TNp), o_WT = take(&total, xd * C * H3p),
                o_mx = take(&total, xa * 2 * H3 * 4), o_csh = take(&total, xa * 2 * H3 * 4), o_cco = take(&total, xa * 2 * H3 * 8),
                o_rsh = take(&total, xd * TN * 4), o_rco = take(&total, xd * TN * 8), o_PR = take(&total, xa * XS_DIGITS * H3 * H * 4),
                o_PW = take(&total, xa * XS_DIGITS * H3 * C * 4), o_PX = take(&total, xd * XS_DIGITS * TN * C * 4);
  char *ws;
  QG_CHECK(qg_dev_workspace(ctx, fn, total, (void **)&ws));
  float *dp = (float *)(ws + o_dp), *dq = (float *)(ws + o_dq), *bcx = (float *)(ws + o_bcx), *bcr = (float *)(ws + o_bcr);
  float *dh = (float *)(ws + o_dh), *dh_next = (float *)(ws + o_dhn);
  float *Xf = (float *)(ws + o_Xf), *Hf = (float *)(ws + o_Hf), *tX = (float *)(ws + o_tX), *tW = (float *)(ws + o_tW),
        *tR = (float *)(ws + o_tR), *P = (float *)(ws + o_P);
  double *part = (double *)(ws + o_part);
  __nv_bfloat16 *Rb = (__nv_bfloat16 *)(ws + o_Rb), *Wb = (__nv_bfloat16 *)(ws + o_Wb);
  int8_t *sDq = (int8_t *)(ws + o_sDq), *RT = (int8_t *)(ws + o_RT);

  if (lengths && TN > 0) QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dp, 0, (size_t)(TN * H3) * 4, st));   /* padded (t, n) rows */
  if (NH > 0) {
    if (dhn) QG_CUDA_CHECK(ctx, fn, cudaMemcpyAsync(dh, dhn->data, (size_t)NH * 4, cudaMemcpyDeviceToDevice, st));
    else QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(dh, 0, (size_t)NH * 4, st));
  }
  bwd_params bp;
  memset(&bp, 0, sizeof bp);
  bp.cell = *cq; bp.tb = g->bwd;
  bp.T = T; bp.N = N; bp.H = H;
  bp.L = lengths ? (const int64_t *)lengths->data : NULL;
  bp.reverse = reverse ? 1 : 0;
  bp.hq = (const int32_t *)saved->hq->data;
  bp.cellp = (const uint8_t *)saved->cell->data;
  bp.cb = cb;
  bp.dy = dy ? (const float *)dy->data : NULL;
  bp.Hy = Hy;
  bp.y_offset = y_offset;
  bp.dp = dp; bp.dq = dq; bp.bcx = persistent ? bcx : NULL; bp.bcr = persistent ? bcr : NULL;
  bp.Rf = g->fq[QG_W_R];
  bp.bsum = persistent && pc.WS ? part : NULL;
  if (persistent) {
    QG_CHECK(int_bwd_persist_launch(ctx, fn, bp, pc, dh));
  }
  unsigned *kmx = NULL;   /* the after-loop split's column maxima when the step kernels compute them (bwd_step1_xs_kernel) */
  cudaEvent_t side_join = NULL;        /* work left on the side stream after the loop (QGRU_SIDE_DEFER_LAST): joined at the end */
  cudaStream_t side_stream = NULL;
  if (!persistent && TN > 0 && NH > 0) {
    /* the per-step loop, as one CUDA graph from the second identical call on (the context's cache of
     * captured loops, kernels/gru.cu): the key is every argument of the loop */
    step_loop L;
    memset(&L, 0, sizeof L);
    memcpy(L.tag, "qgIGRUb", 8);
    memcpy(&L.bp, &bp, sizeof bp);
    if (pieces == 2) {   /* R~ in bf16 (exact), outside the captured loop: R~ changes with the weights */
      to_bf16_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>(g->fq[QG_W_R], H3 * H, Rb);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    if (xs_step) {   /* R's codes as RT [H][3Hp] (K = 3H contiguous), outside the captured loop likewise */
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(H3p, XS_TILE), qg_cuda_blocks(H, XS_TILE)), XS_THREADS, 0, st>>>(RT, g->codes[QG_W_R], H3, H,
                                                                                                            H3p, offR);
      QG_CHECK(qg_cuda_launched(ctx, fn));
      L.xs = 1; L.zoff = offR; L.Kp = H3p; L.Dq = sDq; L.RT = RT;
      L.fused = xs_fused;
      L.own_xs = QGRU_XS_OWN_PRODUCT && xs_fused && slices >= 1 && ig_available();
      L.zc_any = 0;
      for (int64_t j = 0; j < H3 && !L.zc_any; j++) L.zc_any = g->w_zp_host[QG_W_R][j] != offR;
      if (xs_fused && xs_after) {   /* the after-loop split's column maxima by the step kernels: zeroed here, before the loop */
        L.kmx = kmx = (unsigned *)(ws + o_mx);
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(kmx, 0, (size_t)2 * H3 * 4, st));
      }
      L.xsh = (int *)(ws + o_sSh); L.xcorr = (long long *)(ws + o_sCo);
      L.ke = g->w_exp[QG_W_R]; L.kz = g->w_zp[QG_W_R];
    }
    L.R = pieces == 2 ? (const void *)Rb : (const void *)g->fq[QG_W_R];
    L.dh = dh; L.dh_next = dh_next; L.P = P; L.sp = part;
    L.Hf = xs_step && xs_after ? NULL : Hf;   /* the split's dR takes h's codes: no dequantized h to write */
    L.chunks = schunks; L.rpt = rpt; L.math = (int)ctx->math; L.slices = slices;
    L.words = words;
    L.fits32 = fits32;
    L.pieces = pieces;
    L.own = own; L.own_rows = osh.rows; L.own_kc = osh.Kc;
    L.ctx = ctx;
    L.groups = groups;
    for (int gi = 0; gi <= groups; gi++) L.gstart[gi] = gstart[gi];
    for (int gi = 0; gi < groups && L.own_xs; gi++) {   /* each row group's product: its digit rows by RT; cuBLAS where a plan fails */
      const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
      if (ig_plan_init(&L.xp[gi], L.Dq + XS_DIGITS * n0 * L.Kp, L.Kp, RT, L.Kp, XS_DIGITS * nr, H, L.Kp, H, slices, XS_DIGITS * nr * H,
                       QGRU_XS_OWN_BN) ||
          L.xp[gi].slices != slices) {
        L.own_xs = 0;
        memset(L.xp, 0, sizeof L.xp);
      }
    }
    for (int gi = 0; gi < groups; gi++) {   /* streams: main, aux (then ext[0], ... where XG_MAX allows) */
      L.gstream[gi] = gi == 0 ? (void *)st : gi == 1 ? ctx->aux_stream : ctx->ext_stream[gi - 2];
      L.gblas[gi] = gi == 0 ? (void *)qg_cuda_blas(ctx) : gi == 1 ? ctx->aux_cublas : ctx->ext_cublas[gi - 2];
      L.gev[gi] = ctx->ev_mark[gi];
    }
    if (sc) {   /* the side stream's work (step_loop) */
      L.sc = sc; L.side_dx = side_dx; L.reverse = reverse ? 1 : 0; L.C = C; L.TNp = TNp; L.QX = QX;
      L.offW = offW; L.offH = offH; L.offX = offX;
      L.side_stream = ctx->ext_stream[QG_EXT_STREAMS - 1]; L.side_blas = ctx->ext_cublas[QG_EXT_STREAMS - 1];
      L.side_ev = ctx->ev_mark[1 + QG_EXT_STREAMS];
      L.xcodes = (const int32_t *)xq->data;
      if (xs_step) {
        L.Dp = (int8_t *)(ws + o_Dp); L.WT = (int8_t *)(ws + o_WT); L.hT = (int8_t *)(ws + o_hT); L.xT = (int8_t *)(ws + o_xT);
        L.mx = (unsigned *)(ws + o_mx); L.rsh = (int *)(ws + o_rsh); L.rco = (long long *)(ws + o_rco); L.PX = (int32_t *)(ws + o_PX);
        L.Wcodes = g->codes[QG_W_W]; L.wke = g->w_exp[QG_W_W]; L.wkz = g->w_zp[QG_W_W];
      } else {
        L.Xb = Xf; L.Wb = Wb; L.Wq = g->fq[QG_W_W]; L.tX = tX;
      }
      if (side_dx) { L.dx = (float *)dx->data; L.xmask = (const uint8_t *)saved->xmask->data; }
      L.defer_last = QGRU_SIDE_DEFER_LAST && side_dx;
    }
    static_assert(sizeof(step_loop) <= QG_CUDA_GRAPH_KEY, "the per-step loop's key fits the graph cache");
    XS_TL("loop0", st);
    KT_PREPARE(T, st);
#if XS_TIMELINE   /* uncaptured, so that the loop's own marks are events on the streams */
    QG_CHECK(step_loop_body(&L));
#else
    QG_CHECK(qg_cuda_graphed(ctx, st, &L, sizeof L, step_loop_body, &L));
#endif
    if (L.defer_last) {   /* the last chunk's dx on the side stream, beside the after-loop work; joined at the end */
      const cudaStream_t ss = (cudaStream_t)L.side_stream;
      QG_CUDA_CHECK(ctx, fn, cudaEventRecord((cudaEvent_t)ctx->ev_mark[0], st));
      QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(ss, (cudaEvent_t)ctx->ev_mark[0], 0));
      QG_CHECK(side_chunk(ctx, fn, L, 0, L.sc < T ? L.sc : T, SIDE_DX));
      side_join = (cudaEvent_t)L.side_ev;
      side_stream = ss;
    }
    XS_TL("loop", st);
    if (T % 2) { float *tmp = dh; dh = dh_next; dh_next = tmp; }   /* where dL/dh_0's direct part ended */
    if (slices && xs_step) {   /* plus the last step's product */
      for (int gi = 0; gi < groups; gi++) {   /* the row groups' products: planes of nr rows each */
        const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
        add_xs_kernel<<<qg_cuda_blocks(nr * H, 256), 256, 0, st>>>(dh + n0 * H, (const int32_t *)P + slices * XS_DIGITS * n0 * H, slices,
                                                                   L.xsh + n0, L.xcorr + n0, nr * H, H, dh_next + n0 * H);
      }
      QG_CHECK(qg_cuda_launched(ctx, fn));
      float *tmp = dh; dh = dh_next; dh_next = tmp;
    } else if (slices) {   /* plus the last GEMM's partial products */
      for (int gi = 0; gi < groups; gi++) {   /* per row group as for the split above (one group: all rows) */
        const int64_t n0 = gstart[gi], nr = gstart[gi + 1] - n0;
        add_parts_kernel<<<qg_cuda_blocks(nr * H, 256), 256, 0, st>>>(dh + n0 * H, P + slices * pieces * n0 * H, slices, pieces, nr * H, H,
                                                                      dh_next + n0 * H);
      }
      QG_CHECK(qg_cuda_launched(ctx, fn));
      float *tmp = dh; dh = dh_next; dh_next = tmp;
    }
    QG_CHECK(bias_steps(ctx, fn, st, part, T, schunks, H, g, dbx, dbr));
    XS_TL("bias", st);
  } else if (pc.WS) {
    bias_rows_kernel<<<qg_cuda_blocks(H3, 128), 128, 0, st>>>(part, N, H, g->mask[QG_W_BX], g->mask[QG_W_BR], (float *)dbx->data,
                                                              (float *)dbr->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  } else {
    if (TN > 0 && H3 > 0) {
      bias_partial_kernel<<<dim3(qg_cuda_blocks(H3, 128), (unsigned)chunks), 128, 0, st>>>(bcx, bcr, T, N, H3, part);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    bias_final_kernel<<<qg_cuda_blocks(H3, 128), 128, 0, st>>>(part, TN > 0 ? chunks : 0, H3, g->mask[QG_W_BX], g->mask[QG_W_BR],
                                                               (float *)dbx->data, (float *)dbr->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (dh0 && NH > 0) {
    dh0_kernel<<<qg_cuda_blocks(NH, 256), 256, 0, st>>>(dh, h0 ? (const float *)h0->data : NULL, QH, NH, (float *)dh0->data);
    QG_CHECK(qg_cuda_launched(ctx, fn));
  }
  if (xs_after) {
    /* the exact int8 split (exact_split.cuh): codes of h (step-indexed like dq) and x (time-indexed
     * like dp) as K = T N contiguous rows; dq and dp as digit planes of their columns (one shift per
     * column from its largest |value|) and, for dx, dp's rows (W's exponents folded in); each
     * product an int8 GEMM and a combine that adds the masked results. On the aux stream dp's
     * column split and dW = dp^T x~, beside the main stream's dq split, dR = dq^T h~, dp's row
     * split and dx = dp W~ (the splits are memory-bound, the GEMMs compute-bound: they overlap) */
    int8_t *DqT = (int8_t *)(ws + o_DqT), *DpT = (int8_t *)(ws + o_DpT), *Dp = (int8_t *)(ws + o_Dp), *hT = (int8_t *)(ws + o_hT),
           *xT = (int8_t *)(ws + o_xT), *WT = (int8_t *)(ws + o_WT);
    unsigned *mx = (unsigned *)(ws + o_mx);
    int *csh = (int *)(ws + o_csh), *rsh = (int *)(ws + o_rsh);
    long long *cco = (long long *)(ws + o_cco), *rco = (long long *)(ws + o_rco);
    int32_t *PR = (int32_t *)(ws + o_PR), *PW = (int32_t *)(ws + o_PW), *PX = (int32_t *)(ws + o_PX);
    const dim3 tb(XS_THREADS);
    const int64_t rpb = XS_COLMAX_ROWS;   /* rows per block of the column maxima */
    const dim3 mg(qg_cuda_blocks(H3, XS_THREADS), qg_cuda_blocks(TN, (int)rpb));
    /* the aux stream from here: its memory-bound splits run beside the main stream's GEMMs */
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    /* aux: dW = dp^T x~ (x's codes and the column maxima: the loop's side stream, where sc) */
    if (!sc) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(TNp, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, ax>>>(xT, (const int32_t *)xq->data, TN, C,
                                                                                                    TNp, offX);
      if (!kmx) {
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(mx + H3, 0, (size_t)H3 * 4, ax));
        xs_colmax_kernel<<<mg, tb, 0, ax>>>(mx + H3, dp, TN, H3, rpb);
      }
    }
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(cco + H3, 0, (size_t)H3 * 8, ax));
    QG_CUDA_CHECK(ctx, fn, xs_cols(DpT, csh + H3, cco + H3, dp, mx + H3, TN, H3, TNp, offX - (int)QX.z, ax));
    XS_TL("ax_dpsplit", ax);
    QG_CHECK(xs_gemm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, PW, DpT, xT, XS_DIGITS * H3, C, TNp, 1));
    XS_TL("ax_dW", ax);
    xs_combine_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, PW, 1, csh + H3, cco + H3, g->mask[QG_W_W], H3, C,
                                                                   (int)QX.e, 1);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    XS_TL("ax_dWcomb", ax);
    /* main: dR = dq^T h~, then dx = dp W~ (h's codes, the column maxima and dx: the loop's side stream, where sc) */
    if (!sc) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(TNp, XS_TILE), qg_cuda_blocks(H, XS_TILE)), tb, 0, st>>>(hT, bp.hq, TN, H, TNp, offH);
      if (!kmx) {
        QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(mx, 0, (size_t)H3 * 4, st));
        xs_colmax_kernel<<<mg, tb, 0, st>>>(mx, dq, TN, H3, rpb);
      }
    }
    QG_CUDA_CHECK(ctx, fn, cudaMemsetAsync(cco, 0, (size_t)H3 * 8, st));
    QG_CUDA_CHECK(ctx, fn, xs_cols(DqT, csh, cco, dq, mx, TN, H3, TNp, offH - (int)QH.z, st));
    XS_TL("dqsplit", st);
    QG_CHECK(xs_gemm_on(ctx, qg_cuda_blas(ctx), fn, PR, DqT, hT, XS_DIGITS * H3, H, TNp, 1));
    XS_TL("dR", st);
    xs_combine_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, PR, 1, csh, cco, g->mask[QG_W_R], H3, H, (int)QH.e, 1);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    XS_TL("dRcomb", st);
    if (dx && !side_dx) {
      xs_codes_t_kernel<<<dim3(qg_cuda_blocks(H3p, XS_TILE), qg_cuda_blocks(C, XS_TILE)), tb, 0, st>>>(WT, g->codes[QG_W_W], H3, C, H3p, offW);
      QG_CHECK(xs_dx_rows(ctx, fn, st, qg_cuda_blas(ctx), (float *)dx->data, dp, (const uint8_t *)saved->xmask->data, Dp, rsh, rco, PX, WT,
                          g->w_exp[QG_W_W], g->w_zp[QG_W_W], offW, H3, H3p, C, 0, TN));
    }
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
    XS_TL("end", st);
    KT_PRINT(T, groups);
  } else if (TN > 0 && H > 0 && pieces == 2) {
    /* the split: bf16 operands (x~, h~ from the step kernel, W~ exact; dp, dq as [T N][2][3H] pieces),
     * each GEMM's two piece results added by masked_add2_kernel (hi's first) */
    if (!sc) {   /* (else the loop's side stream did) */
      deq_bf16_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((const int32_t *)xq->data, TN * C, QX, (__nv_bfloat16 *)Xf);
      if (dx) to_bf16_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, st>>>(g->fq[QG_W_W], H3 * C, Wb);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    /* tW [2][3H, C] = dp^T Xf (rows c 3H + j: piece c of dp's column j) */
    QG_CHECK(gemm_bf16_rm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, 1, 0, 2 * H3, C, TN, dp, 2 * H3, Xf, C, tW));
    masked_add2_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, tW, g->mask[QG_W_W], H3 * C, H3 * C, 0, H3 * C);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    /* tR [2][3H, H] = dq^T Hf */
    QG_CHECK(gemm_bf16_rm_on(ctx, qg_cuda_blas(ctx), fn, 1, 0, 2 * H3, H, TN, dq, 2 * H3, Hf, H, tR));
    masked_add2_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, tR, g->mask[QG_W_R], H3 * H, H3 * H, 0, H3 * H);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (dx && !side_dx)
      QG_CHECK(bf16_dx_rows(ctx, fn, st, qg_cuda_blas(ctx), (float *)dx->data, (const __nv_bfloat16 *)dp, (const uint8_t *)saved->xmask->data,
                            Wb, tX, H3, C, 0, TN));
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
  } else if (TN > 0 && H > 0) {
    deq_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((const int32_t *)xq->data, TN * C, QX, Xf);
    if (persistent) deq_kernel<<<qg_cuda_blocks(TN * H, 256), 256, 0, st>>>(bp.hq, TN * H, QH, Hf);   /* else the step kernel's */
    QG_CHECK(qg_cuda_launched(ctx, fn));
    /* dW on the aux stream (forked from and joined back to the main one, as the float GRU's two
     * directions, kernels/gru.cu) beside dR and dx on the main one: neither GEMM fills the device
     * alone (tf32 at large: dW 0.61 ms on 96 of 132 multiprocessors) */
    cudaStream_t ax = (cudaStream_t)ctx->aux_stream;
    QG_CHECK(qg_cuda_fork_aux(ctx, fn));
    QG_CHECK(sgemm_rm_on(ctx, (cublasHandle_t)ctx->aux_cublas, fn, 1, 0, H3, C, TN, dp, Xf, 0.0f, tW));   /* dp^T [3H, TN] Xf [TN, C] */
    masked_add_kernel<<<qg_cuda_blocks(H3 * C, 256), 256, 0, ax>>>((float *)dW->data, tW, g->mask[QG_W_W], H3 * C);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    QG_CHECK(sgemm_rm(ctx, fn, 1, 0, H3, H, TN, dq, Hf, 0.0f, tR));   /* dq^T [3H, TN] Hf [TN, H] */
    masked_add_kernel<<<qg_cuda_blocks(H3 * H, 256), 256, 0, st>>>((float *)dR->data, tR, g->mask[QG_W_R], H3 * H);
    QG_CHECK(qg_cuda_launched(ctx, fn));
    if (dx) {
      QG_CHECK(sgemm_rm(ctx, fn, 0, 0, TN, C, H3, dp, g->fq[QG_W_W], 0.0f, tX));   /* dp [TN, 3H] W~ [3H, C] */
      masked_add_kernel<<<qg_cuda_blocks(TN * C, 256), 256, 0, st>>>((float *)dx->data, tX, (const uint8_t *)saved->xmask->data, TN * C);
      QG_CHECK(qg_cuda_launched(ctx, fn));
    }
    QG_CHECK(qg_cuda_join_aux(ctx, fn));
  }
  if (side_join) {   /* the side stream's work after the loop */
    QG_CUDA_CHECK(ctx, fn, cudaEventRecord(side_join, side_stream));
    QG_CUDA_CHECK(ctx, fn, cudaStreamWaitEvent(st, side_join, 0));
  }
  XS_TL("join", st);
  XS_TL_PRINT();
  return QG_OK;
}

/*
 * int_gru_prep.cuh: the integer GRU forward's operand preparation (steps 1-3 of int_gru.cu's
 * header): the weights' codes, fake-quantized values and masks (quantize_weights_kernel and its
 * launcher qg_cuda_int_gru_quantize_weights), the weights as int8 planes or centered doubles for
 * the GEMMs, the input's codes and planes with h0's codes (x_quant_kernel, x_quant4_kernel), and
 * the fp64 path's requantization of W x (wx_requant_kernel).
 * Included once by kernels/int_gru.cu, after its shared device helpers; the forward's host code
 * launches these kernels.
 */

/* ================================ weight quantization ================================ */

/* The four weights' codes, fake-quantized values and masks (QUANT_SPEC.md section 1, per output
 * channel j: qg_quant_f32 and qg_deq_f32, which give qg_quant_real's and qg_deq's values in float
 * arithmetic). A warp per row of W and of R (rows 3H each: the row's quantizer made once; rows
 * strided over the first row_blocks blocks' warps), each lane WQ_VEC 16-byte loads in flight at
 * once where the row allows (v4: cols % 4 == 0, the arrays aligned), then blocks of WQ_THREADS
 * bias elements (one channel each). The first version (a grid-stride loop over all elements that
 * found each element's weight and channel by a search and a 64-bit division, with ldexp's general
 * path twice per element) took 31 us at T100 N256 C512 H1024 (H200, ncu); a warp per row with
 * double arithmetic, 21 us. */
enum { WQ_THREADS = 256, WQ_VEC = 4 };

struct wq_params {
  const float *src[QG_W_NUM];
  int32_t *codes[QG_W_NUM];
  float *fq[QG_W_NUM];
  uint8_t *mask[QG_W_NUM];
  const int32_t *exps[QG_W_NUM], *zps[QG_W_NUM];
  int bits[QG_W_NUM], uns[QG_W_NUM];
  int v4[2];                /* W, R: rows as 16-byte vectors */
  int64_t cols[QG_W_NUM];   /* W: C, R: H, the biases 1 (qg_int_gru_weight_cols) */
  int64_t H3, row_blocks;
};

/* One weight value: its code, fake-quantized value (*fq) and mask (*m); qf = qg_qf32_make(q) (its
 * float clamp where it applies: the same codes). */
__device__ __forceinline__ int32_t wq_value(float x, const qg_qp &q, const qg_qf32 &qf, float *fq, uint32_t *m) {
  int mm;
  const int64_t code = qf.ok ? qg_quant_qf32(x, &qf, &mm) : qg_quant_f32(x, q, &mm);
  *fq = qg_deq_f32(code, q);
  *m = (uint32_t)mm;
  return (int32_t)code;
}

__device__ __forceinline__ void wq_element(const wq_params &p, int w, const qg_qp &q, const qg_qf32 &qf, int64_t i) {
  float f;
  uint32_t m;
  p.codes[w][i] = wq_value(p.src[w][i], q, qf, &f, &m);
  p.fq[w][i] = f;
  p.mask[w][i] = (uint8_t)m;
}

__global__ void __launch_bounds__(WQ_THREADS) quantize_weights_kernel(const __grid_constant__ wq_params p) {
  const int64_t H3 = p.H3;
  if ((int64_t)blockIdx.x < p.row_blocks) {   /* row r: W's row r (r < 3H) or R's row r - 3H */
    const int lane = threadIdx.x & 31;
    const int64_t warps = p.row_blocks * (WQ_THREADS / 32);
    for (int64_t r = blockIdx.x * (int64_t)(WQ_THREADS / 32) + (threadIdx.x >> 5); r < 2 * H3; r += warps) {
      const int w = r < H3 ? 0 : 1;
      const int64_t j = r - w * H3, cols = p.cols[w], i0 = j * cols;
      const qg_qp q = qg_qp_make(p.bits[w], p.uns[w], p.exps[w][j], p.zps[w][j]);
      const qg_qf32 qf = qg_qf32_make(q);
      if (!p.v4[w]) {
        for (int64_t c = lane; c < cols; c += 32) wq_element(p, w, q, qf, i0 + c);
        continue;
      }
      for (int64_t c0 = 4 * (int64_t)lane; c0 < cols; c0 += 4 * 32 * WQ_VEC) {
        float4 v[WQ_VEC];
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {   /* every load of the lane first */
          const int64_t c = c0 + u * 4 * 32;
          v[u] = c < cols ? *(const float4 *)(p.src[w] + i0 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {
          const int64_t c = c0 + u * 4 * 32;
          if (c >= cols) break;
          const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
          int32_t k[4];
          float f[4];
          uint32_t mw = 0;
#pragma unroll
          for (int e = 0; e < 4; e++) {
            uint32_t m;
            k[e] = wq_value(x[e], q, qf, &f[e], &m);
            mw |= m << (8 * e);
          }
          *(int4 *)(p.codes[w] + i0 + c) = make_int4(k[0], k[1], k[2], k[3]);
          *(float4 *)(p.fq[w] + i0 + c) = make_float4(f[0], f[1], f[2], f[3]);
          *(uint32_t *)(p.mask[w] + i0 + c) = mw;
        }
      }
    }
    return;
  }
  const int64_t e = ((int64_t)blockIdx.x - p.row_blocks) * WQ_THREADS + threadIdx.x;   /* bias element e of bx, then br */
  if (e >= 2 * H3) return;
  const int w = e < H3 ? QG_W_BX : QG_W_BR;
  const int64_t j = e < H3 ? e : e - H3;
  const qg_qp q = qg_qp_make(p.bits[w], p.uns[w], p.exps[w][j], p.zps[w][j]);
  wq_element(p, w, q, qg_qf32_make(q), j);
}

static int aligned16(const void *a) { return ((uintptr_t)a & 15) == 0; }

extern "C" qg_status qg_cuda_int_gru_quantize_weights(qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                                                      const qg_tensor *bx, const qg_tensor *br) {
  const qg_tensor *src[QG_W_NUM] = {W, R, bx, br};
  static_assert(QG_W_W == 0 && QG_W_R == 1 && QG_W_BX == 2 && QG_W_BR == 3 && QG_W_NUM == 4, "the kernel's row order");
  wq_params p;
  for (int w = 0; w < QG_W_NUM; w++) {
    p.src[w] = (const float *)src[w]->data;
    p.codes[w] = g->codes[w]; p.fq[w] = g->fq[w]; p.mask[w] = g->mask[w];
    p.exps[w] = g->w_exp[w]; p.zps[w] = g->w_zp[w];
    p.bits[w] = g->w_bits[w]; p.uns[w] = g->w_unsigned[w];
    p.cols[w] = qg_int_gru_weight_cols(g, w);
    if (w < 2)
      p.v4[w] = p.cols[w] % 4 == 0 && aligned16(p.src[w]) && aligned16(p.codes[w]) && aligned16(p.fq[w]) && ((uintptr_t)p.mask[w] & 3) == 0;
  }
  p.H3 = 3 * g->H;
  if (p.H3 == 0) return QG_OK;
  const int64_t need = (2 * p.H3 + WQ_THREADS / 32 - 1) / (WQ_THREADS / 32), cap = 8 * (int64_t)(ctx->sm_count > 0 ? ctx->sm_count : 1);
  p.row_blocks = need < cap ? need : cap;
  const int64_t blocks = p.row_blocks + qg_cuda_blocks(2 * p.H3, WQ_THREADS);
  quantize_weights_kernel<<<(unsigned)blocks, WQ_THREADS, 0, qg_cuda_stream(ctx)>>>(p);
  return qg_cuda_launched(ctx, "qg_int_gru_quantize_weights");
}

/* ================================ forward: operand preparation ================================ */

/* Planes of a weight's codes [rows, K] for the int8 GEMMs, one block per padded row j < Mp:
 * planes [np][Mp][Kp] (zeros beyond rows and K); off[j] = c0 + base - z[j];
 * bconst[j] = offB S[j] + K off[j] offB with S[j] = sum_k (r - c0). */
struct planes_job {
  const int32_t *codes, *zp;
  int64_t rows, K, Mp, Kp;
  int np;
  int64_t base, c0, offB;
  int8_t *planes;
  int64_t *off, *bconst;
};

/* A warp per row (rows strided over the grid's warps): rows [0, na) of job a (W), then rows
 * [0, nb) of job b (R). Where K and Kp are multiples of 4 and the codes 16-byte aligned (every
 * shape of the benchmarks), each lane takes 4 consecutive columns per vector, WQ_VEC vectors in
 * flight at once (16-byte loads, 4-byte plane stores; a block per row, one column per thread and
 * trip, took 17 us at the large shape, H200): the same planes and sums. */
__device__ __forceinline__ uint32_t planes_quad(const int4 &q4, const planes_job &p, uint32_t *hi, int64_t *sum) {
  const int32_t q[4] = {q4.x, q4.y, q4.z, q4.w};
  uint32_t w0 = 0, w1 = 0;
  int32_t s = 0;   /* |q - base - c0| < 2^17 (codes of at most 16 bits in planes) */
#pragma unroll
  for (int e = 0; e < 4; e++) {
    int8_t p0, p1;
    split_planes(q[e], p.base, p.np, &p0, &p1);
    w0 |= (uint32_t)(uint8_t)p0 << (8 * e);
    w1 |= (uint32_t)(uint8_t)p1 << (8 * e);
    s += q[e] - (int32_t)(p.base + p.c0);
  }
  *sum += s;
  *hi = w1;
  return w0;
}

__global__ void __launch_bounds__(WQ_THREADS) weight_planes_kernel(const __grid_constant__ planes_job a, const __grid_constant__ planes_job b,
                                                                   int64_t na, int64_t nb) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (WQ_THREADS / 32);
  for (int64_t rr = blockIdx.x * (int64_t)(WQ_THREADS / 32) + (threadIdx.x >> 5); rr < na + nb; rr += warps) {
    const bool first = rr < na;
    const planes_job &p = first ? a : b;
    const int64_t j = first ? rr : rr - na;
    int64_t sum = 0;
    const bool v4 = p.K % 4 == 0 && p.Kp % 4 == 0 && ((uintptr_t)p.codes & 15) == 0 && ((uintptr_t)p.planes & 3) == 0;
    if (v4) {
      const bool row = j < p.rows;
      const int32_t *cr = p.codes + j * p.K;
      uint32_t *d0 = (uint32_t *)(p.planes + j * p.Kp), *d1 = (uint32_t *)(p.planes + (p.Mp + j) * p.Kp);
      for (int64_t k0 = 4 * (int64_t)lane; k0 < p.Kp; k0 += 4 * 32 * WQ_VEC) {
        int4 c[WQ_VEC];
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {   /* every load of the lane first */
          const int64_t k = k0 + u * 4 * 32;
          c[u] = row && k < p.K ? *(const int4 *)(cr + k) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < WQ_VEC; u++) {
          const int64_t k = k0 + u * 4 * 32;
          if (k >= p.Kp) break;
          uint32_t w0 = 0, w1 = 0;
          if (row && k < p.K) w0 = planes_quad(c[u], p, &w1, &sum);
          d0[k / 4] = w0;
          if (p.np == 2) d1[k / 4] = w1;
        }
      }
    } else {
      for (int64_t k = lane; k < p.Kp; k += 32) {
        int8_t p0 = 0, p1 = 0;
        if (j < p.rows && k < p.K) {
          const int64_t q = p.codes[j * p.K + k];
          split_planes(q, p.base, p.np, &p0, &p1);
          sum += q - p.base - p.c0;
        }
        p.planes[j * p.Kp + k] = p0;
        if (p.np == 2) p.planes[(p.Mp + j) * p.Kp + k] = p1;
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      const int64_t o = j < p.rows ? p.c0 + p.base - p.zp[j] : 0;
      p.off[j] = o;
      p.bconst[j] = j < p.rows ? p.offB * sum + p.K * o * p.offB : 0;
    }
  }
}

/* Centered codes of a weight [rows, K] as doubles (the fp64 GEMM), or transposed [K, rows] (the
 * double recurrence's R). */
__global__ void weight_centered_kernel(const int32_t *codes, const int32_t *zp, int64_t rows, int64_t K, int transpose,
                                       double *out) {
  const int64_t n = rows * K;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = e / K, k = e % K;
    const int64_t c = (int64_t)codes[e] - zp[j];
    const int64_t o = transpose ? k * rows + j : e;
    out[o] = (double)c;
  }
}

/* input.x: one block per row r < nrows (rows >= TN only get zero planes): codes and masks (xq /
 * xm NULL: not written), int8
 * planes [np][Np][Kp] and S[r] = sum_k (r - c0) (when planes), centered doubles (when xd),
 * statistics at valid steps. The blocks after nrows quantize h0 (h0_part). */
struct h0_job {
  const float *h0;   /* NULL: zeros */
  int64_t NH;
  qg_qp QH;
  int32_t *hq0;
};

template <int OBS>
__device__ __forceinline__ void h0_part(const h0_job &h, int64_t blk, double *range, int64_t *counts) {
  const int64_t i = blk * blockDim.x + threadIdx.x;
  if (i >= h.NH) return;
  const double v = h.h0 ? (double)h.h0[i] : 0.0;
  int m;
  h.hq0[i] = (int32_t)qg_quant_real(v, h.QH, &m);
  if (OBS && h.h0) observe(range, counts, QG_Q_OUTPUT_H, v);
}

template <int OBS>
__global__ void x_quant_kernel(const float *x, int64_t T, int64_t N, int64_t C, qg_qp QX, const int64_t *L, int32_t *xq,
                               uint8_t *xm, int np, int64_t base, int64_t c0, int64_t Np, int64_t Kp, int8_t *planes,
                               int64_t *S, double *xd, double *range, int64_t *counts, int64_t nrows, const __grid_constant__ h0_job hj) {
  __shared__ int64_t red[32];
  if ((int64_t)blockIdx.x >= nrows) { h0_part<OBS>(hj, blockIdx.x - nrows, range, counts); return; }
  const int64_t r = blockIdx.x, TN = T * N;
  const bool row = r < TN;
  bool valid = false;
  if (OBS && row) valid = r / N < length_at(L, r % N, T);
  int64_t sum = 0;
  const int64_t kend = planes ? Kp : C;
  for (int64_t k = threadIdx.x; k < kend; k += blockDim.x) {
    int8_t p0 = 0, p1 = 0;
    if (row && k < C) {
      const int64_t i = r * C + k;
      const float v = x[i];
      int m;
      const int64_t q = qg_quant_real((double)v, QX, &m);
      if (xq) xq[i] = (int32_t)q;
      if (xm) xm[i] = (uint8_t)m;
      if (OBS && valid) observe(range, counts, QG_Q_INPUT_X, (double)v);
      if (planes) { split_planes(q, base, np, &p0, &p1); sum += q - base - c0; }
      if (xd) xd[i] = (double)(q - QX.z);
    }
    if (planes) {
      planes[r * Kp + k] = p0;
      if (np == 2) planes[(Np + r) * Kp + k] = p1;
    }
  }
  if (planes) {
    sum = block_sum_i64(sum, red);
    if (threadIdx.x == 0) S[r] = sum;
  }
}

/* x_quant_kernel without an observer for one int8 plane, C % 4 == 0 and x 16-byte aligned: a
 * warp per row (rows strided over the grid's warps), each lane XQ4_VEC 16-byte loads of x in
 * flight at once, then 4-byte stores of the plane and the masks and 16-byte stores of the codes;
 * xq / xm NULL (inference: nothing reads them) skip those stores. The same codes, planes and sums
 * as x_quant_kernel (qg_quant_f32 per element: qg_quant_real's codes in float arithmetic;
 * FAST = 1: qg_quant_qf32, its float clamp, where qg_qf32_make says it applies). (A block of 64
 * threads per row, two loads each, took 31 us at T100 N256 C512 on an H200: six waves of one
 * round trip each; a warp per row with double arithmetic, 28 us; with qg_quant_f32's 64-bit
 * integer clamps, 31 us at 62% of the issue slots; with the float clamp, 22 us.) The blocks from
 * row_blocks on quantize h0. */
enum { XQ4_THREADS = 256, XQ4_VEC = 4 };

template <int FAST>
__device__ __forceinline__ uint32_t xq4_quad(float4 v4, bool in, const qg_qp &QX, const qg_qf32 &QF, int64_t base, int64_t c0, int32_t *xq,
                                             uint8_t *xm, int32_t *sum) {
  if (!in) return 0;
  const float v[4] = {v4.x, v4.y, v4.z, v4.w};
  int32_t q[4];
  uint32_t mw = 0, pw = 0;
#pragma unroll
  for (int e = 0; e < 4; e++) {
    int m;
    q[e] = FAST ? qg_quant_qf32(v[e], &QF, &m) : (int32_t)qg_quant_f32(v[e], QX, &m);
    mw |= (uint32_t)m << (8 * e);
    const int32_t rr = q[e] - (int32_t)base;
    pw |= ((uint32_t)rr & 255u) << (8 * e);
    *sum += rr - (int32_t)c0;
  }
  if (xq) *(int4 *)xq = make_int4(q[0], q[1], q[2], q[3]);
  if (xm) *(uint32_t *)xm = mw;
  return pw;
}

template <int FAST>
__global__ void __launch_bounds__(XQ4_THREADS) x_quant4_kernel(const float *__restrict__ x, int64_t TN, int64_t C, qg_qp QX,
                                                               int32_t *xq, uint8_t *xm, int64_t base, int64_t c0, int64_t Kp,
                                                               int8_t *planes, int64_t *S, int64_t nrows, int64_t row_blocks,
                                                               const __grid_constant__ h0_job hj) {
  if ((int64_t)blockIdx.x >= row_blocks) { h0_part<0>(hj, blockIdx.x - row_blocks, NULL, NULL); return; }
  const int lane = threadIdx.x & 31;
  const int64_t warps = row_blocks * (XQ4_THREADS / 32);
  const qg_qf32 QF = qg_qf32_make(QX);
  for (int64_t r = blockIdx.x * (int64_t)(XQ4_THREADS / 32) + (threadIdx.x >> 5); r < nrows; r += warps) {
    const bool row = r < TN;
    int32_t sum = 0;   /* |sum| <= 255 C < 2^31 (C < 2^17) */
    for (int64_t k0 = 4 * (int64_t)lane; k0 < Kp; k0 += 4 * 32 * XQ4_VEC) {
      float4 v[XQ4_VEC];
#pragma unroll
      for (int u = 0; u < XQ4_VEC; u++) {   /* every load of the lane first */
        const int64_t k = k0 + u * 4 * 32;
        v[u] = row && k < C ? *(const float4 *)(x + r * C + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < XQ4_VEC; u++) {
        const int64_t k = k0 + u * 4 * 32;
        if (k >= Kp) break;
        const bool in = row && k < C;
        *(uint32_t *)(planes + r * Kp + k) =
            xq4_quad<FAST>(v[u], in, QX, QF, base, c0, in && xq ? xq + r * C + k : NULL, in && xm ? xm + r * C + k : NULL, &sum);
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) S[r] = sum;
  }
}

/* matmul.Wx codes and masks from an fp64 accumulator [TN, 3H] (exact integers, or simulated). */
template <int OBS>
__global__ void wx_requant_kernel(const double *acc, int64_t T, int64_t N, int64_t H3, const int32_t *eW, int eX, qg_qp Q,
                                  int exact, const int64_t *L, int32_t *qwx, uint8_t *mwx, double *range, int64_t *counts) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (e >= T * N * H3) return;
  const int64_t r = e / H3, j = e % H3;
  const int s = eW[j] + eX;
  const double a = acc[e];
  int m;
  const int64_t code = exact ? qg_requant64((int64_t)a, s, Q, &m) : qg_requant_real(a, s, Q, &m);
  qwx[e] = (int32_t)code;
  mwx[e] = (uint8_t)m;
  if (OBS && r / N < length_at(L, r % N, T)) observe(range, counts, QG_Q_MATMUL_WX, ldexp(a, -s));
}

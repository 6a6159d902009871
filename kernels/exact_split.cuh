/*
 * exact_split.cuh: products of a float matrix and a matrix of at-most-8-bit integer codes on the
 * int8 tensor cores, exact but for one rounding of the float operand to 30-bit fixed point and one
 * rounding of each result to fp32. The strict mode's STE backward GEMMs run on them
 * (kernels/int_gru_backward.cu); bench/xs_gemm.cu measures them against SGEMM and fp64.
 *
 * Why: every float GEMM of the integer GRU's STE backward multiplies a float gradient by a
 * fake-quantized tensor (q - z) 2^-e. As fp32 SIMT SGEMMs they run at the fp32 FMA rate (at the
 * large bench shape 483 GFLOP a train step: 7.2 ms even at the H200's fp32 peak). bf16 splits make
 * every product exact, but Hopper's tensor cores accumulate fp32 with truncation: errors 2-13x
 * SGEMM's (bench/gpu_runs/bf16_split_gemm_h200.log). Integer accumulation does not round at all:
 *   - each row r of the float operand X [R, K] (times 2^-ke[k] for an integer operand with a
 *     per-row exponent along K) becomes integers Xi[r, k] = rne(X[r, k] 2^-ke[k] 2^sh[r]), sh[r]
 *     such that max_k |Xi[r, k]| <= 2^30: the row's largest values keep 30 significant bits (fp32
 *     has 24; every value within 2^-6 of the row's largest is exact), any value's error is at most
 *     2^-31 of the row's largest;
 *   - Xi = sum_d 256^d D_d, balanced base-256 digits D_d in [-128, 127] (d = 0..3; the top digit
 *     within [-64, 64]), stored as 4 digit planes of R rows each;
 *   - the integer operand as codes c = q - off in [-128, 127] (off = 0 where the grid fits int8,
 *     else qmin + 128), so that q - z = c + (off - z);
 *   - one int8 GEMM of the 4 R digit rows by the codes (int32 accumulation: exact while
 *     K 2^14 < 2^31), then S = sum_d 256^d P_d + corr[r] in int64 (corr[r] = sum_k Xi[r, k]
 *     (off - z_k)), rounded once to float, times 2^-sh[r] and the output's scale (exact).
 * So the result is the exact product of the 30-bit-rounded X with the integer operand, rounded
 * once: at least as accurate as SGEMM, whose every FMA rounds, and deterministic (integer sums have
 * no order). A row with an Inf or a NaN gives NaN in every product of the row (XS_NONFINITE), as
 * an SGEMM's would be Inf or NaN. The int8 tensor cores need both operands K-contiguous (cuBLAS "TN"): the digit planes
 * and the codes are written K-contiguous, rows padded to XS_KPAD bytes with zeros.
 */
#ifndef QGRU_EXACT_SPLIT_CUH
#define QGRU_EXACT_SPLIT_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

enum { XS_DIGITS = 4,      /* base-256 digits of the 30-bit fixed point */
       XS_FRAC = 30,       /* max |Xi| <= 2^XS_FRAC */
       XS_KPAD = 16,       /* K-contiguous rows padded to a multiple of this many bytes */
       XS_THREADS = 256,   /* threads of xs_rows_kernel (one block per row) */
       XS_VPT = 16,        /* values per thread of one chunk of xs_rows_kernel's row */
       XS_TILE = 64,       /* xs_codes_t_kernel's tiles: 64 x 64 */
       XS_MAX_SLICES = 4 };   /* K slices of a split-K product that xs_element adds */

/* The largest K of an exact split product: int32 accumulation of K products of two int8 values. */
#define XS_MAX_K ((int64_t)1 << 17)

/* K padded for the int8 GEMM's operands. */
static inline int64_t xs_kpad(int64_t K) { return (K + XS_KPAD - 1) / XS_KPAD * XS_KPAD; }

/* The shift of a row whose largest |value| is m (>= 0): max |rne(v 2^sh)| <= 2^XS_FRAC; 0 for m = 0;
 * XS_NONFINITE for a row with an Inf or a NaN (m not finite: the row maxima take a NaN as Inf),
 * whose products are then NaN (xs_value), as an SGEMM's would be Inf or NaN: a diverging training
 * stays visible. */
enum { XS_NONFINITE = 1 << 20 };
__device__ __forceinline__ int xs_shift(double m) {
  if (!(m <= 1.7976931348623157e308)) return XS_NONFINITE;
  if (!(m > 0)) return 0;
  int ex;
  frexp(m, &ex);   /* m < 2^ex */
  return XS_FRAC - ex;
}

/* |x| for a row maximum, a NaN taken as Inf (fmaxf would drop it). */
__device__ __forceinline__ float xs_mag(float x) { return x == x ? fabsf(x) : __int_as_float(0x7f800000); }

/* rne(x 2^k) as an integer, for |x 2^k| <= 2^XS_FRAC (what the shift ensures): in 32 bits. x 2^k
 * in float is exact wherever it is normal, and where it is not (|x 2^k| < 2^-126) it rounds to 0
 * either way; double for exponents float cannot hold. (32-bit conversion and digit arithmetic: the
 * 64-bit versions cost the large strict STE backward 0.12 ms; bench/cuda_int_gru.md, session 21.) */
static_assert(XS_FRAC <= 30, "the split's integers fit int32");
__device__ __forceinline__ int xs_fixed(float x, int k) {
  if (k >= XS_NONFINITE / 2) return 0;   /* a non-finite row: its products are NaN anyway */
  if (k >= -126 && k <= 127) return __float2int_rn(x * __int_as_float((127 + k) << 23));
  return (int)llrint(ldexp((double)x, k));
}

/* 2^-e as a float (|e| <= 31: the quantizers' exponents, QUANT_SPEC.md section 1). */
__device__ __forceinline__ float xs_pow2_neg(int e) { return __int_as_float((127 - e) << 23); }

/* The 4 balanced base-256 digits of x (|x| <= 2^30): x = sum_d 256^d dg[d], dg in [-128, 127]. */
__device__ __forceinline__ void xs_digits(int x, int8_t dg[XS_DIGITS]) {
#pragma unroll
  for (int d = 0; d < XS_DIGITS - 1; d++) {
    const int v = (int)((x + 128) & 255) - 128;
    dg[d] = (int8_t)v;
    x = (x - v) >> 8;   /* exact: x - v is a multiple of 256 */
  }
  dg[XS_DIGITS - 1] = (int8_t)x;   /* |x| <= 64 here */
}

/* One result: (sum_d 256^d p_d + corr) 2^-shift, rounded once to float, then scaled by a power of
 * two (exact unless the result is subnormal or overflows; in float where 2^-shift is a normal
 * float, else in double). p_d: digit d's product, the sum over the K slices of a split-K GEMM
 * (integers: exact in any order). */
__device__ __forceinline__ float xs_value(int32_t p0, int32_t p1, int32_t p2, int32_t p3, long long corr, int shift) {
  if (shift >= XS_NONFINITE / 2) return __int_as_float(0x7fffffff);   /* a row with an Inf or a NaN */
  const long long S = (long long)p0 + ((long long)p1 << 8) + ((long long)p2 << 16) + ((long long)p3 << 24) + corr;
  const float f = __ll2float_rn(S);
  if (shift >= -127 && shift <= 126) return __fmul_rn(f, __int_as_float((127 - shift) << 23));
  return (float)ldexp((double)f, -shift);
}

/* Element e of a product whose int32 result P is [slices][4][n] (plane size n = rows x columns),
 * slices <= MAXS (unrolled: every load in flight at once). */
template <int MAXS>
__device__ __forceinline__ float xs_element(const int32_t *__restrict__ P, int slices, int64_t n, int64_t e, long long corr, int shift) {
  int32_t v[MAXS][XS_DIGITS];
#pragma unroll
  for (int k = 0; k < MAXS; k++)
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++) v[k][d] = k < slices ? P[(k * XS_DIGITS + d) * n + e] : 0;
  int32_t p[XS_DIGITS] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < MAXS; k++)
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++) p[d] += v[k][d];
  return xs_value(p[0], p[1], p[2], p[3], corr, shift);
}

/* xs_element of a product of one K slice (P [4][n]) in 32-bit offsets (4 n below 2^31): the
 * per-step path's form with two row groups, where the address arithmetic of the general form's
 * predicated slices was a seventh of its step kernel's instructions (bench/cuda_int_gru.md,
 * session 30). */
__device__ __forceinline__ float xs_element1(const int32_t *__restrict__ P, unsigned n, unsigned e, long long corr, int shift) {
  const int32_t *q = P + e;
  const int32_t p0 = q[0], p1 = q[n], p2 = q[2 * n], p3 = q[3 * n];
  return xs_value(p0, p1, p2, p3, corr, shift);
}

/* Warp-then-block reductions over XS_THREADS threads (every thread gets the result). */
__device__ __forceinline__ double xs_block_max(double v, double *sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int w = 1; w < XS_THREADS / 32; w++) v = fmax(v, sh[w]);
  return v;
}
__device__ __forceinline__ long long xs_block_sum(long long v, long long *sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < XS_THREADS / 32; w++) v += sh[w];
  return v;
}

/* xs_rows_kernel: row r of X [R, ldx] (K used) -> digit planes D [4][R][Kp] (K-contiguous, zero
 * padding), shift sh[r] and corr[r] = sum_k Xi[r, k] (zoff - (kz ? kz[k] : 0)). ke (K values or
 * NULL): X[r, k] is taken times 2^-ke[k] (the integer operand's per-row exponents along K, folded
 * into the float operand: exact). One block of XS_THREADS per row, the row in chunks of XS_VPT
 * values per thread whose loads are all issued before any use (one chunk up to K = 4096: read
 * once, kept in registers; the per-step split at large was latency-bound at 14.8 us with one
 * load in flight per thread). */
__global__ void __launch_bounds__(XS_THREADS) xs_rows_kernel(int8_t *__restrict__ D, int *__restrict__ sh, long long *__restrict__ corr,
                                                             const float *__restrict__ X, int64_t ldx, int64_t R, int64_t K,
                                                             int64_t Kp, const int32_t *__restrict__ ke,
                                                             const int32_t *__restrict__ kz, int zoff) {
  __shared__ double smax[XS_THREADS / 32];
  __shared__ long long ssum[XS_THREADS / 32];
  const int64_t r = blockIdx.x, chunk = (int64_t)XS_VPT * XS_THREADS;
  const float *x = X + r * ldx;
  float v[XS_VPT];
  int e[XS_VPT], zc[XS_VPT];
  auto load = [&](int64_t c0) {   /* the values, their exponents and code offsets: every load issued at once */
#pragma unroll
    for (int i = 0; i < XS_VPT; i++) {
      const int64_t k = c0 + threadIdx.x + (int64_t)i * XS_THREADS;
      v[i] = k < K ? x[k] : 0.0f;
      e[i] = ke && k < K ? ke[k] : 0;
      zc[i] = zoff - (kz && k < K ? kz[k] : 0);
    }
  };
  float m = 0;   /* |x| 2^-ke: exact (|ke| <= 31, gradients far from float's limits) */
  for (int64_t c0 = 0; c0 < K; c0 += chunk) {
    load(c0);
#pragma unroll
    for (int i = 0; i < XS_VPT; i++) m = fmaxf(m, xs_mag(v[i]) * xs_pow2_neg(e[i]));
  }
  const int s = xs_shift(xs_block_max((double)m, smax));
  long long c = 0;
  const int64_t plane = R * Kp;
  int8_t *d0 = D + r * Kp;
  for (int64_t c0 = 0; c0 < Kp; c0 += chunk) {
    if (K > chunk || K == 0) load(c0);   /* one chunk: still in the registers */
#pragma unroll
    for (int i = 0; i < XS_VPT; i++) {
      const int64_t k = c0 + threadIdx.x + (int64_t)i * XS_THREADS;
      if (k >= Kp) break;
      int8_t dg[XS_DIGITS] = {0, 0, 0, 0};
      if (k < K) {
        const int xi = xs_fixed(v[i], s - e[i]);
        xs_digits(xi, dg);
        c += xi * (long long)zc[i];
      }
#pragma unroll
      for (int d = 0; d < XS_DIGITS; d++) d0[d * plane + k] = dg[d];
    }
  }
  c = xs_block_sum(c, ssum);
  if (threadIdx.x == 0) { sh[r] = s; corr[r] = c; }
}

/* xs_colmax_kernel: mbits[j] = max over rows t of |X[t, j]| as float bits (X [T, J] row-major;
 * mbits zeroed before; integer atomicMax of non-negative floats' bits: order-independent). Blocks:
 * x over columns (XS_THREADS), y over chunks of rows_per_block rows (XS_COLMAX_ROWS), each thread
 * XS_COLMAX_VEC loads in flight at a time. (256 rows a block, one load in flight, took 29 us for the
 * side stream's 2048 x 3072 chunks at the large shape, H200: 96 blocks at 0.9 TB/s.) */
enum { XS_COLMAX_ROWS = 64, XS_COLMAX_VEC = 8 };
__global__ void xs_colmax_kernel(unsigned *__restrict__ mbits, const float *__restrict__ X, int64_t T, int64_t J, int64_t rows_per_block) {
  const int64_t j = blockIdx.x * (int64_t)XS_THREADS + threadIdx.x;
  if (j >= J) return;
  const int64_t t0 = blockIdx.y * rows_per_block, t1 = t0 + rows_per_block < T ? t0 + rows_per_block : T;
  float m = 0;
  for (int64_t t = t0; t < t1; t += XS_COLMAX_VEC) {
    float v[XS_COLMAX_VEC];
#pragma unroll
    for (int i = 0; i < XS_COLMAX_VEC; i++) v[i] = t + i < t1 ? X[(t + i) * J + j] : 0.0f;
#pragma unroll
    for (int i = 0; i < XS_COLMAX_VEC; i++) m = fmaxf(m, xs_mag(v[i]));
  }
  atomicMax(mbits + j, __float_as_uint(m));
}

/* xs_cols_kernel: the columns of X [T, J] (row-major) as rows: digit planes D [4][J][Tp] (row j =
 * column j of X, T-contiguous, zero padding), with the shift of column j from its largest |value|
 * (mbits, xs_colmax_kernel), written to sh[j] by the first row of tiles, and corr[j] +=
 * zoff * sum_t Xi[t, j] (corr zeroed before; 64-bit integer atomics: order-independent).
 * Launched by xs_cols (below). A block's tile is ROWS rows t x 32 columns j (XC_THREADS threads):
 * - lane = column, so each warp load is one 128-byte row piece; a thread loads ROWS / 32 values
 *   (4-row quads w, w + 8, ...: every load issued first);
 * - each quad's 4 bytes of a digit are packed into one word of tw [digit][column][ROWS / 4 + 1]
 *   (the +1: word (r, q) is in bank r + q, so that the packing's stores, one column a lane, and the
 *   read-out below, 8 words of 4 rows a warp, are both conflict-free);
 * - the read-out stores 16-byte pieces: a warp writes 4 digit rows of 128 bytes (ROWS = 128).
 * Session 39 (bench/xs_cols_bench.cu, H200, the large shape's dq [25600, 3072]): 177 us, 3.56 TB/s,
 * against 272 us (2.31 TB/s) for session 22's 64 x 64 tiles with byte stores into shared memory and
 * 4-byte stores, and 153 us for a cudaMemcpy of X (4.11 TB/s). Same bytes, shifts and sums. */
enum { XC_COLS = 32, XC_THREADS = 256, XC_ROWS = 128 };
template <int ROWS>
__global__ void __launch_bounds__(XC_THREADS) xs_cols_kernel(int8_t *__restrict__ D, int *__restrict__ sh, long long *__restrict__ corr,
                                                             const float *__restrict__ X, const unsigned *__restrict__ mbits,
                                                             int64_t T, int64_t J, int64_t Tp, int zoff) {
  constexpr int WARPS = XC_THREADS / 32, QW = ROWS / 4 / WARPS, PIECES = ROWS / 16;   /* quads a warp; 16-byte pieces a row */
  static_assert(ROWS % (4 * WARPS) == 0 && ROWS % 16 == 0 && (XS_DIGITS * XC_COLS * PIECES) % XC_THREADS == 0, "tile shape");
  __shared__ uint32_t tw[XS_DIGITS][XC_COLS][ROWS / 4 + 1];
  __shared__ long long csum[WARPS][XC_COLS];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t t0 = blockIdx.x * (int64_t)ROWS, j0 = blockIdx.y * (int64_t)XC_COLS, j = j0 + lane;
  const bool jv = j < J;
  float v[QW][4];
#pragma unroll
  for (int q = 0; q < QW; q++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int64_t t = t0 + 4 * (w + WARPS * q) + r;
      v[q][r] = t < T && jv ? X[t * J + j] : 0.0f;
    }
  const int s = jv ? xs_shift((double)__uint_as_float(mbits[j])) : 0;
  if (blockIdx.x == 0 && w == 0 && jv) sh[j] = s;
  long long c = 0;
#pragma unroll
  for (int q = 0; q < QW; q++) {
    uint32_t pk[XS_DIGITS] = {};
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int xi = xs_fixed(v[q][r], s);
      int8_t dg[XS_DIGITS];
      xs_digits(xi, dg);
      c += xi;
#pragma unroll
      for (int d = 0; d < XS_DIGITS; d++) pk[d] |= (uint32_t)(uint8_t)dg[d] << (8 * r);   /* little-endian: row t0 + 4 q' + r at byte r */
    }
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++) tw[d][lane][w + WARPS * q] = pk[d];
  }
  csum[w][lane] = c;
  __syncthreads();
  if (zoff != 0 && w == 0 && jv) {   /* corrections only for an offset grid */
    long long b = 0;
#pragma unroll
    for (int k = 0; k < WARPS; k++) b += csum[k][lane];
    atomicAdd((unsigned long long *)(corr + j), (unsigned long long)(b * zoff));
  }
  const int64_t plane = J * Tp;
#pragma unroll
  for (int u = threadIdx.x; u < XS_DIGITS * XC_COLS * PIECES; u += XC_THREADS) {
    const int row = u / PIECES, k = u % PIECES, d = row / XC_COLS, jj = row % XC_COLS;
    const int64_t jr = j0 + jj, tc = t0 + 16 * k;
    if (jr >= J || tc >= Tp) continue;
    const uint32_t *src = &tw[d][jj][4 * k];
    *(uint4 *)(D + d * plane + jr * Tp + tc) = make_uint4(src[0], src[1], src[2], src[3]);   /* Tp % XS_KPAD == 0: aligned, in the row */
  }
}

/* Enqueues xs_cols_kernel over X [T, J] on st (D, sh, corr, mbits as the kernel says; Tp a multiple
 * of XS_KPAD, at least T). */
static inline cudaError_t xs_cols(int8_t *D, int *sh, long long *corr, const float *X, const unsigned *mbits, int64_t T, int64_t J,
                                  int64_t Tp, int zoff, cudaStream_t st) {
  if (Tp <= 0 || J <= 0) return cudaSuccess;
  const dim3 grid((unsigned)((Tp + XC_ROWS - 1) / XC_ROWS), (unsigned)((J + XC_COLS - 1) / XC_COLS));
  xs_cols_kernel<XC_ROWS><<<grid, XC_THREADS, 0, st>>>(D, sh, corr, X, mbits, T, J, Tp, zoff);
  return cudaGetLastError();
}

/* xs_codes_t_kernel: Y [Cc][Rp] (int8, K-contiguous, zero padding) = codes [R, Cc]^T - off
 * (codes row-major int32; every code - off within [-128, 127]). Tiles of XS_TILE x XS_TILE. */
__global__ void __launch_bounds__(XS_THREADS) xs_codes_t_kernel(int8_t *__restrict__ Y, const int32_t *__restrict__ codes, int64_t R,
                                                                int64_t Cc, int64_t Rp, int off) {
  __shared__ int8_t tile[XS_TILE][XS_TILE + 4];   /* [column c][row r] */
  const int64_t r0 = blockIdx.x * (int64_t)XS_TILE, c0 = blockIdx.y * (int64_t)XS_TILE;
  const int tx = threadIdx.x % XS_TILE, ty = threadIdx.x / XS_TILE;
  for (int yy = ty; yy < XS_TILE; yy += XS_THREADS / XS_TILE) {
    const int64_t r = r0 + yy, c = c0 + tx;
    tile[tx][yy] = (int8_t)(r < R && c < Cc ? codes[r * Cc + c] - off : 0);
  }
  __syncthreads();
  for (int w = threadIdx.x; w < XS_TILE * (XS_TILE / 4); w += XS_THREADS) {
    const int cc = w / (XS_TILE / 4), q = w % (XS_TILE / 4);
    const int64_t c = c0 + cc, rc = r0 + 4 * q;
    if (c >= Cc || rc >= Rp) continue;
    const uint32_t v = (uint32_t)(uint8_t)tile[cc][4 * q] | (uint32_t)(uint8_t)tile[cc][4 * q + 1] << 8 |
                       (uint32_t)(uint8_t)tile[cc][4 * q + 2] << 16 | (uint32_t)(uint8_t)tile[cc][4 * q + 3] << 24;
    *(uint32_t *)(Y + c * Rp + rc) = v;
  }
}

/* xs_combine_kernel: out[r, c] (+ when accumulate) = (mask ? M[r, c] : 1) xs_value(P's digits of
 * (r, c), corr[r], sh[r] + oe) over out [R, Cc] (P: the int8 GEMM's int32 result,
 * [slices][4][R][Cc]). */
__global__ void xs_combine_kernel(float *__restrict__ out, const int32_t *__restrict__ P, int slices, const int *__restrict__ sh,
                                  const long long *__restrict__ corr, const uint8_t *__restrict__ mask, int64_t R, int64_t Cc, int oe,
                                  int accumulate) {
  const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = R * Cc;
  if (e >= n) return;
  const int64_t r = e / Cc;
  float v = xs_element<XS_MAX_SLICES>(P, slices, n, e, corr[r], sh[r] + oe);
  if (mask && !mask[e]) v = 0.0f;
  out[e] = accumulate ? out[e] + v : v;
}

/* int32 C [S][M, Nc] = D [M, Kp] Y [Nc, Kp]^T over S slices of Kp (S = 1: one GEMM; Kp / S a
 * multiple of XS_KPAD): the int8 GEMM of a split product, both operands K-contiguous (cuBLAS's
 * column-major "TN": C^T [Nc, M] = Y^T D), on hb's stream. */
static inline cublasStatus_t xs_gemm(cublasHandle_t hb, int32_t *C, const int8_t *D, const int8_t *Y, int64_t M, int64_t Nc, int64_t Kp,
                                     int S) {
  if (M <= 0 || Nc <= 0) return CUBLAS_STATUS_SUCCESS;
  const int32_t one = 1, zero = 0;
  const int64_t Kc = Kp / S;
  if (S == 1)
    return cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)Nc, (int)M, (int)Kp, &one, Y, CUDA_R_8I, (int)Kp, D, CUDA_R_8I, (int)Kp, &zero, C,
                        CUDA_R_32I, (int)Nc, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
  return cublasGemmStridedBatchedEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)Nc, (int)M, (int)Kc, &one, Y, CUDA_R_8I, (int)Kp, Kc, D, CUDA_R_8I,
                                    (int)Kp, Kc, &zero, C, CUDA_R_32I, (int)Nc, M * Nc, S, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
}

#endif

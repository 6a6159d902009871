/*
 * wx_gemm.cuh: the W x GEMM of the integer GRU forward on the int8 tensor cores (included by
 * kernels/int_gru.cu, which documents the plane decomposition, and by bench/wx_gemm_bench.cu,
 * which times it against cuBLASLt); the mma / ldmatrix / cp.async wrappers are ptx.cuh's.
 *
 * D[tn][j] = sum_k cX[tn][k] cW[j][k] for every time row tn < T N and output row j < 3H, from
 * int8 planes Xp [PB][Np][Kp] (rows tn of x) and Wp [PA][Mp][Kp] (rows j of W), zeros beyond
 * the true sizes (Np % WX_BT == 0, Mp % WX_BJ == 0, Kp % WX_BK == 0: the producers pad), then
 *   v = sum_ab sA sB (PW_a . PX_b) + bconst[j] + offW[j] SX[tn]            (exact, int64)
 * and either the int32 accumulator (acc_out, no observer: the 32-bit mode; exact below 2^29, so
 * the sums are taken mod 2^32 with single planes) or the matmul.Wx code and in-range mask of v at
 * exponent eW[j] + eX (qg_requant64), observed at valid steps (OBS). Output rows tn of
 * qwx / mwx [T N][3H] (time order), j contiguous.
 *
 * Kernel: block tile BT time rows x WX_BJ = 128 output rows, warps of MT*16 x 32 (WT along tn x 4
 * along j; three variants below, chosen by the grid's size); K in tiles of WX_BK = 64 bytes through a WX_STAGES-deep cp.async ring
 * in shared memory (rows padded to 80 bytes: the ldmatrix row addresses of a phase fall in
 * distinct 16-byte bank groups); fragments by ldmatrix.x4, products on mma.sync m16n8k32 s8
 * (int32). The plane pairs of two-plane operands continue the same pipeline (their K tiles
 * follow each other), each pair's int32 sums folded into int64 accumulators at its end.
 * Two-plane operands take the 64 x 128 variant (room for the int64 accumulators); single planes
 * 128 x 128 where that grid covers the GPU (and 3H is even), else 64 x 128 (wx_gemm_variant).
 * Epilogue straight from the accumulator fragments: each thread holds pairs of adjacent j of one
 * tn, stored as one 8-byte word (codes / accumulators) and one 2-byte word (masks) where 3H is
 * even, element by element otherwise; a warp's store covers 8 rows x 32 bytes (full sectors).
 */
#ifndef QGRU_WX_GEMM_CUH
#define QGRU_WX_GEMM_CUH

#include "int_gru_common.cuh"
#include "ptx.cuh"   /* mma.sync, ldmatrix, cp.async */
#include "stats.cuh"

/* WX_BT: the padding of Np (every variant's time tile divides it) */
enum { WX_BJ = 128, WX_BT = 256, WX_BK = 64, WX_LD = WX_BK + 16, WX_STAGES = 4 };

struct wx_params {
  const int8_t *Wp, *Xp;
  int64_t Mp, Np, Kp;
  int PA, PB;        /* planes of W, of x */
  int64_t H3, T, N;
  const int64_t *bconst, *offW, *SX;
  const int32_t *eW;
  int eX;
  qg_qp Q;
  const int64_t *L;
  int32_t *qwx;      /* codes, or (acc_out) the accumulators themselves, exact below 2^29 */
  uint8_t *mwx;
  int acc_out;       /* 1: write the int32 accumulators (the persistent kernel's 32-bit mode requantizes them) */
  double *range;
  int64_t *counts;
};

/* ldmatrix .x4 into a fragment array from a generic pointer into shared memory */
__device__ __forceinline__ void wx_ldsm4(uint32_t *r, const int8_t *p) { ldsm_x4(r[0], r[1], r[2], r[3], smem_addr(p)); }

/* Tile variants: WT warps along the time rows (x 4 along j), MT m16 tiles per warp.
 *   0: 2 x 2 ->  64 x 128, 256 threads (two-plane operands; small grids)
 *   1: 2 x 4 -> 128 x 128, 256 threads, two blocks per multiprocessor
 *   2: 4 x 4 -> 256 x 128, 512 threads (one plane, large grids: a quarter less operand traffic) */
__host__ __device__ constexpr int wx_wt(int v) { return v == 2 ? 4 : 2; }
__host__ __device__ constexpr int wx_mtv(int v) { return v == 0 ? 2 : 4; }
__host__ __device__ constexpr int wx_rows_t(int v) { return wx_wt(v) * 16 * wx_mtv(v); }
__host__ __device__ constexpr int wx_threads(int v) { return 128 * wx_wt(v); }
__host__ __device__ constexpr int wx_smem(int v) { return WX_STAGES * (wx_rows_t(v) + WX_BJ) * WX_LD; }

template <int OBS, int SINGLE, int V>
__global__ void __launch_bounds__(wx_threads(V), (SINGLE && V == 1) ? 2 : 1) wx_gemm_kernel(const __grid_constant__ wx_params p) {
  constexpr int MT = wx_mtv(V), BT = wx_rows_t(V), STAGE = (BT + WX_BJ) * WX_LD, WX_THREADS = wx_threads(V);
  extern __shared__ __align__(16) int8_t wx_sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int wt = warp >> 2, wj = warp & 3;   /* warp tile: time rows wt*MT*16, output rows wj*32 */
  const int64_t n0 = (int64_t)blockIdx.x * BT, m0 = (int64_t)blockIdx.y * WX_BJ;
  const int PA = SINGLE ? 1 : p.PA, PB = SINGLE ? 1 : p.PB;
  const int64_t Kp = p.Kp;
  const int KT = (int)(Kp / WX_BK), total = PA * PB * KT;

  int32_t acc[MT][4][4];
  int64_t acc64[SINGLE ? 1 : MT][4][4];
#pragma unroll
  for (int a = 0; a < MT; a++)
#pragma unroll
    for (int b = 0; b < 4; b++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        acc[a][b][e] = 0;
        if (!SINGLE) acc64[SINGLE ? 0 : a][b][e] = 0;
      }

  /* stage `it` of the flattened (plane pair, K tile) sequence into ring slot `slot` */
  auto load = [&](int it, int slot) {
    const int pp = it / KT, kt = it - pp * KT, pa = pp / PB, pb = pp - pa * PB;
    int8_t *Xs = wx_sm + slot * STAGE, *Ws = Xs + BT * WX_LD;
    const int8_t *xg = p.Xp + ((int64_t)pb * p.Np + n0) * Kp + (int64_t)kt * WX_BK;
    const int8_t *wg = p.Wp + ((int64_t)pa * p.Mp + m0) * Kp + (int64_t)kt * WX_BK;
#pragma unroll
    for (int i = 0; i < BT * 4 / WX_THREADS; i++) {
      const int c = threadIdx.x + i * WX_THREADS, row = c >> 2, cv = c & 3;
      cp_async16(Xs + row * WX_LD + cv * 16, xg + row * Kp + cv * 16);
    }
#pragma unroll
    for (int i = 0; i < WX_BJ * 4 / WX_THREADS; i++) {
      const int c = threadIdx.x + i * WX_THREADS, row = c >> 2, cv = c & 3;
      cp_async16(Ws + row * WX_LD + cv * 16, wg + row * Kp + cv * 16);
    }
  };

#pragma unroll
  for (int s = 0; s < WX_STAGES - 1; s++) {
    if (s < total) load(s, s);
    cp_async_commit();
  }
  /* ldmatrix lane offsets: A (time rows) 16 rows x 2 k halves; B (output rows) 2 n tiles x 2 k halves */
  const int a_off = (wt * MT * 16 + (lane & 15)) * WX_LD + (lane >> 4) * 16;
  const int b_off = (wj * 32 + (lane & 7) + ((lane >> 4) << 3)) * WX_LD + ((lane >> 3) & 1) * 16;
  int kt_in_pair = 0, pp = 0;
  for (int it = 0; it < total; it++) {
    cp_async_wait<WX_STAGES - 2>();
    __syncthreads();
    {
      const int nx = it + WX_STAGES - 1;
      if (nx < total) load(nx, nx % WX_STAGES);
      cp_async_commit();
    }
    const int8_t *Xs = wx_sm + (it % WX_STAGES) * STAGE, *Ws = Xs + BT * WX_LD;
#pragma unroll
    for (int kk = 0; kk < WX_BK; kk += 32) {
      uint32_t af[MT][4], bf[4][2];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) wx_ldsm4(af[mt], Xs + a_off + mt * 16 * WX_LD + kk);
#pragma unroll
      for (int np = 0; np < 2; np++) {
        uint32_t r[4];
        wx_ldsm4(r, Ws + b_off + np * 16 * WX_LD + kk);
        bf[2 * np][0] = r[0]; bf[2 * np][1] = r[1]; bf[2 * np + 1][0] = r[2]; bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) mma_s8(acc[mt][nt], af[mt], bf[nt]);
    }
    if (!SINGLE && ++kt_in_pair == KT) {   /* the end of a plane pair: fold into int64 */
      const int pa = pp / PB, pb = pp - pa * PB;
      const int64_t sc = (int64_t)((p.PA == 2 && pa == 0) ? 256 : 1) * ((p.PB == 2 && pb == 0) ? 256 : 1);
#pragma unroll
      for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            acc64[SINGLE ? 0 : a][b][e] += sc * acc[a][b][e];
            acc[a][b][e] = 0;
          }
      kt_in_pair = 0;
      pp++;
    }
  }
  cp_async_wait<0>();

  /* epilogue: thread element (mt, nt, e) is time row tn = n0 + wt*MT*16 + mt*16 + g + 8 (e >> 1),
   * output row j = m0 + wj*32 + nt*8 + 2 tq + (e & 1) */
  const int64_t TN = p.T * p.N, H3 = p.H3;
  const bool pairs = (H3 & 1) == 0;
  int64_t sx[MT][2];
  bool valid[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t tn = n0 + wt * MT * 16 + mt * 16 + g + 8 * h;
      sx[mt][h] = tn < TN ? p.SX[tn] : 0;
      valid[mt][h] = OBS && tn < TN && tn / p.N < length_at(p.L, tn % p.N, p.T);
    }
  const bool raw = !OBS && p.acc_out;
#pragma unroll
  for (int nt = 0; nt < 4; nt++) {
    const int64_t j0 = m0 + wj * 32 + nt * 8 + 2 * tq;
    if (j0 >= H3) continue;
    const bool two = j0 + 1 < H3;
    const int64_t bc0 = p.bconst[j0], ow0 = p.offW[j0];
    const int64_t bc1 = two ? p.bconst[j0 + 1] : 0, ow1 = two ? p.offW[j0 + 1] : 0;
    const int s0 = p.eW[j0] + p.eX, s1 = two ? p.eW[j0 + 1] + p.eX : 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int64_t tn = n0 + wt * MT * 16 + mt * 16 + g + 8 * h;
        if (tn >= TN) continue;
        const int64_t o = tn * H3 + j0;
        if (SINGLE && raw) {   /* exact below 2^29: the sums mod 2^32 */
          const uint32_t x = (uint32_t)sx[mt][h];
          const int32_t v0 = (int32_t)((uint32_t)acc[mt][nt][2 * h] + (uint32_t)bc0 + (uint32_t)ow0 * x);
          const int32_t v1 = (int32_t)((uint32_t)acc[mt][nt][2 * h + 1] + (uint32_t)bc1 + (uint32_t)ow1 * x);
          if (pairs && two) *(int2 *)(p.qwx + o) = make_int2(v0, v1);
          else {
            p.qwx[o] = v0;
            if (two) p.qwx[o + 1] = v1;
          }
          continue;
        }
        const int64_t a0 = SINGLE ? (int64_t)acc[mt][nt][2 * h] : acc64[SINGLE ? 0 : mt][nt][2 * h];
        const int64_t a1 = SINGLE ? (int64_t)acc[mt][nt][2 * h + 1] : acc64[SINGLE ? 0 : mt][nt][2 * h + 1];
        const int64_t v0 = a0 + bc0 + ow0 * sx[mt][h], v1 = a1 + bc1 + ow1 * sx[mt][h];
        if (raw) {
          if (pairs && two) *(int2 *)(p.qwx + o) = make_int2((int32_t)v0, (int32_t)v1);
          else {
            p.qwx[o] = (int32_t)v0;
            if (two) p.qwx[o + 1] = (int32_t)v1;
          }
          continue;
        }
        int mk0, mk1 = 0;
        const int32_t c0 = (int32_t)qg_requant64(v0, s0, p.Q, &mk0);
        const int32_t c1 = two ? (int32_t)qg_requant64(v1, s1, p.Q, &mk1) : 0;
        if (pairs && two) {
          *(int2 *)(p.qwx + o) = make_int2(c0, c1);
          *(uint16_t *)(p.mwx + o) = (uint16_t)((mk0 & 255) | ((mk1 & 255) << 8));
        } else {
          p.qwx[o] = c0;
          p.mwx[o] = (uint8_t)mk0;
          if (two) {
            p.qwx[o + 1] = c1;
            p.mwx[o + 1] = (uint8_t)mk1;
          }
        }
        if (OBS && valid[mt][h]) {
          qg_stats_observe_dev(p.range + 4 * QG_Q_MATMUL_WX, p.counts + (int64_t)QG_STATS_BINS * QG_Q_MATMUL_WX, ldexp((double)v0, -s0));
          if (two)
            qg_stats_observe_dev(p.range + 4 * QG_Q_MATMUL_WX, p.counts + (int64_t)QG_STATS_BINS * QG_Q_MATMUL_WX,
                                 ldexp((double)v1, -s1));
        }
      }
  }
}

/* The variant a launch takes (variant < 0: by the grid; two-plane operands always take 0). From
 * bench/gpu_runs/wx_gemm_bench.log (H200, every variant timed at the five bench sizes): 1 where
 * its grid covers the GPU (large 0.268 ms against 0.296 for 2 and 0.350 for 0; medium, long-kws
 * too), else 0 (seed-small, seed-qat); 0 also for odd 3H (element-wise stores: odd-large 0.59 ms
 * against 0.73 for 1). Variant 2 is never chosen (slower everywhere measured); kept for the bench. */
static inline int wx_gemm_variant(int64_t Np, int64_t Mp, int64_t H3, int single, int sms, int variant) {
  if (!single) return 0;
  if (variant >= 0) return variant;
  if (H3 & 1) return 0;
  if ((Np / wx_rows_t(1)) * (Mp / WX_BJ) >= (int64_t)sms) return 1;
  return 0;
}

template <int OBS, int SINGLE, int V>
static inline cudaError_t wx_gemm_go(const wx_params &p, cudaStream_t st) {
  cudaError_t e = cudaFuncSetAttribute((const void *)wx_gemm_kernel<OBS, SINGLE, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, wx_smem(V));
  if (e != cudaSuccess) return e;
  const dim3 grid((unsigned)(p.Np / wx_rows_t(V)), (unsigned)(p.Mp / WX_BJ));
  wx_gemm_kernel<OBS, SINGLE, V><<<grid, wx_threads(V), wx_smem(V), st>>>(p);
  return cudaSuccess;
}

/* Enqueues W x on stream st (Np % WX_BT == 0, Mp % WX_BJ == 0, Kp % WX_BK == 0); sms: the
 * device's multiprocessors; variant: -1 (chosen by the grid) or a forced one (benchmarks).
 * Returns the error of raising the kernel's shared-memory limit; the launch's own error is the
 * caller's to read. */
static inline cudaError_t wx_gemm_launch(const wx_params &p, int obs, int single, cudaStream_t st, int sms, int variant = -1) {
  const int v = wx_gemm_variant(p.Np, p.Mp, p.H3, single, sms, variant);
  if (!single) return obs ? wx_gemm_go<1, 0, 0>(p, st) : wx_gemm_go<0, 0, 0>(p, st);
  if (obs) return v == 2 ? wx_gemm_go<1, 1, 2>(p, st) : v == 1 ? wx_gemm_go<1, 1, 1>(p, st) : wx_gemm_go<1, 1, 0>(p, st);
  return v == 2 ? wx_gemm_go<0, 1, 2>(p, st) : v == 1 ? wx_gemm_go<0, 1, 1>(p, st) : wx_gemm_go<0, 1, 0>(p, st);
}

#endif

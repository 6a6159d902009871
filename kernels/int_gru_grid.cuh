/*
 * int_gru_grid.cuh: the integer GRU forward's GPU-wide persistent recurrence (tc_grid_kernel), for
 * shapes whose R the cluster kernel of int_gru.cu cannot hold (large H) but whose tiles all fit
 * the GPU at once. Included by kernels/int_gru.cu after tc_step_kernel, whose tiles, parameters
 * and helpers it shares; the host code that picks and launches it is in qg_cuda_int_gru_forward.
 *
 * Why: the per-step kernel (tc_step_kernel, one launch per step) re-reads its 96 rows of R from
 * L2 every step, starts each step with an empty pipeline and a one-wave grid, and pays a launch
 * per step; at T100 N256 C512 H1024 it took ~21-26 us per step against an R h of ~1-2 us of
 * tensor-core work. Here one cooperative launch runs all T steps: the same tiles (block = TS_U
 * units, all three gates = TS_M rows of R, x TS_N batch rows; grid ceil(H/TS_U) x ceil(N/TS_N),
 * one block per multiprocessor, all resident) but the block's rows of R stay in shared memory for
 * the whole sequence and the cells' previous codes in registers. Per step a block:
 *   1. waits until every block of its batch group (the same blockIdx.y: the blocks whose h it
 *      reads) has written the step's h planes: one arrival counter per batch group in global
 *      memory, monotonic over the launch (cooperative groups' grid barrier pattern: block
 *      barrier, one thread's __threadfence + atomicAdd; the waiting thread polls with an acquire
 *      load, fences, then a block barrier);
 *   2. copies its TS_N rows of the step's h plane (all K) from L2 with cp.async in TG_KQ groups,
 *      and runs R h on mma.sync m16n8k32 as each group lands (16 warps: 4 K groups x 2 x 48 rows
 *      x 2 x 32 batch rows; every R fragment is read twice per step, every h fragment twice), the
 *      per-row sums of the h codes for the zero-point term from the same B fragments (__dp4a);
 *   3. adds the K groups' partial sums in shared memory (two tiles, two passes) and runs the
 *      32-bit cell of int_gru_cell.h for its units (thread: unit tid % TS_U, batch rows
 *      tid / TS_U + 16 q), exactly as tc_step_kernel's A32 epilogue (a unit outside the 32-bit
 *      bounds runs the general cell and sets the layer's flag), then writes y, the saved state,
 *      hn and the next step's h plane (double-buffered as for tc_step_kernel), and arrives.
 *      The four rows' cells are one straight-line block (every row computed, stores after), so
 *      their dependent chains interleave; the activation tables sit in shared memory where they
 *      fit (tg_params.lut_smem); SAVE = 0 (inference) drops the saved codes and mask words.
 * W x comes from cuBLASLt where int_gru.cu could run it (single planes of W and x, no observer):
 * the plane products in rows of wx_ld int32, to which fold_wx adds the zero-point terms (mod
 * 2^32, the values wx_gemm_kernel's acc_out epilogue writes) where the cells use them; else
 * wx_gemm_kernel's accumulators. The inference variant keeps the terms in registers; the
 * training variant (SAVE = 1, at the 128-register limit) reads them from shared memory: the
 * units' bconst / offW (wzs) and the rows' SX[tn], copied by cp.async a step ahead (sxs).
 * Conditions (host): the 32-bit mode, one int8 plane of R and of h (operands of at most 8 bits),
 * no forced persistent shape, the block's shared memory (R rows + the h block) within the
 * device's limit, every block resident at once (occupancy API x multiprocessors), cooperative
 * launch supported. Bit-exact as the step kernel (the same integer sums: int32 plane products
 * below 2^14 Kp, then taken mod 2^32 as the 32-bit mode bounds them below 2^29).
 */

/* TG_SKIP (timing experiments only, never in a build that is used: results are wrong): 1 leaves
 * out the wait for the batch group, 2 the products, 3 the cells. */
#ifndef TG_SKIP
#define TG_SKIP 0
#endif

enum { TG_KQ = 4, TG_WARPS_K = 4 };

struct tg_params {
  ts_params t;
  int32_t *bar;   /* [gridDim.y] arrival counters, zero at launch */
  int rld;        /* bytes per shared row of R and h: Kp + 16 (conflict-free 32-bit fragment loads) */
  int lut_smem;   /* 1: the cell's three activation tables are copied into shared memory (tg_smem) */
  /* W x: rows of wx_ld int32 (t.c.qwx); wx_bc != NULL: cuBLASLt's plane products, to which the
   * kernel adds the zero-point terms wx_bc[j] + wx_ow[j] wx_sx[tn] ([3H], [3H], [T N]) mod 2^32
   * as it loads them (int_gru.cu, "W x on cuBLASLt"); NULL: wx_gemm_kernel's accumulators */
  int64_t wx_ld;
  const int64_t *wx_bc, *wx_ow, *wx_sx;
};

/* Shared memory of the grid kernel (dynamic part): R's rows [TS_M][rld], then the h block
 * [TS_N][rld], which after the products holds the two partial tiles [2][TS_N][TS_ALD] int32,
 * then (lut_bytes > 0) the three activation tables of the 32-bit cell, codes then masks each
 * (in shared memory the look-ups of the cell's chain do not depend on L1, which the W x stream
 * evicts every step). */
static size_t tg_smem(int64_t Kp, int64_t lut_bytes) {
  const size_t rld = (size_t)Kp + 16, hb = (size_t)TS_N * rld, tiles = 2 * (size_t)TS_N * TS_ALD * 4;
  return (size_t)TS_M * rld + (hb > tiles ? hb : tiles) + (size_t)lut_bytes;
}

__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t *p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <int WIDE, int SAVE>
__global__ void __launch_bounds__(TS_THREADS, 1) tc_grid_kernel(const __grid_constant__ tg_params gp) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t rsum[TG_WARPS_K][TS_N];        /* [K group][batch row]: sums of the h codes (r - base) */
  __shared__ int32_t Ps[(QG_C32_ROWS + 1) * TS_U];  /* [QG_C32_ROWS + 1][TS_U] */
  /* SAVE = 1 (training) only: per-unit terms [12][TS_U] mod 2^32: the W x fold's bconst[k],
   * offW[k] (rows 0-5), R h's rconst[k], roff[k] (rows 6-11); the low words of SX[tn] of the
   * block's rows for steps of parity b ([2][TS_N]); the rows' valid steps ([TS_N]). In shared
   * memory, not registers live across the step (the fold in registers: 164 bytes of spills) */
  __shared__ uint32_t wzs[SAVE ? 12 * TS_U : 1];
  __shared__ uint32_t sxs[SAVE ? 2 : 1][SAVE ? TS_N : 1];
  __shared__ int32_t lens[SAVE ? TS_N : 1];
  const ts_params &p = gp.t;
  const rec_common &c = p.c;
  const int64_t H = c.H, N = c.N, T = c.T, Kp = p.Kp, Np = p.Np;
  const int rld = gp.rld;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kg = warp >> 2, wm = warp & 1, wn = (warp >> 1) & 1;   /* K group; rows wm 48, cols wn 32 */
  const int64_t u0 = (int64_t)blockIdx.x * TS_U, n0 = (int64_t)blockIdx.y * TS_N;
  int8_t *Rs = (int8_t *)smem, *Hs = Rs + (size_t)TS_M * rld;
  int32_t *tile = (int32_t *)Hs;   /* after the products: [2][TS_N][TS_ALD] */
  const int kc = (int)(Kp / 16);   /* 16-byte chunks per row */

  /* once: the block's rows of R (gate-major: row gt TS_U + u is R's row gt H + u0 + u; zero rows
   * beyond H) and its units' rows of the 32-bit cell */
  for (int e = tid; e < TS_M * kc; e += TS_THREADS) {
    const int row = e / kc, cv = e % kc, gt = row / TS_U, u = row % TS_U;
    const bool ok = u0 + u < H;
    cp_async16(Rs + (size_t)row * rld + cv * 16, p.Rp + (ok ? (gt * H + u0 + u) * Kp + cv * 16 : 0), ok ? 16 : 0);
  }
  cp_async_commit();
  for (int e = tid; e < (QG_C32_ROWS + 1) * TS_U; e += TS_THREADS) {
    const int r = e / TS_U, uu = e % TS_U;
    Ps[e] = u0 + uu < H ? p.P32[r * H + u0 + uu] : 0;
  }
  qg_cell32 c32 = p.c32;
  c32.P = Ps;
  c32.H = TS_U;
  if (gp.lut_smem) {   /* the tables after the h block / tiles (tg_smem) */
    const size_t rld = (size_t)Kp + 16, hb = (size_t)TS_N * rld, tiles = 2 * (size_t)TS_N * TS_ALD * 4;
    cell_luts_to_smem(&c32, (int32_t *)(smem + (size_t)TS_M * rld + (hb > tiles ? hb : tiles)), tid, TS_THREADS);
  }

  /* this thread's cells: unit u, rows rb + 16 q; their previous codes stay in registers */
  constexpr int RPT = TS_N / (TS_THREADS / TS_U);
  const int u = tid % TS_U, rb = tid / TS_U;
  const int64_t i = u0 + u;
  const bool unit_ok = i < H;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H];
  /* R h's per-unit terms: registers (inference) or wzs rows 6-11 (training) */
  uint32_t rconst_r[3], roff_r[3];
#pragma unroll
  for (int k = 0; k < 3; k++) {
    rconst_r[k] = !SAVE && unit_ok ? (uint32_t)p.rconst[k * H + i] : 0;
    roff_r[k] = !SAVE && unit_ok ? (uint32_t)p.roff[k * H + i] : 0;
  }
  if (SAVE) {
    for (int e = tid; e < 6 * TS_U; e += TS_THREADS) {
      const int k = e / TS_U, uu = e % TS_U;
      const int64_t j = (k % 3) * H + u0 + uu;
      wzs[6 * TS_U + e] = u0 + uu < H ? (uint32_t)(k < 3 ? p.rconst[j] : p.roff[j]) : 0u;
    }
    for (int e = tid; e < TS_N; e += TS_THREADS) lens[e] = n0 + e < N ? (int32_t)length_at(c.L, n0 + e, T) : 0;
  }
  auto rconst = [&](int k) -> uint32_t { return SAVE ? wzs[(6 + k) * TS_U + u] : rconst_r[k]; };
  auto roff = [&](int k) -> uint32_t { return SAVE ? wzs[(9 + k) * TS_U + u] : roff_r[k]; };
  int32_t php[RPT], pwx[RPT][3];
  uint32_t psx[RPT];   /* inference: SX[tn] of the loaded W x rows (fold) */
  int32_t Ln_r[RPT];   /* inference: valid steps of the rows (T < 2^31); training: lens */
#pragma unroll
  for (int q = 0; q < RPT; q++) {
    const int64_t n = n0 + rb + q * (TS_THREADS / TS_U);
    Ln_r[q] = !SAVE && n < N ? (int32_t)length_at(c.L, n, T) : 0;
    php[q] = unit_ok && n < N ? h_at(c, 0)[n * H + i] : 0;
  }
  auto Ln = [&](int q) -> int32_t { return SAVE ? lens[rb + q * (TS_THREADS / TS_U)] : Ln_r[q]; };
  /* the unit's zero-point terms of W x (cuBLASLt's products; zeros otherwise): registers
   * (inference) or wzs rows 0-5 (training) */
  const bool fold = gp.wx_bc != NULL;
  uint32_t wbc[3] = {0, 0, 0}, wow[3] = {0, 0, 0};
  if (!SAVE && fold && unit_ok) {
#pragma unroll
    for (int k = 0; k < 3; k++) {
      wbc[k] = (uint32_t)gp.wx_bc[k * H + i];
      wow[k] = (uint32_t)gp.wx_ow[k * H + i];
    }
  }
  if (SAVE && fold)
    for (int e = tid; e < 6 * TS_U; e += TS_THREADS) {
      const int k = e / TS_U, uu = e % TS_U;
      const int64_t j = (k % 3) * H + u0 + uu;
      wzs[e] = u0 + uu < H ? (uint32_t)(k < 3 ? gp.wx_bc[j] : gp.wx_ow[j]) : 0u;
    }
  if (SAVE) __syncthreads();   /* lens */
  /* W x accumulators of step s (DRAM at large shapes): loaded a step ahead, before the wait.
   * Training with the fold: SX[tn] of the block's rows by cp.async into sxs[s & 1] (thread u = 0
   * of each row; zeros for a row beyond N or a padded step), its own group, committed before
   * step s's h groups: step s's first wait (cp_async_wait<TG_KQ - 1>) and barrier cover it */
  auto load_wx = [&](int64_t s) {
#pragma unroll
    for (int q = 0; q < RPT; q++) {
      const int r = rb + q * (TS_THREADS / TS_U);
      const int64_t n = n0 + r;
      pwx[q][0] = pwx[q][1] = pwx[q][2] = 0;
      psx[q] = 0;
      if (!SAVE) {
        if (unit_ok && n < N && s < Ln(q)) {
          const int64_t tn = (c.reverse ? Ln(q) - 1 - s : s) * N + n;
          const int32_t *wx = c.qwx + tn * gp.wx_ld + i;
          pwx[q][0] = wx[0]; pwx[q][1] = wx[H]; pwx[q][2] = wx[2 * H];
          if (fold) psx[q] = (uint32_t)gp.wx_sx[tn];
        }
      } else {
        const bool ok = n < N && s < Ln(q);
        const int64_t tn = ok ? (c.reverse ? Ln(q) - 1 - s : s) * N + n : 0;
        if (unit_ok && ok) {
          const int32_t *wx = c.qwx + tn * gp.wx_ld + i;
          pwx[q][0] = wx[0]; pwx[q][1] = wx[H]; pwx[q][2] = wx[2 * H];
        }
        if (fold && u == 0) cp_async4(&sxs[SAVE ? s & 1 : 0][SAVE ? r : 0], gp.wx_sx + tn, ok ? 4 : 0);   /* the low word (little-endian) */
      }
    }
    if (SAVE && fold) cp_async_commit();
  };
  /* + bconst[j] + offW[j] SX[tn], mod 2^32 (wx_gemm_kernel's acc_out epilogue), applied where
   * the cells use them: the loads issued a step ahead are not waited for before the arrival */
  auto fold_wx = [&](int64_t s) {
    if (!fold) return;
#pragma unroll
    for (int q = 0; q < RPT; q++) {
      if (SAVE) {
        const uint32_t sx = sxs[SAVE ? s & 1 : 0][SAVE ? rb + q * (TS_THREADS / TS_U) : 0];
#pragma unroll
        for (int k = 0; k < 3; k++) pwx[q][k] = (int32_t)((uint32_t)pwx[q][k] + wzs[SAVE ? k * TS_U + u : 0] + wzs[SAVE ? (3 + k) * TS_U + u : 0] * sx);
      } else {
#pragma unroll
        for (int k = 0; k < 3; k++) pwx[q][k] = (int32_t)((uint32_t)pwx[q][k] + wbc[k] + wow[k] * psx[q]);
      }
    }
  };
  load_wx(0);
  /* y = (h - z) 2^-e in float: h - z (at most 17 bits) and 2^-e (|e| <= 31, QUANT_SPEC.md section 1)
   * are exact floats and so is their product, the value qg_deq's double rounds to */
  const float ysc = (float)ldexp(1.0, -QH.e);
  const int nks = (int)(Kp / 32);   /* k steps of 32 columns */

  for (int64_t s = 0; s < T; s++) {
    const int cur = (int)(s & 1), nxt = cur ^ 1;
    /* 1. every block of this batch group has written step s's h plane */
    if (TG_SKIP != 1 && s > 0 && tid == 0) {
      const int32_t want = (int32_t)(s * gridDim.x);
      const int32_t *b = gp.bar + blockIdx.y;
      while (ld_acquire_gpu(b) < want) {
      }
      __threadfence();
    }
    __syncthreads();   /* s = 0: R, Ps are issued / written; the wait above for the others */
    /* 2. the h block in TG_KQ groups of k steps, R h as each lands */
    const int8_t *Hg = p.Hp + ((int64_t)cur * Np + n0) * Kp;
#pragma unroll
    for (int q = 0; q < TG_KQ; q++) {   /* thread: rows tid / 16 + 32 j, chunk columns c0 + tid % 16 + 16 m (no divisions) */
      const int c0 = (q * nks / TG_KQ) * 2, c1 = ((q + 1) * nks / TG_KQ) * 2;   /* 16-byte chunk columns */
#pragma unroll
      for (int row = tid >> 4; row < TS_N; row += TS_THREADS / 16)
        for (int cv = c0 + (tid & 15); cv < c1; cv += 16)
          cp_async16(Hs + (size_t)row * rld + cv * 16, Hg + (int64_t)row * Kp + cv * 16, 16);
      cp_async_commit();
    }
    int32_t acc[3][4][4];
#pragma unroll
    for (int a = 0; a < 3; a++)
#pragma unroll
      for (int b = 0; b < 4; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[a][b][e] = 0;
    int32_t rs[4] = {0, 0, 0, 0};
#pragma unroll
    for (int q = 0; q < TG_KQ; q++) {
      if (q == 0) cp_async_wait<TG_KQ - 1>();
      else if (q == 1) cp_async_wait<TG_KQ - 2>();
      else if (q == 2) cp_async_wait<TG_KQ - 3>();
      else cp_async_wait<0>();
      __syncthreads();   /* group q landed for every thread (s = 0: R as well) */
      const int k0 = q * nks / TG_KQ, k1 = (q + 1) * nks / TG_KQ;
      for (int ks = k0 + kg; ks < (TG_SKIP == 2 ? k0 : k1); ks += TG_WARPS_K) {
        rh_k32<4>(acc, rs, Rs, Hs, wm * 48, wn * 32, rld, ks * 32, wm == 0);
      }
    }
    if (wm == 0) {   /* the row sums: lanes tq of a row, then one store per K group */
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        int32_t v = rs[nt];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (tq == 0) rsum[kg][wn * 32 + nt * 8 + g] = v;
      }
    }
    __syncthreads();   /* every product done: the h block becomes the tiles */
    /* 3. the K groups' sums: groups 0, 1 store into tiles 0, 1, then groups 2, 3 add */
    for (int pass = 0; pass < 2; pass++) {
      if ((kg >> 1) == pass) {
        int32_t *tl = tile + (kg & 1) * TS_N * TS_ALD;
#pragma unroll
        for (int mt = 0; mt < 3; mt++)
#pragma unroll
          for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int row = wm * 48 + mt * 16 + g + 8 * (e >> 1), col = wn * 32 + nt * 8 + 2 * tq + (e & 1);
              if (pass == 0) tl[col * TS_ALD + row] = acc[mt][nt][e];
              else tl[col * TS_ALD + row] += acc[mt][nt][e];
            }
      }
      __syncthreads();
    }
    /* the cells. 32-bit units: the four rows' cells in one straight-line block, every row
     * computed (a row beyond N, a padded step or a unit beyond H gives defined codes that are
     * not stored: the inputs are clamped by the cell's first requantizations, and the tables are
     * indexed by clamped codes), so their four dependent chains interleave and the unit's rows
     * of Ps are read once for the four; then the stores. SAVE = 0 (inference): the saved codes
     * and the mask word are dead and the compiler drops their work. */
    fold_wx(s);
    const bool use32 = Ps[QG_C32_ROWS * TS_U + u] != 0;
    int32_t *hsave = SAVE ? c.hq + (s + 1) * N * H : NULL;
    if (TG_SKIP == 3) {
    } else if (use32) {
      qg_cell32_out o[RPT];
#pragma unroll
      for (int q = 0; q < RPT; q++) {
        const int r = rb + q * (TS_THREADS / TS_U);
        uint32_t sh = 0;
#pragma unroll
        for (int k = 0; k < TG_WARPS_K; k++) sh += (uint32_t)rsum[k][r];
        uint32_t a[3];
#pragma unroll
        for (int k = 0; k < 3; k++)
          a[k] = (uint32_t)tile[r * TS_ALD + k * TS_U + u] + (uint32_t)tile[TS_N * TS_ALD + r * TS_ALD + k * TS_U + u] + rconst(k) +
                 roff(k) * sh;
        qg_cell32_forward(&c32, u, pwx[q][0], pwx[q][1], pwx[q][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], php[q], &o[q]);
      }
#pragma unroll
      for (int q = 0; q < RPT; q++) {
        const int64_t n = n0 + rb + q * (TS_THREADS / TS_U);
        if (!unit_ok || n >= N) continue;
        if (s >= Ln(q)) {   /* padded step (t = s): the state stays, y = 0 */
          if (SAVE) zero_cell(c, s, n, i);
          c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
        } else {
          const int64_t t = c.reverse ? Ln(q) - 1 - s : s;
          c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)(o[q].h - QH.z) * ysc;
          if (SAVE) {   /* narrow (the 32-bit mode implies it): three aligned words */
            uint32_t wd[3];
            qg_cell_narrow_words(&c.cell, o[q].zpre, o[q].rpre, o[q].gpre, o[q].rhb, o[q].mask, wd);
            uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
            d[0] = wd[0]; d[1] = wd[1]; d[2] = wd[2];
          }
          php[q] = o[q].h;
        }
      }
    } else {   /* a unit outside the 32-bit bounds: the general cell, as tc_step_kernel's */
#pragma unroll
      for (int q = 0; q < RPT; q++) {
        const int r = rb + q * (TS_THREADS / TS_U);
        const int64_t n = n0 + r;
        if (!unit_ok || n >= N) continue;
        const int32_t hp = php[q];
        int32_t hnew = hp;
        if (s >= Ln(q)) {
          zero_cell(c, s, n, i);
          c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
        } else {
          const int64_t t = c.reverse ? Ln(q) - 1 - s : s;
          uint32_t sh = 0;
#pragma unroll
          for (int k = 0; k < TG_WARPS_K; k++) sh += (uint32_t)rsum[k][r];
          const qg_qp QRH = c.cell.a[QG_Q_MATMUL_RH];
          qg_cell_in in;
          fill_bias(c, i, &in);
          in.mask = 0;
#pragma unroll
          for (int k = 0; k < 3; k++) {
            const uint32_t a = (uint32_t)tile[r * TS_ALD + k * TS_U + u] + (uint32_t)tile[TS_N * TS_ALD + r * TS_ALD + k * TS_U + u] +
                               rconst(k) + roff(k) * sh;
            int m;
            in.rh[k] = qg_requant64((int64_t)(int32_t)a, c.eR[k * H + i] + QH.e, QRH, &m);
            in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
          }
#pragma unroll
          for (int k = 0; k < 3; k++) {
            int m;
            in.wx[k] = qg_requant64(pwx[q][k], p.eW[k * H + i] + p.eX, c.cell.a[QG_Q_MATMUL_WX], &m);
            in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
          }
          in.hprev = hp;
          hnew = (int32_t)run_cell<WIDE, 0>(&c.cell, c, s, t, n, i, &in);
        }
        php[q] = hnew;
      }
    }
#pragma unroll
    for (int q = 0; q < RPT; q++) {   /* the next step's h: saved codes, hn, the int8 plane */
      const int64_t n = n0 + rb + q * (TS_THREADS / TS_U);
      if (!unit_ok || n >= N) continue;
      if (SAVE) hsave[n * H + i] = php[q];
      if (s == T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(php[q], QH);
      int8_t p0, p1;
      split_planes(php[q], p.baseH, 1, &p0, &p1);
      p.Hp[((int64_t)nxt * Np + n) * Kp + i] = p0;
    }
    if (s + 1 < T) {
      load_wx(s + 1);
      __syncthreads();   /* every cell of the block written (and the tiles read) */
      if (tid == 0) {
        __threadfence();
        atomicAdd(gp.bar + blockIdx.y, 1);
      }
    }
  }
}

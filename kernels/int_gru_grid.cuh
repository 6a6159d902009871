/*
 * int_gru_grid.cuh: the integer GRU forward's GPU-wide persistent recurrence (tc_grid_kernel), for
 * shapes whose R the cluster kernel (int_gru_cluster.cuh) cannot hold (large H) but whose tiles all fit
 * the GPU at once. Included by kernels/int_gru.cu after tc_step_kernel (int_gru_step.cuh), whose tiles, parameters
 * and helpers it shares; the host code that picks and launches it is in qg_cuda_int_gru_forward.
 *
 * Why: the per-step kernel (tc_step_kernel, one launch per step) re-reads its 96 rows of R from
 * L2 every step, starts each step with an empty pipeline and a one-wave grid, and pays a launch
 * per step; at T100 N256 C512 H1024 it took ~21-26 us per step against an R h of ~1-2 us of
 * tensor-core work. Here one cooperative launch runs all T steps: the same tiles (block = TS_U
 * units, all three gates = TS_M rows of R, x TS_N batch rows; grid ceil(H/TS_U) x ceil(N/TS_N),
 * one block per multiprocessor, all resident) but the block's rows of R stay in shared memory for
 * the whole sequence and the cells' previous codes in registers.
 * Within a block, the TS_N batch rows are two halves of TG_HALF rows that never mix, run as a
 * ping-pong: warps 0-7 (the product warps) and warps 8-15 (the cell warps) work on different
 * halves at once, so that one half's R h (tensor cores, shared-memory loads) runs beside the
 * other half's cells (integer ALU) and each half's wait for the other blocks hides behind the
 * other half's work (bench/cuda_int_gru.md, "ping-pong": the forward 12.1 -> 10.2 us a step at
 * large). For each step s and half x in turn:
 *   the product warps
 *   1. wait until every block of the batch group (the same blockIdx.y: the blocks whose h they
 *      read) has written the half's rows of step s's h plane: one arrival counter per (batch
 *      group, half) in global memory, monotonic over the launch, which the cell warps' last
 *      barrier plus one thread's red.release.gpu advance and one product thread polls with an
 *      acquire load before its arrival on the half's "buffer free" mbarrier (below: the roles'
 *      mbarriers);
 *   2. copy the half's rows of the h plane (all K) from L2 into the half's buffer with cp.async
 *      in KQ groups (two in training, one in inference) and run R h on mma.sync m16n8k32
 *      (ldmatrix fragments) as each group lands (8 warps: 4 K groups x 2 x 48 rows of R x the
 *      half's 32 rows), the per-row sums of the h codes for the zero-point term from the same B
 *      fragments (__dp4a);
 *   3. add the K groups' partial sums into two tiles in the same buffer (two passes) and signal
 *      the cell warps ("tiles ready");
 *   the cell warps
 *   4. run the 32-bit cell of int_gru_cell.h for the block's units on the half's rows (thread:
 *      unit ct % TS_U, rows ct / TS_U + 8 q), exactly as tc_step_kernel's A32 epilogue (a unit
 *      outside the 32-bit bounds runs the general cell and sets the layer's flag), with W x
 *      loaded two half-steps ahead and requantized (step 2) after the previous half's arrival,
 *      where the cell warps wait for the tiles anyway, then write y, the saved state and the
 *      next step's h plane (double-buffered as for tc_step_kernel), and arrive (hn after the
 *      last step). The four rows' cells are one straight-line block (every row computed, stores
 *      after), so their dependent chains interleave; the activation tables sit in shared memory
 *      where they fit (tg_params.lut_smem); SAVE = 0 (inference) drops the saved codes and mask
 *      words.
 * A half's buffer takes the next copy only after the cell warps have signalled that they read its
 * tiles ("buffer free"; the group's arrival counter implies it as well).
 * W x comes from cuBLASLt where int_gru.cu could run it (single planes of W and x, no observer):
 * the plane products in rows of wx_ld int32, to which the cell warps add the zero-point terms
 * bconst + offW SX[tn] (mod 2^32, the values wx_gemm_kernel's acc_out epilogue writes); else
 * wx_gemm_kernel's accumulators. The inference variant keeps the per-unit terms in registers, the
 * training variant (SAVE = 1) in shared memory (wzs).
 * Conditions (host): the 32-bit mode, one int8 plane of R and of h (operands of at most 8 bits),
 * no forced persistent shape, the block's shared memory (R rows + the two halves' buffers) within the
 * device's limit, every block resident at once (occupancy API x multiprocessors), cooperative
 * launch supported. Bit-exact as the step kernel (the same integer sums: int32 plane products
 * below 2^14 Kp, then taken mod 2^32 as the 32-bit mode bounds them below 2^29).
 */

/* Warp roles (see the header): warps 0-7 (TG_PT threads) run the h copies and R h, warps 8-15 the
 * cells; each batch half x (TG_HALF rows) has its own arrival counter and h buffer. Every order
 * of shared-memory accesses between threads is an mbarrier on which each accessing thread
 * arrives itself:
 *   mb_full[x][q]  group q of half x's h copy landed (each product thread's
 *                  cp.async.mbarrier.arrive: it arrives once the thread's copies have landed);
 *   mb_prod        every product warp done with the h buffer, which then becomes the tiles;
 *   mb_pair[k][m]  K group k's pass-0 tile stores done, before K group k + 2 adds (32 arrivals:
 *                  the storing warp; only the adding warp waits);
 *   mb_tiles[x]    the half's tiles and row sums ready (product threads arrive, cells wait);
 *   mb_free[x]     the half's tiles read (the cell threads arrive, and the product thread that
 *                  polled the group's arrival counter: 257 arrivals); the product threads wait
 *                  before the next copy into the buffer.
 * The cell warps' own barrier before the group's arrival (TG_BAR_C) orders global stores only, so
 * it stays a named barrier. Why mbarriers with one arrival per thread: compute-sanitizer's
 * racecheck follows them (cp.async's completion through cp.async.mbarrier.arrive included); it
 * does not follow named barriers with a thread count (bar.sync id, n), which this kernel used up
 * to session 19 (hazards on every grid spec; bench/racecheck_named_probe.cu), nor an arrival per
 * warp after __syncwarp (pp10; bench/racecheck_async_probe.cu, modes 3 and 4 against 0-2). The
 * cost (bench/cuda_int_gru.md, "racecheck-clean grid kernel"): inference at large 1.09 -> 1.14
 * ms, the training forward 1.36 -> 1.33. Measured and not kept there: the h copy as bulk copies
 * (TMA, one row a lane: 1.29 ms), the cells' barrier with one waiting thread (1.46 ms), one copy
 * group (training forward 1.40 ms). */
/* TG_SKIP (timing experiments only, never in a build that is used: results are wrong): 2 leaves
 * out the products, 3 the cells (bench/cuda_int_gru.md, "ping-pong"). */
#ifndef TG_SKIP
#define TG_SKIP 0
#endif
/* TG_TIMELINE (experiment builds only): %globaltimer stamps per (block, step, half, event) into
 * tg_tl, summarized by the host after the launch (int_gru.cu) */
#ifndef TG_TIMELINE
#define TG_TIMELINE 0
#endif
#if TG_TIMELINE
enum { TG_TL_B = 128, TG_TL_S = 100, TG_TL_E = 9 };
__device__ unsigned long long tg_tl[TG_TL_B * TG_TL_S * 2 * TG_TL_E];
__device__ __forceinline__ unsigned long long tg_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define TG_STAMP(s, x, ev)                                                                          \
  do {                                                                                              \
    const int b_ = blockIdx.y * gridDim.x + blockIdx.x;                                             \
    if (b_ < TG_TL_B && (s) < TG_TL_S) tg_tl[((b_ * TG_TL_S + (int)(s)) * 2 + (x)) * TG_TL_E + (ev)] = tg_now(); \
  } while (0)
#else
#define TG_STAMP(s, x, ev) do { } while (0)
#endif
enum { TG_KQ = 2 /* copy groups at most (KQ) */, TG_WARPS_K = 4, TG_HALF = TS_N / 2, TG_PT = TS_THREADS / 2, TG_BAR_C = 2 };
static_assert(TS_THREADS - TG_PT == TG_PT && TG_HALF == 32,
              "mb_free counts TG_PT cell threads; the h copy (8 threads a row) and R h (4 n8 tiles) take 32 rows a half");

struct tg_params {
  ts_params t;
  int32_t *bar;   /* [gridDim.y][2] arrival counters (batch group, half), zero at launch */
  int rld;        /* bytes per shared row of R and h: Kp + 16 (conflict-free fragment loads) */
  int lut_smem;   /* 1: the cell's three activation tables are copied into shared memory (tg_smem) */
  /* W x: rows of wx_ld int32 (t.c.qwx); wx_bc != NULL: cuBLASLt's plane products, to which the
   * kernel adds the zero-point terms wx_bc[j] + wx_ow[j] wx_sx[tn] ([3H], [3H], [T N]) mod 2^32
   * as it loads them (int_gru_wx_lt.cuh); NULL: wx_gemm_kernel's accumulators */
  int64_t wx_ld;
  const int64_t *wx_bc, *wx_ow, *wx_sx;
};

/* Bytes of one half's h buffer: its TG_HALF rows of h (all K), which after the products hold the
 * half's two partial tiles [2][TG_HALF][TS_ALD] int32; 16-byte multiple. */
static __host__ __device__ size_t tg_half_bytes(int64_t Kp) {
  const size_t hb = (size_t)TG_HALF * ((size_t)Kp + 16), tiles = 2 * (size_t)TG_HALF * TS_ALD * 4;
  return ((hb > tiles ? hb : tiles) + 15) / 16 * 16;
}

/* Shared memory of the grid kernel (dynamic part): R's rows [TS_M][rld], the two halves' h buffers
 * (tg_half_bytes each), then (lut_bytes > 0) the three activation tables of the 32-bit cell,
 * codes then masks each (in shared memory the look-ups of the cell's chain do not depend on L1,
 * which the W x stream evicts every step). */
static size_t tg_smem(int64_t Kp, int64_t lut_bytes) {
  return (size_t)TS_M * ((size_t)Kp + 16) + 2 * tg_half_bytes(Kp) + (size_t)lut_bytes;
}

template <int WIDE, int SAVE>
__global__ void __launch_bounds__(TS_THREADS, 1) tc_grid_kernel(const __grid_constant__ tg_params gp) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t rsum[2][TG_WARPS_K][TG_HALF];   /* [half][K group][row]: sums of the h codes (r - base) */
  __shared__ int32_t Ps[(QG_C32_ROWS + 1) * TS_U];   /* [QG_C32_ROWS + 1][TS_U] */
  /* SAVE = 1 (training) only: per-unit terms [12][TS_U] mod 2^32: the W x fold's bconst[k],
   * offW[k] (rows 0-5), R h's rconst[k], roff[k] (rows 6-11), in shared memory, not registers
   * live across the step (the training variant is at the register limit) */
  __shared__ uint32_t wzs[SAVE ? 12 * TS_U : 1];
  __shared__ int32_t lens[TS_N];                     /* the rows' valid steps */
  /* the roles' mbarriers (the comment above tg_params): every participating thread arrives */
  __shared__ uint64_t mb_full[2 * TG_KQ], mb_tiles[2], mb_free[2], mb_prod, mb_pair[4];
  const ts_params &p = gp.t;
  const rec_common &c = p.c;
  const int64_t H = c.H, N = c.N, T = c.T, Kp = p.Kp, Np = p.Np;
  const int rld = gp.rld;
  const int tid = threadIdx.x;
  const int64_t u0 = (int64_t)blockIdx.x * TS_U, n0 = (int64_t)blockIdx.y * TS_N;
  int8_t *Rs = (int8_t *)smem;
  const size_t hbytes = tg_half_bytes(Kp);
  auto hbuf = [&](int x) -> int8_t * { return (int8_t *)smem + (size_t)TS_M * rld + (size_t)x * hbytes; };
  const int kc = (int)(Kp / 16);   /* 16-byte chunks per row */

  /* once: the block's rows of R (gate-major: row gt TS_U + u is R's row gt H + u0 + u; zero rows
   * beyond H), its units' rows of the 32-bit cell, the rows' lengths */
  for (int e = tid; e < TS_M * kc; e += TS_THREADS) {
    const int row = e / kc, cv = e % kc, gt = row / TS_U, u = row % TS_U;
    const bool ok = u0 + u < H;
    cp_async16_zfill(Rs + (size_t)row * rld + cv * 16, p.Rp + (ok ? (gt * H + u0 + u) * Kp + cv * 16 : 0), ok ? 16 : 0);
  }
  cp_async_commit();
  for (int e = tid; e < (QG_C32_ROWS + 1) * TS_U; e += TS_THREADS) {
    const int r = e / TS_U, uu = e % TS_U;
    Ps[e] = u0 + uu < H ? p.P32[r * H + u0 + uu] : 0;
  }
  for (int e = tid; e < TS_N; e += TS_THREADS) lens[e] = n0 + e < N ? (int32_t)length_at(c.L, n0 + e, T) : 0;
  qg_cell32 c32 = p.c32;
  c32.P = Ps;
  c32.H = TS_U;
  if (gp.lut_smem)   /* the tables after the h buffers (tg_smem) */
    cell_luts_to_smem(&c32, (int32_t *)(smem + (size_t)TS_M * rld + 2 * hbytes), tid, TS_THREADS);
  const bool fold = gp.wx_bc != NULL;
  if (SAVE)
    for (int e = tid; e < 6 * TS_U; e += TS_THREADS) {
      const int k = e / TS_U, uu = e % TS_U;
      const int64_t j = (k % 3) * H + u0 + uu;
      const bool ok = u0 + uu < H;
      wzs[6 * TS_U + e] = ok ? (uint32_t)(k < 3 ? p.rconst[j] : p.roff[j]) : 0u;
      wzs[e] = ok && fold ? (uint32_t)(k < 3 ? gp.wx_bc[j] : gp.wx_ow[j]) : 0u;
    }
  if (tid == 0) {
    for (int e = 0; e < 2 * TG_KQ; e++) mb_init(&mb_full[e], TG_PT);
    for (int x = 0; x < 2; x++) {
      mb_init(&mb_tiles[x], TG_PT);
      mb_init(&mb_free[x], TG_PT + 1);   /* the cell threads and the product warps' poller */
    }
    mb_init(&mb_prod, TG_PT);
    for (int e = 0; e < 4; e++) mb_init(&mb_pair[e], 32);
  }
  cp_async_wait<0>();
  __syncthreads();   /* R, Ps, the tables, the lengths, wzs, the mbarriers */

  if (tid < TG_PT) {
    /* ---- the product warps: per (step, half) the wait for the half's group, the h copy in KQ
     * groups with R h on mma.sync as each lands (8 warps: 4 K groups x 2 x 48 rows x all 32 rows
     * of the half), the per-row sums of the h codes, the K groups' sums into the half's two
     * tiles (two passes), then the tiles' arrival for the cell warps */
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int kg = warp >> 1, wm = warp & 1;
    const int nks = (int)(Kp / 32);   /* k steps of 32 columns */
    /* copy groups: two in training (R h starts on the first half of K while the second lands),
     * one in inference, where the second group's wait cost more than the overlap gave
     * (bench/cuda_int_gru.md, session 31: inference 1.086-1.093 -> 1.071-1.074 ms at large, the
     * training forward 1.267-1.270 -> 1.305-1.311 with one) */
    constexpr int KQ = SAVE ? 2 : 1;
    /* the h copy: thread t takes row t / 8 of the half, 16-byte chunk columns t % 8 + 8 j */
    const int crow = tid >> 3, ccol = (tid & 7) * 16;
    const uint32_t cdst = (uint32_t)__cvta_generic_to_shared(smem) + (uint32_t)(TS_M * rld) + (uint32_t)(crow * rld + ccol);
    const int64_t csrc = (int64_t)crow * Kp + ccol;
    for (int64_t s = 0; s < T; s++) {
      const int cur = (int)(s & 1);
      for (int x = 0; x < 2; x++) {
        int8_t *Hs = hbuf(x);
        int32_t *tile = (int32_t *)Hs;
        /* every block of the group has written the half's rows of step s's h plane (its cells of
         * step s - 1, which also read this buffer's tiles last) */
        if (s > 0) {
          if (tid == 0) {   /* the acquire, then the arrival: the other threads' copies read after it */
            const int32_t want = (int32_t)(s * gridDim.x);
            const int32_t *b = gp.bar + blockIdx.y * 2 + x;
            while (ld_acquire_gpu(b) < want) {
            }
            TG_STAMP(s, x, 0);
            mb_arrive(&mb_free[x]);
          }
          mb_wait(&mb_free[x], (int)((s - 1) & 1));   /* the group's h, and this block's cells have read the tiles */
        }
        if (tid == 0) TG_STAMP(s, x, 1);
        const int8_t *Hg = p.Hp + ((int64_t)cur * Np + n0 + x * TG_HALF) * Kp + csrc;
        const uint32_t Hd = cdst + (uint32_t)(x * hbytes);
#pragma unroll
        for (int q = 0; q < KQ; q++) {
          const int b0 = (q * nks / KQ) * 32, b1 = ((q + 1) * nks / KQ) * 32;   /* the group's bytes of a row */
          for (int b = b0; b + ccol < b1; b += 128) cp_async16_s(Hd + b, Hg + b);
          cp_async_mb_arrive(&mb_full[x * TG_KQ + q]);   /* arrives once this thread's copies so far have landed */
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
        for (int q = 0; q < KQ; q++) {
          mb_wait(&mb_full[x * TG_KQ + q], (int)(s & 1));   /* group q landed for every product thread */
          if (tid == 0 && q == KQ - 1) TG_STAMP(s, x, 2);
          const int k0 = q * nks / KQ, k1 = (q + 1) * nks / KQ;
          for (int ks = k0 + kg; ks < (TG_SKIP == 2 ? k0 : k1); ks += TG_WARPS_K) rh_k32<4>(acc, rs, Rs, Hs, wm * 48, 0, rld, ks * 32, wm == 0);
        }
        if (wm == 0) {   /* the row sums: lanes tq of a row, then one store per K group */
#pragma unroll
          for (int nt = 0; nt < 4; nt++) {
            int32_t v = rs[nt];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (tq == 0) rsum[x][kg][nt * 8 + g] = v;
          }
        }
        mb_arrive(&mb_prod);   /* every product done: the h buffer becomes the tiles; */
        mb_wait(&mb_prod, x);  /* one phase per (step, half): 2 s + x */
        if (tid == 0) TG_STAMP(s, x, 3);
        /* the K groups' sums: groups 0, 1 store into tiles 0, 1, then groups 2, 3 add */
        for (int pass = 0; pass < 2; pass++) {
          if ((kg >> 1) == pass) {
            if (pass == 1) mb_wait(&mb_pair[(kg & 1) * 2 + wm], x);   /* the pair's pass-0 warp stored (phase 2 s + x) */
            int32_t *tl = tile + (kg & 1) * TG_HALF * TS_ALD;
#pragma unroll
            for (int mt = 0; mt < 3; mt++)
#pragma unroll
              for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                  const int row = wm * 48 + mt * 16 + g + 8 * (e >> 1), col = nt * 8 + 2 * tq + (e & 1);
                  if (pass == 0) tl[col * TS_ALD + row] = acc[mt][nt][e];
                  else tl[col * TS_ALD + row] += acc[mt][nt][e];
                }
          }
          if (pass == 0 && (kg >> 1) == 0) mb_arrive(&mb_pair[(kg & 1) * 2 + wm]);
        }
        mb_arrive(&mb_tiles[x]);   /* the half's tiles and row sums are ready */
        if (tid == 0) TG_STAMP(s, x, 4);
      }
    }
    return;
  }

  /* ---- the cell warps: per (step, half), once its tiles are ready, the 32-bit cells of the
   * block's units (thread: unit ct % TS_U, rows ct / TS_U + 8 q of the half), exactly as
   * tc_step_kernel's A32 epilogue (a unit outside the 32-bit bounds runs the general cell and
   * sets the layer's flag); then y, the saved state, hn and the next step's h plane, and the
   * half's arrival. The four rows' cells are one straight-line block (every row computed,
   * stores after), so their dependent chains interleave; SAVE = 0 (inference) drops the saved
   * codes and mask words. */
  constexpr int RPT = TG_HALF / (TG_PT / TS_U);
  const int ct = tid - TG_PT, u = ct % TS_U, rb = ct / TS_U;
  const int64_t i = u0 + u;
  const bool unit_ok = i < H;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H];
  /* R h's per-unit terms and the unit's zero-point terms of W x (cuBLASLt's products; zeros
   * otherwise): registers (inference) or wzs (training) */
  uint32_t rconst_r[3], roff_r[3], wbc[3], wow[3];
#pragma unroll
  for (int k = 0; k < 3; k++) {
    rconst_r[k] = !SAVE && unit_ok ? (uint32_t)p.rconst[k * H + i] : 0;
    roff_r[k] = !SAVE && unit_ok ? (uint32_t)p.roff[k * H + i] : 0;
    wbc[k] = !SAVE && fold && unit_ok ? (uint32_t)gp.wx_bc[k * H + i] : 0;
    wow[k] = !SAVE && fold && unit_ok ? (uint32_t)gp.wx_ow[k * H + i] : 0;
  }
  auto rconst = [&](int k) -> uint32_t { return SAVE ? wzs[(6 + k) * TS_U + u] : rconst_r[k]; };
  auto roff = [&](int k) -> uint32_t { return SAVE ? wzs[(9 + k) * TS_U + u] : roff_r[k]; };
  auto bconst = [&](int k) -> uint32_t { return SAVE ? wzs[k * TS_U + u] : wbc[k]; };
  auto offw = [&](int k) -> uint32_t { return SAVE ? wzs[(3 + k) * TS_U + u] : wow[k]; };
  auto row_of = [&](int x, int q) -> int { return x * TG_HALF + rb + q * (TG_PT / TS_U); };   /* the block's row */
  int32_t php[2][RPT], pwx[RPT][3];
  uint32_t psx[RPT];   /* SX[tn] of the loaded W x rows (fold) */
#pragma unroll
  for (int x = 0; x < 2; x++)
#pragma unroll
    for (int q = 0; q < RPT; q++) {
      const int64_t n = n0 + row_of(x, q);
      php[x][q] = unit_ok && n < N ? h_at(c, 0)[n * H + i] : 0;
    }
  /* W x accumulators of (step s, half x) and their rows' SX[tn] (DRAM at large shapes): loaded two
   * half-steps ahead of their cells (a half-step and its cells to land), requantized one ahead */
  auto load_wx = [&](int64_t s, int x) {
#pragma unroll
    for (int q = 0; q < RPT; q++) {
      const int r = row_of(x, q);
      const int64_t n = n0 + r;
      pwx[q][0] = pwx[q][1] = pwx[q][2] = 0;
      psx[q] = 0;
      if (unit_ok && n < N && s < lens[r]) {
        const int64_t tn = (c.reverse ? lens[r] - 1 - s : s) * N + n;
        const int32_t *wx = c.qwx + tn * gp.wx_ld + i;
        pwx[q][0] = wx[0]; pwx[q][1] = wx[H]; pwx[q][2] = wx[2 * H];
        if (fold) psx[q] = (uint32_t)gp.wx_sx[tn];
      }
    }
  };
  /* y = (h - z) 2^-e in float: h - z (at most 17 bits) and 2^-e (|e| <= 31, QUANT_SPEC.md section 1)
   * are exact floats and so is their product, the value qg_deq's double rounds to */
  const float ysc = (float)ldexp(1.0, -QH.e);
  const bool use32 = Ps[QG_C32_ROWS * TS_U + u] != 0;
  const bool fast = c32_block_fast(Ps, u0, H);
  const qg_qp QWX = c.cell.a[QG_Q_MATMUL_WX];
  /* step 2 of the loaded W x ahead of its cells (int_gru_cell.h, "W x requantized ahead of the
   * cell"): + bconst[j] + offW[j] SX[tn] mod 2^32 (wx_gemm_kernel's acc_out epilogue), then the
   * code and in-range bit as one word (qg_wx_word): the 32-bit cell's requantization, or for a
   * unit outside its bounds requant64's. The cells run it for the next half-step after their
   * half's arrival, where they wait for the next tiles, so it is not on the step's chain
   * (bench/cuda_int_gru.md, session 48: the cells 2.8 -> 1.8 us a half-step at large, the step
   * 9.2 -> 8.7 us). */
  int32_t wxw[RPT][3];
  auto wx_words = [&]() {
    /* the folded accumulator of row q, gate k */
    auto acc = [&](int q, int k) -> int32_t {
      return fold ? (int32_t)((uint32_t)pwx[q][k] + bconst(k) + offw(k) * psx[q]) : pwx[q][k];
    };
    if (use32) {   /* one branch for all 12 (not a predicated 64-bit path per value) */
      const qg_q32 qwx = p.c32.wx;   /* the parameter (constant bank), not c32's copy on the stack */
#pragma unroll
      for (int k = 0; k < 3; k++) {
        const int b = (QG_C32_WX + 4 * k) * TS_U + u;   /* the unit's W x rows of P (staged in Ps) */
        qg_rs32 r;
        r.lim = Ps[b]; r.mul = Ps[b + TS_U]; r.kr = Ps[b + 2 * TS_U]; r.bias = Ps[b + 3 * TS_U];
#pragma unroll
        for (int q = 0; q < RPT; q++) {
          uint32_t m;
          const int32_t cc = qg_cell32_wx_code(acc(q, k), r, qwx, &m);
          wxw[q][k] = qg_wx_word(cc, m);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 3; k++)
#pragma unroll
        for (int q = 0; q < RPT; q++) {
          int m;
          const int32_t cc = (int32_t)(qg_requant64(acc(q, k), p.eW[k * H + i] + p.eX, QWX, &m) - QWX.z);
          wxw[q][k] = qg_wx_word(cc, (uint32_t)m);
        }
    }
  };
  load_wx(0, 0);
  wx_words();
  load_wx(0, 1);

  for (int64_t s = 0; s < T; s++) {
    const int nxt = (int)(s & 1) ^ 1;
    int32_t *hsave = SAVE ? c.hq + (s + 1) * N * H : NULL;
    for (int x = 0; x < 2; x++) {
      const int32_t *tile = (const int32_t *)hbuf(x);
      mb_wait(&mb_tiles[x], (int)(s & 1));   /* the half's tiles of step s */
      if (ct == 0) TG_STAMP(s, x, 5);
      int32_t cwx[RPT][3];   /* the half's W x words */
#pragma unroll
      for (int q = 0; q < RPT; q++)
#pragma unroll
        for (int k = 0; k < 3; k++) cwx[q][k] = wxw[q][k];
      if (TG_SKIP == 3) {
      } else if (use32) {
        qg_cell32_out o[RPT];
        /* the four rows' cells, with the requantizations' clamps (F = 0) or without (F = 1: every
         * requantization of the block's units has k >= 0, the same codes; qg_rs32) */
        auto cells = [&](auto F) {
#pragma unroll
          for (int q = 0; q < RPT; q++) {
            const int r = rb + q * (TG_PT / TS_U);
            uint32_t sh = 0;
#pragma unroll
            for (int k = 0; k < TG_WARPS_K; k++) sh += (uint32_t)rsum[x][k][r];
            uint32_t a[3];
#pragma unroll
            for (int k = 0; k < 3; k++)
              a[k] = (uint32_t)tile[r * TS_ALD + k * TS_U + u] + (uint32_t)tile[TG_HALF * TS_ALD + r * TS_ALD + k * TS_U + u] +
                     rconst(k) + roff(k) * sh;
            qg_cell32_forward_w(&c32, u, cwx[q][0], cwx[q][1], cwx[q][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], php[x][q], &o[q],
                                decltype(F)::value);
          }
        };
        if (fast) cells(std::integral_constant<int, 1>());
        else cells(std::integral_constant<int, 0>());
#pragma unroll
        for (int q = 0; q < RPT; q++) {
          const int r = row_of(x, q);
          const int64_t n = n0 + r;
          if (!unit_ok || n >= N) continue;
          if (s >= lens[r]) {   /* padded step (t = s): the state stays, y = 0 */
            if (SAVE) zero_cell(c, s, n, i);
            c.y[(s * N + n) * c.Hy + c.y_offset + i] = 0.0f;
          } else {
            const int64_t t = c.reverse ? lens[r] - 1 - s : s;
            c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)(o[q].h - QH.z) * ysc;
            if (SAVE) {   /* narrow (the 32-bit mode implies it): three aligned words */
              uint32_t wd[3];
              qg_cell_narrow_words(&c.cell, o[q].zpre, o[q].rpre, o[q].gpre, o[q].rhb, o[q].mask, wd);
              uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
              d[0] = wd[0]; d[1] = wd[1]; d[2] = wd[2];
            }
            php[x][q] = o[q].h;
          }
        }
      } else {   /* a unit outside the 32-bit bounds: the general cell, as tc_step_kernel's */
#pragma unroll
        for (int q = 0; q < RPT; q++) {
          const int r = row_of(x, q), rh = rb + q * (TG_PT / TS_U);
          const int64_t n = n0 + r;
          if (!unit_ok || n >= N) continue;
          const int32_t hp = php[x][q];
          int32_t hnew = hp;
          if (s >= lens[r]) {
            pad_cell(c, s, n, i, N);
          } else {
            const int64_t t = c.reverse ? lens[r] - 1 - s : s;
            uint32_t sh = 0;
#pragma unroll
            for (int k = 0; k < TG_WARPS_K; k++) sh += (uint32_t)rsum[x][k][rh];
            const qg_qp QRH = c.cell.a[QG_Q_MATMUL_RH];
            qg_cell_in in;
            fill_bias(c, i, &in);
            in.mask = 0;
#pragma unroll
            for (int k = 0; k < 3; k++) {
              const uint32_t a = (uint32_t)tile[rh * TS_ALD + k * TS_U + u] +
                                 (uint32_t)tile[TG_HALF * TS_ALD + rh * TS_ALD + k * TS_U + u] + rconst(k) + roff(k) * sh;
              int m;
              in.rh[k] = qg_requant64((int64_t)(int32_t)a, c.eR[k * H + i] + QH.e, QRH, &m);
              in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
            }
#pragma unroll
            for (int k = 0; k < 3; k++) {
              in.wx[k] = qg_wx_word_code(cwx[q][k]) + QWX.z;   /* wx_words: requant64's code and bit */
              in.mask |= qg_wx_word_bit(cwx[q][k]) << (QG_MB_WX_Z + k);
            }
            in.hprev = hp;
            hnew = (int32_t)run_cell<WIDE, 0>(&c.cell, c, s, t, n, i, &in);
          }
          php[x][q] = hnew;
        }
      }
      if (ct == 0) TG_STAMP(s, x, 6);
      if (s + 1 < T) mb_arrive(&mb_free[x]);   /* the half's tiles and row sums are read */
#pragma unroll
      for (int q = 0; q < RPT; q++) {   /* the next step's h: saved codes, hn, the int8 plane */
        const int64_t n = n0 + row_of(x, q);
        if (!unit_ok || n >= N) continue;
        if (SAVE) hsave[n * H + i] = php[x][q];
        int8_t p0, p1;
        split_planes(php[x][q], p.baseH, 1, &p0, &p1);
        p.Hp[((int64_t)nxt * Np + n) * Kp + i] = p0;
      }
      if (s + 1 < T) {
        bar_sync_named(TG_BAR_C, TG_PT);   /* every cell of the half written (it orders global stores only) */
        if (ct == 0) red_release_gpu(gp.bar + blockIdx.y * 2 + x, 1);   /* after the barrier: every cell thread's stores */
        if (ct == 0) TG_STAMP(s, x, 7);
      }
      if (x == 0 || s + 1 < T) wx_words();   /* the next half-step's, while its tiles are made */
      if (ct == 0) TG_STAMP(s, x, 8);
      if (s + 1 < T) load_wx(s + 1, x);        /* the one after it */
    }
  }
  if (c.hn)   /* the last step's h */
#pragma unroll
    for (int x = 0; x < 2; x++)
#pragma unroll
      for (int q = 0; q < RPT; q++) {
        const int64_t n = n0 + row_of(x, q);
        if (unit_ok && n < N) c.hn[n * H + i] = (float)qg_deq(php[x][q], QH);
      }
}

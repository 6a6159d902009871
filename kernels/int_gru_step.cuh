/*
 * int_gru_step.cuh: the integer GRU forward's per-step recurrence on the tensor cores (one launch
 * per step), for the shapes the persistent kernels cannot hold: tc_step_kernel, R h on the int8
 * tensor cores (mma.sync), R's planes read from L2 every step, with cell32_units_kernel (the
 * 32-bit cell's per-unit rows, built once per forward). Operands above 16 bits take
 * int_gru_fallback.cuh instead.
 * Included once by kernels/int_gru.cu, after rec_common and its helpers; int_gru_grid.cuh (the
 * GPU-wide recurrence) follows it and shares tc_step_kernel's tiles and parameters.
 */

/* ---- tensor-core step: one kernel per step where the persistent kernel cannot hold R ----
 * Block (TS_THREADS threads): TS_U units (all three gates: the TS_M rows k H + u0 + u of R, gate
 * major) x TS_N batch rows. R h from the int8 planes of R ([PR][3H][Kp], read from L2 every step)
 * and of the step's h ([PH][Np][Kp], double-buffered: step s reads buffer s & 1 and writes the
 * other) on mma.sync m16n8k32, the tiles of each TS_BK columns staged by cp.async through
 * TS_STAGES buffers (three tiles in flight: with one, the loop waits on L2 latency every tile).
 * Warps: two K groups (the two 32-column halves of each staged tile) of 8 warps, each 48 rows x
 * 16 batch rows. The per-row sums of the h planes (the zero-point term offR[j] SH[n]) come from
 * the same B fragments (__dp4a, warps of the first 48 rows). The two K groups' sums meet in
 * shared memory (int32 for one plane pair, else int64 with the plane scales), where each thread
 * then takes the three gates of its unit for TS_N / 16 batch rows: the exact sum
 *   R h = sum_ab sA sB (PR_a . PH_b) + rconst[j] + offR[j] SH[n]     (see int_gru.cu's header)
 * requantized to matmul.Rh, the shared cell, y, the saved state, hn, and the next step's h codes
 * and planes. Every plane product is below 2^14 Kp < 2^31 (H < 2^17): exact. */
enum { TS_U = 32, TS_M = 3 * TS_U, TS_N = 64, TS_BK = 64, TS_LD = TS_BK + 16, TS_THREADS = 512, TS_ALD = TS_M + 4,
       TS_STAGE = (TS_M + TS_N) * TS_LD, TS_STAGES = 4 };

struct ts_params {
  rec_common c;
  const int8_t *Rp;                /* [PR][3H][Kp] */
  const int64_t *rconst, *roff;    /* [3H] */
  int8_t *Hp;                      /* [2][PH][Np][Kp]; rows >= N and columns >= H stay 0 */
  int64_t Np, Kp;
  int PR, PH;
  int64_t baseH;                   /* output.h planes: r = q - baseH */
  /* the 32-bit mode (A32): the per-tensor part of the 32-bit cell, the per-unit rows
   * [QG_C32_ROWS + 1][H] (cell32_units_kernel; the last row: 1 where the unit is within the
   * bounds), W's exponents and input.x's (the general cell's requantization of W x) */
  qg_cell32 c32;
  const int32_t *P32;
  const int32_t *eW;
  int eX;
};

/* Shared memory of the tensor-core step: the staging buffers, later the summed tile. */
static size_t ts_smem(int single) {
  const size_t stage = (size_t)TS_STAGES * TS_STAGE, tile = (size_t)TS_N * TS_ALD * (single ? 4 : 8);
  return stage > tile ? stage : tile;
}


/* The rows of the 32-bit cell of every unit, once per forward for the tensor-core step's 32-bit
 * mode: P [QG_C32_ROWS + 1][H], the last row 1 where qg_cell32_unit accepts the unit, 2 where
 * besides every requantization of the unit and of the layer (tensor_fast: qg_cell32's fast) has
 * k >= 0 (the cell may run with `fast` set, qg_rs32); a unit outside the bounds sets *flag (the
 * general cell runs for it, qg_int_gru_cell_path says 64). */
__global__ void cell32_units_kernel(const __grid_constant__ rec_common c, const int32_t *eW, int32_t *P, int32_t *flag, int tensor_fast) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, H = c.H;
  if (i >= H) return;
  int ok = cell32_unit_rows(P, H, i, &c.cell, H, i, eW, c.eR, c.bxc, c.bxz, c.bxe, c.brc, c.brz, c.bre);
  if (ok && tensor_fast && qg_cell32_unit_fast(P, H, i)) ok = 2;
  /* a unit outside the bounds: qg_cell32_unit returned before writing all its rows; tc_step_kernel
   * still stages every row of its block's units (and runs the general cell for this one), so the
   * rest is defined here (compute-sanitizer initcheck: uninitialized workspace reads otherwise) */
  if (!ok)
    for (int r = 0; r < QG_C32_ROWS; r++) P[r * H + i] = 0;
  P[QG_C32_ROWS * H + i] = ok;
  if (!ok) *flag = 1;
}

/* Whether every unit of a block (units u0 .. u0 + TS_U - 1 of H, their flag row of P staged in
 * Ps [QG_C32_ROWS + 1][TS_U]) takes the cell without clamps (cell32_units_kernel's 2). */
__device__ __forceinline__ bool c32_block_fast(const int32_t *Ps, int64_t u0, int64_t H) {
  bool fast = true;
  for (int uu = 0; uu < TS_U; uu++) fast = fast && (u0 + uu >= H || Ps[QG_C32_ROWS * TS_U + uu] == 2);
  return fast;
}

/* SINGLE: one plane of R and of h (operands of <= 8 bits): int32 sums, no plane loops.
 * A32: W x arrives as int32 accumulators (wx_gemm_kernel with acc_out) and R h is taken mod 2^32
 * (exact: the host bounds every accumulator below 2^29, as in the persistent kernel's 32-bit
 * mode); the block's units' rows of the 32-bit cell (p.P32) are staged in shared memory, and
 * each unit within the bounds runs qg_cell32_forward, the others the general cell. */
template <int WIDE, int OBS, int SINGLE, int A32>
__global__ void __launch_bounds__(TS_THREADS) tc_step_kernel(const __grid_constant__ ts_params p, int64_t s) {
  typedef typename std::conditional<SINGLE, int32_t, int64_t>::type tile_t;
  typedef typename std::conditional<A32, uint32_t, int64_t>::type sum_t;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t rsum[2][2][TS_N];   /* [K group][h plane][batch row]: sums of the h planes */
  __shared__ int32_t Ps[A32 ? (QG_C32_ROWS + 1) * TS_U : 1];   /* A32: [QG_C32_ROWS + 1][TS_U] */
  const rec_common &c = p.c;
  const int64_t H = c.H, H3 = 3 * H, N = c.N, Kp = p.Kp, Np = p.Np;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kg = warp >> 3, wm = warp & 1, wn = (warp >> 1) & 3;   /* K group; warp tile rows wm 48, cols wn 16 */
  const int64_t u0 = (int64_t)blockIdx.x * TS_U, n0 = (int64_t)blockIdx.y * TS_N;
  const int cur = (int)(s & 1), nxt = cur ^ 1;
  const int PR = SINGLE ? 1 : p.PR, PH = SINGLE ? 1 : p.PH;
  int8_t *stage = (int8_t *)smem;
  tile_t *tile = (tile_t *)smem;   /* after the K loops: [TS_N][TS_ALD] */
  if (A32)   /* read after the K loop's barriers */
    for (int e = tid; e < (QG_C32_ROWS + 1) * TS_U; e += TS_THREADS) {
      const int r = e / TS_U, uu = e % TS_U;
      Ps[e] = u0 + uu < H ? p.P32[r * H + u0 + uu] : 0;
    }
  /* A32: this thread's cells' inputs that do not depend on R h (unit tid % TS_U, batch rows
   * tid / TS_U + 16 q: the W x accumulators, from DRAM at large shapes, and the previous codes),
   * loaded before the products so that their latency hides behind them */
  constexpr int TS_RPT = TS_N / (TS_THREADS / TS_U), TS_PRE = A32 ? TS_RPT : 1;
  int32_t pwx[TS_PRE][3], php[TS_PRE];
  if (A32) {
    const int64_t i = u0 + tid % TS_U;
#pragma unroll
    for (int q = 0; q < TS_PRE; q++) {
      const int64_t n = n0 + tid / TS_U + q * (TS_THREADS / TS_U);
      pwx[q][0] = pwx[q][1] = pwx[q][2] = php[q] = 0;
      if (i < H && n < N) {
        const int64_t Ln = length_at(c.L, n, c.T);
        php[q] = h_at(c, s)[n * H + i];
        if (s < Ln) {
          const int32_t *wx = c.qwx + ((c.reverse ? Ln - 1 - s : s) * N + n) * 3 * H + i;
          pwx[q][0] = wx[0]; pwx[q][1] = wx[H]; pwx[q][2] = wx[2 * H];
        }
      }
    }
  }

  /* this thread's 16-byte chunks of each staged tile: chunk tid, and tid + TS_THREADS where it
   * exists (rows 0..TS_M-1 of R, then TS_N rows of h) */
  const int nchunks = (TS_M + TS_N) * (TS_BK / 16);
  int64_t src_row[2];   /* byte offset of the chunk's row, plane 0, column 0 (R rows: -1 = zero fill) */
  int dst[2];
  bool isA[2], has[2];
  for (int q = 0; q < 2; q++) {
    const int ch = tid + q * TS_THREADS, row = ch / (TS_BK / 16), cv = ch % (TS_BK / 16);
    has[q] = ch < nchunks;
    isA[q] = row < TS_M;
    dst[q] = row * TS_LD + cv * 16;
    if (isA[q]) {
      const int gt = row / TS_U, u = row % TS_U;
      src_row[q] = u0 + u < H ? (gt * H + u0 + u) * Kp + cv * 16 : -1;
    } else {
      src_row[q] = (n0 + row - TS_M) * Kp + cv * 16;
    }
  }

  int32_t acc[3][2][4];
  int64_t wacc[3][2][4];
  if (!SINGLE) {
#pragma unroll
    for (int a = 0; a < 3; a++)
#pragma unroll
      for (int b = 0; b < 2; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) wacc[a][b][e] = 0;
  }
  const int nk = (int)(Kp / TS_BK);
  for (int pa = 0; pa < PR; pa++)
    for (int pb = 0; pb < PH; pb++) {
#pragma unroll
      for (int a = 0; a < 3; a++)
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[a][b][e] = 0;
      int32_t rs[2] = {0, 0};
      const int8_t *Ab = p.Rp + (int64_t)pa * H3 * Kp, *Bb = p.Hp + ((int64_t)cur * PH + pb) * Np * Kp;
      auto load = [&](int kt, int buf) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
          if (!has[q]) continue;
          const int8_t *src = isA[q] ? (src_row[q] >= 0 ? Ab + src_row[q] : Ab) : Bb + src_row[q];
          const int bytes = isA[q] && src_row[q] < 0 ? 0 : 16;
          cp_async16_zfill(stage + buf * TS_STAGE + dst[q], src + (bytes ? (int64_t)kt * TS_BK : 0), bytes);
        }
      };
      /* TS_STAGES buffers: tiles kt + 1 .. kt + TS_STAGES - 1 in flight while tile kt is used */
#pragma unroll
      for (int q = 0; q < TS_STAGES - 1; q++) {
        if (q < nk) load(q, q);
        cp_async_commit();
      }
      for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<TS_STAGES - 2>();
        __syncthreads();   /* tile kt landed for every thread; tile kt - 1's buffer is free */
        if (kt + TS_STAGES - 1 < nk) load(kt + TS_STAGES - 1, (kt + TS_STAGES - 1) % TS_STAGES);
        cp_async_commit();
        const int8_t *As = stage + (kt % TS_STAGES) * TS_STAGE, *Bs = As + TS_M * TS_LD;
        rh_k32<2>(acc, rs, As, Bs, wm * 48, wn * 16, TS_LD, kg * 32, pa == 0 && wm == 0);
      }
      cp_async_wait<0>();
      __syncthreads();   /* every buffer free for the next plane pair or the tile */
      if (pa == 0 && wm == 0) {   /* the row sums of this h plane: lanes tq of a row, then one store */
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          int32_t v = rs[nt];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          if (tq == 0) rsum[kg][pb][wn * 16 + nt * 8 + g] = v;
        }
      }
      if (!SINGLE) {
        const int64_t sc = plane_scale(PR, pa) * plane_scale(PH, pb);
#pragma unroll
        for (int a = 0; a < 3; a++)
#pragma unroll
          for (int b = 0; b < 2; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) wacc[a][b][e] += sc * acc[a][b][e];
      }
    }
  /* the K groups' sums into the tile [batch row][gate row] (the staging buffers are free: the
   * last K step ended with a barrier) */
  for (int pass = 1; pass >= 0; pass--) {
    if (kg == pass) {
#pragma unroll
      for (int mt = 0; mt < 3; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int row = wm * 48 + mt * 16 + g + 8 * (e >> 1), col = wn * 16 + nt * 8 + 2 * tq + (e & 1);
            const tile_t v = SINGLE ? (tile_t)acc[mt][nt][e] : (tile_t)wacc[mt][nt][e];
            if (pass) tile[col * TS_ALD + row] = v;
            else tile[col * TS_ALD + row] += v;
          }
    }
    __syncthreads();
  }

  /* the cells: unit u of the tile, batch rows rb, rb + 16, ... */
  const int u = tid % TS_U, rb = tid / TS_U;
  const int64_t i = u0 + u;
  if (i >= H) return;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H], QRH = c.cell.a[QG_Q_MATMUL_RH];
  qg_cell_in base_in;
  fill_bias(c, i, &base_in);
  sum_t rconst[3], roff[3];
  int srh[3];
#pragma unroll
  for (int k = 0; k < 3; k++) {
    const int64_t j = k * H + i;
    rconst[k] = (sum_t)p.rconst[j];
    roff[k] = (sum_t)p.roff[j];
    srh[k] = c.eR[j] + QH.e;
  }
  qg_cell32 c32 = p.c32;   /* A32: this block's rows in shared memory, unit u */
  c32.P = Ps;
  c32.H = TS_U;
  const bool use32 = A32 ? Ps[QG_C32_ROWS * TS_U + u] != 0 : false;
  const bool fast = A32 && c32_block_fast(Ps, u0, H);
  const int32_t *hprev_codes = h_at(c, s);
  int32_t *hnext = h_at(c, s + 1);
  /* rows rb, rb + 16, ...; A32: a constant trip count, unrolled (the prefetched inputs stay in registers) */
#pragma unroll TS_PRE
  for (int rq = 0, r = rb; A32 ? rq < TS_PRE : r < TS_N; rq++, r += TS_THREADS / TS_U) {
    const int64_t n = n0 + r;
    if (n >= N) break;
    const int64_t Ln = length_at(c.L, n, c.T), hp = A32 ? php[rq] : hprev_codes[n * H + i];
    int64_t hnew = hp;
    if (s >= Ln) {   /* padded step (t = s): the state stays, y = 0 */
      pad_cell(c, s, n, i, N);
    } else {
      const int64_t t = c.reverse ? Ln - 1 - s : s;
      sum_t sh = 0;
      for (int q = 0; q < 2; q++)
        for (int pb = 0; pb < PH; pb++) sh += (sum_t)plane_scale(PH, pb) * (sum_t)rsum[q][pb][r];
      sum_t a[3];
#pragma unroll
      for (int k = 0; k < 3; k++) a[k] = (sum_t)tile[r * TS_ALD + k * TS_U + u] + rconst[k] + roff[k] * sh;
      if (use32) {
        qg_cell32_out o;
        if (fast)
          qg_cell32_forward(&c32, u, pwx[rq][0], pwx[rq][1], pwx[rq][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hp, &o, 1);
        else
          qg_cell32_forward(&c32, u, pwx[rq][0], pwx[rq][1], pwx[rq][2], (int32_t)a[0], (int32_t)a[1], (int32_t)a[2], (int32_t)hp, &o, 0);
        hnew = o.h;
        c.y[(t * N + n) * c.Hy + c.y_offset + i] = (float)((double)(o.h - QH.z) * ldexp(1.0, -QH.e));
        if (c.cell_out) {   /* narrow (A32 implies it): three aligned words */
          uint32_t w[3];
          qg_cell_narrow_words(&c.cell, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, w);
          uint32_t *d = (uint32_t *)(c.cell_out + ((s * N + n) * H + i) * 12);
          d[0] = w[0]; d[1] = w[1]; d[2] = w[2];
        }
      } else {
        qg_cell_in in = base_in;
        in.mask = 0;
        cell_rh<A32, OBS>(c, a, srh, QRH, in);
        if (A32) {   /* a unit outside the 32-bit bounds: W x requantized here, as wx_gemm_kernel does */
#pragma unroll
          for (int k = 0; k < 3; k++) {
            int m;
            in.wx[k] = qg_requant64(pwx[rq][k], p.eW[k * H + i] + p.eX, c.cell.a[QG_Q_MATMUL_WX], &m);
            in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
          }
        } else {
          cell_wx(c, t * N + n, i, &in);
        }
        in.hprev = hp;
        hnew = run_cell<WIDE, OBS>(&c.cell, c, s, t, n, i, &in);
      }
    }
    hnext[n * H + i] = (int32_t)hnew;
    if (s == c.T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
    int8_t p0, p1;
    split_planes(hnew, p.baseH, PH, &p0, &p1);
    int8_t *hp_next = p.Hp + (int64_t)nxt * PH * Np * Kp + n * Kp + i;
    hp_next[0] = p0;
    if (PH == 2) hp_next[Np * Kp] = p1;
  }
}

/*
 * int_gru_small.cu: the integer GRU recurrence for small H (kernels/int_gru.cu decides when it
 * runs and prepares its operands; int_gru_small.cuh is the interface). It takes the persistent
 * kernel's 32-bit mode (W x as int32 accumulators, R h mod 2^32, the 32-bit cell of
 * core/int_gru_cell.h) for single-plane R and h (<= 8-bit operands), when every unit of the layer
 * fits one CTA: no cluster, no exchange of h between CTAs, one block barrier per step.
 *
 * Layout: CTA blockIdx.x owns batch rows [NB x, NB x + NB) and every hidden unit. Unit mu has S
 * consecutive lanes (S a power of two dividing 32, S >= NB); lane ms holds, in registers, words
 * [ms KW, ms KW + KW) (4 int8 each) of R's three gate rows g H + mu (3 KW registers). A step:
 *   1. each lane takes the dot products of its words with the same words of each of the NB rows'
 *      h plane (shared memory, double-buffered, 16-byte loads that lanes of other units share)
 *      on __dp4a, and where some row of R has a zero-point term (roff != 0) also the row's sum of
 *      the h plane bytes (__dp4a with 0x01010101);
 *   2. a butterfly of shuffles over the S lanes gives each lane the full sums;
 *   3. lane b of the unit (b < NB) runs row b's cell: R h = dot + rconst + roff sh (uint32, exact:
 *      the host bounds every accumulator below 2^29), qg_cell32_forward with the unit's rows of
 *      the 32-bit cell in registers (built once per launch), the W x accumulators of the step
 *      prefetched ISK_RING - 1 steps ahead by cp.async into a per-thread ring; it writes y, the
 *      saved state (hq, cell_out) or the last state, hn, and its new h byte into the next buffer;
 *   4. one __syncthreads.
 * A variant for one row per CTA and one lane per unit (int_gru_small_ws_kernel, below: chosen by
 * auto where it applies, forced by storage 5) runs the cell over two roles of warps.
 * Where every unit of the CTA and the layer allow it (qg_cell32_unit_fast, qg_cell32.fast: every
 * requantization shifts right), the loop runs the cell without the requantizations' clamps: a
 * second instance of the loop, chosen once per CTA (the same codes; ptxas: no spills with both).
 * A unit outside the 32-bit bounds (its bias terms) makes its CTA run the general loop (the same
 * products, then qg_cell_forward on the same accumulators, as the persistent kernel) and raises
 * the layer's c32_flag; padded steps, lengths, reverse and h0 as in int_gru.cu's header.
 * Instances: NB rows x KW words in isk_kernel_of (H <= 4 S KW, S H <= ISK_MAX_THREADS = 256, so
 * H <= 128: up to 64 with 4 S KW registers of R for one row). The shape (isk_choose, a model
 * fitted on an H200 over forced shapes, bench/cuda_int_gru.md): the fewest rows per CTA with at
 * most two CTAs per multiprocessor (NB = 1 up to 264 rows), then the fewest lanes per unit, where
 * the whole grid is resident at once; where no such shape exists (more rows than one wave holds),
 * the shape with the fewest threads over the grid, in as many waves as it takes (rows are
 * independent recurrences, so a wave simply follows the one before): at T100 C40 on an H100, H 128
 * with N 512 / 1024 0.32 / 0.63 ms, against the cluster kernel's 0.60 / 1.16 that auto took
 * before and its best forced shape's 0.48 / 0.91; H 64, N 1024: 0.30 against 0.58 (session 42).
 * Built with --fmad=false as int_gru.cu (CMakeLists.txt).
 */
#include "int_gru_common.cuh"
#include "int_gru_small.cuh"
#include "ptx.cuh"   /* cp.async, bar.sync */

#include <string.h>
#include <type_traits>   /* std::integral_constant: the cell variants of the loops */

/* output.h codes of step s (before the step: the state after s steps), as int_gru.cu's h_at. */
__device__ __forceinline__ int32_t *isk_h_at(const isk_params &p, int64_t s) {
  return p.hq ? p.hq + s * p.N * p.H : p.hping + (s & 1) * p.N * p.H;
}

/* The general loop, for a CTA with a unit outside the 32-bit bounds (rare: out of line, one copy
 * for every instance, no lane split): the thread of (unit mu, row b = lane ms) takes its three
 * R h sums over all of R's row from global memory and its row's h plane in shared memory (hb, as
 * the kernel's, h0's plane in buffer 0), requantizes W x and R h as wx_gemm_kernel and the
 * persistent kernel do, runs qg_cell_forward and writes what the 32-bit loop writes. lz, lr, lg:
 * the activation tables where the kernel keeps them. */
__device__ __noinline__ void isk_general_loop(const isk_params &p, int NB, int8_t *hb, const int32_t *lz, const int32_t *lr,
                                              const int32_t *lg) {
  const int64_t H = p.H, N = p.N, T = p.T, Kp = p.Kp;
  const int S = p.S, ms = threadIdx.x & (S - 1), mu = threadIdx.x / S, b = ms;
  const int64_t n = (int64_t)blockIdx.x * NB + b, i = mu;
  const bool active = b < NB && mu < H && n < N;
  qg_cell_q cq = p.cell;
  cq.lut[0] = lz; cq.lut[1] = lr; cq.lut[2] = lg;
  const qg_cell_q *q = &cq;
  const qg_qp QH = q->a[QG_Q_OUTPUT_H];
  int64_t hprev = active ? isk_h_at(p, 0)[n * H + i] : 0;
  const int64_t Ln = active ? length_at(p.L, n, T) : 0;
  for (int64_t s = 0; s < T; s++) {
    if (active) {
      const int8_t *hr = hb + ((s & 1) * NB + b) * Kp;
      int64_t hnew = hprev;
      if (s >= Ln) {   /* padded step (t = s): the state stays, y = 0 */
        if (p.cell_out) {
          uint32_t *z = (uint32_t *)(p.cell_out + ((s * N + n) * H + i) * 12);
          z[0] = 0; z[1] = 0; z[2] = 0;
        }
        p.y[(s * N + n) * p.Hy + p.y_offset + i] = 0.0f;
      } else {
        const int64_t t = p.reverse ? Ln - 1 - s : s;
        const int32_t *wx = p.qwx + (t * N + n) * 3 * H + i;
        int32_t sh = 0;
        for (int64_t k = 0; k < Kp; k++) sh += hr[k];
        qg_cell_in in;
        in.mask = 0;
        for (int k = 0; k < 3; k++) {
          const int64_t j = k * H + i;
          const int8_t *rr = p.Rp + j * Kp;
          int32_t dot = 0;
          for (int64_t kk = 0; kk < Kp; kk++) dot += (int32_t)rr[kk] * (int32_t)hr[kk];
          const int32_t a = (int32_t)((uint32_t)dot + (uint32_t)p.rconst[j] + (uint32_t)p.roff[j] * (uint32_t)sh);
          in.bx[k] = (int64_t)p.bxc[j] - p.bxz[j];
          in.br[k] = (int64_t)p.brc[j] - p.brz[j];
          in.ebx[k] = p.bxe[j];
          in.ebr[k] = p.bre[j];
          int m;
          in.wx[k] = qg_requant64(wx[k * H], p.eW[j] + p.eX, q->a[QG_Q_MATMUL_WX], &m);
          in.mask |= (uint32_t)m << (QG_MB_WX_Z + k);
          in.rh[k] = qg_requant64(a, p.eR[j] + QH.e, q->a[QG_Q_MATMUL_RH], &m);
          in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
        }
        in.hprev = hprev;
        qg_cell_out out;
        qg_cell_reals re = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        qg_cell_forward(q, &in, &out, p.wide, 0, &re);
        hnew = out.h;
        p.y[(t * N + n) * p.Hy + p.y_offset + i] = (float)((double)(out.h - QH.z) * ldexp(1.0, -QH.e));
        if (p.cell_out) qg_cell_pack(p.cell_out + ((s * N + n) * H + i) * qg_cell_bytes(q->narrow), q, &out);
      }
      if (p.hq) p.hq[((s + 1) * N + n) * H + i] = (int32_t)hnew;
      else if (s == T - 1) isk_h_at(p, T)[n * H + i] = (int32_t)hnew;
      if (s == T - 1 && p.hn) p.hn[n * H + i] = (float)qg_deq(hnew, QH);
      hb[(((s + 1) & 1) * NB + b) * Kp + mu] = (int8_t)(hnew - p.baseH);
      hprev = hnew;
    }
    __syncthreads();
  }
}

/* A lane's KW words of a row's h codes (4-byte words of int8 codes) from shared memory, 16 (or,
 * for KW = 2, 8) bytes a load. */
template <int KW>
__device__ __forceinline__ void isk_load_h(const int8_t *hr, int *hw) {
  if (KW >= 4) {
#pragma unroll
    for (int w = 0; w < KW; w += 4) {
      const int4 v = *(const int4 *)(hr + 4 * w);
      hw[w] = v.x; hw[w + 1] = v.y; hw[w + 2] = v.z; hw[w + 3] = v.w;
    }
  } else {
    const int2 v = *(const int2 *)hr;
    hw[0] = v.x; hw[KW - 1] = v.y;
  }
}

template <int NB, int KW>
__global__ void __launch_bounds__(ISK_MAX_THREADS, 1) int_gru_small_kernel(const __grid_constant__ isk_params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t H = p.H, N = p.N, T = p.T;
  const int S = p.S, Hp = 4 * S * KW;   /* bytes of an h row (= Kp) */
  const int tid = threadIdx.x, nthr = blockDim.x;
  const int ms = tid & (S - 1), mu = tid / S;
  const int64_t n0 = (int64_t)blockIdx.x * NB;
  int8_t *hb = (int8_t *)smem;                          /* [2][NB][Hp] */
  int32_t *ring = (int32_t *)(smem + p.off_ring);       /* [ISK_RING][NB H][3] W x accumulators */
  int32_t *Ps = (int32_t *)(smem + p.off_P);            /* [QG_C32_ROWS][H] */

  /* R: words ms KW .. ms KW + KW - 1 of rows g H + mu (zero past H and for lanes past the units) */
  uint32_t Rr[3][KW];
#pragma unroll
  for (int g = 0; g < 3; g++)
#pragma unroll
    for (int w = 0; w < KW; w++)
      Rr[g][w] = mu < H ? ((const uint32_t *)(p.Rp + ((int64_t)g * H + mu) * p.Kp))[ms * KW + w] : 0u;
  for (int e = tid; e < 2 * NB * Hp / 16; e += nthr) ((int4 *)hb)[e] = make_int4(0, 0, 0, 0);
  qg_cell_q q = p.cell;
  if (p.lut_smem) cell_luts_to_smem(&q, (int32_t *)(smem + p.off_lut), tid, nthr);
  __syncthreads();
  /* h0's plane (buffer 0) */
  const int32_t *hq0 = isk_h_at(p, 0);
  for (int64_t e = tid; e < NB * H; e += nthr) {
    const int64_t b = e / H, k = e % H, n = n0 + b;
    if (n < N) hb[b * Hp + k] = (int8_t)(hq0[n * H + k] - p.baseH);
  }
  /* this thread's cell: unit mu, row b = ms */
  const int b = ms;
  const int64_t n = n0 + b, i = mu;
  const bool active = b < NB && mu < H && n < N;
  const qg_qp QH = q.a[QG_Q_OUTPUT_H];
  uint32_t rconst[3] = {0, 0, 0}, roff[3] = {0, 0, 0};
  int64_t hprev = 0, Ln = 0;
  if (active) {
    for (int k = 0; k < 3; k++) {
      rconst[k] = (uint32_t)p.rconst[k * H + i];
      roff[k] = (uint32_t)p.roff[k * H + i];
    }
    hprev = hq0[n * H + i];
    Ln = length_at(p.L, n, T);
  }
  /* the rows of the 32-bit cell of every unit (lane 0 of each unit), then this thread's in registers */
  int use32 = 1, fast_unit = 1;
  if (ms == 0 && mu < H) {
    use32 = cell32_unit_rows(Ps, H, i, &q, H, i, p.eW, p.eR, p.bxc, p.bxz, p.bxe, p.brc, p.brz, p.bre);
    if (!use32) *p.c32_flag = 1;
    fast_unit = use32 && qg_cell32_unit_fast(Ps, H, i);
  }
  use32 = __syncthreads_and(use32);   /* also publishes h0's plane and Ps */
  if (!use32) {
    isk_general_loop(p, NB, hb, q.lut[0], q.lut[1], q.lut[2]);
    return;
  }
  /* the cell without the requantizations' clamps where every unit allows it (qg_rs32) */
  const bool fast = __syncthreads_and(p.c32.fast && fast_unit);
  int32_t P[QG_C32_ROWS];
#pragma unroll
  for (int r = 0; r < QG_C32_ROWS; r++) P[r] = active ? Ps[r * H + i] : 0;
  qg_cell32 c32 = p.c32;
  c32.P = P;
  c32.H = 1;
#pragma unroll
  for (int k = 0; k < 3; k++) c32.lut[k] = q.lut[k];
  const double yscale = ldexp(1.0, -QH.e);

  /* the W x prefetch ring: this thread's slot (b H + mu) of each of ISK_RING steps. Offsets in
   * the loop are 32-bit (isk_choose checks that T N max(3H, 12 H, Hy) < 2^31). */
  const int Hi = (int)H, Ni = (int)N, Ti = (int)T, Li = (int)Ln, NBH = NB * Hi, slot = b * Hi + mu;
  const int wx_row = Ni * 3 * Hi, y_row = Ni * (int)p.Hy, h_row = Ni * Hi;
  const int32_t *wxb = p.qwx + (active ? (int)n * 3 * Hi + mu : 0);
  float *yb = p.y + (active ? (int)n * (int)p.Hy + p.y_offset + mu : 0);
  const int hoff = active ? (int)n * Hi + mu : 0;
  auto issue = [&](int s) {
    if (active && s < Li) {
      const int32_t *w = wxb + (p.reverse ? Li - 1 - s : s) * wx_row;
      int32_t *d = ring + ((s & (ISK_RING - 1)) * NBH + slot) * 3;
      cp_async4(d, w); cp_async4(d + 1, w + Hi); cp_async4(d + 2, w + 2 * Hi);
    }
    cp_async_commit();
  };
  for (int s = 0; s < ISK_RING - 1; s++) issue(s);

  /* the steps, with the cell's clamps (F = 0) or without them (F = 1): one loop per variant */
  auto steps = [&](auto F) {
    constexpr int FAST = decltype(F)::value;
    for (int s = 0; s < Ti; s++) {
      const int8_t *hc = hb + (s & 1) * NB * Hp;
      /* 1. this lane's dot products (and row sums) over its words */
      int32_t acc[NB][4];
  #pragma unroll
      for (int r = 0; r < NB; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0;
  #pragma unroll
      for (int r = 0; r < NB; r++) {
        int hw[KW];
        isk_load_h<KW>(hc + r * Hp + ms * KW * 4, hw);
  #pragma unroll
        for (int w = 0; w < KW; w++) {
  #pragma unroll
          for (int g = 0; g < 3; g++) acc[r][g] = __dp4a((int)Rr[g][w], hw[w], acc[r][g]);
          if (p.need_sh) acc[r][3] = __dp4a(hw[w], 0x01010101, acc[r][3]);
        }
      }
      /* 2. the full sums in every lane of the unit */
      for (int o = S >> 1; o > 0; o >>= 1) {
  #pragma unroll
        for (int r = 0; r < NB; r++) {
  #pragma unroll
          for (int g = 0; g < 3; g++) acc[r][g] += __shfl_xor_sync(0xffffffffu, acc[r][g], o);
          if (p.need_sh) acc[r][3] += __shfl_xor_sync(0xffffffffu, acc[r][3], o);
        }
      }
      /* 3. row b's cell */
      if (active) {
        int32_t d[4] = {acc[0][0], acc[0][1], acc[0][2], acc[0][3]};
  #pragma unroll
        for (int r = 1; r < NB; r++)
          if (b == r) { d[0] = acc[r][0]; d[1] = acc[r][1]; d[2] = acc[r][2]; d[3] = acc[r][3]; }
        cp_async_wait<ISK_RING - 2>();
        int32_t hnew = (int32_t)hprev;
        const int cell = s * h_row + hoff;   /* (s N + n) H + i */
        if (s >= Li) {   /* padded step (t = s): the state stays, y = 0 */
          if (p.cell_out) {   /* narrow: three aligned words */
            uint32_t *z = (uint32_t *)(p.cell_out + (int64_t)cell * 12);
            z[0] = 0; z[1] = 0; z[2] = 0;
          }
          yb[s * y_row] = 0.0f;
        } else {
          const int t = p.reverse ? Li - 1 - s : s;
          const int32_t *w = ring + ((s & (ISK_RING - 1)) * NBH + slot) * 3;
          const int32_t wx0 = w[0], wx1 = w[1], wx2 = w[2];
          const uint32_t sh = p.need_sh ? (uint32_t)d[3] : 0u;
          int32_t a[3];
  #pragma unroll
          for (int k = 0; k < 3; k++) a[k] = (int32_t)((uint32_t)d[k] + rconst[k] + roff[k] * sh);
          qg_cell32_out o;
          qg_cell32_forward(&c32, 0, wx0, wx1, wx2, a[0], a[1], a[2], hnew, &o, FAST);
          hnew = o.h;
          yb[t * y_row] = (float)((double)(o.h - QH.z) * yscale);
          if (p.cell_out) {   /* narrow (the 32-bit mode implies it): three aligned words */
            uint32_t cw[3];
            qg_cell_narrow_words(&q, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, cw);
            uint32_t *dst = (uint32_t *)(p.cell_out + (int64_t)cell * 12);
            dst[0] = cw[0]; dst[1] = cw[1]; dst[2] = cw[2];
          }
        }
        hb[((s + 1) & 1) * NB * Hp + b * Hp + mu] = (int8_t)(hnew - (int32_t)p.baseH);
        issue(s + ISK_RING - 1);
        if (p.hq) p.hq[cell + h_row] = hnew;
        else if (s == Ti - 1) isk_h_at(p, T)[hoff] = hnew;
        if (s == Ti - 1 && p.hn) p.hn[hoff] = (float)qg_deq(hnew, QH);
        hprev = hnew;
      }
      /* 4. the new plane visible to every lane; the old buffer free */
      __syncthreads();
    }
  };
  if (fast) steps(std::integral_constant<int, 1>());
  else steps(std::integral_constant<int, 0>());
}

/* ---- the cell over two roles of warps (storage 5; auto where it fits) ----------------------
 * One batch row per CTA, one thread per hidden unit in each of two roles (2 round_up(H, 32)
 * threads, H <= 64): the first round_up(H, 32) threads (role Z) hold R's row z of their unit, the
 * others (role RG) rows r and g. A step:
 *   Z:  R h of row z (and the h row sum), qg_cell32_z (z_pre, z, old = z h), its z code and old
 *       into shared memory (xz); step s - 1's global stores (y, the saved state or the last
 *       state) from what RG left in xr, the W x prefetch; barrier 1, then barrier 0 (Z's part
 *       of the step is the shorter one: it waits there for RG's).
 *   RG: R h of rows r and g, qg_cell32_rg (r_pre, r, Rh_g + br_g, r Rhb, g_pre, g); bar.sync on
 *       barrier 1 (Z's values of the step), qg_cell32_h (new, h), the new h byte into the next
 *       plane, h and its codes and mask bits into xr (double-buffered by step); barrier 0.
 * The two halves of the cell (and the products: 16 vs 32 __dp4a chains at H 64) run on different
 * warps, so the step's critical path is RG's chain plus the combination, with one warp per
 * scheduler on four schedulers instead of two. Steps past the row's length (all at the end, one
 * row per CTA) are written after the loop by Z. Each role loads the W x rows it uses into
 * registers, ISK_RING - 1 steps ahead (no shared-memory ring). The products use
 * several partial sums per row (shorter __dp4a chains). Both barriers are bar.sync of every
 * thread (a first version had Z pass barrier 1 by bar.arrive and do its stores after it:
 * compute-sanitizer's racecheck reported hazards on the ring and the h plane under it).
 * The barriers are bar_sync_named (ptx.cuh: bar.sync, barrier.sync.aligned, which every thread of
 * a warp must reach from the same instruction). Both roles run one loop with the barriers in
 * common code and their work in warp-uniform branches between them.
 * (Until session 19 each role had a loop of its own, so the roles reached a barrier from
 * different instructions: compute-sanitizer synccheck reported "divergent thread(s) in block";
 * the non-aligned form, barrier.sync, passed it but ran 9% slower, long-kws int8 inference
 * 0.623-0.633 ms against 0.570-0.575, bench/gpu_runs/s18_barriers_h200_*.log.) */

/* NR rows of R (KW words each) against the h words: NP partial sums per row (shorter dependent
 * __dp4a chains; the sum is the same integer), and with SH the h row's byte sum. */
template <int KW, int NR, int NP, bool SH>
__device__ __forceinline__ void isk_dots(const uint32_t (*R)[KW], const int *hw, int32_t *acc, int32_t *sh) {
  int32_t pa[NR][NP], ps[NP];
#pragma unroll
  for (int j = 0; j < NP; j++) {
    ps[j] = 0;
#pragma unroll
    for (int r = 0; r < NR; r++) pa[r][j] = 0;
  }
#pragma unroll
  for (int w = 0; w < KW; w++) {
#pragma unroll
    for (int r = 0; r < NR; r++) pa[r][w % NP] = __dp4a((int)R[r][w], hw[w], pa[r][w % NP]);
    if (SH) ps[w % NP] = __dp4a(hw[w], 0x01010101, ps[w % NP]);
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
    acc[r] = pa[r][0];
#pragma unroll
    for (int j = 1; j < NP; j++) acc[r] += pa[r][j];
  }
  *sh = 0;
  if (SH) {
    *sh = ps[0];
#pragma unroll
    for (int j = 1; j < NP; j++) *sh += ps[j];
  }
}

template <int KW>
__global__ void __launch_bounds__(ISK_MAX_THREADS, 1) int_gru_small_ws_kernel(const __grid_constant__ isk_params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t H = p.H, N = p.N, T = p.T;
  const int Hp = 4 * KW;   /* bytes of an h row (= Kp) */
  const int tid = threadIdx.x, nthr = blockDim.x, HW = nthr / 2;
  const int rg = tid >= HW, mu = rg ? tid - HW : tid;
  const int64_t n = blockIdx.x;
  int8_t *hb = (int8_t *)smem;                          /* [2][Hp] */
  int32_t *Ps = (int32_t *)(smem + p.off_P);            /* [QG_C32_ROWS][H] */
  int32_t *xz = (int32_t *)(smem + p.off_x);            /* [2][HW]: z's centered code, old's code */
  int32_t *xr = xz + 2 * HW;                            /* [2 steps][5][HW]: h, r_pre, g_pre, Rh_g + br_g, mask bits */

  for (int e = tid; e < 2 * Hp / 16; e += nthr) ((int4 *)hb)[e] = make_int4(0, 0, 0, 0);
  qg_cell_q q = p.cell;
  if (p.lut_smem) cell_luts_to_smem(&q, (int32_t *)(smem + p.off_lut), tid, nthr);
  __syncthreads();
  const int32_t *hq0 = isk_h_at(p, 0);
  for (int64_t e = tid; e < H; e += nthr)
    if (n < N) hb[e] = (int8_t)(hq0[n * H + e] - p.baseH);
  const int64_t i = mu;
  const bool active = mu < H && n < N;
  const qg_qp QH = q.a[QG_Q_OUTPUT_H];
  int use32 = 1, fast_unit = 1;
  if (!rg && mu < H) {
    use32 = cell32_unit_rows(Ps, H, i, &q, H, i, p.eW, p.eR, p.bxc, p.bxz, p.bxe, p.brc, p.brz, p.bre);
    if (!use32) *p.c32_flag = 1;
    fast_unit = use32 && qg_cell32_unit_fast(Ps, H, i);
  }
  use32 = __syncthreads_and(use32);   /* also publishes h0's plane and Ps */
  if (!use32) {
    isk_general_loop(p, 1, hb, q.lut[0], q.lut[1], q.lut[2]);
    return;
  }
  /* the cell without the requantizations' clamps where every unit allows it (qg_rs32) */
  const bool fast = __syncthreads_and(p.c32.fast && fast_unit);
  int32_t P[QG_C32_ROWS];   /* the rows a role does not use are dead loads */
#pragma unroll
  for (int r = 0; r < QG_C32_ROWS; r++) P[r] = active ? Ps[r * H + i] : 0;
  qg_cell32 c32 = p.c32;
  c32.P = P;
  c32.H = 1;
#pragma unroll
  for (int k = 0; k < 3; k++) c32.lut[k] = q.lut[k];

  /* offsets in the loop are 32-bit (isk_choose checks that T N max(3H, 12 H, Hy) < 2^31) */
  const int Hi = (int)H, Ni = (int)N, Ti = (int)T, Li = n < N ? (int)length_at(p.L, n, T) : 0;   /* Li: the same in the CTA */
  const int wx_row = Ni * 3 * Hi, y_row = Ni * (int)p.Hy, h_row = Ni * Hi;
  const int32_t *wxb = p.qwx + (active ? (int)n * 3 * Hi + mu : 0);
  const uint32_t need_sh = p.need_sh;
  /* W x: each role loads the accumulators of the rows it uses (Z row z, RG rows r and g of its
   * unit) straight into registers, ISK_RING - 1 steps ahead (a register pipeline: wq[0] is step
   * s's, wq[ISK_RING - 2] the newest), so no thread reads what another wrote and no load waits
   * inside a step's chain. (A first version had Z copy all three rows into a shared-memory
   * cp.async ring read by both roles behind the step's barriers: correct by the barrier order,
   * but compute-sanitizer's racecheck reported hazards on the ring, also with each role copying
   * its own rows.) */
  auto wx_at = [&](int s, int k) -> int32_t {
    return active && s < Li ? wxb[(p.reverse ? Li - 1 - s : s) * wx_row + k * Hi] : 0;
  };
  __syncthreads();

  /* one loop for both roles, so that each barrier is one instruction that every thread executes
   * (bar.sync is barrier.sync.aligned): the roles' work sits in warp-uniform branches between
   * them. Each thread holds its role's registers: R's rows (Z: row z in Rw[0]; RG: rows r, g), the
   * per-row terms and the W x pipeline (Z: row z in wq[][0]; RG: rows r, g). */
  uint32_t Rw[2][KW];
#pragma unroll
  for (int g = 0; g < 2; g++)
#pragma unroll
    for (int w = 0; w < KW; w++)
      Rw[g][w] = mu < H && (rg || g == 0) ? ((const uint32_t *)(p.Rp + ((int64_t)(g + rg) * H + i) * p.Kp))[w] : 0u;
  uint32_t rconst[2] = {0, 0}, roff[2] = {0, 0};   /* Z: row z's in [0]; RG: rows r, g */
  if (active) {
    rconst[0] = (uint32_t)p.rconst[rg * H + i];
    roff[0] = (uint32_t)p.roff[rg * H + i];
    if (rg) {
      rconst[1] = (uint32_t)p.rconst[2 * H + i];
      roff[1] = (uint32_t)p.roff[2 * H + i];
    }
  }
  float *yb = p.y + (active ? (int)n * (int)p.Hy + p.y_offset + mu : 0);
  const int hoff = active ? (int)n * Hi + mu : 0;
  const double yscale = ldexp(1.0, -QH.e);
  /* Z: step s's outputs: y (at t), the saved state, h after the step */
  auto store = [&](int s, int32_t h, int32_t zpre, int32_t rpre, int32_t gpre, int32_t rhb, uint32_t mask) {
    yb[(p.reverse ? Li - 1 - s : s) * y_row] = (float)((double)(h - QH.z) * yscale);
    const int cell = s * h_row + hoff;
    if (p.cell_out) {   /* narrow (the 32-bit mode implies it): three aligned words */
      uint32_t cw[3];
      qg_cell_narrow_words(&q, zpre, rpre, gpre, rhb, mask, cw);
      uint32_t *dst = (uint32_t *)(p.cell_out + (int64_t)cell * 12);
      dst[0] = cw[0]; dst[1] = cw[1]; dst[2] = cw[2];
    }
    if (p.hq) p.hq[cell + h_row] = h;
  };
  const int32_t baseH = (int32_t)p.baseH;
  int32_t hprev = !rg && active ? hq0[n * H + i] : 0, zpre_p = 0;
  uint32_t mz_p = 0;
  int32_t wq[ISK_RING - 1][2];
#pragma unroll
  for (int k = 0; k < ISK_RING - 1; k++) {
    wq[k][0] = wx_at(k, rg);
    wq[k][1] = rg ? wx_at(k, 2) : 0;
  }
  /* the steps, with the cell's clamps (F = 0) or without them (F = 1): one loop per variant */
  auto steps = [&](auto F) {
    constexpr int FAST = decltype(F)::value;
    for (int s = 0; s < Li; s++) {
      int hw[KW];
      isk_load_h<KW>(hb + (s & 1) * Hp, hw);
      const int32_t w0 = wq[0][0], w1 = wq[0][1];
  #pragma unroll
      for (int k = 0; k < ISK_RING - 2; k++) {
        wq[k][0] = wq[k + 1][0];
        wq[k][1] = wq[k + 1][1];
      }
      wq[ISK_RING - 2][0] = wx_at(s + ISK_RING - 1, rg);
      wq[ISK_RING - 2][1] = rg ? wx_at(s + ISK_RING - 1, 2) : 0;
      qg_cell32_rgo ro;
      if (!rg) {   /* Z: row z, z_pre, z, old; step s - 1's stores from what RG left in xr */
        int32_t acc, sh;
        if (need_sh) isk_dots<KW, 1, 4, true>(Rw, hw, &acc, &sh);
        else isk_dots<KW, 1, 4, false>(Rw, hw, &acc, &sh);
        int32_t xh = 0, xrp = 0, xgp = 0, xrb = 0;
        uint32_t xm = 0;
        if (s > 0) {   /* what RG left of step s - 1 */
          const int32_t *x = xr + ((s - 1) & 1) * 5 * HW + mu;
          xh = x[0]; xrp = x[HW]; xgp = x[2 * HW]; xrb = x[3 * HW]; xm = (uint32_t)x[4 * HW];
          hprev = xh;
        }
        qg_cell32_zo zo;
        qg_cell32_z(&c32, 0, w0, (int32_t)((uint32_t)acc + rconst[0] + roff[0] * (uint32_t)sh), hprev, &zo, FAST);
        xz[mu] = zo.cz; xz[HW + mu] = zo.cold;
        if (s > 0 && active) store(s - 1, xh, zpre_p, xrp, xgp, xrb, xm | mz_p);
        zpre_p = zo.zpre; mz_p = zo.mask;
      } else {   /* RG: rows r and g, r_pre, r, Rh_g + br_g, r Rhb, g_pre, g */
        int32_t acc[2], sh;
        if (need_sh) isk_dots<KW, 2, 2, true>(Rw, hw, acc, &sh);
        else isk_dots<KW, 2, 2, false>(Rw, hw, acc, &sh);
        qg_cell32_rg(&c32, 0, w0, w1, (int32_t)((uint32_t)acc[0] + rconst[0] + roff[0] * (uint32_t)sh),
                     (int32_t)((uint32_t)acc[1] + rconst[1] + roff[1] * (uint32_t)sh), &ro, FAST);
        int32_t *x = xr + (s & 1) * 5 * HW + mu;
        x[HW] = ro.rpre; x[2 * HW] = ro.gpre; x[3 * HW] = ro.rhb;
      }
      bar_sync_named(1, nthr);   /* publishes Z's z and old of this step to RG */
      if (rg) {   /* RG: new h, its byte into the next plane, h and its codes and mask bits into xr */
        uint32_t mh;
        const int32_t h = qg_cell32_h(&c32, xz[mu], xz[HW + mu], ro.g, &mh, FAST);
        if (active) hb[((s + 1) & 1) * Hp + mu] = (int8_t)(h - baseH);
        int32_t *x = xr + (s & 1) * 5 * HW + mu;
        x[0] = h; x[4 * HW] = (int32_t)(ro.mask | mh);
      }
      bar_sync_named(0, nthr);   /* publishes the new h plane and xr */
    }
  };
  if (fast) steps(std::integral_constant<int, 1>());
  else steps(std::integral_constant<int, 0>());
  if (rg || !active) return;
  /* Z after the loop: the last step's stores, the padded steps, the last state */
  if (Li > 0) {
    const int32_t *x = xr + ((Li - 1) & 1) * 5 * HW + mu;
    hprev = x[0];
    store(Li - 1, x[0], zpre_p, x[HW], x[2 * HW], x[3 * HW], (uint32_t)x[4 * HW] | mz_p);
  }
  for (int s = Li; s < Ti; s++) {   /* padded steps (t = s): the state stays, y = 0 */
    const int cell = s * h_row + hoff;
    if (p.cell_out) {
      uint32_t *z = (uint32_t *)(p.cell_out + (int64_t)cell * 12);
      z[0] = 0; z[1] = 0; z[2] = 0;
    }
    yb[s * y_row] = 0.0f;
    if (p.hq) p.hq[cell + h_row] = hprev;
  }
  if (!p.hq) isk_h_at(p, T)[hoff] = hprev;
  if (p.hn) p.hn[hoff] = (float)qg_deq(hprev, QH);
}

typedef void (*isk_kernel)(isk_params);

/* The instances: KW up to 16 with 1 or 2 rows, 4 with 4 rows (S >= 4, S H <= 256: H <= 64), 2
 * with 8 (H <= 32); NULL for the others. */
static isk_kernel isk_kernel_of(int NB, int KW) {
  switch (NB * 100 + KW) {
    case 102: return int_gru_small_kernel<1, 2>;
    case 104: return int_gru_small_kernel<1, 4>;
    case 108: return int_gru_small_kernel<1, 8>;
    case 116: return int_gru_small_kernel<1, 16>;
    case 202: return int_gru_small_kernel<2, 2>;
    case 204: return int_gru_small_kernel<2, 4>;
    case 208: return int_gru_small_kernel<2, 8>;
    case 216: return int_gru_small_kernel<2, 16>;
    case 402: return int_gru_small_kernel<4, 2>;
    case 404: return int_gru_small_kernel<4, 4>;
    case 802: return int_gru_small_kernel<8, 2>;
    default: return NULL;
  }
}

/* The two-role instances (one row per CTA, one lane per unit): KW words per row, H <= 4 KW. */
static isk_kernel isk_ws_kernel_of(int KW) {
  switch (KW) {
    case 2: return int_gru_small_ws_kernel<2>;
    case 4: return int_gru_small_ws_kernel<4>;
    case 8: return int_gru_small_ws_kernel<8>;
    case 16: return int_gru_small_ws_kernel<16>;
    default: return NULL;
  }
}

/* Lanes per unit and words per lane for NB rows (0 when none fits): the fewest lanes S >= NB
 * (forced_S > 0: that S) whose KW (the fewest words, a power of two >= 2, with 4 S KW >= H) is
 * at most ISK_MAX_KW, within ISK_MAX_THREADS threads, with an instance. Fewer lanes measured
 * faster (bench/cuda_int_gru.md: the lanes' shuffles and the idle lanes of the cells cost more
 * than the longer product chains). */
static int isk_lanes(int64_t H, int NB, int forced_S, int *S_out, int *KW_out) {
  for (int S = 1; S <= 32; S *= 2) {
    if (S < NB || (forced_S > 0 && S != forced_S)) continue;
    if (round_up((int64_t)S * H, 32) > ISK_MAX_THREADS) continue;
    int KW = 2;
    while (KW <= ISK_MAX_KW && 4LL * S * KW < H) KW *= 2;
    if (KW > ISK_MAX_KW || !isk_kernel_of(NB, KW)) continue;
    *S_out = S;
    *KW_out = KW;
    return 1;
  }
  return 0;
}

qg_status isk_choose(qg_ctx *ctx, const char *fn, int64_t T, int64_t N, int64_t H, int64_t Hy, int forced_rows, int forced_splits, int ws,
                     int64_t lut_bytes, isk_plan *out, int *found) {
  *found = 0;
  int dev, sms, smem_max;
  QG_CUDA_CHECK(ctx, fn, cudaGetDevice(&dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  QG_CUDA_CHECK(ctx, fn, cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (N < 1 || H < 1 || H > ISK_MAX_THREADS) return QG_OK;
  const int64_t wide_row = 12 * H > Hy ? 12 * H : Hy;   /* the kernel's offsets are 32-bit */
  if (T * N * wide_row >= ((int64_t)1 << 31)) return QG_OK;
  const int nbs[4] = {1, 2, 4, 8};
  /* pass 0: one wave (the model above); pass 1, unforced and only where pass 0 found nothing:
   * every shape that fits a multiprocessor, in waves, the fewest threads over the grid kept */
  isk_plan best;
  memset(&best, 0, sizeof best);
  int64_t best_threads = 0;
  for (int pass = 0; pass < 2; pass++)
  for (int a = 0; a < 4; a++) {
    if (pass == 1 && forced_rows > 0) break;
    const int NB = nbs[a];
    if (forced_rows > 0 && NB != forced_rows) continue;
    /* unforced: the fewest rows per CTA with at most two CTAs per multiprocessor (else 8) */
    if (pass == 0 && forced_rows == 0 && NB < 8 && (N + NB - 1) / NB > 2LL * sms) continue;
    isk_plan c;
    memset(&c, 0, sizeof c);
    c.NB = NB;
    if (!isk_lanes(H, NB, forced_splits, &c.S, &c.KW)) continue;
    /* the two roles: one row, one lane per unit (ws 1: forced, 2: wherever it holds the layer) */
    c.ws = ws > 0 && NB == 1 && c.S == 1 && isk_ws_kernel_of(c.KW) && 2 * round_up(H, 32) <= ISK_MAX_THREADS;
    if (pass == 1 && ws != 1) c.ws = 0;   /* in waves the two roles' doubled threads cost more than they save */
    if (ws == 1 && !c.ws) continue;
    c.Kp = 4LL * c.S * c.KW;
    c.threads = (int)round_up((int64_t)c.S * H, 32) * (c.ws ? 2 : 1);
    c.blocks = (N + NB - 1) / NB;
    int64_t o = 2LL * NB * c.Kp;
    c.off_ring = round_up(o, 16); o = c.off_ring + (int64_t)ISK_RING * NB * H * 3 * 4;
    c.off_P = round_up(o, 16); o = c.off_P + (int64_t)QG_C32_ROWS * H * 4;
    c.off_x = round_up(o, 16); o = c.off_x + (c.ws ? 12LL * (c.threads / 2) * 4 : 0);
    c.off_lut = round_up(o, 16);
    c.lut_smem = lut_bytes > 0 && lut_bytes <= 65536 && c.off_lut + lut_bytes <= smem_max;
    c.smem = c.lut_smem ? c.off_lut + lut_bytes : c.off_lut;
    if (c.smem > smem_max) continue;
    const isk_kernel k = c.ws ? isk_ws_kernel_of(c.KW) : isk_kernel_of(c.NB, c.KW);
    QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
    int per_sm = 0;
    QG_CUDA_CHECK(ctx, fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, c.threads, (size_t)c.smem));
    if (per_sm < 1) continue;
    if (pass == 1) {   /* in waves: the fewest threads over the grid, then the fewest rows a CTA */
      const int64_t threads = c.blocks * c.threads;
      if (!*found || threads < best_threads) { best = c; best_threads = threads; *found = 1; }
      continue;
    }
    if (forced_rows == 0 && c.blocks > (int64_t)per_sm * sms) continue;   /* more than one wave: pass 1 */
    *out = c;
    *found = 1;
    return QG_OK;
  }
  if (*found) *out = best;
  return QG_OK;
}

qg_status isk_launch(qg_ctx *ctx, const char *fn, const isk_plan *pl, isk_params *p) {
  p->Kp = pl->Kp;
  p->S = pl->S;
  p->off_ring = pl->off_ring; p->off_P = pl->off_P; p->off_x = pl->off_x; p->off_lut = pl->off_lut;
  p->lut_smem = pl->lut_smem;
  const isk_kernel k = pl->ws ? isk_ws_kernel_of(pl->KW) : isk_kernel_of(pl->NB, pl->KW);
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl->smem));
  k<<<(unsigned)pl->blocks, (unsigned)pl->threads, (size_t)pl->smem, qg_cuda_stream(ctx)>>>(*p);
  return qg_cuda_launched(ctx, fn);
}

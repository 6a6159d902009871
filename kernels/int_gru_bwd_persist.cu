/*
 * int_gru_bwd_persist.cu: the persistent recurrence of the integer GRU layer's STE backward
 * (qg_int_gru_backward, kernels/int_gru_backward.cu, which chooses between it and the per-step
 * path and runs the GEMMs after either), on the shared STE cell of core/int_gru_cell.h. Built with
 * --fmad=false like the rest of the integer GRU (CMakeLists.txt).
 *
 * The recurrence (bwd_persist_kernel): one launch for all T steps, the design of the float GRU's
 * persistent backward (kernels/gru_persist.cu). A thread-block cluster of K CTAs (K = 1, 2, 4,
 * 8, 16) runs NB batch rows; CTA k owns the hidden units [k Hk, k Hk + Hk) and holds the
 * fake-quantized R~'s columns of those units for all 3H rows in shared memory (float:
 * Rt[j][u] = R~[j][k Hk + u]), and the cluster rows' dq, qb[2][NB][3H], double-buffered. Step
 * s: one thread per (row, unit) runs the shared STE cell from its dh (kept in a register; the
 * step's saved record, h code and dy were loaded during the previous step), writes dp, dq,
 * bcx and bcr as the fallback does (the after-loop GEMMs and bias sums read them), and stores
 * its three dq values into every CTA's qb (distributed shared memory); one cluster barrier;
 * S threads per unit form the partial sums of sum_j dq[n, j] R~[j, i] over strided shares
 * j = ms, ms + S, ... (sequential fp32 FMAs), and the (row, unit) thread sets
 * dh = direct part + the partials added in a fixed order (sum_partials). Deterministic: the
 * order depends only on the configuration, which depends only on the device and the shape.
 * Batch-row groups are independent clusters (no barrier between them). The matrix-vector
 * product is strict fp32 in both math modes (more accurate than TF32, and the product is
 * latency-bound, so TF32 would not be faster). R~ must fit: 12 H ceil(H / K) bytes plus the
 * exchange buffers in one CTA's shared memory, K <= 16 (H up to about 530 on an H100/H200).
 * Three register variants (small H; qg_ctx_set_persist_shape storage 2, 3 and 4, chosen by the
 * estimates without clusters; 4 is bwd_ws3_kernel, bwd_ws_kernel with the cell's inputs
 * prepared on warps of their own): bwd_reg_kernel holds R~'s share in the registers of S lanes per
 * unit (the float register backward's layout, kernels/gru_persist_reg.cu), and bwd_ws_kernel
 * does the same on warps of its own while one thread per unit runs the cell (one row per CTA,
 * two block barriers per step); both take the cell's saved-state values a step ahead
 * (qg_cell_backward_prepare) and issue a step's global stores after its barrier. Their sums
 * are fixed-order too (four FMA chains per lane, then a butterfly over the S lanes).
 */
#include "int_gru_bwd.cuh"
#include "gru_persist.cuh"   /* cluster_barrier, sum_partials, persist_reg_threads, ptx.cuh */
#include "mbarrier.cuh"      /* bwd_persist_kernel's dq exchange */

#include <stdio.h>   /* QG_BP_TRACE builds */
#include <string.h>

/* bwd_persist_kernel's shared memory in floats: Rt [3H][Hk], qb [2][NB][3H], part [S][NB][Hk],
 * then (8-byte aligned) the two mbarriers of the dq exchange at this offset. */
__host__ __device__ __forceinline__ int64_t bp_mbar_offset(int64_t H, int64_t Hk, int64_t NB, int64_t S) {
  return (3 * H * Hk + 2 * NB * 3 * H + S * NB * Hk + 1) & ~(int64_t)1;
}

/* dh: [N, H], the incoming dL/dh_T on entry, dL/dh_0 (before the h0 mask) on exit.
 * K > 1: the dq exchange is st.async into every CTA's qb buffer s & 1, counted on that buffer's
 * mbarrier qm[s & 1] (each phase one step's 12 rows H bytes, armed by thread 0), instead of a
 * cluster barrier per step (the cluster forward's exchange, kernels/int_gru_cluster.cuh persistent_kernel).
 * Iteration m = T - 1 - s waits for phase m / 2 of qm[s & 1]; thread 0 then arms the phase of
 * iteration m + 2, whose bytes no peer can send before it has this CTA's dq of iteration m + 1,
 * stored after the block barrier that follows the arming. Buffer s & 1 is rewritten at step s - 2
 * only by peers that have waited for this CTA's dq of step s - 1, stored after its reads of step s
 * (the block barrier after the partial sums). */
template <int NB>
__global__ void __launch_bounds__(BP_MAX_THREADS, 1) bwd_persist_kernel(const __grid_constant__ bwd_params p, const bp_plan c, float *dh_io) {
  extern __shared__ __align__(16) float sm[];
  const int H = (int)p.H, H3 = 3 * H, N = (int)p.N, T = (int)p.T, Hk = c.Hk, S = c.S, K = c.K;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  const int NBHk = NB * Hk;
  float *Rt = sm;                            /* [3H][Hk] */
  float *qb = Rt + (size_t)H3 * Hk;          /* [2][NB][3H] */
  float *part = qb + 2 * NB * H3;            /* [S][NB][Hk] */
  uint64_t *qm = (uint64_t *)(sm + bp_mbar_offset(H, Hk, NB, S));   /* [2] (K > 1) */
  const int tid = threadIdx.x, nth = blockDim.x;
  if (K > 1 && tid == 0) {
    mb_init(&qm[0], 1);
    mb_init(&qm[1], 1);
    mb_init_fence_cluster();
  }

  for (int q = tid; q < H3 * Hk; q += nth) {
    const int j = q / Hk, u = q - j * Hk;
    Rt[q] = u < hk ? p.Rf[(int64_t)j * H + k0 + u] : 0.0f;
  }
  for (int q = tid; q < 2 * NB * H3; q += nth) qb[q] = 0.0f;   /* rows beyond the batch stay 0 */

  /* (row, unit) role: thread tid < NB Hk is row tid / Hk, unit tid % Hk */
  const int pb = tid / Hk, pu = tid - pb * Hk;
  const bool pact = pb < rows && pu < hk;
  const int pn = n0 + pb, pi = k0 + pu;
  const int64_t L = pact ? length_at(p.L, pn, T) : 0;
  float dh = pact ? dh_io[(int64_t)pn * H + pi] : 0.0f;
  step_in in;
  if (pact) load_step(p, T - 1, pn, pi, L, in);
  /* matrix-vector role: unit mu, share ms of the j range (j = ms, ms + S, ...) */
  const int mu = tid % Hk, ms = tid / Hk;
  const bool mv = ms < S;
  const uint32_t tx_bytes = 12u * (uint32_t)rows * (uint32_t)H;   /* what each CTA receives a step */
  if (K > 1) __syncthreads();   /* as the cluster forward: racecheck reports the arming as racing the init without it */
  if (K > 1 && tid == 0) {   /* only the phases some iteration waits for (synccheck) */
    if (T > 0) mb_arrive_expect_tx(&qm[(T - 1) & 1], tx_bytes);
    if (T > 1) mb_arrive_expect_tx(&qm[(T - 2) & 1], tx_bytes);
  }

  cluster_barrier(K);   /* every CTA's shared memory and mbarriers are set before any peer writes into them */

  for (int s = T - 1; s >= 0; s--) {
    const int b = s & 1, m = T - 1 - s;
    float *qc = qb + b * NB * H3;
    float keep = 0.0f;
    if (pact) {
      float dq3[3] = {0.0f, 0.0f, 0.0f};
      if (s < L) {
        const int64_t t = p.reverse ? L - 1 - s : s;
        const float dH = dh + (p.dy ? in.dy : 0.0f);
        keep = ste_unit(p, s, t, pn, pi, (const uint8_t *)in.w, in.hp, dH, dq3);
      } else {   /* padded: the state gradient passes through */
        pad_unit(p, s, pn, pi);
        keep = dh;
      }
      load_step(p, s - 1, pn, pi, L, in);   /* the next step's inputs, in flight across the barrier */
      if (K == 1) {
        float *q = qc + pb * H3 + pi;
        q[0] = dq3[0]; q[H] = dq3[1]; q[2 * H] = dq3[2];
      } else {
        const uint32_t d = smem_addr(qc + pb * H3 + pi), mb = smem_addr(&qm[b]);
        for (int r = 0; r < K; r++) {
          const uint32_t dr = mapa_shared(d, r), mr = mapa_shared(mb, r);
          st_async_b32(dr, __float_as_uint(dq3[0]), mr);
          st_async_b32(dr + 4 * H, __float_as_uint(dq3[1]), mr);
          st_async_b32(dr + 8 * H, __float_as_uint(dq3[2]), mr);
        }
      }
    }
    if (K > 1) {
      mb_wait(&qm[b], (m >> 1) & 1);
      if (tid == 0 && m + 2 < T) mb_arrive_expect_tx(&qm[b], tx_bytes);
    }
    __syncthreads();
    if (mv) dq_rt_partials<NB>(part, Rt, qc, mu, ms, S, H3, Hk);
    __syncthreads();
    if (pact) dh = keep + sum_partials(part + pb * Hk + pu, S, NBHk);
  }
  if (pact) dh_io[(int64_t)pn * H + pi] = dh;
  if (K > 1) cl.sync();   /* no CTA leaves while a peer may still store into it */
}

/* ---- the persistent recurrence with R~ in registers ------------------------------------------------ */

/* The register variant of the recurrence (the float GRU's bwd_reg_kernel, kernels/gru_persist_reg.cu,
 * with the STE cell): CTA k of a cluster owns units [k Hk, k Hk + Hk); unit mu's dot product
 * dh[i] += sum_j dq[j] R~[j, i] is split over S consecutive lanes of one warp, lane ms holding R~'s
 * entries j = ms KPT .. ms KPT + KPT - 1 of column k0 + mu in registers and reading the rows' dq
 * from shared memory (qb [2][NB][S KPT], zero past 3H) as float4 broadcasts; four interleaved FMA
 * chains per lane, added in a fixed order, then a butterfly of shuffles (group_sum). Lane ms = b
 * runs row b's cell (NB <= S). One barrier per step (the one that publishes dq). What does not
 * depend on dh is taken off the step's dependent chain: the saved record of step s - 2 is loaded
 * and the table look-ups of step s - 1 are made during step s, and step s's global stores (dp, dq,
 * bcx, bcr) are issued after its barrier. */
template <int NB, int KPT>
__global__ void __launch_bounds__(persist_reg_threads(KPT), 1) bwd_reg_kernel(const __grid_constant__ bwd_params p, const bp_plan c, float *dh_io) {
  extern __shared__ __align__(16) float sm[];
  const int H = (int)p.H, H3 = 3 * H, N = (int)p.N, T = (int)p.T, Hk = c.Hk, S = c.S, K = c.K, Jp = c.S * KPT;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  float *qb = sm;   /* [2][NB][Jp] */
  const int tid = threadIdx.x, nth = blockDim.x;
  const int ms = tid % S, mu = tid / S;

  float Rr[KPT];   /* R~[ms KPT + i][k0 + mu]; 0 past 3H and past the CTA's units */
  reg_share_load<KPT>(Rr, p.Rf, H, H3, ms, k0 + mu, mu < hk);
  for (int q = tid; q < 2 * NB * Jp; q += nth) qb[q] = 0.0f;

  /* (row, unit) role: lane ms = pb of unit mu */
  const int pb = ms;
  const bool pact = pb < NB && pb < rows && mu < hk;
  const int pn = n0 + pb, pi = k0 + mu;
  const int64_t L = pact ? length_at(p.L, pn, T) : 0;
  float dh = pact ? dh_io[(int64_t)pn * H + pi] : 0.0f;
  step_in in;
  step_vals cur;
  if (pact) {
    load_step(p, T - 1, pn, pi, L, in);
    prepare_step(p, T - 1, L, in, cur);
    load_step(p, T - 2, pn, pi, L, in);
  }

  cluster_barrier(K);   /* every CTA's shared memory is set before any peer writes into it */

  for (int s = T - 1; s >= 0; s--) {
    float *qc = qb + (s & 1) * NB * Jp;
    float keep = 0.0f;
    qg_cell_grad gr;
    if (pact) {
      float dq3[3];
      keep = bwd_cell_step(cur.v, cur.dy, dh, s < L, &gr, dq3);
      cluster_store3(cl, K, qc + pb * Jp + pi, H, dq3[0], dq3[1], dq3[2]);
    }
    cluster_barrier(K);
    /* the first of this step's dq words into registers, then the work off the dependent chain */
    const float *qr = qc + ms * KPT;
    constexpr int PV = reg_pre<NB, KPT>::V;
    float4 pre[PV][NB];
    reg_pre_load<NB, KPT>(pre, qr, Jp);
    if (pact) {   /* step s's outputs, step s - 1's values, step s - 2's record */
      if (s < L) {
        const int64_t t = p.reverse ? L - 1 - s : s;
        float *dpr = p.dp + (t * N + pn) * H3, *dqr = p.dq + ((int64_t)s * N + pn) * H3,
              *bxr = p.bcx + ((int64_t)s * N + pn) * H3, *brr = p.bcr + ((int64_t)s * N + pn) * H3;
#pragma unroll
        for (int k = 0; k < 3; k++) {
          dpr[k * H + pi] = gr.dp[k];
          dqr[k * H + pi] = gr.dq[k];
          bxr[k * H + pi] = gr.dbx[k];
          brr[k * H + pi] = gr.dbr[k];
        }
      } else {
        pad_unit(p, s, pn, pi);
      }
      prepare_step(p, s - 1, L, in, cur);
      load_step(p, s - 2, pn, pi, L, in);
    }
    /* dh = keep + (dq R^T) for this lane's row, on every lane (the sums are collective) */
    const float sum = dq_rt_reg<NB, KPT, PV>(Rr, pre, qr, Jp, S, pb);
    if (pact) dh = keep + sum;
  }
  if (pact) dh_io[(int64_t)pn * H + pi] = dh;
}

/* The register variant with the roles split over warps (one batch row per CTA, no cluster): the
 * first mvt = Hk S threads (whole warps) hold R~ in registers and form dq R~ as bwd_reg_kernel does
 * (S lanes per unit, KPT entries each, four chains, group_sum); the following warps hold one unit
 * each and run its STE cell. Step s: the cell thread sets dh = keep + the unit's sum of the step
 * before, runs the cell and writes its dq into shared memory; barrier; the matrix-vector warps form
 * the sums while the cell warps store step s's outputs (dp, dq), add its bias gradients to their
 * running sums, derive step s - 1's values and start the copies of step s - BW_RING + 1's inputs;
 * barrier. Two block barriers per step, but the cell's per-step work no longer occupies the warps
 * of the product (each warp's instructions are what a step waits for).
 * The cell thread's inputs of a step (the saved record's words, the h code, dy) come through a
 * ring of BW_RING steps in shared memory, filled by the thread's own asynchronous copies (cp.async,
 * one group per step, waited for BW_RING - 2 steps later: a step no longer waits for the
 * latency of global memory, which one step of prefetch did not cover). The bias gradients are
 * summed per (row, unit) over the steps in double, in the order of the steps (descending), into
 * bsum [N][4][H] (dzpre, drpre, dgpre, drhb); bias_rows_kernel adds the rows in order after the
 * loop, so bcx, bcr are not written. */
enum { BW_RING = 8, BW_WORDS = BP_MAX_WORDS + 2 };   /* BW_RING a power of two */

/* Start the copies of step u's inputs of row n, unit i into ring slot u mod BW_RING (words k at
 * ring[(slot BW_WORDS + k) H + i]: the record's words, then the h code, then dy); one group, empty
 * for a step outside [0, Ln). */
__device__ __forceinline__ void ws_issue(const bwd_params &p, int64_t u, int n, int i, int64_t Ln, uint32_t *ring) {
  if (u >= 0 && u < Ln) {
    const int H = (int)p.H;
    const int64_t e = (u * p.N + n) * H + i;
    uint32_t *d = ring + (int)(u & (BW_RING - 1)) * BW_WORDS * H + i;
    const float *src = (const float *)(p.cellp + e * p.cb);
    const int nw = p.cb / 4;
#pragma unroll
    for (int k = 0; k < BP_MAX_WORDS; k++)
      if (k < nw) cp_async4((float *)(d + k * H), src + k);
    cp_async4((float *)(d + BP_MAX_WORDS * H), (const float *)(p.hq + e));
    if (p.dy) {
      const int64_t t = p.reverse ? Ln - 1 - u : u;
      cp_async4((float *)(d + (BP_MAX_WORDS + 1) * H), p.dy + (t * p.N + n) * p.Hy + p.y_offset + i);
    }
  }
  cp_async_commit();
}

/* The matrix-vector share of bwd_ws_kernel and bwd_ws3_kernel: lane ms of unit mu's S lanes forms
 * sum_j dq[j] R~[j][mu] over its KPT entries of R~ (registers Rr) against qb[ms KPT ..] in four
 * FMA chains in a fixed order, the chains summed pairwise, then the butterfly over the S lanes
 * (group_sum); lane 0 writes sums[mu]. */
template <int KPT>
__device__ __forceinline__ void ws_dot(const float (&Rr)[KPT], const float *qb, int ms, int S, int mu, int64_t H, float *sums) {
  float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float *qr = qb + ms * KPT;
#pragma unroll
  for (int i = 0; i < KPT; i += 4) {
    const float4 q4 = *reinterpret_cast<const float4 *>(qr + i);
    float v = ch[(i / 4) % 4];
    v = fmaf(Rr[i], q4.x, v);
    v = fmaf(Rr[i + 1], q4.y, v);
    v = fmaf(Rr[i + 2], q4.z, v);
    v = fmaf(Rr[i + 3], q4.w, v);
    ch[(i / 4) % 4] = v;
  }
  float acc[1] = {(ch[0] + ch[1]) + (ch[2] + ch[3])};
  group_sum(acc, S);
  if (ms == 0 && mu < H) sums[mu] = acc[0];
}

/* Step u's values from its ring slot (its group complete). */
__device__ __forceinline__ void ws_prepare(const bwd_params &p, int64_t u, int i, int64_t Ln, const uint32_t *ring, step_vals &o) {
  if (u < 0 || u >= Ln) return;
  const int H = (int)p.H;
  const uint32_t *d = ring + (int)(u & (BW_RING - 1)) * BW_WORDS * H + i;
  const int nw = p.cb / 4;
  step_in in;
#pragma unroll
  for (int k = 0; k < BP_MAX_WORDS; k++) in.w[k] = k < nw ? d[k * H] : 0u;
  in.hp = (int32_t)d[BP_MAX_WORDS * H];
  in.dy = p.dy ? __uint_as_float(d[(BP_MAX_WORDS + 1) * H]) : 0.0f;
  prepare_step(p, u, Ln, in, o);
}

/* Step s's outputs of row pn, unit pi in bwd_ws_kernel and bwd_ws3_kernel (issued after the step's
 * barrier, off the dependent chain): at a valid step (s < L) dp, dq and the unit's bias sums
 * (dzpre, drpre, dgpre, drhb) from the cell's gradients gr; at a padded step zero dq. */
__device__ __forceinline__ void ws_store_step(const bwd_params &p, int s, int64_t L, int pn, int pi, const qg_cell_grad &gr, double &bz,
                                              double &br, double &bg, double &bh) {
  const int H = (int)p.H, H3 = 3 * H;
  float *dqr = p.dq + ((int64_t)s * p.N + pn) * H3 + pi;
  if (s < L) {
    const int64_t t = p.reverse ? L - 1 - s : s;
    float *dpr = p.dp + (t * p.N + pn) * H3 + pi;
    dpr[0] = gr.dp[0]; dpr[H] = gr.dp[1]; dpr[2 * H] = gr.dp[2];
    dqr[0] = gr.dq[0]; dqr[H] = gr.dq[1]; dqr[2 * H] = gr.dq[2];
    bz += (double)gr.dbx[0]; br += (double)gr.dbx[1]; bg += (double)gr.dbx[2]; bh += (double)gr.dbr[2];
  } else {
    dqr[0] = 0.0f; dqr[H] = 0.0f; dqr[2 * H] = 0.0f;
  }
}

template <int KPT>
__global__ void __launch_bounds__(persist_reg_threads(KPT), 1) bwd_ws_kernel(const __grid_constant__ bwd_params p, const bp_plan c, float *dh_io) {
  extern __shared__ __align__(16) float sm[];
  const int H = (int)p.H, H3 = 3 * H, T = (int)p.T, S = c.S, Jp = c.S * KPT;
  const int pn = blockIdx.x;
  float *qb = sm;          /* [Jp]: the row's dq, zero past 3H */
  float *sums = qb + Jp;   /* [H]: (dq R~)[i] of the step */
  uint32_t *ring = (uint32_t *)(sums + H);   /* [BW_RING][BW_WORDS][H] */
  const int tid = threadIdx.x, nth = blockDim.x;
  const int mvt = (H * S + 31) & ~31;
  const bool mvr = tid < mvt;
  const int ms = tid % S, mu = tid / S;

  float Rr[KPT];   /* R~[ms KPT + i][mu]; 0 past 3H, past H and in the cell warps */
  reg_share_load<KPT>(Rr, p.Rf, H, H3, ms, mu, mvr && mu < H);
  for (int q = tid; q < Jp + H; q += nth) sm[q] = 0.0f;

  const int pi = tid - mvt;
  const bool pact = !mvr && pi < H;
  const int64_t L = pact ? length_at(p.L, pn, T) : 0;
  float dh = pact ? dh_io[(int64_t)pn * H + pi] : 0.0f, keep = 0.0f;
  double bz = 0.0, br = 0.0, bg = 0.0, bh = 0.0;   /* the unit's bias sums: dzpre, drpre, dgpre, drhb */
  step_vals cur;
  if (pact) {
    for (int u = T - 1; u > T - BW_RING; u--) ws_issue(p, u, pn, pi, L, ring);
    cp_async_wait_all();
    ws_prepare(p, T - 1, pi, L, ring, cur);
  }
  __syncthreads();

  for (int s = T - 1; s >= 0; s--) {
    qg_cell_grad gr;
    if (pact) {
      if (s < T - 1) dh = keep + sums[pi];
      float dq3[3];
      keep = bwd_cell_step(cur.v, cur.dy, dh, s < L, &gr, dq3);
      qb[pi] = dq3[0]; qb[H + pi] = dq3[1]; qb[2 * H + pi] = dq3[2];
    }
    __syncthreads();
    if (mvr) {
      ws_dot<KPT>(Rr, qb, ms, S, mu, H, sums);
    } else if (pact) {   /* off the dependent chain: step s's outputs and bias sums, step s - 1's values, later steps' copies */
      ws_issue(p, (int64_t)s - BW_RING + 1, pn, pi, L, ring);
      ws_store_step(p, s, L, pn, pi, gr, bz, br, bg, bh);
      cp_async_wait<BW_RING - 2>();
      ws_prepare(p, (int64_t)s - 1, pi, L, ring, cur);
    }
    __syncthreads();
  }
  if (pact) {
    dh_io[(int64_t)pn * H + pi] = keep + sums[pi];
    double *bs = p.bsum + (int64_t)pn * 4 * H + pi;
    bs[0] = bz; bs[H] = br; bs[2 * H] = bg; bs[3 * H] = bh;
  }
}

/* bwd_ws_kernel with a third role (storage 4, or chosen where the block holds it): the cell's
 * inputs are made by warps of their own. Threads [0, mvt) form dq R~ as above; [mvt, mvt + Hc)
 * (Hc = H rounded up to whole warps) run the cell of one unit each; [mvt + Hc, mvt + 2 Hc) prepare
 * the cell's values of one unit each: their copies through the ring (ws_issue), the STE values and
 * dy of step s - 1 (ws_prepare) written into bv [2][BV_WORDS][H] (double-buffered by the step's
 * parity) while the cell and the product run step s. Two named barriers: A (id 1; the product and
 * the cell warps) publishes dq, B (id 2; every thread) publishes the sums and the next step's
 * prepared values; the preparing warps skip A, so their work spans a whole step instead of the
 * second phase. What remains on the cell warps per step: the cell, its dq into shared memory, six
 * global stores and the bias sums. */
enum { BV_WORDS = 10 };

/* The roles' named barriers in the non-aligned form (barrier.sync id, n; ptx.cuh): the three
 * roles reach each barrier from instructions of their own, which bar.sync (barrier.sync.aligned)
 * does not allow (PTX: an aligned barrier in conditional code needs every thread to take the same
 * path), and compute-sanitizer synccheck reported "divergent thread(s) in block" on the 6-7 specs
 * that run this kernel with it (runs 18-20). The non-aligned form passes synccheck on every STE
 * backward test (session 44, bench/sanitize.md) and costs the long-kws backward about 1.5% (H100,
 * four alternated rounds: the layer's backward 0.598-0.606 -> 0.611-0.626 ms, the train step
 * 1.130-1.159 -> 1.141-1.163; bench/gpu_runs/s44_ws3_unaligned_h100.log). Measured before and not
 * kept: the same form in the small-H inference kernels (9% slower there), one noinline barrier
 * function (failed synccheck, 33% slower; bench/gpu_runs/s18_barriers_h200_*.log), all three roles
 * in one loop (0.63 -> 0.75 ms, s19_roles_h200_ab2.log), arrive / wait pairs between the roles
 * (racecheck hazards on 5 of the 6 specs, s19_ws3_arrive_h200_*.log). */
__device__ __forceinline__ void named_barrier(int id, int count) { bar_sync_named_unaligned(id, count); }

template <int KPT>
__global__ void __launch_bounds__(persist_reg_threads(KPT), 1) bwd_ws3_kernel(const __grid_constant__ bwd_params p, const bp_plan c, float *dh_io) {
  extern __shared__ __align__(16) float sm[];
  const int H = (int)p.H, H3 = 3 * H, T = (int)p.T, S = c.S, Jp = c.S * KPT;
  const int pn = blockIdx.x;
  float *qb = sm;          /* [Jp]: the row's dq, zero past 3H */
  float *sums = qb + Jp;   /* [H]: (dq R~)[i] of the step */
  float *bv = sums + H;    /* [2][BV_WORDS][H]: the cell's values and dy of a step */
  uint32_t *ring = (uint32_t *)(bv + 2 * BV_WORDS * H);   /* [BW_RING][BW_WORDS][H] */
  const int tid = threadIdx.x, nth = blockDim.x;
  const int mvt = (H * S + 31) & ~31, Hc = (H + 31) & ~31, nab = mvt + Hc;
  const int role = tid < mvt ? 0 : tid < nab ? 1 : 2;   /* product, cell, preparation (whole warps) */
  const int ms = tid % S, mu = tid / S;

  float Rr[KPT];   /* R~[ms KPT + i][mu]; 0 past 3H, past H and in the other roles */
  reg_share_load<KPT>(Rr, p.Rf, H, H3, ms, mu, role == 0 && mu < H);
  for (int q = tid; q < Jp + H; q += nth) sm[q] = 0.0f;

  const int pi = role == 1 ? tid - mvt : tid - nab;
  const bool pact = role != 0 && pi < H;
  const int64_t L = pact ? length_at(p.L, pn, T) : 0;

  if (role == 2) {   /* preparation: step s - 1's values during step s */
    if (pact)
      for (int u = T - 1; u > T - BW_RING; u--) ws_issue(p, u, pn, pi, L, ring);
    for (int s = T; s >= 1; s--) {
      if (pact) {
        if (s < T) ws_issue(p, (int64_t)s - BW_RING + 1, pn, pi, L, ring);   /* the ring's newest step */
        cp_async_wait<BW_RING - 2>();
        if (s - 1 < L) {
          step_vals v;
          ws_prepare(p, (int64_t)s - 1, pi, L, ring, v);
          float *o = bv + ((s - 1) & 1) * BV_WORDS * H + pi;
          o[0] = v.v.z; o[H] = v.v.rr; o[2 * H] = v.v.g; o[3 * H] = v.v.dsz; o[4 * H] = v.v.dsr; o[5 * H] = v.v.dtg;
          o[6 * H] = v.v.hp; o[7 * H] = v.v.rhb; o[8 * H] = __uint_as_float(v.v.mask); o[9 * H] = v.dy;
        }
      }
      named_barrier(s == T ? 3 : 2, nth);   /* 3: the start (shared memory set, step T - 1's values) */
    }
    named_barrier(2, nth);   /* step 0's B */
    return;
  }

  float dh = role == 1 && pact ? dh_io[(int64_t)pn * H + pi] : 0.0f, keep = 0.0f;
  double bz = 0.0, br = 0.0, bg = 0.0, bh = 0.0;   /* the unit's bias sums: dzpre, drpre, dgpre, drhb */
  named_barrier(3, nth);
  for (int s = T - 1; s >= 0; s--) {
    if (role == 1) {
      qg_cell_grad gr;
      if (pact) {
        if (s < T - 1) dh = keep + sums[pi];
        float dq3[3] = {0.0f, 0.0f, 0.0f};
        if (s < L) {
          const float *v = bv + (s & 1) * BV_WORDS * H + pi;
          const float dH = dh + v[9 * H];
          qg_cell_backward_values(__float_as_uint(v[8 * H]), v[0], v[H], v[2 * H], v[3 * H], v[4 * H], v[5 * H], v[6 * H], v[7 * H],
                                  dH, &gr);
          keep = gr.dhprev;
          dq3[0] = gr.dq[0]; dq3[1] = gr.dq[1]; dq3[2] = gr.dq[2];
        } else {   /* padded: the state gradient passes through */
          keep = dh;
        }
        qb[pi] = dq3[0]; qb[H + pi] = dq3[1]; qb[2 * H + pi] = dq3[2];
      }
      named_barrier(1, nab);
      if (pact) {   /* off the dependent chain: step s's outputs and bias sums */
        ws_store_step(p, s, L, pn, pi, gr, bz, br, bg, bh);
      }
    } else {
      named_barrier(1, nab);
      ws_dot<KPT>(Rr, qb, ms, S, mu, H, sums);
    }
    named_barrier(2, nth);
  }
  if (role == 1 && pact) {
    dh_io[(int64_t)pn * H + pi] = keep + sums[pi];
    double *bs = p.bsum + (int64_t)pn * 4 * H + pi;
    bs[0] = bz; bs[H] = br; bs[2 * H] = bg; bs[3 * H] = bh;
  }
}

typedef void (*bp_kernel)(bwd_params, bp_plan, float *);

/* The instantiated register shares KPT (those of the float backward): 12, 24, 48 with rows 1..8,
 * 96 with rows 1, 2 (at most persist_reg_threads(96) = 256 threads). */
static const int BP_KPT[4] = {12, 24, 48, 96};

static bp_kernel bp_kernel_of(int NB, int KPT) {
#define QG_BP_K(nb)                                                                                      \
  if (NB == nb)                                                                                          \
    return KPT == 0 ? bwd_persist_kernel<nb> : KPT == 12 ? bwd_reg_kernel<nb, 12> : KPT == 24 ? bwd_reg_kernel<nb, 24> \
         : KPT == 48 ? bwd_reg_kernel<nb, 48> : NULL;
  QG_BP_K(1) QG_BP_K(2) QG_BP_K(4) QG_BP_K(8)
#undef QG_BP_K
  return NULL;
}

static bp_kernel bp_kernel_for(int NB, int KPT, int WS = 0) {
  if (WS == 2) return NB != 1 ? NULL : KPT == 12 ? bwd_ws3_kernel<12> : KPT == 24 ? bwd_ws3_kernel<24> : KPT == 48 ? bwd_ws3_kernel<48>
                                        : KPT == 96 ? bwd_ws3_kernel<96> : NULL;
  if (WS) return NB != 1 ? NULL : KPT == 12 ? bwd_ws_kernel<12> : KPT == 24 ? bwd_ws_kernel<24> : KPT == 48 ? bwd_ws_kernel<48>
                                   : KPT == 96 ? bwd_ws_kernel<96> : NULL;
  if (KPT == 96) return NB == 1 ? bwd_reg_kernel<1, 96> : NB == 2 ? bwd_reg_kernel<2, 96> : NULL;
  return bp_kernel_of(NB, KPT);
}

static int64_t bp_smem(int64_t H, int64_t Hk, int64_t NB, int64_t S, int64_t KPT, int WS) {
  if (WS) return 4 * (S * KPT + H + (WS == 2 ? 2 * BV_WORDS * H : 0) + (int64_t)BW_RING * BW_WORDS * H);
  return KPT ? 4 * 2 * NB * S * KPT : 4 * bp_mbar_offset(H, Hk, NB, S) + 16;   /* + bwd_persist_kernel's two mbarriers */
}

static cudaLaunchConfig_t bp_launch_config(qg_ctx *ctx, const bp_plan &c, cudaLaunchAttribute *at) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3((unsigned)(c.groups * c.K));
  lc.blockDim = dim3((unsigned)c.threads);
  lc.dynamicSmemBytes = (size_t)c.smem;
  lc.stream = qg_cuda_stream(ctx);
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)c.K; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
  lc.attrs = at;
  lc.numAttrs = 1;
  return lc;
}

/* Estimated microseconds per step at about 1.75 GHz, times the waves of CTAs: R~ in registers
 * (the roles split or not) by the float register backward's model (kernels/gru_persist.cu,
 * step_cycles: fitted there on an H200; the integer cell counted a little heavier); R~ in shared
 * memory by a fit of its own (below). */
static double bp_step_us(const qg_ctx *ctx, const bp_plan &c, int64_t H, int64_t slots) {
  const double kd = 3.0 * (double)H, NB = c.NB, Hk = c.Hk, S = c.S;
  const int64_t blocks = (int64_t)c.groups * c.K;
  double waves = (double)((blocks + slots - 1) / slots);
  if (blocks * 4 > slots * 3 && blocks <= slots) waves *= 1.5;   /* a nearly full device (gru_persist.cu) */
  if (c.WS) {
    /* roles on separate warps: the cell's dependent chain and two block barriers, the larger of
     * the product's FMAs per scheduler and the cell warps' other work (stores, bias sums; with
     * WS = 1 also the look-ups and copies), and the warps per scheduler (fitted to the H200's
     * long-kws timings: WS = 1 with S = 2 ahead of S = 4, bench/gpu_runs/kws_bwd2_d1_kws.log) */
    const double mv = (double)((Hk * S / 32 + 3) / 4) * (c.KPT + 40.0);
    return waves * (700.0 + (c.WS == 1 ? 250.0 : 0.0) + (mv > 200.0 ? mv : 200.0) + 0.5 * c.threads) / 1750.0;
  }
  if (c.KPT) {
    /* R~ in registers: the float register backward's fit (gru_persist.cu, step_cycles: a fixed
     * cost, the threads, the (row, unit) pairs, the chain of KPT FMAs, the cluster's exchange),
     * plus the integer cell's STE values (their look-ups are made a step ahead) */
    const double pairs = NB * Hk, remote = pairs * c.K * 3.0;
    const double cluster = c.K > 1 ? 600.0 + 40.0 * c.K + 2.5 * remote : 0.0;
    const double issue = (double)((c.threads / 32 + 3) / 4) * c.KPT * NB;   /* FMAs per scheduler */
    (void)ctx;
    return waves * (580.0 + (c.K > 1 ? 2.0 : 0.94) * c.threads + 5.0 * pairs + 10.0 * c.KPT + cluster + issue + 100.0) / 1750.0;
  }
  /* R~ in shared memory (bwd_persist_kernel): one thread's chain of S-strided loads and FMAs, the
   * CTA's FMAs, and the dq values pushed into the cluster's peers (st.async, counted on their
   * mbarriers), in cycles per wave; fitted by least squares (non-negative) to the measured steps of
   * every forced shape (K 1-16, NB 1-8, S 1-32) at six shapes, N 4-128 and H 64-256, on an H200
   * (bench/cuda_int_gru.md, session 50: the previous model, the float kernels' with a cluster
   * barrier's cost, chose steps up to 1.6x the best at N 32-64) */
  const double serial = (double)(((int64_t)kd + c.S - 1) / c.S) * (12.0 + NB);
  const double fma = Hk * kd * NB / 128.0, remote = c.K > 1 ? 3.0 * NB * Hk * c.K : 0.0;
  (void)ctx;
  return (double)((blocks + slots - 1) / slots) * (1590.0 + 1.33 * serial + 3.36 * fma + 0.85 * remote) / 1750.0;
}

/* The configuration with the best estimate that the device can place (*found = 1), or none. */
static qg_status bp_choose_uncached(qg_ctx *ctx, const char *fn, int64_t N, int64_t H, bp_plan *out, double *step_us, int *found) {
  *found = 0;
  static const int Ks[5] = {1, 2, 4, 8, 16}, NBs[4] = {1, 2, 4, 8};
  enum { MAXC = 200 };
  bp_plan cand[MAXC];
  double est[MAXC];
  int nc = 0;
  const int forced = ctx->persist_cluster > 0;   /* qg_ctx_set_persist_shape */
  /* where R~ is held: 0 either, 1 shared memory, 2 registers, 3 registers with the roles on
   * separate warps, 4 the same with the cell's inputs prepared by warps of their own
   * (qg_ctx_set_persist_shape's storage).
   * Unforced, the register variant is a candidate without clusters only: its three dq values per
   * unit go into every peer's shared memory, which made the float register backward slower than
   * the shared-memory one in clusters (bench/gpu.md, run 4's sweep). */
  const int storage = ctx->persist_storage == 5 ? 2 : ctx->persist_storage;   /* 5 (a forward variant): registers */
  for (int ki = 0; ki < 5; ki++) {
    const int K = Ks[ki];
    if (K > H) break;
    if (forced && K != ctx->persist_cluster) continue;
    const int Hk = (int)((H + K - 1) / K);
    if ((int64_t)(K - 1) * Hk >= H || Hk > BP_MAX_THREADS) continue;
    for (int ni = 0; ni < 4; ni++) {
      const int NB = NBs[ni];
      if (forced ? NB != ctx->persist_rows : (NB > 1 && NB / 2 >= N)) continue;   /* no group wider than the batch needs */
      if (NB * Hk > BP_MAX_THREADS) break;
      /* (S, KPT) pairs: shared memory (KPT = 0): S threads per unit, the most that fit and 1/2,
       * 1/4, 1/8 of that (or the forced count); registers: S = 1..32 lanes (powers of two,
       * NB <= S), KPT the smallest instantiated share that covers 3H / S */
      int Ss[24], Kp[24], nsk = 0;
      if (storage == 0 || storage == 1) {
        int Smax = BP_MAX_THREADS / Hk;
        if (Smax > 3 * H) Smax = (int)(3 * H);
        const int fs = forced && ctx->persist_splits > 0 ? (ctx->persist_splits < Smax ? ctx->persist_splits : Smax) : 0;
        for (int S = fs ? fs : Smax, ns = 0; S >= 1 && ns < (fs ? 1 : 4); S /= 2, ns++) { Ss[nsk] = S; Kp[nsk++] = 0; }
      }
      int Ws[24];
      for (int q = 0; q < 24; q++) Ws[q] = 0;
      if (storage == 2 || (storage == 0 && K == 1))
        for (int S = 1; S <= 32; S *= 2) {
          if (S < NB || (forced && ctx->persist_splits > 0 && S != ctx->persist_splits)) continue;
          const int64_t need = (3 * H + S - 1) / S;
          int kpt = 0;
          for (int i = 0; i < 4 && !kpt; i++)
            if (BP_KPT[i] >= need) kpt = BP_KPT[i];
          if (!kpt || (3 * H + kpt - 1) / kpt < S / 2 + 1) continue;   /* no lane group more than half idle */
          if ((int64_t)Hk * S > persist_reg_threads(kpt) || !bp_kernel_for(NB, kpt)) continue;
          Ss[nsk] = S; Kp[nsk++] = kpt;
        }
      /* the split roles (storage 3, or chosen): one row per CTA, no cluster; R~'s warps plus one
       * thread per unit */
      for (int ws = 1; ws <= 2; ws++) {
      if ((storage == 2 + ws || storage == 0) && K == 1 && NB == 1)
        for (int S = 1; S <= 32 && nsk < 24; S *= 2) {
          if (forced && ctx->persist_splits > 0 && S != ctx->persist_splits) continue;
          const int64_t need = (3 * H + S - 1) / S;
          int kpt = 0;
          for (int i = 0; i < 4 && !kpt; i++)
            if (BP_KPT[i] >= need) kpt = BP_KPT[i];
          if (!kpt || (3 * H + kpt - 1) / kpt < S / 2 + 1) continue;
          if (round_up(H * S, 32) + ws * round_up(H, 32) > persist_reg_threads(kpt)) continue;
          Ss[nsk] = S; Kp[nsk] = kpt; Ws[nsk++] = ws;
        }
      }
      for (int si = 0; si < nsk; si++) {
        const int S = Ss[si];
        bp_plan c;
        c.K = K; c.Hk = Hk; c.NB = NB; c.S = S; c.KPT = Kp[si]; c.WS = Ws[si];
        c.threads = (int)round_up(c.KPT ? Hk * S : (Hk * S > NB * Hk ? Hk * S : NB * Hk), 32);
        if (c.WS) c.threads = (int)(round_up(H * S, 32) + c.WS * round_up(H, 32));
        c.groups = (int)((N + NB - 1) / NB);
        int64_t bytes = bp_smem(H, Hk, NB, S, c.KPT, c.WS);
        if (bytes > ctx->smem_optin || nc >= MAXC) continue;
        /* one CTA per multiprocessor (as the float kernels: a step waits for its slowest CTA) */
        if (bytes < ctx->smem_optin / 2 + 1024) bytes = ctx->smem_optin / 2 + 1024;
        c.smem = (int)bytes;
        cand[nc] = c;
        est[nc] = 0;
        nc++;
      }
    }
  }
  for (int i = 0; i < nc; i++) {
    const bp_kernel f = bp_kernel_for(cand[i].NB, cand[i].KPT, cand[i].WS);
    int64_t slots = ctx->sm_count;
    if (cand[i].K > 1) {
      QG_CHECK(persist_prepare_kernel(ctx, fn, (const void *)f));
      cudaLaunchAttribute at[1];
      cudaLaunchConfig_t lc = bp_launch_config(ctx, cand[i], at);
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, f, &lc) != cudaSuccess) { n = 0; (void)cudaGetLastError(); }
      slots = (int64_t)n * cand[i].K;
    }
    est[i] = slots >= cand[i].K ? bp_step_us(ctx, cand[i], H, slots) : -1.0;
#ifdef QG_BP_TRACE   /* experiment builds only: each candidate and its estimate (bench/int_gru_bwd_shapes.lua) */
    fprintf(stderr, "BPC N %lld H %lld K %d NB %d S %d KPT %d WS %d Hk %d threads %d groups %d slots %lld est %.4f\n", (long long)N,
            (long long)H, cand[i].K, cand[i].NB, cand[i].S, cand[i].KPT, cand[i].WS, cand[i].Hk, cand[i].threads, cand[i].groups,
            (long long)slots, est[i]);
#endif
  }
  int bi = -1;
  for (int i = 0; i < nc; i++)
    if (est[i] >= 0 && (bi < 0 || est[i] < est[bi])) bi = i;
  if (bi >= 0) { *out = cand[bi]; *step_us = est[bi]; *found = 1; }
  return QG_OK;
}

/* Memoized per device and shape (the search runs occupancy queries). */
qg_status int_bwd_persist_choose(qg_ctx *ctx, const char *fn, int64_t N, int64_t H, bp_plan *out, double *step_us, int *found) {
  enum { MEMO = 64 };
  static struct { int64_t N, H; int key[6], found; bp_plan c; double us; } memo[MEMO];
  static int nmemo = 0, next = 0;
  const int key[6] = {ctx->device_index, ctx->smem_optin, ctx->persist_cluster, ctx->persist_rows, ctx->persist_splits,
                      ctx->persist_storage};
  for (int i = 0; i < nmemo; i++)
    if (memo[i].N == N && memo[i].H == H && memcmp(memo[i].key, key, sizeof key) == 0) {
      *out = memo[i].c; *step_us = memo[i].us; *found = memo[i].found;
      return QG_OK;
    }
  QG_CHECK(bp_choose_uncached(ctx, fn, N, H, out, step_us, found));
  const int k = nmemo < MEMO ? nmemo++ : (next++ % MEMO);
  memo[k].N = N; memo[k].H = H; memcpy(memo[k].key, key, sizeof key);
  memo[k].found = *found; memo[k].c = *found ? *out : bp_plan{}; memo[k].us = *found ? *step_us : 0.0;
  return QG_OK;
}

qg_status int_bwd_persist_launch(qg_ctx *ctx, const char *fn, const bwd_params &p, const bp_plan &c, float *dh) {
  const bp_kernel f = bp_kernel_for(c.NB, c.KPT, c.WS);
  QG_CHECK(persist_prepare_kernel(ctx, fn, (const void *)f));
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t lc = bp_launch_config(ctx, c, at);
  QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelEx(&lc, f, p, c, dh));
  QG_CHECK(qg_cuda_launched(ctx, fn));
  return QG_OK;
}

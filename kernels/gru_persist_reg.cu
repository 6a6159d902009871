/*
 * gru_persist_reg.cu: the persistent recurrent kernels with R held in registers (for small H; the
 * shared-memory variant of kernels/gru_persist.cu holds larger shares). Same launch layout as that
 * file (clusters of K blocks, NB batch rows per cluster, block k owns units [k Hk, (k + 1) Hk)),
 * but each hidden unit's dot product is split over S consecutive lanes of one warp (S a power of two,
 * at most 32): lane ms of unit mu keeps R's KPT entries of its share in registers, multiplies them
 * with the state read from shared memory as float4 (lanes of different units read the same words:
 * broadcast), and the S lanes add their partial sums with a butterfly of shuffles (every lane gets
 * the same bits). Lane ms = b of the unit then runs row b's cell (NB <= S). So a step needs one
 * barrier, the one that publishes the new state (forward: h; backward: dq) to the cluster.
 * The state rows are padded with zeros to S KPT entries (hb [2][NB][S KPT] forward, qb [2][NB][S KPT]
 * backward, KPT a multiple of 4); the prefetch rings are those of the shared-memory kernels.
 */
#include "gru_persist.cuh"

template <int NB, int KPT>
__global__ void __launch_bounds__(persist_reg_threads(3 * KPT), 1) fwd_reg_kernel(const FwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const FwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, N = a.N, T = a.T, Hk = c.Hk, S = c.S, K = c.K;
  const int Hp = S * KPT;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  const int NBHk = NB * Hk;
  float *hb = sm;                     /* [2][NB][Hp] */
  float *ring = hb + 2 * NB * Hp;     /* [PERSIST_PREFETCH][NB Hk][3] */
  const int tid = threadIdx.x, nth = blockDim.x;
  const int ms = tid % S, mu = tid / S;

  float Rr[3][KPT];   /* R[g H + k0 + mu][ms KPT + i]; 0 past H and past the block's units */
#pragma unroll
  for (int g = 0; g < 3; g++)
#pragma unroll
    for (int i = 0; i < KPT; i++) {
      const int k = ms * KPT + i;
      Rr[g][i] = (mu < hk && k < H) ? D.R[((int64_t)g * H + k0 + mu) * H + k] : 0.0f;
    }
  for (int i = tid; i < 2 * NB * Hp; i += nth) {
    const int b = (i / Hp) % NB, k = i % Hp;
    hb[i] = (i < NB * Hp && b < rows && k < H && D.h0) ? D.h0[(int64_t)(n0 + b) * H + k] : 0.0f;
  }

  /* (row, unit) role: lane ms = pb of unit mu, ring slot pb Hk + mu */
  const int pb = ms;
  const bool pact = pb < NB && pb < rows && mu < hk;
  FwdUnit un = {};
  un.pn = n0 + pb; un.pj = k0 + mu; un.slot = pb * Hk + mu; un.NBHk = NBHk;
  un.L = pact ? gru_row_len(a.len, un.pn, T) : 0;
  const int pj = un.pj;
  if (pact) fwd_unit_start(D, H, N, ring, un);

  cluster_barrier(K);

  for (int s = 0; s < T; s++) {
    const float *hc = hb + (s & 1) * NB * Hp;
    float acc[3 * NB];
#pragma unroll
    for (int i = 0; i < 3 * NB; i++) acc[i] = 0.0f;
    const float *hr = hc + ms * KPT;
    /* two chains per sum (even and odd groups of four entries), added at the end: shorter
     * dependent FMA chains, a fixed order */
    float acc2[3 * NB];
#pragma unroll
    for (int i = 0; i < 3 * NB; i++) acc2[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < KPT; i += 4) {
#pragma unroll
      for (int b = 0; b < NB; b++) {
        const float4 h4 = *reinterpret_cast<const float4 *>(hr + b * Hp + i);
#pragma unroll
        for (int g = 0; g < 3; g++) {
          float v = (i & 4) ? acc2[g * NB + b] : acc[g * NB + b];
          v = fmaf(Rr[g][i], h4.x, v);
          v = fmaf(Rr[g][i + 1], h4.y, v);
          v = fmaf(Rr[g][i + 2], h4.z, v);
          v = fmaf(Rr[g][i + 3], h4.w, v);
          if (i & 4) acc2[g * NB + b] = v;
          else acc[g * NB + b] = v;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 3 * NB; i++) acc[i] += acc2[i];
    group_sum(acc, S);
    if (pact) {
      float rz = acc[0], rr = acc[NB], rg = acc[2 * NB];
#pragma unroll
      for (int b = 1; b < NB; b++)
        if (pb == b) { rz = acc[b]; rr = acc[NB + b]; rg = acc[2 * NB + b]; }
      const float h = fwd_unit_step<false>(a, D, ring, un, s, rz, rr, rg, hc[pb * Hp + pj], D.gates != NULL);
      cluster_store(cl, K, hb + ((s + 1) & 1) * NB * Hp + pb * Hp + pj, h);
    }
    cluster_barrier(K);
  }
}

template <int NB, int KPT>
__global__ void __launch_bounds__(persist_reg_threads(KPT), 1) bwd_reg_kernel(const BwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const BwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, N = a.N, T = a.T, Hk = c.Hk, S = c.S, K = c.K, H3 = 3 * a.H;
  const int Jp = S * KPT;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  const int NBHk = NB * Hk;
  float *qb = sm;                     /* [2][NB][Jp] */
  float *ring = qb + 2 * NB * Jp;     /* [PERSIST_PREFETCH][NB Hk][6] */
  const int tid = threadIdx.x, nth = blockDim.x;
  const int ms = tid % S, mu = tid / S;

  float Rr[KPT];   /* R[ms KPT + i][k0 + mu]; 0 past 3H and past the block's units */
  reg_share_load<KPT>(Rr, D.R, H, H3, ms, k0 + mu, mu < hk);
  for (int i = tid; i < 2 * NB * Jp; i += nth) qb[i] = 0.0f;

  /* (row, unit) role: lane ms = pb of unit mu, ring slot pb Hk + mu */
  const int pb = ms;
  const bool pact = pb < NB && pb < rows && mu < hk;
  BwdUnit un = {};
  un.pn = n0 + pb; un.pj = k0 + mu; un.slot = pb * Hk + mu; un.NBHk = NBHk;
  un.L = pact ? gru_row_len(a.len, un.pn, T) : 0;
  const int pn = un.pn, pj = un.pj;
  float dh = pact ? bwd_unit_start(a, D, ring, un) : 0.0f;

  cluster_barrier(K);

  for (int s = T - 1; s >= 0; s--) {
    float *qc = qb + (s & 1) * NB * Jp;
    float keep = 0.0f, dz = 0.0f, dr = 0.0f, dg = 0.0f, dgr = 0.0f;
    int tp = s;   /* the time index of dp's row */
    if (pact) {
      bwd_unit_cell(a, D, ring, un, s, dh, dz, dr, dg, dgr, keep, tp);
      cluster_store3(cl, K, qc + pb * Jp + pj, H, dz, dr, dgr);
    }
    cluster_barrier(K);
    const float *qr = qc + ms * KPT;
    constexpr int PV = reg_pre<NB, KPT>::V;
    float4 pre[PV][NB];
    reg_pre_load<NB, KPT>(pre, qr, Jp);
    if (pact) bwd_unit_store(a, D, ring, un, s, tp, dz, dr, dg, dgr);   /* off the dependent chain: step s's dp and dq, the prefetch */
    /* dh = keep + (dq R^T) for this lane's row, on every lane (the sums are collective) */
    const float sum = dq_rt_reg<NB, KPT, PV>(Rr, pre, qr, Jp, S, pb);
    if (pact) dh = keep + sum;
  }
  if (pact && D.dh0) D.dh0[(int64_t)pn * H + pj] = dh;
}

/* The instantiated register shares: forward KPT 4, 8, 16 (3 KPT registers of R per thread; rows
 * per cluster 1, 2, 4, 8), 32 (rows 1, 2) and 64 (one row: one thread per unit, H <= 64); backward
 * 12, 24, 48 (KPT registers; rows 1..8) and 96 (rows 1, 2). Shares above 48 registers of R run at
 * most persist_reg_threads(...) = 256 threads per block (255 registers per thread). */
const void *persist_reg_kernel(int bwd, int NB, int KPT) {
  if (bwd && KPT == 96) return NB == 1 ? (const void *)bwd_reg_kernel<1, 96> : NB == 2 ? (const void *)bwd_reg_kernel<2, 96> : NULL;
  if (!bwd && KPT == 32) return NB == 1 ? (const void *)fwd_reg_kernel<1, 32> : NB == 2 ? (const void *)fwd_reg_kernel<2, 32> : NULL;
  if (!bwd && KPT == 64) return NB == 1 ? (const void *)fwd_reg_kernel<1, 64> : NULL;
#define QG_REG_K(nb)                                                                                            \
  if (NB == nb) {                                                                                               \
    if (bwd) return KPT == 12 ? (const void *)bwd_reg_kernel<nb, 12> : KPT == 24 ? (const void *)bwd_reg_kernel<nb, 24> \
                  : KPT == 48 ? (const void *)bwd_reg_kernel<nb, 48> : NULL;                                    \
    return KPT == 4 ? (const void *)fwd_reg_kernel<nb, 4> : KPT == 8 ? (const void *)fwd_reg_kernel<nb, 8>             \
         : KPT == 16 ? (const void *)fwd_reg_kernel<nb, 16> : NULL;                                             \
  }
  QG_REG_K(1) QG_REG_K(2) QG_REG_K(4) QG_REG_K(8)
#undef QG_REG_K
  return NULL;
}

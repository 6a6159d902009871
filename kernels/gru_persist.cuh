/*
 * gru_persist.cuh: device helpers of the persistent recurrent kernels (kernels/gru_persist.cu: R in
 * shared memory; kernels/gru_persist_reg.cu: R in registers; the integer STE backward's
 * persistent recurrence, kernels/int_gru_bwd_persist.cu, both storages, and its step kernels): the cluster barrier, the wait of the per-thread
 * prefetch rings, and the fixed-order sums of partial dot products (shared-memory partials,
 * lane butterflies).
 */
#ifndef QGRU_GRU_PERSIST_CUH
#define QGRU_GRU_PERSIST_CUH

#include "gru_common.cuh"
#include "ptx.cuh"   /* cp.async */

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

__device__ __forceinline__ void cluster_barrier(int K) {
  if (K > 1) cg::this_cluster().sync();
  else __syncthreads();
}

/* Per-thread asynchronous copies (cp_async4 of ptx.cuh): a thread's loads of later steps land in
 * its own slots of a shared-memory ring; it waits for its own groups only, so no barrier is
 * involved: all but the newest PERSIST_PREFETCH - 2 groups of the thread are complete. */
__device__ __forceinline__ void cp_async_wait_step() { cp_async_wait<PERSIST_PREFETCH - 2>(); }

/* ---- the float kernels' block layout and (row, unit) work, shared by the shared-memory kernels
 * (gru_persist.cu) and the register ones (gru_persist_reg.cu) ---- */

/* A block's place: its rank in the cluster, its units [k0, k0 + hk) (Hk per block), its cluster's
 * rows [n0, n0 + rows) (NB per cluster; the clusters along blockIdx.x). */
struct PBlock {
  int rank, k0, hk, n0, rows;
};
__device__ __forceinline__ PBlock persist_block(const cg::cluster_group &cl, int K, int Hk, int NB, int H, int N) {
  PBlock b;
  b.rank = K > 1 ? (int)cl.block_rank() : 0;
  b.k0 = b.rank * Hk;
  b.hk = min(Hk, H - b.k0);
  b.n0 = (int)(blockIdx.x / K) * NB;
  b.rows = min(NB, N - b.n0);
  return b;
}

/* p[0], p[H], p[2 H] = v0, v1, v2 in every block of the cluster (distributed shared memory; K = 1:
 * this block's) */
__device__ __forceinline__ void cluster_store3(cg::cluster_group &cl, int K, float *p, int H, float v0, float v1, float v2) {
  if (K == 1) {
    p[0] = v0; p[H] = v1; p[2 * H] = v2;
    return;
  }
  for (int rk = 0; rk < K; rk++) {
    float *q = cl.map_shared_rank(p, rk);
    q[0] = v0; q[H] = v1; q[2 * H] = v2;
  }
}
/* *p = v in every block of the cluster */
__device__ __forceinline__ void cluster_store(cg::cluster_group &cl, int K, float *p, float v) {
  if (K == 1) *p = v;
  else
    for (int rk = 0; rk < K; rk++) *cl.map_shared_rank(p, rk) = v;
}

/* The forward's (row, unit) thread: row pn, unit pj, valid steps L, its slot `slot` of the ring
 * [PERSIST_PREFETCH][NBHk][3] (x W^T of the coming steps) and its unit's biases. */
struct FwdUnit {
  int pn, pj, L, slot, NBHk;
  float bxz, bxr, bxg, brz, brr, brg;
};
/* step s's x W^T (valid steps) into ring slot s % PERSIST_PREFETCH; one group per step */
__device__ __forceinline__ void fwd_unit_issue(const FwdDir &D, int H, int N, float *ring, const FwdUnit &u, int s) {
  if (s < u.L) {
    const float *w = D.Wx + ((int64_t)(D.reverse ? u.L - 1 - s : s) * N + u.pn) * 3 * H + u.pj;
    float *d = ring + ((s % PERSIST_PREFETCH) * u.NBHk + u.slot) * 3;
    cp_async4(d, w); cp_async4(d + 1, w + H); cp_async4(d + 2, w + 2 * H);
  }
  cp_async_commit();
}
/* The unit's biases, h_0 into hs[0], and the first PERSIST_PREFETCH - 1 steps' x W^T in flight
 * (an active thread only). */
__device__ __forceinline__ void fwd_unit_start(const FwdDir &D, int H, int N, float *ring, FwdUnit &u) {
  u.bxz = D.bx[u.pj]; u.bxr = D.bx[H + u.pj]; u.bxg = D.bx[2 * H + u.pj];
  u.brz = D.br[u.pj]; u.brr = D.br[H + u.pj]; u.brg = D.br[2 * H + u.pj];
  D.hs[(int64_t)u.pn * H + u.pj] = D.h0 ? D.h0[(int64_t)u.pn * H + u.pj] : 0.0f;
  for (int q = 0; q < PERSIST_PREFETCH - 1; q++) fwd_unit_issue(D, H, N, ring, u, q);
}
/* Step s of the forward's (row, unit) thread once its R h sums rz, rr, rg are formed: the cell on
 * its ring slot (valid steps; OBS: the statistics) or the padded pass-through (the state stays, y at
 * time index s is 0); y and, with `gates`, the saved gates written; then step s + PERSIST_PREFETCH
 * - 1's x W^T into the slot step s - 1 used, and h into hs. Returns h. */
template <bool OBS>
__device__ __forceinline__ float fwd_unit_step(const FwdArgs &a, const FwdDir &D, float *ring, const FwdUnit &u, int s, float rz, float rr,
                                               float rg, float hp, bool gates) {
  const int H = a.H, N = a.N;
  float h;
  cp_async_wait_step();
  if (s < u.L) {
    const int t = D.reverse ? u.L - 1 - s : s;
    const float *w = ring + ((s % PERSIST_PREFETCH) * u.NBHk + u.slot) * 3;
    float z, r, g, q;
    h = gru_cell<OBS>(w[0], w[1], w[2], rz, rr, rg, u.bxz, u.bxr, u.bxg, u.brz, u.brr, u.brg, hp, z, r, g, q, a.range, a.counts);
    D.y[((int64_t)t * N + u.pn) * a.Hy + D.y_offset + u.pj] = h;
    if (gates) {
      float *gp = D.gates + ((int64_t)s * N + u.pn) * 4 * H + u.pj;
      gp[0] = z; gp[H] = r; gp[2 * H] = g; gp[3 * H] = q;
    }
  } else {
    h = hp;
    D.y[((int64_t)s * N + u.pn) * a.Hy + D.y_offset + u.pj] = 0.0f;
    if (gates) {
      float *gp = D.gates + ((int64_t)s * N + u.pn) * 4 * H + u.pj;
      gp[0] = 0.0f; gp[H] = 0.0f; gp[2 * H] = 0.0f; gp[3 * H] = 0.0f;
    }
  }
  fwd_unit_issue(D, H, N, ring, u, s + PERSIST_PREFETCH - 1);
  D.hs[((int64_t)(s + 1) * N + u.pn) * H + u.pj] = h;
  return h;
}

/* The backward's (row, unit) thread: row pn, unit pj, valid steps L, its slot of the ring
 * [PERSIST_PREFETCH][NBHk][6] (z r g q, h, dy of the coming steps, in step order T - 1, T - 2, ...). */
struct BwdUnit {
  int pn, pj, L, slot, NBHk;
};
/* the saved values of step s (valid steps) into ring slot (T - 1 - s) % PERSIST_PREFETCH */
__device__ __forceinline__ void bwd_unit_issue(const BwdArgs &a, const BwdDir &D, float *ring, const BwdUnit &u, int s) {
  const int H = a.H, N = a.N;
  if (s >= 0 && s < u.L) {
    float *d = ring + (((a.T - 1 - s) % PERSIST_PREFETCH) * u.NBHk + u.slot) * 6;
    const float *gp = D.gates + ((int64_t)s * N + u.pn) * 4 * H + u.pj;
    cp_async4(d, gp); cp_async4(d + 1, gp + H); cp_async4(d + 2, gp + 2 * H); cp_async4(d + 3, gp + 3 * H);
    cp_async4(d + 4, D.hs + ((int64_t)s * N + u.pn) * H + u.pj);
    if (D.dy) cp_async4(d + 5, D.dy + ((int64_t)(D.reverse ? u.L - 1 - s : s) * N + u.pn) * a.Hy + D.y_offset + u.pj);
  }
  cp_async_commit();
}
/* dL/dh_T (dhn) and the first PERSIST_PREFETCH - 1 steps' values in flight; returns dh */
__device__ __forceinline__ float bwd_unit_start(const BwdArgs &a, const BwdDir &D, float *ring, const BwdUnit &u) {
  for (int q = 0; q < PERSIST_PREFETCH - 1; q++) bwd_unit_issue(a, D, ring, u, a.T - 1 - q);
  return D.dhn ? D.dhn[(int64_t)u.pn * a.H + u.pj] : 0.0f;
}
/* Step s of the backward's (row, unit) thread from dh: the cell backward on its ring slot (valid
 * steps) or the padded pass-through (no gate gradients); dz, dr, dg, dgr = dg r, the direct part
 * keep of dL/dh_{s-1}, and tp, the time index of dp's row. */
__device__ __forceinline__ void bwd_unit_cell(const BwdArgs &a, const BwdDir &D, const float *ring, const BwdUnit &u, int s, float dh,
                                              float &dz, float &dr, float &dg, float &dgr, float &keep, int &tp) {
  dz = dr = dg = dgr = 0.0f;
  tp = s;
  cp_async_wait_step();
  if (s < u.L) {
    const float *v = ring + (((a.T - 1 - s) % PERSIST_PREFETCH) * u.NBHk + u.slot) * 6;
    const float gz = v[0], gr = v[1], gg = v[2], gq = v[3], hp = v[4];
    tp = D.reverse ? u.L - 1 - s : s;
    const float dht = D.dy ? dh + v[5] : dh;
    gru_cell_backward(gz, gr, gg, gq, hp, dht, dz, dr, dg, keep);
    dgr = dg * gr;
  } else {
    keep = dh;
  }
}
/* step s's dp (time row tp) and dq rows of the unit, then step s - (PERSIST_PREFETCH - 1)'s values
 * into the slot step s + 1 used */
__device__ __forceinline__ void bwd_unit_store(const BwdArgs &a, const BwdDir &D, float *ring, const BwdUnit &u, int s, int tp, float dz,
                                               float dr, float dg, float dgr) {
  const int H = a.H, N = a.N, H3 = 3 * a.H;
  float *dp = D.dp + ((int64_t)tp * N + u.pn) * H3 + u.pj;
  dp[0] = dz; dp[H] = dr; dp[2 * H] = dg;
  bwd_unit_issue(a, D, ring, u, s - (PERSIST_PREFETCH - 1));
  float *dq = D.dq + ((int64_t)s * N + u.pn) * H3 + u.pj;
  dq[0] = dz; dq[H] = dr; dq[2 * H] = dgr;
}

/* sum of n partials p[0], p[stride], ... in four interleaved chains (a fixed order) */
/* The backward's share of dh = dq R^T for unit mu: lane ms of the unit sums rows j = ms, ms + S,
 * ... of the 3H rows (sequential fp32 FMAs, a fixed order) for each of the NB rows' dq (qc
 * [NB][3H]) against R^T's column mu (Rt [3H][Hk]) and writes its partial sums to
 * part[(ms NB + b) Hk + mu]; sum_partials then adds the S partials in a fixed order. */
template <int NB>
__device__ __forceinline__ void dq_rt_partials(float *part, const float *Rt, const float *qc, int mu, int ms, int S, int H3,
                                               int Hk) {
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) acc[b] = 0.0f;
  const float *rp = Rt + mu;
#pragma unroll 4
  for (int j = ms; j < H3; j += S) {
    const float rv = rp[j * Hk];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = fmaf(rv, qc[b * H3 + j], acc[b]);
  }
#pragma unroll
  for (int b = 0; b < NB; b++) part[(ms * NB + b) * Hk + mu] = acc[b];
}

__device__ __forceinline__ float sum_partials(const float *p, int n, int stride) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  int q = 0;
  for (; q + 4 <= n; q += 4) {
    a0 += p[q * stride]; a1 += p[(q + 1) * stride]; a2 += p[(q + 2) * stride]; a3 += p[(q + 3) * stride];
  }
  for (; q < n; q++) a0 += p[q * stride];
  return (a0 + a1) + (a2 + a3);
}

/* The butterfly over the S lanes of a unit's group (S a power of two, at most 32, the group within
 * one warp; every lane of the warp calls it): afterwards each lane holds the full sum, the same
 * bits in every lane. */
template <int NV>
__device__ __forceinline__ void group_sum(float (&v)[NV], int S) {
  for (int o = S >> 1; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}

/* The register kernels' share of R (float [3H][H], row-major; the float backward's and the
 * integer STE backward's): Rr[i] = R[ms KPT + i][col], 0 past 3H and where the lane holds no
 * column (own false). */
template <int KPT>
__device__ __forceinline__ void reg_share_load(float (&Rr)[KPT], const float *R, int H, int H3, int ms, int col, bool own) {
#pragma unroll
  for (int i = 0; i < KPT; i++) {
    const int j = ms * KPT + i;
    Rr[i] = (own && j < H3) ? R[(int64_t)j * H + col] : 0.0f;
  }
}

/* One lane's share of dh = dq R^T in the register kernels (the float backward's and the integer
 * STE backward's, gru_persist_reg.cu and int_gru_bwd_persist.cu): its KPT entries of R's row (Rr)
 * against the same entries of each of the NB rows' dq (qr, row stride Jp; the first PV float4
 * words per row already loaded into pre), in four chains per row (groups of four entries, round
 * robin) added in a fixed order, then the butterfly over the unit's S lanes. Returns row pb's sum
 * (every lane of the group gets the same bits). */
template <int NB, int KPT, int PV>
__device__ __forceinline__ float dq_rt_reg(const float (&Rr)[KPT], const float4 (&pre)[PV][NB], const float *qr, int Jp, int S, int pb) {
  float ch[4][NB];
#pragma unroll
  for (int c4 = 0; c4 < 4; c4++)
#pragma unroll
    for (int b = 0; b < NB; b++) ch[c4][b] = 0.0f;
#pragma unroll
  for (int i = 0; i < KPT; i += 4) {
#pragma unroll
    for (int b = 0; b < NB; b++) {
      const float4 q4 = i / 4 < PV ? pre[i / 4 < PV ? i / 4 : 0][b] : *reinterpret_cast<const float4 *>(qr + b * Jp + i);
      float v = ch[(i / 4) % 4][b];
      v = fmaf(Rr[i], q4.x, v);
      v = fmaf(Rr[i + 1], q4.y, v);
      v = fmaf(Rr[i + 2], q4.z, v);
      v = fmaf(Rr[i + 3], q4.w, v);
      ch[(i / 4) % 4][b] = v;
    }
  }
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) acc[b] = (ch[0][b] + ch[1][b]) + (ch[2][b] + ch[3][b]);
  group_sum(acc, S);
  float sum = acc[0];
#pragma unroll
  for (int b = 1; b < NB; b++)
    if (pb == b) sum = acc[b];
  return sum;
}

/* How many of a step's float4 state words per row a thread reads into registers before the work
 * that does not depend on them (the previous step's global stores, the prefetch): their
 * shared-memory latency then overlaps that work. */
template <int NB, int KPT>
struct reg_pre {
  static constexpr int W = NB >= 4 ? 1 : 4 / NB;   /* at most 16 registers while NB <= 4 */
  static constexpr int V = KPT / 4 < W ? KPT / 4 : W;
};

/* The first reg_pre<NB, KPT>::V float4 words of each of a step's NB dq rows (row b at q + b ld)
 * into registers, issued right after the exchange's barrier so that they land while the work off
 * the dependent chain runs. */
template <int NB, int KPT>
__device__ __forceinline__ void reg_pre_load(float4 (&pre)[reg_pre<NB, KPT>::V][NB], const float *q, int ld) {
#pragma unroll
  for (int v = 0; v < reg_pre<NB, KPT>::V; v++)
#pragma unroll
    for (int b = 0; b < NB; b++) pre[v][b] = *reinterpret_cast<const float4 *>(q + b * ld + 4 * v);
}

#endif

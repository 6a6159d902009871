/*
 * gru_persist.cuh: device helpers of the persistent recurrent kernels (kernels/gru_persist.cu: R in
 * shared memory; kernels/gru_persist_reg.cu: R in registers; the integer STE backward of
 * kernels/int_gru_backward.cu, both storages): the cluster barrier, per-thread asynchronous copies
 * for the prefetch rings, and the fixed-order sums of partial dot products (shared-memory partials,
 * lane butterflies).
 */
#ifndef QGRU_GRU_PERSIST_CUH
#define QGRU_GRU_PERSIST_CUH

#include "gru_common.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

__device__ __forceinline__ void cluster_barrier(int K) {
  if (K > 1) cg::this_cluster().sync();
  else __syncthreads();
}

/* Per-thread asynchronous copies (sm_80+): a thread's loads of later steps land in its own slots of
 * a shared-memory ring; it waits for its own groups only, so no barrier is involved. */
__device__ __forceinline__ void cp_async4(float *smem, const float *gmem) {
  const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* all but the newest PERSIST_PREFETCH - 2 groups of this thread are complete */
__device__ __forceinline__ void cp_async_wait_step() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PERSIST_PREFETCH - 2) : "memory");
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

/* One lane's share of dh = dq R^T in the register kernels (the float backward's and the integer
 * STE backward's, gru_persist_reg.cu and int_gru_backward.cu): its KPT entries of R's row (Rr)
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

#endif

/*
 * gru_persist.cu: the persistent recurrent kernels of the float GRU: one launch runs all T steps
 * of one or two directions, with R on chip. Used by kernels/gru.cu (see gru_common.cuh).
 *
 * Layout. A cluster of K blocks (K = 1, 2, 4, 8 or 16; 16 needs the non-portable cluster size)
 * runs NB batch rows; the launch has `groups` = ceil(N / NB) clusters per direction along x and the
 * directions along y, and clusters never wait for each other. Block k of a cluster owns the hidden
 * units U_k = [k Hk, min(H, (k + 1) Hk)).
 *   forward:  shared memory holds R's rows of U_k for the three gates, transposed:
 *             Rs[k][g Hk + u] = R[g H + k0 + u][k]; and the full state of the cluster's rows,
 *             hb[2][NB][H], double-buffered. Step s: the block computes R h for its units
 *             (S threads per unit, each a strided share of the H products, partial sums to
 *             shared memory), one thread per (row, unit) adds the partials in order and runs the
 *             cell, writes y/hs/gates, and stores its new h into hb[(s + 1) & 1] of every block of
 *             the cluster (distributed shared memory); one cluster barrier ends the step.
 *   backward: shared memory holds R's columns of U_k: Rt[j][u] = R[j][k0 + u], j < 3H; and the
 *             cluster rows' dq = (dz, dr, dg r), qb[2][NB][3H]. Step s (T-1 down to 0): one thread
 *             per (row, unit) runs the cell backward from its dh (kept in a register), writes dp
 *             and dq, and stores its three dq values into every block's qb; cluster barrier; the
 *             block computes dq R for its units (S threads per unit, partials in order) and the
 *             (row, unit) thread sets dh = z dht + (dq R)[u].
 * One cluster barrier per step suffices: a buffer written at step s is next written at step s + 2
 * (s - 2), after every block has passed the barrier that follows its last read.
 * Per-step global loads (x W^T of the next step; gates, hs and dy of the previous one) are issued
 * one step ahead. Strided shares (k = s0, s0 + S, ...) keep the shared-memory reads of a warp in
 * distinct banks or broadcast.
 */
#include "gru_persist.cuh"

#include <string.h>

/* ---- kernels -------------------------------------------------------------------------------------- */

template <int NB, bool OBS, bool TRAIN>
__global__ void __launch_bounds__(PERSIST_MAX_THREADS, 1) fwd_persist_kernel(const FwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const FwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, N = a.N, T = a.T, Hk = c.Hk, S = c.S, K = c.K;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  const int H3k = 3 * Hk, NBHk = NB * Hk;
  float *Rs = sm;                       /* [H][3 Hk] */
  float *hb = Rs + (size_t)H * H3k;     /* [2][NB][H] */
  float *part = hb + 2 * NB * H;        /* [S][3][NB][Hk] */
  float *ring = part + S * 3 * NBHk;    /* [PERSIST_PREFETCH][NB Hk][3]: x W^T of the coming steps */
  const int tid = threadIdx.x, nth = blockDim.x;

  for (int i = tid; i < H3k * H; i += nth) {
    const int c3 = i / H, k = i - c3 * H;
    const int g = c3 / Hk, u = c3 - g * Hk;
    Rs[k * H3k + c3] = u < hk ? D.R[((int64_t)g * H + k0 + u) * H + k] : 0.0f;
  }
  for (int i = tid; i < 2 * NB * H; i += nth) {
    const int b = (i / H) % NB, k = i % H;
    hb[i] = (i < NB * H && b < rows && D.h0) ? D.h0[(int64_t)(n0 + b) * H + k] : 0.0f;
  }

  /* (row, unit) role: thread tid < NB Hk is row tid / Hk, unit tid % Hk, ring slot tid */
  const int pb = tid / Hk, pu = tid - (tid / Hk) * Hk;
  const bool pact = pb < rows && pu < hk;
  FwdUnit un = {};
  un.pn = n0 + pb; un.pj = k0 + pu; un.slot = tid; un.NBHk = NBHk;
  un.L = pact ? gru_row_len(a.len, un.pn, T) : 0;
  const int pj = un.pj;
  if (pact) fwd_unit_start(D, H, N, ring, un);
  /* matrix-vector role: unit mu, share ms of the k range (k = ms, ms + S, ...) */
  const int mu = tid % Hk, ms = tid / Hk;
  const bool mv = ms < S;

  cluster_barrier(K);   /* every block's shared memory is set before any peer writes into it */

  for (int s = 0; s < T; s++) {
    const float *hc = hb + (s & 1) * NB * H;
    if (mv) {
      float acc[3][NB];
#pragma unroll
      for (int b = 0; b < NB; b++) { acc[0][b] = 0.0f; acc[1][b] = 0.0f; acc[2][b] = 0.0f; }
      const float *rp = Rs + mu;
#pragma unroll 4
      for (int k = ms; k < H; k += S) {
        const float r0 = rp[k * H3k], r1 = rp[k * H3k + Hk], r2 = rp[k * H3k + 2 * Hk];
#pragma unroll
        for (int b = 0; b < NB; b++) {
          const float h = hc[b * H + k];
          acc[0][b] = fmaf(r0, h, acc[0][b]);
          acc[1][b] = fmaf(r1, h, acc[1][b]);
          acc[2][b] = fmaf(r2, h, acc[2][b]);
        }
      }
#pragma unroll
      for (int b = 0; b < NB; b++) {
        part[((ms * 3 + 0) * NB + b) * Hk + mu] = acc[0][b];
        part[((ms * 3 + 1) * NB + b) * Hk + mu] = acc[1][b];
        part[((ms * 3 + 2) * NB + b) * Hk + mu] = acc[2][b];
      }
    }
    __syncthreads();
    if (pact) {
      const float *p = part + pb * Hk + pu;
      const float rz = sum_partials(p, S, 3 * NBHk), rr = sum_partials(p + NBHk, S, 3 * NBHk),
                  rg = sum_partials(p + 2 * NBHk, S, 3 * NBHk);
      const float h = fwd_unit_step<OBS>(a, D, ring, un, s, rz, rr, rg, hc[pb * H + pj], TRAIN);
      cluster_store(cl, K, hb + ((s + 1) & 1) * NB * H + pb * H + pj, h);
    }
    cluster_barrier(K);
  }
}

template <int NB>
__global__ void __launch_bounds__(PERSIST_MAX_THREADS, 1) bwd_persist_kernel(const BwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const BwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, T = a.T, Hk = c.Hk, S = c.S, K = c.K, H3 = 3 * a.H;
  cg::cluster_group cl = cg::this_cluster();
  const PBlock pbk = persist_block(cl, K, Hk, NB, H, a.N);
  const int k0 = pbk.k0, hk = pbk.hk, n0 = pbk.n0, rows = pbk.rows;
  const int NBHk = NB * Hk;
  float *Rt = sm;                       /* [3H][Hk] */
  float *qb = Rt + (size_t)H3 * Hk;     /* [2][NB][3H] */
  float *part = qb + 2 * NB * H3;       /* [S][NB][Hk] */
  float *ring = part + S * NBHk;        /* [PERSIST_PREFETCH][NB Hk][6]: z r g q, h, dy of the coming steps */
  const int tid = threadIdx.x, nth = blockDim.x;

  for (int i = tid; i < H3 * Hk; i += nth) {
    const int j = i / Hk, u = i - j * Hk;
    Rt[i] = u < hk ? D.R[(int64_t)j * H + k0 + u] : 0.0f;
  }
  for (int i = tid; i < 2 * NB * H3; i += nth) qb[i] = 0.0f;

  /* (row, unit) role: thread tid < NB Hk is row tid / Hk, unit tid % Hk, ring slot tid */
  const int pb = tid / Hk, pu = tid - (tid / Hk) * Hk;
  const bool pact = pb < rows && pu < hk;
  BwdUnit un = {};
  un.pn = n0 + pb; un.pj = k0 + pu; un.slot = tid; un.NBHk = NBHk;
  un.L = pact ? gru_row_len(a.len, un.pn, T) : 0;
  const int pn = un.pn, pj = un.pj;
  float dh = pact ? bwd_unit_start(a, D, ring, un) : 0.0f;
  const int mu = tid % Hk, ms = tid / Hk;
  const bool mv = ms < S;

  cluster_barrier(K);

  for (int s = T - 1; s >= 0; s--) {
    float *qc = qb + (s & 1) * NB * H3;
    float keep = 0.0f;
    if (pact) {
      float dz, dr, dg, dgr;
      int tp;
      bwd_unit_cell(a, D, ring, un, s, dh, dz, dr, dg, dgr, keep, tp);
      bwd_unit_store(a, D, ring, un, s, tp, dz, dr, dg, dgr);
      cluster_store3(cl, K, qc + pb * H3 + pj, H, dz, dr, dgr);
    }
    cluster_barrier(K);
    if (mv) dq_rt_partials<NB>(part, Rt, qc, mu, ms, S, H3, Hk);
    __syncthreads();
    if (pact) dh = keep + sum_partials(part + pb * Hk + pu, S, NBHk);
  }
  if (pact && D.dh0) D.dh0[(int64_t)pn * H + pj] = dh;
}

/* ---- host side -------------------------------------------------------------------------------------- */

static const void *fwd_kernel(int NB, int obs, int train) {
#define QG_FWD_K(nb)                                                                             \
  if (NB == nb) {                                                                                \
    if (obs) return train ? (const void *)fwd_persist_kernel<nb, true, true>                     \
                          : (const void *)fwd_persist_kernel<nb, true, false>;                   \
    return train ? (const void *)fwd_persist_kernel<nb, false, true> : (const void *)fwd_persist_kernel<nb, false, false>; \
  }
  QG_FWD_K(1) QG_FWD_K(2) QG_FWD_K(4) QG_FWD_K(8)
#undef QG_FWD_K
  return NULL;
}

static const void *bwd_kernel(int NB) {
  switch (NB) {
    case 1: return (const void *)bwd_persist_kernel<1>;
    case 2: return (const void *)bwd_persist_kernel<2>;
    case 4: return (const void *)bwd_persist_kernel<4>;
    case 8: return (const void *)bwd_persist_kernel<8>;
  }
  return NULL;
}

/* Per kernel and device, once: the shared-memory opt-in and the non-portable cluster size (every
 * persistent cluster kernel: these and the integer STE backward's). The memo (and the one below)
 * holds device properties only, never call state. */
qg_status persist_prepare_kernel(qg_ctx *ctx, const char *fn, const void *f) {
  enum { MEMO = 256 };   /* more than the instantiated persistent kernels (past it: set again each call, harmless) */
  static struct { const void *f; int dev; } done[MEMO];
  static int ndone = 0;
  for (int i = 0; i < ndone; i++)
    if (done[i].f == f && done[i].dev == ctx->device_index) return QG_OK;
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, ctx->smem_optin));
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (ndone < MEMO) { done[ndone].f = f; done[ndone].dev = ctx->device_index; ndone++; }
  return QG_OK;
}

static cudaLaunchConfig_t launch_config(qg_ctx *ctx, const PCfg &c, int ndirs, cudaLaunchAttribute *at) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3((unsigned)(c.groups * c.K), (unsigned)ndirs, 1);
  lc.blockDim = dim3((unsigned)c.threads, 1, 1);
  lc.dynamicSmemBytes = (size_t)c.smem;
  lc.stream = qg_cuda_stream(ctx);
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)c.K;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  lc.attrs = at;
  lc.numAttrs = 1;
  return lc;
}

/* How many clusters of this configuration the device runs at once (cudaOccupancyMaxActiveClusters:
 * with one block per SM, what the GPCs' sizes allow), memoized per kernel, K, shared memory and
 * threads; 0 when none fits. */
static int cluster_slots(qg_ctx *ctx, const void *f, const PCfg &c) {
  enum { MEMO = 512 };
  static struct { const void *f; int dev, K, smem, threads, n; } memo[MEMO];
  static int nmemo = 0;
  for (int i = 0; i < nmemo; i++)
    if (memo[i].f == f && memo[i].dev == ctx->device_index && memo[i].K == c.K && memo[i].smem == c.smem &&
        memo[i].threads == c.threads)
      return memo[i].n;
  int n = 0;
  if (persist_prepare_kernel(ctx, "qg_gru", f) == QG_OK) {
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t lc = launch_config(ctx, c, 1, at);
    if (cudaOccupancyMaxActiveClusters(&n, f, &lc) != cudaSuccess) { n = 0; (void)cudaGetLastError(); }
  }
  if (nmemo < MEMO) {
    memo[nmemo].f = f; memo[nmemo].dev = ctx->device_index; memo[nmemo].K = c.K; memo[nmemo].smem = c.smem;
    memo[nmemo].threads = c.threads; memo[nmemo].n = n;
    nmemo++;
  }
  return n;
}

static int64_t smem_floats(int bwd, int64_t H, int64_t Hk, int64_t NB, int64_t S, int64_t KPT) {
  if (KPT) return 2 * NB * S * KPT + PERSIST_PREFETCH * NB * Hk * (bwd ? 6 : 3);
  return bwd ? 3 * H * Hk + 2 * NB * 3 * H + S * NB * Hk + PERSIST_PREFETCH * NB * Hk * 6
             : 3 * Hk * H + 2 * NB * H + S * 3 * NB * Hk + PERSIST_PREFETCH * NB * Hk * 3;
}

/* Estimated cycles of one step of one block (one block per SM), fitted to the H200 sweep of the
 * final kernels (bench/gpu.md, bench/gpu_runs/run4_h200_sweep.log).
 * Shared memory (about 1750 cycles per step in one block, 3300-3900 in a cluster of 8 or 16): the
 * block's shared-memory or FMA throughput, or one thread's serial share (a dependent chain of
 * loads and FMAs), whichever is larger, plus the partial sums, the cell, the barriers, a fixed cost.
 * Registers (about 1150 cycles per step in one block of 256 threads, 1600-3600 in clusters): a
 * fixed cost, the threads, the (row, unit) pairs, the backward's longer chains, and in a cluster
 * its size and the stores into the peers' shared memory (NB Hk K per block, three times that
 * backward). */
static double step_cycles(int bwd, int H, int Hk, int NB, int S, int KPT, int threads, int K, int observe) {
  const double obs = observe ? 3000.0 : 0.0;
  if (KPT) {
    const double pairs = (double)NB * Hk, remote = pairs * K * (bwd ? 3.0 : 1.0);
    const double cluster = K > 1 ? 600.0 + 40.0 * K + 2.5 * remote : 0.0;
    /* the FMAs one scheduler issues (a block's warps over the SM's four schedulers): the same for
     * every split of a unit's products while each scheduler has a warp, more when fewer warps */
    const double issue = (double)((threads / 32 + 3) / 4) * (bwd ? 1.0 : 3.0) * KPT * NB;
    /* the backward's longer chains (10 KPT, run 4's fit in clusters); one block per row group
     * (K = 1), with its stores after the barrier, timed at long-kws on an H200: 2 lanes of 96
     * entries 0.68 ms, 4 of 48 0.89, 8 of 24 1.04 (bench/gpu_runs/kws_bwd_d2_kws.log): the threads
     * count, the chain does not */
    const double chain = bwd && K > 1 ? 10.0 * KPT : 0.0;
    return 580.0 + (K > 1 ? 2.0 : 0.94) * threads + 5.0 * pairs + chain + cluster + issue + obs;
  }
  const double kd = bwd ? 3.0 * H : (double)H, G = bwd ? 1.0 : 3.0, cell = bwd ? 120.0 : 220.0;
  const double iters = (double)((int)kd + S - 1) / S;
  const double serial = iters * (12.0 + G * NB);
  const double lds = (double)Hk * kd * (G + NB) / 32.0, fma = G * Hk * kd * NB / 128.0;
  double mv = serial;
  if (lds > mv) mv = lds;
  if (fma > mv) mv = fma;
  const double red = G * (S / 4.0 + 4.0) * 6.0 + 40.0;
  const double sync = K > 1 ? 1900.0 + 20.0 * K : 300.0;
  return 1.3 * mv + red + cell + sync + 300.0 + obs;
}

static const int FWD_KPT[5] = {4, 8, 16, 32, 64}, BWD_KPT[4] = {12, 24, 48, 96};

static int persist_pick_uncached(qg_ctx *ctx, int bwd, int T, int N, int H, int ndirs, int observe, PCfg *cfg,
                                 double *est_us);

/* The choice depends only on the device, the shape and the forced settings: memoized (a call
 * then costs a lookup, not the search and its occupancy queries). */
int persist_pick(qg_ctx *ctx, int bwd, int T, int N, int H, int ndirs, int observe, PCfg *cfg, double *est_us) {
  enum { MEMO = 64 };
  static struct { int key[12]; int ok; PCfg cfg; double est; } memo[MEMO];
  static int nmemo = 0, next = 0;
  const int key[12] = {ctx->device_index, bwd, T, N, H, ndirs, observe, ctx->persist_cluster, ctx->persist_rows,
                       ctx->persist_splits, ctx->persist_storage, ctx->smem_optin};
  for (int i = 0; i < nmemo; i++)
    if (memcmp(memo[i].key, key, sizeof key) == 0) {
      *cfg = memo[i].cfg;
      *est_us = memo[i].est;
      return memo[i].ok;
    }
  const int ok = persist_pick_uncached(ctx, bwd, T, N, H, ndirs, observe, cfg, est_us);
  const int slot = nmemo < MEMO ? nmemo++ : (next++ % MEMO);
  memcpy(memo[slot].key, key, sizeof key);
  memo[slot].ok = ok;
  memo[slot].cfg = ok ? *cfg : PCfg{};
  memo[slot].est = ok ? *est_us : 0.0;
  return ok;
}

static int persist_pick_uncached(qg_ctx *ctx, int bwd, int T, int N, int H, int ndirs, int observe, PCfg *cfg,
                                 double *est_us) {
  enum { MAXC = 160 };
  PCfg cand[MAXC];
  double est[MAXC];
  int nc = 0;
  static const int Ks[5] = {1, 2, 4, 8, 16}, NBs[4] = {1, 2, 4, 8};
  const int forced = ctx->persist_cluster > 0;   /* qg_ctx_set_persist_shape */
  /* 0 either, 1 shared memory, 2 registers (3, the integer backward's split roles: registers) */
  const int storage = ctx->persist_storage >= 3 ? 2 : ctx->persist_storage;
  const int kd = bwd ? 3 * H : H;
  for (int ki = 0; ki < 5; ki++) {
    const int K = Ks[ki];
    if (K > H) break;
    if (forced && K != ctx->persist_cluster) continue;
    const int Hk = (H + K - 1) / K;
    if ((K - 1) * Hk >= H || Hk > PERSIST_MAX_THREADS) continue;
    for (int ni = 0; ni < 4; ni++) {
      const int NB = NBs[ni];
      if (forced ? NB != ctx->persist_rows : (NB > 1 && NB / 2 >= N)) continue;   /* no group wider than the batch needs */
      if (NB * Hk > PERSIST_MAX_THREADS) break;
      /* (S, KPT) pairs: shared memory: S threads per unit, the most that fit and 1/2, 1/4, 1/8 of
       * that (or the forced count); registers: S = 1..32 lanes (powers of two, NB <= S), KPT the
       * smallest instantiated share that covers kd / S */
      int Ss[16], Kp[16], ns = 0;
      if (storage != 2) {
        int Smax = PERSIST_MAX_THREADS / Hk;
        if (Smax > kd) Smax = kd;
        if (Smax < 1) Smax = 1;
        if (forced && ctx->persist_splits > 0) { Ss[ns] = ctx->persist_splits < Smax ? ctx->persist_splits : Smax; Kp[ns++] = 0; }
        else
          for (int S = Smax; S >= 1 && ns < 4; S /= 2) { Ss[ns] = S; Kp[ns++] = 0; }
      }
      if (storage != 1 && !observe)
        for (int S = 1; S <= 32; S *= 2) {
          if (S < NB || (forced && ctx->persist_splits > 0 && S != ctx->persist_splits)) continue;
          const int need = (kd + S - 1) / S;
          const int *set = bwd ? BWD_KPT : FWD_KPT;
          const int nset = bwd ? 4 : 5;
          int kpt = 0;
          for (int i = 0; i < nset && !kpt; i++)
            if (set[i] >= need) kpt = set[i];
          if (!kpt || (kd + kpt - 1) / kpt < S / 2 + 1) continue;   /* no lane group more than half idle */
          if (Hk * S > persist_reg_threads(bwd ? kpt : 3 * kpt) || !persist_reg_kernel(bwd, NB, kpt)) continue;
          /* the large shares (R in more than 48 registers) were timed without clusters only */
          if (!forced && K > 1 && kpt > (bwd ? 48 : 16)) continue;
          Ss[ns] = S; Kp[ns++] = kpt;
        }
      for (int si = 0; si < ns; si++) {
        const int S = Ss[si], KPT = Kp[si];
        int threads = KPT ? Hk * S : (Hk * S > NB * Hk ? Hk * S : NB * Hk);
        threads = (threads + 31) & ~31;
        int64_t bytes = smem_floats(bwd, H, Hk, NB, S, KPT) * (int64_t)sizeof(float);
        if (bytes > ctx->smem_optin) continue;
        /* one block per SM: a block that needs little shared memory asks for more than half of
         * an SM's, so that two never share an SM (a step waits for the slowest block; the
         * timings of co-resident blocks were erratic) */
        if (bytes < ctx->smem_optin / 2 + 1024) bytes = ctx->smem_optin / 2 + 1024;
        const int groups = (N + NB - 1) / NB;
        if (nc >= MAXC) continue;
        cand[nc] = (PCfg){K, Hk, NB, S, threads, groups, (int)bytes, KPT};
        /* blocks running at once: one per SM, and for clusters what the device places */
        int slots = ctx->sm_count;
        if (K > 1) {
          const void *f = KPT ? persist_reg_kernel(bwd, NB, KPT) : (bwd ? bwd_kernel(NB) : fwd_kernel(NB, observe, 1));
          slots = f ? cluster_slots(ctx, f, cand[nc]) * K : 0;
        }
        if (slots < K) continue;
        const int64_t blocks = (int64_t)groups * K * ndirs;
        double waves = (double)((blocks + slots - 1) / slots);
        /* a device more than 3/4 full ran about 1.5 times slower per step than a half-full one in
         * the H200 sweep (bench/gpu.md) */
        if (blocks * 4 > (int64_t)slots * 3 && blocks <= slots) waves *= 1.5;
        /* cycles at ~1.75 GHz, plus loading R (its share over ~1 TB/s per wave) */
        const double rbytes = 12.0 * (double)H * Hk;
        est[nc] = waves * ((double)T * step_cycles(bwd, H, Hk, NB, S, KPT, threads, K, observe) / 1750.0 +
                           rbytes / 1.0e6) + 4.0;
        nc++;
      }
    }
  }
  /* best estimate first; a cluster size the device cannot place is skipped */
  for (int round = 0; round < nc; round++) {
    int bi = -1;
    for (int i = 0; i < nc; i++)
      if (est[i] >= 0 && (bi < 0 || est[i] < est[bi])) bi = i;
    if (bi < 0) break;
    const void *f = cand[bi].KPT ? persist_reg_kernel(bwd, cand[bi].NB, cand[bi].KPT)
                                 : (bwd ? bwd_kernel(cand[bi].NB) : fwd_kernel(cand[bi].NB, observe, 1));
    if (f && (cand[bi].K == 1 || cluster_slots(ctx, f, cand[bi]) > 0)) {
      *cfg = cand[bi];
      *est_us = est[bi];
      return 1;
    }
    est[bi] = -1;
  }
  return 0;
}

static qg_status launch(qg_ctx *ctx, const char *fn, const void *f, const PCfg &c, int ndirs, void **args) {
  QG_CHECK(persist_prepare_kernel(ctx, fn, f));
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t lc = launch_config(ctx, c, ndirs, at);
  QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelExC(&lc, f, args));
  return qg_cuda_launched(ctx, fn);
}

qg_status persist_forward(qg_ctx *ctx, const char *fn, const FwdArgs &a, const PCfg &cfg, int ndirs, int observe, int train) {
  FwdArgs ka = a;
  PCfg kc = cfg;
  void *args[2] = {(void *)&ka, (void *)&kc};
  const void *f = cfg.KPT ? persist_reg_kernel(0, cfg.NB, cfg.KPT) : fwd_kernel(cfg.NB, observe, train);
  return launch(ctx, fn, f, cfg, ndirs, args);
}

qg_status persist_backward(qg_ctx *ctx, const char *fn, const BwdArgs &a, const PCfg &cfg, int ndirs) {
  BwdArgs ka = a;
  PCfg kc = cfg;
  void *args[2] = {(void *)&ka, (void *)&kc};
  const void *f = cfg.KPT ? persist_reg_kernel(1, cfg.NB, cfg.KPT) : bwd_kernel(cfg.NB);
  return launch(ctx, fn, f, cfg, ndirs, args);
}

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
#include "gru_common.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

/* ---- kernels -------------------------------------------------------------------------------------- */

__device__ __forceinline__ void cluster_barrier(int K) {
  if (K > 1) cg::this_cluster().sync();
  else __syncthreads();
}

template <int NB, bool OBS, bool TRAIN>
__global__ void __launch_bounds__(PERSIST_MAX_THREADS, 1) fwd_persist_kernel(const FwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const FwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, N = a.N, T = a.T, Hk = c.Hk, S = c.S, K = c.K;
  cg::cluster_group cl = cg::this_cluster();
  const int rank = K > 1 ? (int)cl.block_rank() : 0;
  const int group = blockIdx.x / K;
  const int k0 = rank * Hk;
  const int hk = min(Hk, H - k0);
  const int n0 = group * NB;
  const int rows = min(NB, N - n0);
  const int H3k = 3 * Hk;
  float *Rs = sm;                       /* [H][3 Hk] */
  float *hb = Rs + (size_t)H * H3k;     /* [2][NB][H] */
  float *part = hb + 2 * NB * H;        /* [S][3][NB][Hk] */
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

  /* (row, unit) role */
  const int pb = tid / Hk, pu = tid - (tid / Hk) * Hk;
  const bool pact = pb < rows && pu < hk;
  const int pn = n0 + pb, pj = k0 + pu;
  const int L = pact ? gru_row_len(a.len, pn, T) : 0;
  float bxz = 0, bxr = 0, bxg = 0, brz = 0, brr = 0, brg = 0, wz = 0, wr = 0, wg = 0;
  if (pact) {
    bxz = D.bx[pj]; bxr = D.bx[H + pj]; bxg = D.bx[2 * H + pj];
    brz = D.br[pj]; brr = D.br[H + pj]; brg = D.br[2 * H + pj];
    D.hs[(int64_t)pn * H + pj] = D.h0 ? D.h0[(int64_t)pn * H + pj] : 0.0f;
    if (L > 0) {
      const float *w = D.Wx + ((int64_t)(D.reverse ? L - 1 : 0) * N + pn) * 3 * H + pj;
      wz = w[0]; wr = w[H]; wg = w[2 * H];
    }
  }
  /* matrix-vector role: unit mu, share ms */
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
      float rz = 0.0f, rr = 0.0f, rg = 0.0f;
      for (int q = 0; q < S; q++) {
        const float *p = part + (q * 3 * NB + pb) * Hk + pu;
        rz += p[0];
        rr += p[NB * Hk];
        rg += p[2 * NB * Hk];
      }
      const float hp = hc[pb * H + pj];
      float h;
      if (s < L) {
        const int t = D.reverse ? L - 1 - s : s;
        float z, r, g, q;
        h = gru_cell<OBS>(wz, wr, wg, rz, rr, rg, bxz, bxr, bxg, brz, brr, brg, hp, z, r, g, q, a.range, a.counts);
        D.y[((int64_t)t * N + pn) * a.Hy + D.y_offset + pj] = h;
        if (TRAIN) {
          float *gp = D.gates + ((int64_t)s * N + pn) * 4 * H + pj;
          gp[0] = z; gp[H] = r; gp[2 * H] = g; gp[3 * H] = q;
        }
        if (s + 1 < L) {   /* next step's x W^T, loaded while the cluster synchronises */
          const float *w = D.Wx + ((int64_t)(D.reverse ? L - 2 - s : s + 1) * N + pn) * 3 * H + pj;
          wz = w[0]; wr = w[H]; wg = w[2 * H];
        }
      } else {   /* padded: the state stays, y at time index s is 0 */
        h = hp;
        D.y[((int64_t)s * N + pn) * a.Hy + D.y_offset + pj] = 0.0f;
        if (TRAIN) {
          float *gp = D.gates + ((int64_t)s * N + pn) * 4 * H + pj;
          gp[0] = 0.0f; gp[H] = 0.0f; gp[2 * H] = 0.0f; gp[3 * H] = 0.0f;
        }
      }
      D.hs[((int64_t)(s + 1) * N + pn) * H + pj] = h;
      float *dst = hb + ((s + 1) & 1) * NB * H + pb * H + pj;
      if (K == 1) *dst = h;
      else
        for (int rk = 0; rk < K; rk++) *cl.map_shared_rank(dst, rk) = h;
    }
    cluster_barrier(K);
  }
}

template <int NB>
__global__ void __launch_bounds__(PERSIST_MAX_THREADS, 1) bwd_persist_kernel(const BwdArgs a, const PCfg c) {
  extern __shared__ __align__(16) float sm[];
  const BwdDir D = blockIdx.y ? a.d1 : a.d0;
  const int H = a.H, N = a.N, T = a.T, Hk = c.Hk, S = c.S, K = c.K, H3 = 3 * a.H;
  cg::cluster_group cl = cg::this_cluster();
  const int rank = K > 1 ? (int)cl.block_rank() : 0;
  const int group = blockIdx.x / K;
  const int k0 = rank * Hk;
  const int hk = min(Hk, H - k0);
  const int n0 = group * NB;
  const int rows = min(NB, N - n0);
  float *Rt = sm;                       /* [3H][Hk] */
  float *qb = Rt + (size_t)H3 * Hk;     /* [2][NB][3H] */
  float *part = qb + 2 * NB * H3;       /* [S][NB][Hk] */
  const int tid = threadIdx.x, nth = blockDim.x;

  for (int i = tid; i < H3 * Hk; i += nth) {
    const int j = i / Hk, u = i - j * Hk;
    Rt[i] = u < hk ? D.R[(int64_t)j * H + k0 + u] : 0.0f;
  }
  for (int i = tid; i < 2 * NB * H3; i += nth) qb[i] = 0.0f;

  const int pb = tid / Hk, pu = tid - (tid / Hk) * Hk;
  const bool pact = pb < rows && pu < hk;
  const int pn = n0 + pb, pj = k0 + pu;
  const int L = pact ? gru_row_len(a.len, pn, T) : 0;
  float dh = 0.0f;
  if (pact && D.dhn) dh = D.dhn[(int64_t)pn * H + pj];
  /* the saved values of the next valid step, loaded one step ahead */
  float gz = 0, gr = 0, gg = 0, gq = 0, hp = 0, dyv = 0;
  auto load = [&](int s) {
    const float *gp = D.gates + ((int64_t)s * N + pn) * 4 * H + pj;
    gz = gp[0]; gr = gp[H]; gg = gp[2 * H]; gq = gp[3 * H];
    hp = D.hs[((int64_t)s * N + pn) * H + pj];
    const int t = D.reverse ? L - 1 - s : s;
    dyv = D.dy ? D.dy[((int64_t)t * N + pn) * a.Hy + D.y_offset + pj] : 0.0f;
  };
  if (pact && T - 1 < L) load(T - 1);
  const int mu = tid % Hk, ms = tid / Hk;
  const bool mv = ms < S;

  cluster_barrier(K);

  for (int s = T - 1; s >= 0; s--) {
    float *qc = qb + (s & 1) * NB * H3;
    float keep = 0.0f;
    if (pact) {
      float dz = 0.0f, dr = 0.0f, dgr = 0.0f;
      if (s < L) {
        const int t = D.reverse ? L - 1 - s : s;
        const float dht = D.dy ? dh + dyv : dh;
        float dg;
        gru_cell_backward(gz, gr, gg, gq, hp, dht, dz, dr, dg, keep);
        dgr = dg * gr;
        float *dp = D.dp + ((int64_t)t * N + pn) * H3 + pj;
        dp[0] = dz; dp[H] = dr; dp[2 * H] = dg;
      } else {   /* padded: the state gradient passes through; no gate gradients */
        keep = dh;
        float *dp = D.dp + ((int64_t)s * N + pn) * H3 + pj;
        dp[0] = 0.0f; dp[H] = 0.0f; dp[2 * H] = 0.0f;
      }
      float *dq = D.dq + ((int64_t)s * N + pn) * H3 + pj;
      dq[0] = dz; dq[H] = dr; dq[2 * H] = dgr;
      if (s >= 1 && s - 1 < L) load(s - 1);
      float *dst = qc + pb * H3 + pj;
      if (K == 1) {
        dst[0] = dz; dst[H] = dr; dst[2 * H] = dgr;
      } else {
        for (int rk = 0; rk < K; rk++) {
          float *p = cl.map_shared_rank(dst, rk);
          p[0] = dz; p[H] = dr; p[2 * H] = dgr;
        }
      }
    }
    cluster_barrier(K);
    if (mv) {
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
    __syncthreads();
    if (pact) {
      float sum = 0.0f;
      for (int q = 0; q < S; q++) sum += part[(q * NB + pb) * Hk + pu];
      dh = keep + sum;
    }
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

/* Per kernel and device, once: the shared-memory opt-in and the non-portable cluster size. The
 * memo (and the one below) holds device properties only, never call state. */
static qg_status prepare_kernel(qg_ctx *ctx, const char *fn, const void *f) {
  static struct { const void *f; int dev; } done[64];
  static int ndone = 0;
  for (int i = 0; i < ndone; i++)
    if (done[i].f == f && done[i].dev == ctx->device_index) return QG_OK;
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, ctx->smem_optin));
  QG_CUDA_CHECK(ctx, fn, cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (ndone < 64) { done[ndone].f = f; done[ndone].dev = ctx->device_index; ndone++; }
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

/* Whether clusters of this configuration can be resident at all (memoized per kernel, K, size). */
static int cluster_fits(qg_ctx *ctx, const void *f, const PCfg &c) {
  static struct { const void *f; int dev, K, smem, threads, fits; } memo[128];
  static int nmemo = 0;
  for (int i = 0; i < nmemo; i++)
    if (memo[i].f == f && memo[i].dev == ctx->device_index && memo[i].K == c.K && memo[i].smem == c.smem &&
        memo[i].threads == c.threads)
      return memo[i].fits;
  int fits = 0;
  if (prepare_kernel(ctx, "qg_gru", f) == QG_OK) {
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t lc = launch_config(ctx, c, 1, at);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, f, &lc) == cudaSuccess) fits = n > 0;
    else (void)cudaGetLastError();
  }
  if (nmemo < 128) {
    memo[nmemo].f = f; memo[nmemo].dev = ctx->device_index; memo[nmemo].K = c.K; memo[nmemo].smem = c.smem;
    memo[nmemo].threads = c.threads; memo[nmemo].fits = fits;
    nmemo++;
  }
  return fits;
}

static int64_t smem_floats(int bwd, int64_t H, int64_t Hk, int64_t NB, int64_t S) {
  return bwd ? 3 * H * Hk + 2 * NB * 3 * H + S * NB * Hk : 3 * Hk * H + 2 * NB * H + S * 3 * NB * Hk;
}

int persist_pick(qg_ctx *ctx, int bwd, int T, int N, int H, int ndirs, int observe, PCfg *cfg, double *est_us) {
  enum { MAXC = 32 };
  PCfg cand[MAXC];
  double est[MAXC];
  int nc = 0;
  static const int Ks[5] = {1, 2, 4, 8, 16}, NBs[4] = {1, 2, 4, 8};
  const int forced = ctx->persist_cluster > 0;   /* qg_ctx_set_persist_shape */
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
      const int kd = bwd ? 3 * H : H;
      int S = PERSIST_MAX_THREADS / Hk;
      if (S > kd) S = kd;
      if (S < 1) S = 1;
      int threads = Hk * S > NB * Hk ? Hk * S : NB * Hk;
      threads = (threads + 31) & ~31;
      const int64_t bytes = smem_floats(bwd, H, Hk, NB, S) * (int64_t)sizeof(float);
      if (bytes > ctx->smem_optin) continue;
      const int groups = (N + NB - 1) / NB;
      /* blocks resident at once per SM: limited by shared memory, threads, and registers (up to
       * 128 per thread under the launch bounds) */
      int per_sm = (int)((228 * 1024) / (bytes + 1024));
      if (per_sm > 2048 / threads) per_sm = 2048 / threads;
      if (per_sm > 512 / threads) per_sm = 512 / threads;
      if (per_sm < 1) per_sm = 1;
      int slots = (ctx->sm_count * per_sm / K) * K;
      if (K == 16 && slots > (ctx->sm_count / 18) * 16 * per_sm) slots = (ctx->sm_count / 18) * 16 * per_sm;
      if (slots < K) continue;
      const double waves = (double)(((int64_t)groups * K * ndirs + slots - 1) / slots);
      const double G = bwd ? 1.0 : 3.0;
      const double lds = (double)Hk * kd * (G + NB) / 32.0, fma = G * Hk * kd * NB / 128.0;
      const double step = (lds > fma ? lds : fma) + (K > 1 ? 450.0 : 80.0) + 350.0 + 3.0 * S + (observe ? 3000.0 : 0.0);
      if (nc < MAXC) {
        cand[nc] = (PCfg){K, Hk, NB, S, threads, groups, (int)bytes};
        est[nc] = waves * T * step / 1700.0 + 5.0;   /* cycles at ~1.7 GHz, plus loading R */
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
    const void *f = bwd ? bwd_kernel(cand[bi].NB) : fwd_kernel(cand[bi].NB, observe, 1);
    if (cand[bi].K == 1 || cluster_fits(ctx, f, cand[bi])) {
      *cfg = cand[bi];
      *est_us = est[bi];
      return 1;
    }
    est[bi] = -1;
  }
  return 0;
}

static qg_status launch(qg_ctx *ctx, const char *fn, const void *f, const PCfg &c, int ndirs, void **args) {
  QG_CHECK(prepare_kernel(ctx, fn, f));
  cudaLaunchAttribute at[1];
  cudaLaunchConfig_t lc = launch_config(ctx, c, ndirs, at);
  QG_CUDA_CHECK(ctx, fn, cudaLaunchKernelExC(&lc, f, args));
  return qg_cuda_launched(ctx, fn);
}

qg_status persist_forward(qg_ctx *ctx, const char *fn, const FwdArgs &a, const PCfg &cfg, int ndirs, int observe, int train) {
  FwdArgs ka = a;
  PCfg kc = cfg;
  void *args[2] = {(void *)&ka, (void *)&kc};
  return launch(ctx, fn, fwd_kernel(cfg.NB, observe, train), cfg, ndirs, args);
}

qg_status persist_backward(qg_ctx *ctx, const char *fn, const BwdArgs &a, const PCfg &cfg, int ndirs) {
  BwdArgs ka = a;
  PCfg kc = cfg;
  void *args[2] = {(void *)&ka, (void *)&kc};
  return launch(ctx, fn, bwd_kernel(cfg.NB), cfg, ndirs, args);
}

/*
 * gru_common.cuh: what the float GRU's CUDA files share (kernels/gru.cu: entry points, GEMMs,
 * fallback recurrence; kernels/gru_persist.cu: the persistent recurrent kernels): the kernel
 * argument blocks of one call (up to two directions), the GRU cell and its backward as device
 * functions (the formulas of core/gru_cpu.c, in the same order of operations), and the interface
 * of the persistent recurrence.
 */
#ifndef QGRU_GRU_COMMON_CUH
#define QGRU_GRU_COMMON_CUH

#include "cuda_common.cuh"
#include "stats.cuh"

/* One direction of a forward. Wx [T*N, 3H] = x W^T (by time index); y [T, N, Hy] (columns
 * y_offset..+H); hs [T+1, N, H] and gates [T, N, 4H] (NULL at inference) by processing step. */
struct FwdDir {
  const float *Wx, *R, *bx, *br, *h0;
  float *y, *hs, *gates;
  int y_offset, reverse;
};
struct FwdArgs {
  int T, N, H, Hy;
  const int64_t *len;   /* i64 [N] on the device, or NULL */
  double *range;        /* statistics observer rows (one direction only), or NULL */
  int64_t *counts;
  FwdDir d0, d1;        /* direction 0 and (bidirectional calls) 1; by value, selected without indexing */
};

/* One direction of a backward. dp [T*N, 3H] (by time index) and dq [T*N, 3H] (by step) are the
 * gradients of the gate pre-activations and of R h + br that the weight GEMMs read afterwards. */
struct BwdDir {
  const float *R, *hs, *gates, *dy, *dhn;
  float *dp, *dq, *dh0;
  int y_offset, reverse;
};
struct BwdArgs {
  int T, N, H, Hy;
  const int64_t *len;
  BwdDir d0, d1;
};

/* Row n's number of valid steps, clamped to 0..T (device values are not checked by the front door). */
__device__ __forceinline__ int gru_row_len(const int64_t *len, int n, int T) {
  if (!len) return T;
  const int64_t L = len[n];
  return L < 0 ? 0 : (L > T ? T : (int)L);
}

/* sigmoid and tanh from the fast exponential (__expf: a few ulp, about 1e-6 relative at the
 * arguments a GRU sees) and the approximate division; tanh takes the odd polynomial of core/gru_cpu.c
 * below |x| = 0.625, where 1 - 2 / (e^2|x| + 1) would cancel. Saturated arguments give exactly 0, 1
 * or +-1 (e = inf: the approximate division returns 0). */
__device__ __forceinline__ float gru_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

__device__ __forceinline__ float gru_tanh(float x) {
  const float a = fabsf(x);
  const float big = 1.0f - __fdividef(2.0f, __expf(2.0f * a) + 1.0f);
  const float x2 = x * x;
  float p = -5.70498872745e-3f;
  p = p * x2 + 2.06390887954e-2f;
  p = p * x2 - 5.37397155531e-2f;
  p = p * x2 + 1.33314422036e-1f;
  p = p * x2 - 3.33332819422e-1f;
  const float small = p * x2 * x + x;
  return a < 0.625f ? small : copysignf(big, x);
}

#define GRU_OBS(op, v) qg_stats_observe_dev(range + 4 * (op), counts + (int64_t)(op) * QG_STATS_BINS, (double)(v))

/* One valid step of one unit: wx*, rh* (R h without br) of its three gates; returns the new state
 * and the saved values z, r, g, q = Rh_g + br_g. With OBS, every operator value enters its row. */
template <bool OBS>
__device__ __forceinline__ float gru_cell(float wz, float wr, float wg, float rz, float rr, float rg, float bxz, float bxr,
                                          float bxg, float brz, float brr, float brg, float hp, float &z, float &r, float &g,
                                          float &q, double *range, int64_t *counts) {
  const float zpre = wz + bxz + rz + brz;
  const float rpre = wr + bxr + rr + brr;
  z = gru_sigmoid(zpre);
  r = gru_sigmoid(rpre);
  q = rg + brg;
  const float rrh = r * q;
  const float gpre = wg + bxg + rrh;
  g = gru_tanh(gpre);
  const float old = z * hp, nw = (1.0f - z) * g;
  const float h = old + nw;
  if (OBS) {
    GRU_OBS(QG_Q_MATMUL_RH, rz); GRU_OBS(QG_Q_MATMUL_RH, rr); GRU_OBS(QG_Q_MATMUL_RH, rg);
    GRU_OBS(QG_Q_Z_PRE, zpre); GRU_OBS(QG_Q_R_PRE, rpre); GRU_OBS(QG_Q_Z_OUT, z); GRU_OBS(QG_Q_R_OUT, r);
    GRU_OBS(QG_Q_MATMUL_RH, q); GRU_OBS(QG_Q_RRH, rrh); GRU_OBS(QG_Q_G_PRE, gpre); GRU_OBS(QG_Q_G_OUT, g);
    GRU_OBS(QG_Q_OLD, old); GRU_OBS(QG_Q_NEW, nw); GRU_OBS(QG_Q_OUTPUT_H, h);
  }
  return h;
}

/* Backward of one valid step of one unit: dht = dL/dh_t (state gradient plus dy); gives the
 * pre-activation gradients dz, dr, dg (dq is dz, dr, dg * r) and keep = z dht, the part of
 * dL/dh_{t-1} that does not pass through R. */
__device__ __forceinline__ void gru_cell_backward(float z, float r, float g, float q, float hp, float dht, float &dz, float &dr,
                                                  float &dg, float &keep) {
  dg = (1.0f - z) * dht * (1.0f - g * g);
  dz = (hp - g) * dht * z * (1.0f - z);
  dr = dg * q * r * (1.0f - r);
  keep = z * dht;
}

/* ---- the persistent recurrence (kernels/gru_persist.cu) -----------------------------------------
 * A launch is groups x K blocks per direction: a cluster of K blocks runs NB batch rows; block k of
 * the cluster owns hidden units [k Hk, min(H, (k + 1) Hk)) and keeps R's rows (forward) or columns
 * (backward) of those units on chip: in shared memory (KPT = 0; threads = max(Hk S, NB Hk) rounded
 * to warps, S threads split each unit's dot product, partial sums through shared memory) or in
 * registers (KPT > 0: S lanes of a warp split each unit's dot product, KPT entries each, partial
 * sums by shuffles; threads = Hk S rounded to warps). */
enum { PERSIST_MAX_CLUSTER = 16, PERSIST_MAX_THREADS = 512, PERSIST_PREFETCH = 4 };
struct PCfg {
  int K, Hk, NB, S, threads, groups;
  int smem;   /* dynamic shared memory bytes per block */
  int KPT;    /* 0: R in shared memory (gru_persist.cu); else R in registers, KPT entries per thread
               * and gate (gru_persist_reg.cu) */
};
/* The most threads a register-variant block may run: 512 while R takes at most 48 of a thread's
 * registers (128 per thread at 512), else 256 (up to 255 registers per thread). rregs: R's
 * registers per thread (3 KPT forward, KPT backward). */
__host__ __device__ constexpr int persist_reg_threads(int rregs) { return rregs <= 48 ? PERSIST_MAX_THREADS : 256; }
/* The register-variant kernel for (backward?, rows per cluster, KPT), or NULL if not instantiated. */
const void *persist_reg_kernel(int bwd, int NB, int KPT);
/* Per kernel and device, once: a persistent cluster kernel's shared-memory opt-in and non-portable
 * cluster size (kernels/gru_persist.cu). */
qg_status persist_prepare_kernel(qg_ctx *ctx, const char *fn, const void *f);

/* The best configuration for this shape (1), or none fits (0). *est_us: estimated time of the
 * recurrence. bwd: the backward recurrence; observe: the forward with the statistics observer. */
int persist_pick(qg_ctx *ctx, int bwd, int T, int N, int H, int ndirs, int observe, PCfg *cfg, double *est_us);
/* Queue the recurrence of a's directions (ndirs) on the context's stream. The forward writes hs
 * (hs[0] from h0 too), y and gates; the backward writes dp, dq and dh0. */
qg_status persist_forward(qg_ctx *ctx, const char *fn, const FwdArgs &a, const PCfg &cfg, int ndirs, int observe, int train);
qg_status persist_backward(qg_ctx *ctx, const char *fn, const BwdArgs &a, const PCfg &cfg, int ndirs);

#endif

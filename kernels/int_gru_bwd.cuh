/*
 * int_gru_bwd.cuh: what the two files of the integer GRU's STE backward share. kernels/
 * int_gru_backward.cu holds the layer's backward (qg_int_gru_backward: the choice of path, the
 * per-step recurrence, the GEMMs and bias sums after it); kernels/int_gru_bwd_persist.cu holds the
 * persistent recurrence (one launch for all T steps). Both run the same per-(row, unit) step on
 * the shared STE cell of core/int_gru_cell.h, declared here with the persistent path's
 * configuration and its two entry points. Both files are built with --fmad=false (CMakeLists.txt):
 * the cell's float math must round as the CPU's.
 */
#ifndef QGRU_INT_GRU_BWD_CUH
#define QGRU_INT_GRU_BWD_CUH

#include "int_gru_common.cuh"


struct bwd_params {
  qg_cell_q cell;
  qg_cell_tables tb;
  int64_t T, N, H;
  const int64_t *L;
  int reverse;
  const int32_t *hq;      /* [T+1, N, H] */
  const uint8_t *cellp;   /* [T, N, H, cb] */
  int cb;
  const float *dy;
  int64_t Hy;
  int y_offset;
  float *dp, *dq, *bcx, *bcr;   /* [T N, 3H]: dp in time order, the others in processing order */
  const float *Rf;              /* R~ [3H, H] (the persistent kernel) */
  double *bsum;                 /* bwd_ws_kernel's bias sums per (row, unit) [N][4][H], else NULL */
};

/* One valid step s (time t) of row n, unit i: the shared STE cell on the saved record rec, the
 * code hprev of h_{s} and dH = dL/dh_t; writes dp, dq, bcx, bcr; returns the direct part of
 * dL/dh_{t-1} and the unit's dq in dq3. */
__device__ __forceinline__ float ste_unit(const bwd_params &p, int64_t s, int64_t t, int64_t n, int64_t i, const uint8_t *rec,
                                          int64_t hprev, float dH, float *dq3) {
  const int64_t H = p.H, H3 = 3 * H, N = p.N;
  qg_cell_out su;
  qg_cell_grad gr;
  qg_cell_unpack(rec, &p.cell, &su);
  qg_cell_backward(&p.cell, &p.tb, &su, hprev, dH, &gr);
  float *dpr = p.dp + (t * N + n) * H3, *dqr = p.dq + (s * N + n) * H3, *bxr = p.bcx + (s * N + n) * H3,
        *brr = p.bcr + (s * N + n) * H3;
  for (int k = 0; k < 3; k++) {
    dpr[k * H + i] = gr.dp[k];
    dqr[k * H + i] = gr.dq[k];
    bxr[k * H + i] = gr.dbx[k];
    brr[k * H + i] = gr.dbr[k];
    dq3[k] = gr.dq[k];
  }
  return gr.dhprev;
}

/* A padded step s of row n, unit i: no gate gradients. */
__device__ __forceinline__ void pad_unit(const bwd_params &p, int64_t s, int64_t n, int64_t i) {
  const int64_t H = p.H, H3 = 3 * H, r = (s * p.N + n) * H3;
  for (int k = 0; k < 3; k++) p.dq[r + k * H + i] = p.bcx[r + k * H + i] = p.bcr[r + k * H + i] = 0.0f;
}

enum { BP_MAX_THREADS = 512, BP_MAX_WORDS = 5 };

/* One configuration: clusters of K CTAs of `threads` threads, Hk units per CTA, NB rows per
 * cluster, S threads per unit in the matrix-vector product; `groups` clusters; smem bytes per CTA;
 * KPT = 0: R~ in shared memory (bwd_persist_kernel), else R~ in registers, KPT entries per thread
 * (bwd_reg_kernel; WS = 1: bwd_ws_kernel, the roles on separate warps, K = NB = 1; WS = 2:
 * bwd_ws3_kernel, the cell's inputs on warps of their own too). */
struct bp_plan {
  int K, Hk, NB, S, threads, groups, smem, KPT, WS;
};

/* A (row, unit)'s inputs of one step, loaded a step ahead: the saved record as 32-bit words (cb is
 * 12 or 20 bytes; the host checks the base's alignment), the h code and dy. */
struct step_in {
  uint32_t w[BP_MAX_WORDS];
  int32_t hp;
  float dy;
};

__device__ __forceinline__ void load_step(const bwd_params &p, int64_t s, int64_t n, int64_t i, int64_t Ln, step_in &in) {
  if (s < 0 || s >= Ln) return;
  const int64_t N = p.N, H = p.H, e = (s * N + n) * H + i, t = p.reverse ? Ln - 1 - s : s;
  const uint32_t *src = (const uint32_t *)(p.cellp + e * p.cb);
  const int nw = p.cb / 4;
#pragma unroll
  for (int k = 0; k < BP_MAX_WORDS; k++)
    if (k < nw) in.w[k] = src[k];
  in.hp = p.hq[e];
  in.dy = p.dy ? p.dy[(t * N + n) * p.Hy + p.y_offset + i] : 0.0f;
}

/* A (row, unit)'s STE values of one step (qg_cell_backward_prepare: table look-ups and
 * dequantized codes) and its dy, derived a step before its dH is known. */
struct step_vals {
  qg_cell_bvals v;
  float dy;
};

/* One unit's cell step in a persistent backward: dh the gradient of step s's state, dy the
 * output's. At a valid step (valid: s < the row's length) the cell's gradients go to *gr and its
 * dq words to dq3, and the gradient of step s - 1's state is returned; at a padded step dq3 is
 * zero and the state gradient passes through. */
__device__ __forceinline__ float bwd_cell_step(const qg_cell_bvals &v, float dy, float dh, bool valid, qg_cell_grad *gr, float dq3[3]) {
  dq3[0] = dq3[1] = dq3[2] = 0.0f;
  if (!valid) return dh;
  qg_cell_backward_values(v.mask, v.z, v.rr, v.g, v.dsz, v.dsr, v.dtg, v.hp, v.rhb, dh + dy, gr);
  dq3[0] = gr->dq[0]; dq3[1] = gr->dq[1]; dq3[2] = gr->dq[2];
  return gr->dhprev;
}

/* The saved record's words as qg_cell_unpack reads its bytes (little-endian; narrow: zpre | rpre
 * << 16, gpre | rhb << 16 as offsets from each qmin, then the mask; else four int32 codes, then the
 * mask), without taking the address of the register copy. */
__device__ __forceinline__ void prepare_step(const bwd_params &p, int64_t s, int64_t Ln, const step_in &in, step_vals &o) {
  if (s < 0 || s >= Ln) return;
  const qg_cell_q &q = p.cell;
  qg_cell_out su;
  if (q.narrow) {
    su.zpre = (int64_t)(in.w[0] & 0xffffu) + q.a[QG_Q_Z_PRE].qmin;
    su.rpre = (int64_t)(in.w[0] >> 16) + q.a[QG_Q_R_PRE].qmin;
    su.gpre = (int64_t)(in.w[1] & 0xffffu) + q.a[QG_Q_G_PRE].qmin;
    su.rhb = (int64_t)(in.w[1] >> 16) + q.a[QG_Q_MATMUL_RH].qmin;
    su.mask = in.w[2];
  } else {
    su.zpre = (int32_t)in.w[0]; su.rpre = (int32_t)in.w[1]; su.gpre = (int32_t)in.w[2]; su.rhb = (int32_t)in.w[3];
    su.mask = in.w[4];
  }
  su.h = 0;
  qg_cell_backward_prepare(&q, &p.tb, &su, in.hp, &o.v);
  o.dy = in.dy;
}

/* The persistent recurrence's configuration for N rows of H units with the best estimate that the
 * device can place (*found = 1, *out and *step_us its estimated microseconds a step), or none
 * (*found = 0); a forced shape (qg_ctx_set_persist_shape) limits the search to it. Memoized per
 * device, shape and forced shape (the search runs occupancy queries). */
qg_status int_bwd_persist_choose(qg_ctx *ctx, const char *fn, int64_t N, int64_t H, bp_plan *out, double *step_us, int *found);

/* Enqueues the persistent recurrence of configuration c (from int_bwd_persist_choose) on the
 * context's stream: p as the per-step path fills it (bcx, bcr: [T N, 3H]; bsum [N][4][H] where
 * c.WS, else NULL), dh [N, H] the incoming dL/dh_T on entry, dL/dh_0 (before the h0 mask) on exit. */
qg_status int_bwd_persist_launch(qg_ctx *ctx, const char *fn, const bwd_params &p, const bp_plan &c, float *dh);

#endif

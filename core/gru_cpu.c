/*
 * gru_cpu.c: the CPU backend of the float32 GRU (one layer and one direction per call; the Lua
 * GRU module stacks layers and directions). Arguments were checked by the front doors in gru.c.
 *
 * Every batch row runs its own recurrence, so the work is split by batch rows over the threads
 * (OpenMP; as many as OpenBLAS is set to use, qg_set_num_threads) for the whole time loop, with
 * no synchronisation per step. Inside that region each thread multiplies its own rows
 * (OpenBLAS is set to one thread for the region and restored after it): per-step GEMMs of a
 * [N/threads, H] x [H, 3H] size are too small for BLAS's own threading, which spends more time
 * waking and yielding threads than computing. The per-step products (and dR) use their weight
 * operand packed once per call and an AVX-512 kernel where the CPU has one (see "small GEMMs"
 * below), else CBLAS.
 *
 * Forward:  per thread, W x of its rows for all steps, then per step one GEMM R h on its rows
 *           and one pointwise loop (sigmoid and tanh as branch-free polynomials, so the loop
 *           vectorizes; a few ulp of float32, far below the 1e-5 the PyTorch golden file allows).
 * Backward: per step and thread one pointwise loop and one GEMM (dh += dq R) on its rows; then,
 *           after a barrier, dx (rows split), dW, dR (output rows split) as GEMMs and dbx, dbr from
 *           the threads' sums, as tasks of a fixed split (deterministic for a thread count).
 * The two-direction entry points (qg_cpu_gru_forward_bidir / backward_bidir, at the end) run the
 * directions one after the other.
 * Variable lengths (qgru.h): a row's invalid steps copy its state (forward) or its state gradient
 * (backward) and zero its y / its gate gradients; the time index of a valid step s is
 * reverse ? L - 1 - s : s. The padded time indices t in [L, T) are exactly the invalid steps
 * s = t, so both directions zero them at step s.
 * Variants (statistics observer or not, training or inference, dy or none) are constant
 * arguments of always-inlined functions, so each is a separately compiled loop with no test in
 * its inner loop. On x86-64 (GCC) the thread bodies are compiled for AVX2+FMA and AVX-512 too and
 * picked at load time for the CPU (target_clones); results may differ in the last bits between
 * CPUs, as PyTorch's do. The observer runs on one thread (calibration is not time-critical),
 * so the statistics rows are filled without sharing.
 */
#include "backend.h"
#include "cpu_gemm.h"
#include "cpu_threads.h"
#include "stats.h"

#include <cblas.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define QG_INLINE static inline __attribute__((always_inline))
#else
#define QG_INLINE static inline
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define QG_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define QG_CLONES
#endif

/* ---- branch-free float32 exp, sigmoid, tanh (Cephes coefficients) ---------------------------- */

/* e^x, x clamped to [-87.3, 88.3] (so 2^n stays a normal float): n = round(x / ln 2) by the
 * 1.5 * 2^23 trick, r = x - n ln 2 in two parts, e^r by a degree-7 polynomial. About 2 ulp. */
QG_INLINE float gru_expf(float x) {
  const float in = x;
  x = x == x ? x : 0.0f;   /* NaN: computed on 0 (no float-to-int conversion of NaN), returned as NaN */
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) * 8388608;   /* (n + 127) << 23, n + 127 in 1..254 */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return in == in ? p * scale : in;
}

QG_INLINE float gru_sigmoidf(float x) { return 1.0f / (1.0f + gru_expf(-x)); }

/* tanh: the odd polynomial of Cephes' tanhf below |x| = 0.625, 1 - 2 / (e^2|x| + 1) above. */
QG_INLINE float gru_tanhf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float big = 1.0f - 2.0f / (gru_expf(2.0f * a) + 1.0f);
  const float x2 = x * x;
  float p = -5.70498872745e-3f;
  p = p * x2 + 2.06390887954e-2f;
  p = p * x2 - 5.37397155531e-2f;
  p = p * x2 + 1.33314422036e-1f;
  p = p * x2 - 3.33332819422e-1f;
  const float small = p * x2 * x + x;
  return a < 0.625f ? small : (x < 0.0f ? -big : big);
}

/* ---- threads --------------------------------------------------------------------------------- */


/* ---- forward --------------------------------------------------------------------------------- */

typedef struct {
  int64_t T, N, C, H, Hy;
  int y_offset, reverse, nt;
  const float *x, *W, *R, *bx, *br;
  const int64_t *len;
  float *y, *hs, *gates, *Wx, *scratch;  /* Wx [T*N, 3H] = x W^T; scratch: per thread [rows, 3H] */
  int64_t scratch_stride;
  gmat Bw, Br;                            /* W^T and R^T as GEMM operands */
  double *range;                          /* observer rows, or NULL */
  int64_t *counts;
} fwd_args;

#define OBS(op, v) qg_stats_observe(range + (op) * 4, counts + (int64_t)(op) * QG_STATS_BINS, (double)(v))

/* One valid step of one row: wx, rh the row's x W^T and R h; hp its state, hn the new state. */
QG_INLINE void fwd_point(int64_t H, const float *restrict wx, const float *restrict rh, const float *restrict bx,
                         const float *restrict br, const float *restrict hp, float *restrict hn, float *restrict yrow,
                         float *restrict grow, double *range, int64_t *counts, const int observe, const int train) {
  if (observe)
    for (int64_t i = 0; i < 3 * H; i++) OBS(QG_Q_MATMUL_RH, rh[i]);
  for (int64_t i = 0; i < H; i++) {
    const float zpre = wx[i] + bx[i] + rh[i] + br[i];
    const float rpre = wx[H + i] + bx[H + i] + rh[H + i] + br[H + i];
    const float z = gru_sigmoidf(zpre), r = gru_sigmoidf(rpre);
    const float q = rh[2 * H + i] + br[2 * H + i];
    const float rrh = r * q;
    const float gpre = wx[2 * H + i] + bx[2 * H + i] + rrh;
    const float g = gru_tanhf(gpre);
    const float old = z * hp[i], nw = (1.0f - z) * g;
    const float h = old + nw;
    hn[i] = h;
    yrow[i] = h;
    if (train) { grow[i] = z; grow[H + i] = r; grow[2 * H + i] = g; grow[3 * H + i] = q; }
    if (observe) {
      OBS(QG_Q_Z_PRE, zpre); OBS(QG_Q_R_PRE, rpre); OBS(QG_Q_Z_OUT, z); OBS(QG_Q_R_OUT, r);
      OBS(QG_Q_MATMUL_RH, q); OBS(QG_Q_RRH, rrh); OBS(QG_Q_G_PRE, gpre); OBS(QG_Q_G_OUT, g);
      OBS(QG_Q_OLD, old); OBS(QG_Q_NEW, nw); OBS(QG_Q_OUTPUT_H, h);
    }
  }
}

/* The recurrence of rows [n0, n1) over all T steps; Rh is this thread's [n1 - n0, 3H] scratch. */
QG_INLINE void fwd_rows(const fwd_args *a, int64_t n0, int64_t n1, float *Rh, const int observe, const int train) {
  const int64_t T = a->T, N = a->N, H = a->H, H3 = 3 * H, Hy = a->Hy, nb = n1 - n0;
  double *range = a->range;
  int64_t *counts = a->counts;
  for (int64_t s = 0; s < T; s++) {
    const float *hp = a->hs + s * N * H;
    float *hn = a->hs + (s + 1) * N * H;
    gemm_b(nb, hp + n0 * H, H, &a->Br, Rh, H3, 0);
    for (int64_t n = n0; n < n1; n++) {
      const int64_t L = a->len ? a->len[n] : T;
      if (s >= L) {   /* padded: the state stays, y at time index s is 0 */
        memcpy(hn + n * H, hp + n * H, (size_t)H * sizeof(float));
        memset(a->y + (s * N + n) * Hy + a->y_offset, 0, (size_t)H * sizeof(float));
        if (train) memset(a->gates + (s * N + n) * 4 * H, 0, (size_t)(4 * H) * sizeof(float));
        continue;
      }
      const int64_t t = a->reverse ? L - 1 - s : s;
      fwd_point(H, a->Wx + (t * N + n) * H3, Rh + (n - n0) * H3, a->bx, a->br, hp + n * H, hn + n * H,
                a->y + (t * N + n) * Hy + a->y_offset, train ? a->gates + (s * N + n) * 4 * H : NULL, range, counts,
                observe, train);
    }
  }
}

/* Thread k of nt: W x of its rows (one GEMM per time index: its rows of x[t] are contiguous), then
 * its rows' recurrence; it shares nothing with the other threads, so there is no barrier. Without
 * an observer (qg_cpu_gru_forward runs the observed variants on one thread). */
QG_CLONES static void fwd_thread(const fwd_args *a, int k) {
  const int nt = a->nt;
  const int64_t N = a->N, C = a->C, H3 = 3 * a->H, n0 = qg_cpu_part(N, k, nt), n1 = qg_cpu_part(N, k + 1, nt), nb = n1 - n0;
  for (int64_t t = 0; t < a->T; t++) gemm_b(nb, a->x + (t * N + n0) * C, C, &a->Bw, a->Wx + (t * N + n0) * H3, H3, 0);
  float *Rh = a->scratch + k * a->scratch_stride;
  if (a->gates) fwd_rows(a, n0, n1, Rh, 0, 1); else fwd_rows(a, n0, n1, Rh, 0, 0);
}

/* Observer values before the recurrence: x and x W^T at each row's valid time indices, h0. */
static void observe_inputs(const fwd_args *a, const float *h0) {
  const int64_t T = a->T, N = a->N, C = a->C, H = a->H, H3 = 3 * H;
  double *range = a->range;
  int64_t *counts = a->counts;
  for (int64_t n = 0; n < N; n++) {
    const int64_t L = a->len ? a->len[n] : T;
    for (int64_t t = 0; t < L; t++) {
      for (int64_t c = 0; c < C; c++) OBS(QG_Q_INPUT_X, a->x[(t * N + n) * C + c]);
      for (int64_t j = 0; j < H3; j++) OBS(QG_Q_MATMUL_WX, a->Wx[(t * N + n) * H3 + j]);
    }
  }
  if (h0)
    for (int64_t i = 0; i < N * H; i++) OBS(QG_Q_OUTPUT_H, h0[i]);
}

qg_status qg_cpu_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates, const qg_stats *stats,
                             const qg_tensor *x, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx,
                             const qg_tensor *br, const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_gru_forward";
  fwd_args a;
  a.T = x->dims[0]; a.N = x->dims[1]; a.C = x->dims[2]; a.H = R->dims[1]; a.Hy = y->dims[2];
  a.y_offset = y_offset; a.reverse = reverse;
  a.nt = stats ? 1 : qg_cpu_row_threads(a.N);
  a.x = (const float *)x->data; a.W = (const float *)W->data; a.R = (const float *)R->data;
  a.bx = (const float *)bx->data; a.br = (const float *)br->data;
  a.len = lengths ? (const int64_t *)lengths->data : NULL;
  a.y = (float *)y->data; a.hs = (float *)hs->data; a.gates = gates ? (float *)gates->data : NULL;
  a.range = stats ? (double *)stats->range->data : NULL;
  a.counts = stats ? (int64_t *)stats->counts->data : NULL;
  const int64_t TN = a.T * a.N, H3 = 3 * a.H, NH = a.N * a.H;
  a.scratch_stride = ((qg_cpu_part(a.N, 1, a.nt) + 1) * H3 + 15) & ~(int64_t)15;
  const int pack = use_packed();
  const int64_t pw = pack ? packed_floats(H3, a.C) : 0, pr = pack ? packed_floats(H3, a.H) : 0;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, (TN * H3 + a.nt * a.scratch_stride + pw + pr) * (int64_t)sizeof(float), (void **)&ws));
  a.Wx = ws; a.scratch = ws + TN * H3;
  a.Bw = (gmat){a.W, 1, H3, a.C, pack ? a.scratch + a.nt * a.scratch_stride : NULL};
  a.Br = (gmat){a.R, 1, H3, a.H, pack ? a.scratch + a.nt * a.scratch_stride + pw : NULL};
  if (pack) { pack_b(&a.Bw); pack_b(&a.Br); }

  if (h0) memcpy(a.hs, h0->data, (size_t)NH * sizeof(float));
  else memset(a.hs, 0, (size_t)NH * sizeof(float));
  if (a.nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel num_threads(a.nt))
    fwd_thread(&a, QG_THREAD_NUM());
    openblas_set_num_threads(blas);
  } else if (stats) {
    /* one thread: W x first (observed), then the recurrence */
    gemm_b(TN, a.x, a.C, &a.Bw, a.Wx, H3, 0);
    observe_inputs(&a, h0 ? (const float *)h0->data : NULL);
    if (a.gates) fwd_rows(&a, 0, a.N, a.scratch, 1, 1); else fwd_rows(&a, 0, a.N, a.scratch, 1, 0);
  } else {
    fwd_thread(&a, 0);
  }
  return QG_OK;
}

/* ---- backward -------------------------------------------------------------------------------- */

typedef struct {
  int64_t T, N, C, H, Hy;
  int y_offset, reverse, nt;
  const float *x, *W, *R, *hs, *gates, *dy, *dhn;
  const int64_t *len;
  float *dx, *dW, *dR, *dbx, *dbr, *dh0;
  float *dp, *dq;            /* [T*N, 3H]: pre-activation gradients by time index / by step */
  float *scratch;            /* per thread: dh and dh_next [rows, H] each, then at bsum_offset */
  int64_t scratch_stride;    /* the sums of its rows' dp and dq [2, 3H] */
  int64_t bsum_offset;
  gmat Br;                   /* R [3H, H] as the GEMM operand of dq R */
  gmat Bh;                   /* hs[0:T] as [T*N, H], the GEMM operand of dR (packed in the region) */
} bwd_args;

/* One valid step of one row: gradients of the pre-activations (dp, for W and x), of R h + br
 * (dq, for R, h and br) and the state gradient through z (dnext; the GEMM adds dq R after). */
QG_INLINE void bwd_point(int64_t H, const float *restrict gr, const float *restrict hp, const float *restrict dh,
                         const float *restrict dyrow, float *restrict dpr, float *restrict dqr, float *restrict dnext,
                         const int has_dy) {
  for (int64_t i = 0; i < H; i++) {
    const float z = gr[i], r = gr[H + i], g = gr[2 * H + i], q = gr[3 * H + i];
    const float dht = has_dy ? dh[i] + dyrow[i] : dh[i];
    const float dgpre = (1.0f - z) * dht * (1.0f - g * g);
    const float dzpre = (hp[i] - g) * dht * z * (1.0f - z);
    const float drpre = dgpre * q * r * (1.0f - r);
    dpr[i] = dzpre; dpr[H + i] = drpre; dpr[2 * H + i] = dgpre;
    dqr[i] = dzpre; dqr[H + i] = drpre; dqr[2 * H + i] = dgpre * r;
    dnext[i] = z * dht;
  }
}

/* The recurrence of rows [n0, n1); dh, dh_next: [n1 - n0, H] scratch; bsum [2, 3H]: this thread's
 * sums of its rows' dp and dq (the bias gradients), over steps s = T-1..0 and rows in order. */
QG_INLINE void bwd_rows(const bwd_args *a, int64_t n0, int64_t n1, float *dh, float *dh_next, float *restrict bsum,
                        const int has_dy) {
  const int64_t T = a->T, N = a->N, H = a->H, H3 = 3 * H, Hy = a->Hy, nb = n1 - n0;
  memset(bsum, 0, (size_t)(2 * H3) * sizeof(float));
  if (a->dhn) memcpy(dh, a->dhn + n0 * H, (size_t)(nb * H) * sizeof(float));
  else memset(dh, 0, (size_t)(nb * H) * sizeof(float));
  for (int64_t s = T - 1; s >= 0; s--) {
    for (int64_t n = n0; n < n1; n++) {
      const int64_t L = a->len ? a->len[n] : T;
      float *dhr = dh + (n - n0) * H, *dnr = dh_next + (n - n0) * H;
      if (s >= L) {   /* padded: the state gradient passes through; no gate gradients */
        memcpy(dnr, dhr, (size_t)H * sizeof(float));
        memset(a->dp + (s * N + n) * H3, 0, (size_t)H3 * sizeof(float));
        memset(a->dq + (s * N + n) * H3, 0, (size_t)H3 * sizeof(float));
        continue;
      }
      const int64_t t = a->reverse ? L - 1 - s : s;
      float *dpr = a->dp + (t * N + n) * H3, *dqr = a->dq + (s * N + n) * H3;
      bwd_point(H, a->gates + (s * N + n) * 4 * H, a->hs + (s * N + n) * H, dhr,
                has_dy ? a->dy + (t * N + n) * Hy + a->y_offset : NULL, dpr, dqr, dnr, has_dy);
      for (int64_t j = 0; j < H3; j++) { bsum[j] += dpr[j]; bsum[H3 + j] += dqr[j]; }
    }
    gemm_b(nb, a->dq + (s * N + n0) * H3, H3, &a->Br, dh_next, H, 1);
    float *tmp = dh; dh = dh_next; dh_next = tmp;
  }
  if (a->dh0) memcpy(a->dh0 + n0 * H, dh, (size_t)(nb * H) * sizeof(float));
}

/* dR rows [j0, j1) += dq[:, j0:j1]^T hs[0:T]: with hs packed (a->Bh), in blocks of 256 of the
 * T*N sums so that a block of packed hs stays in the cache; else CBLAS. */
static void dR_rows(const bwd_args *a, int64_t j0, int64_t j1) {
  const int64_t H = a->H, H3 = 3 * H, TN = a->T * a->N;
#ifdef QG_HAVE_AVX512_KERNEL
  if (a->Bh.packed) {
    for (int64_t k0 = 0; k0 < TN; k0 += 256)
      gemm_packed(j1 - j0, a->dq + j0, 1, H3, &a->Bh, k0, k0 + 256 < TN ? k0 + 256 : TN, a->dR + j0 * H, H, 1);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(j1 - j0), (int)H, (int)TN, 1.0f, a->dq + j0, (int)H3, a->hs,
              (int)H, 1.0f, a->dR + j0 * H, (int)H);
}

/* Weight-gradient task i of ntask: its share of the rows of dx, of the rows of dW and dR (each a
 * GEMM), and of the columns of dbx and dbr (the threads' partial sums added in thread order). The shares depend only
 * on i and ntask, so the results do not depend on which thread runs which task. */
static void bwd_weights(const bwd_args *a, int i, int ntask) {
  const int64_t C = a->C, H = a->H, H3 = 3 * H, TN = a->T * a->N;
  const int64_t r0 = qg_cpu_part(TN, i, ntask), r1 = qg_cpu_part(TN, i + 1, ntask), j0 = qg_cpu_part(H3, i, ntask), j1 = qg_cpu_part(H3, i + 1, ntask);
  if (a->dx && C > 0 && r1 > r0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)C, (int)H3, 1.0f, a->dp + r0 * H3, (int)H3,
                a->W, (int)C, 1.0f, a->dx + r0 * C, (int)C);
  if (j1 > j0) {
    if (C > 0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(j1 - j0), (int)C, (int)TN, 1.0f, a->dp + j0, (int)H3,
                  a->x, (int)C, 1.0f, a->dW + j0 * C, (int)C);
    dR_rows(a, j0, j1);
    for (int k = 0; k < a->nt; k++) {   /* the threads' partial sums, in thread order */
      const float *bsum = a->scratch + k * a->scratch_stride + a->bsum_offset;
      for (int64_t j = j0; j < j1; j++) { a->dbx[j] += bsum[j]; a->dbr[j] += bsum[H3 + j]; }
    }
  }
}

/* Thread k of nt: its rows' recurrence, then (after all threads) weight-gradient tasks, handed out
 * dynamically so that a thread the system delays does not hold the others up. */
QG_CLONES static void bwd_thread(const bwd_args *a, int k) {
  const int nt = a->nt;
  const int64_t N = a->N, H = a->H, n0 = qg_cpu_part(N, k, nt), n1 = qg_cpu_part(N, k + 1, nt);
  float *dh = a->scratch + k * a->scratch_stride, *dh_next = dh + (n1 - n0) * H;
  float *bsum = a->scratch + k * a->scratch_stride + a->bsum_offset;
  if (a->dy) bwd_rows(a, n0, n1, dh, dh_next, bsum, 1); else bwd_rows(a, n0, n1, dh, dh_next, bsum, 0);
  if (a->T * N <= 0 || H <= 0) return;
  if (a->Bh.packed) pack_panels(&a->Bh, qg_cpu_part((H + 15) / 16, k, nt), qg_cpu_part((H + 15) / 16, k + 1, nt));
  const int ntask = nt > 1 ? 4 * nt : 1;
  QG_PRAGMA(omp barrier)   /* every row's dp and dq are complete */
  QG_PRAGMA(omp for schedule(dynamic, 1))
  for (int i = 0; i < ntask; i++) bwd_weights(a, i, ntask);
}

qg_status qg_cpu_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                              qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_tensor *x,
                              const qg_tensor *W, const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates,
                              const qg_tensor *lengths, int reverse) {
  const char *fn = "qg_gru_backward";
  bwd_args a;
  a.T = x->dims[0]; a.N = x->dims[1]; a.C = x->dims[2]; a.H = R->dims[1]; a.Hy = dy ? dy->dims[2] : 0;
  a.y_offset = y_offset; a.reverse = reverse;
  a.nt = qg_cpu_row_threads(a.N);
  a.x = (const float *)x->data; a.W = (const float *)W->data; a.R = (const float *)R->data;
  a.hs = (const float *)hs->data; a.gates = (const float *)gates->data;
  a.dy = dy ? (const float *)dy->data : NULL; a.dhn = dhn ? (const float *)dhn->data : NULL;
  a.len = lengths ? (const int64_t *)lengths->data : NULL;
  a.dx = dx ? (float *)dx->data : NULL; a.dW = (float *)dW->data; a.dR = (float *)dR->data;
  a.dbx = (float *)dbx->data; a.dbr = (float *)dbr->data; a.dh0 = dh0 ? (float *)dh0->data : NULL;
  const int64_t TNH3 = a.T * a.N * 3 * a.H;
  a.bsum_offset = 2 * (qg_cpu_part(a.N, 1, a.nt) + 1) * a.H;
  a.scratch_stride = (a.bsum_offset + 6 * a.H + 15) & ~(int64_t)15;
  const int pack = use_packed();
  const int64_t TN = a.T * a.N, pr = pack ? packed_floats(a.H, 3 * a.H) : 0, ph = pack ? packed_floats(a.H, TN) : 0;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, (2 * TNH3 + a.nt * a.scratch_stride + pr + ph) * (int64_t)sizeof(float), (void **)&ws));
  a.dp = ws; a.dq = ws + TNH3; a.scratch = ws + 2 * TNH3;
  a.Br = (gmat){a.R, 0, a.H, 3 * a.H, pack ? a.scratch + a.nt * a.scratch_stride : NULL};
  a.Bh = (gmat){a.hs, 0, a.H, TN, pack ? a.scratch + a.nt * a.scratch_stride + pr : NULL};
  if (pack) pack_b(&a.Br);
  if (a.nt > 1) {
    const int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    QG_PRAGMA(omp parallel num_threads(a.nt))
    bwd_thread(&a, QG_THREAD_NUM());
    openblas_set_num_threads(blas);
  } else {
    bwd_thread(&a, 0);
  }
  return QG_OK;
}

/* ---- both directions: one after the other ------------------------------------------------------ */

qg_status qg_cpu_gru_forward_bidir(qg_ctx *ctx, qg_tensor *y, qg_tensor *const *hs, qg_tensor *const *gates, const qg_tensor *x,
                                   const qg_tensor *const *W, const qg_tensor *const *R, const qg_tensor *const *bx,
                                   const qg_tensor *const *br, const qg_tensor *const *h0, const qg_tensor *lengths) {
  const int H = (int)R[0]->dims[1];
  for (int d = 0; d < 2; d++)
    QG_CHECK(qg_cpu_gru_forward(ctx, y, d * H, hs[d], gates ? gates[d] : NULL, NULL, x, W[d], R[d], bx[d], br[d],
                                h0 ? h0[d] : NULL, lengths, d));
  return QG_OK;
}

qg_status qg_cpu_gru_backward_bidir(qg_ctx *ctx, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR,
                                    qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0, const qg_tensor *dy,
                                    const qg_tensor *const *dhn, const qg_tensor *x, const qg_tensor *const *W,
                                    const qg_tensor *const *R, const qg_tensor *const *hs, const qg_tensor *const *gates,
                                    const qg_tensor *lengths) {
  const int H = (int)R[0]->dims[1];
  for (int d = 0; d < 2; d++)
    QG_CHECK(qg_cpu_gru_backward(ctx, dx, dW[d], dR[d], dbx[d], dbr[d], dh0 ? dh0[d] : NULL, dy, d * H, dhn ? dhn[d] : NULL,
                                 x, W[d], R[d], hs[d], gates[d], lengths, d));
  return QG_OK;
}

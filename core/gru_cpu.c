/*
 * gru_cpu.c: the float32 GRU forward and backward on the CPU, one layer and one direction per
 * call (the Lua GRU module stacks layers and directions). This is the reference path: the same
 * structure as Haste's GPU code, written plainly.
 *
 * Forward:  one GEMM for W x over all T steps; per step one GEMM R h and one pointwise loop.
 * Backward: per step one pointwise loop and one GEMM (dh += dq R); after the loop three large
 *           GEMMs give dx, dW and dR, and plain column sums give dbx and dbr (deterministic).
 * Both take their scratch from the context workspace once, before the time loop.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

qg_status qg_check_gru_args(qg_ctx *ctx, const char *fn, const qg_tensor *x, const qg_tensor *W,
                                const qg_tensor *R, int64_t *T, int64_t *N, int64_t *C, int64_t *H) {
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 3, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "R", R, QG_F32, 2, NULL));
  *T = x->dims[0]; *N = x->dims[1]; *C = x->dims[2]; *H = R->dims[1];
  int64_t w[2] = {3 * *H, *C}, r[2] = {3 * *H, *H};
  QG_CHECK(qg_check_tensor(ctx, fn, "W", W, QG_F32, 2, w));
  QG_CHECK(qg_check_tensor(ctx, fn, "R", R, QG_F32, 2, r));
  if (x->device != QG_CPU || W->device != QG_CPU || R->device != QG_CPU)
    return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "cuda tensors: the CUDA GRU kernels are not in this build yet");
  return QG_OK;
}

static qg_status check_cpu_f32(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t, int ndim, const int64_t *dims) {
  QG_CHECK(qg_check_tensor(ctx, fn, arg, t, QG_F32, ndim, dims));
  if (t->device != QG_CPU) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%s is a cuda tensor; this build's GRU is CPU only", arg);
  return QG_OK;
}

static qg_status check_y(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *y, int y_offset,
                         int64_t T, int64_t N, int64_t H) {
  int64_t d[3] = {T, N, -1};
  QG_CHECK(check_cpu_f32(ctx, fn, arg, y, 3, d));
  if (y_offset < 0 || y_offset + H > y->dims[2])
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: columns [%d, %lld) do not fit in its last dim %lld", arg, y_offset,
                   (long long)(y_offset + H), (long long)y->dims[2]);
  return QG_OK;
}

qg_status qg_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates,
                         const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                         const qg_tensor *bx, const qg_tensor *br, const qg_tensor *h0, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t T, N, C, H;
  QG_CHECK(qg_check_gru_args(ctx, fn, x, W, R, &T, &N, &C, &H));
  int64_t b3[1] = {3 * H}, hsd[3] = {T + 1, N, H}, gd[3] = {T, N, 4 * H}, h0d[2] = {N, H};
  QG_CHECK(check_cpu_f32(ctx, fn, "bx", bx, 1, b3));
  QG_CHECK(check_cpu_f32(ctx, fn, "br", br, 1, b3));
  QG_CHECK(check_y(ctx, fn, "y", y, y_offset, T, N, H));
  QG_CHECK(check_cpu_f32(ctx, fn, "hs", hs, 3, hsd));
  if (gates) QG_CHECK(check_cpu_f32(ctx, fn, "gates", gates, 3, gd));
  if (h0) QG_CHECK(check_cpu_f32(ctx, fn, "h0", h0, 2, h0d));

  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, (3 * T * N * H + 3 * N * H) * (int64_t)sizeof(float), (void **)&ws));
  float *Wx = ws, *Rh = ws + 3 * T * N * H;
  const int64_t H3 = 3 * H, Hy = y->dims[2];
  const float *bxp = (const float *)bx->data, *brp = (const float *)br->data;
  float *hsp = (float *)hs->data, *yp = (float *)y->data, *gp = gates ? (float *)gates->data : NULL;

  if (T * N > 0 && H > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(T * N), (int)H3, (int)C, 1.0f,
                (const float *)x->data, (int)C, (const float *)W->data, (int)C, 0.0f, Wx, (int)H3);
  if (h0) memcpy(hsp, h0->data, (size_t)(N * H) * sizeof(float));
  else memset(hsp, 0, (size_t)(N * H) * sizeof(float));

  for (int64_t s = 0; s < T; s++) {
    const int64_t t = reverse ? T - 1 - s : s;
    const float *hp = hsp + s * N * H;
    float *hn = hsp + (s + 1) * N * H;
    if (N > 0 && H > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)H3, (int)H, 1.0f, hp, (int)H,
                  (const float *)R->data, (int)H, 0.0f, Rh, (int)H3);
    for (int64_t n = 0; n < N; n++) {
      const float *wx = Wx + (t * N + n) * H3, *rh = Rh + n * H3;
      float *yrow = yp + (t * N + n) * Hy + y_offset;
      float *grow = gp ? gp + (s * N + n) * 4 * H : NULL;
      for (int64_t i = 0; i < H; i++) {
        const float z = sigmoidf(wx[i] + bxp[i] + rh[i] + brp[i]);
        const float r = sigmoidf(wx[H + i] + bxp[H + i] + rh[H + i] + brp[H + i]);
        const float q = rh[2 * H + i] + brp[2 * H + i];
        const float g = tanhf(wx[2 * H + i] + bxp[2 * H + i] + r * q);
        const float h = z * hp[n * H + i] + (1.0f - z) * g;
        hn[n * H + i] = h;
        yrow[i] = h;
        if (grow) { grow[i] = z; grow[H + i] = r; grow[2 * H + i] = g; grow[3 * H + i] = q; }
      }
    }
  }
  return QG_OK;
}

static void add_column_sums(float *out, const float *m, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[c] += m[r * cols + c];
}

qg_status qg_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                          qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0,
                          const qg_tensor *dy, int y_offset, const qg_tensor *dhn,
                          const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                          const qg_tensor *hs, const qg_tensor *gates, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t T, N, C, H;
  QG_CHECK(qg_check_gru_args(ctx, fn, x, W, R, &T, &N, &C, &H));
  int64_t b3[1] = {3 * H}, hsd[3] = {T + 1, N, H}, gd[3] = {T, N, 4 * H}, nh[2] = {N, H};
  int64_t xd[3] = {T, N, C}, wd[2] = {3 * H, C}, rd[2] = {3 * H, H};
  if (!gates) return qg_fail(ctx, QG_ERR_ARG, fn, "gates is NULL: run the forward in training mode first");
  QG_CHECK(check_cpu_f32(ctx, fn, "hs", hs, 3, hsd));
  QG_CHECK(check_cpu_f32(ctx, fn, "gates", gates, 3, gd));
  if (dx) QG_CHECK(check_cpu_f32(ctx, fn, "dx", dx, 3, xd));
  QG_CHECK(check_cpu_f32(ctx, fn, "dW", dW, 2, wd));
  QG_CHECK(check_cpu_f32(ctx, fn, "dR", dR, 2, rd));
  QG_CHECK(check_cpu_f32(ctx, fn, "dbx", dbx, 1, b3));
  QG_CHECK(check_cpu_f32(ctx, fn, "dbr", dbr, 1, b3));
  if (dh0) QG_CHECK(check_cpu_f32(ctx, fn, "dh0", dh0, 2, nh));
  if (dy) QG_CHECK(check_y(ctx, fn, "dy", dy, y_offset, T, N, H));
  if (dhn) QG_CHECK(check_cpu_f32(ctx, fn, "dhn", dhn, 2, nh));

  const int64_t H3 = 3 * H;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, (2 * T * N * H3 + 2 * N * H) * (int64_t)sizeof(float), (void **)&ws));
  float *dp = ws, *dq = ws + T * N * H3, *dh = dq + T * N * H3, *dh_next = dh + N * H;
  const float *hsp = (const float *)hs->data, *gp = (const float *)gates->data;
  const float *dyp = dy ? (const float *)dy->data : NULL;
  const int64_t Hy = dy ? dy->dims[2] : 0;

  if (dhn) memcpy(dh, dhn->data, (size_t)(N * H) * sizeof(float));
  else memset(dh, 0, (size_t)(N * H) * sizeof(float));

  for (int64_t s = T - 1; s >= 0; s--) {
    const int64_t t = reverse ? T - 1 - s : s;
    const float *hp = hsp + s * N * H;
    for (int64_t n = 0; n < N; n++) {
      const float *gr = gp + (s * N + n) * 4 * H;
      const float *dyrow = dyp ? dyp + (t * N + n) * Hy + y_offset : NULL;
      float *dpr = dp + (t * N + n) * H3, *dqr = dq + (s * N + n) * H3;
      for (int64_t i = 0; i < H; i++) {
        const float z = gr[i], r = gr[H + i], g = gr[2 * H + i], q = gr[3 * H + i];
        const float dht = dh[n * H + i] + (dyrow ? dyrow[i] : 0.0f);
        const float dgpre = (1.0f - z) * dht * (1.0f - g * g);
        const float dzpre = (hp[n * H + i] - g) * dht * z * (1.0f - z);
        const float drpre = dgpre * q * r * (1.0f - r);
        dpr[i] = dzpre; dpr[H + i] = drpre; dpr[2 * H + i] = dgpre;
        dqr[i] = dzpre; dqr[H + i] = drpre; dqr[2 * H + i] = dgpre * r;
        dh_next[n * H + i] = z * dht;
      }
    }
    if (N > 0 && H > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)H3, 1.0f, dq + s * N * H3,
                  (int)H3, (const float *)R->data, (int)H, 1.0f, dh_next, (int)H);
    float *tmp = dh; dh = dh_next; dh_next = tmp;
  }
  if (dh0) memcpy(dh0->data, dh, (size_t)(N * H) * sizeof(float));
  if (T * N > 0 && H > 0) {
    if (dx && C > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(T * N), (int)C, (int)H3, 1.0f, dp, (int)H3,
                  (const float *)W->data, (int)C, 1.0f, (float *)dx->data, (int)C);
    if (C > 0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)C, (int)(T * N), 1.0f, dp, (int)H3,
                  (const float *)x->data, (int)C, 1.0f, (float *)dW->data, (int)C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)H, (int)(T * N), 1.0f, dq, (int)H3,
                hsp, (int)H, 1.0f, (float *)dR->data, (int)H);
    add_column_sums((float *)dbx->data, dp, T * N, H3);
    add_column_sums((float *)dbr->data, dq, T * N, H3);
  }
  return QG_OK;
}

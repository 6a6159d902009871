/*
 * linear_cpu.c: the fully connected layer y = x W^T + b on the CPU (CBLAS), and its backward.
 */
#include "internal.h"

#include <cblas.h>

static qg_status check_f32_cpu(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t, int ndim, const int64_t *dims) {
  QG_CHECK(qg_check_tensor(ctx, fn, arg, t, QG_F32, ndim, dims));
  if (t->device != QG_CPU) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "%s is a cuda tensor; this build's Linear is CPU only", arg);
  return QG_OK;
}

/* Checks W [O, In], x [N, In], the output-shaped tensor y [N, O] and the bias-shaped b [O] (may be
 * NULL); fills N, O, In. */
static qg_status check_linear(qg_ctx *ctx, const char *fn, const char *yname, const qg_tensor *y, const char *bname,
                              const qg_tensor *b, const qg_tensor *x, const qg_tensor *W, int64_t *N, int64_t *O, int64_t *In) {
  QG_CHECK(check_f32_cpu(ctx, fn, "W", W, 2, NULL));
  *O = W->dims[0]; *In = W->dims[1];
  int64_t xd[2] = {-1, *In};
  QG_CHECK(check_f32_cpu(ctx, fn, "x", x, 2, xd));
  *N = x->dims[0];
  int64_t yd[2] = {*N, *O}, bd[1] = {*O};
  QG_CHECK(check_f32_cpu(ctx, fn, yname, y, 2, yd));
  if (b) QG_CHECK(check_f32_cpu(ctx, fn, bname, b, 1, bd));
  return QG_OK;
}

qg_status qg_linear_forward(qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t N, O, In;
  QG_CHECK(check_linear(ctx, fn, "y", y, "b", b, x, W, &N, &O, &In));
  float *yp = (float *)y->data;
  if (b) {
    const float *bp = (const float *)b->data;
    for (int64_t n = 0; n < N; n++) for (int64_t o = 0; o < O; o++) yp[n * O + o] = bp[o];
  }
  if (N > 0 && O > 0 && In > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)In, 1.0f, (const float *)x->data, (int)In,
                (const float *)W->data, (int)In, b ? 1.0f : 0.0f, yp, (int)O);
  else if (!b)
    for (int64_t i = 0; i < N * O; i++) yp[i] = 0.0f;
  return QG_OK;
}

qg_status qg_linear_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db,
                             const qg_tensor *dy, const qg_tensor *x, const qg_tensor *W) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t N, O, In;
  QG_CHECK(check_linear(ctx, fn, "dy", dy, "db", db, x, W, &N, &O, &In));
  if (dW) QG_CHECK(check_f32_cpu(ctx, fn, "dW", dW, 2, W->dims));
  if (dx) QG_CHECK(check_f32_cpu(ctx, fn, "dx", dx, 2, x->dims));
  const float *dyp = (const float *)dy->data;
  if (N > 0 && O > 0 && In > 0) {
    if (dx)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)In, (int)O, 1.0f, dyp, (int)O,
                  (const float *)W->data, (int)In, 0.0f, (float *)dx->data, (int)In);
    if (dW)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)O, (int)In, (int)N, 1.0f, dyp, (int)O,
                  (const float *)x->data, (int)In, 1.0f, (float *)dW->data, (int)In);
  } else if (dx) {
    for (int64_t i = 0; i < N * In; i++) ((float *)dx->data)[i] = 0.0f;
  }
  if (db) {
    float *dbp = (float *)db->data;
    for (int64_t n = 0; n < N; n++) for (int64_t o = 0; o < O; o++) dbp[o] += dyp[n * O + o];
  }
  return QG_OK;
}

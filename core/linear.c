/*
 * linear.c: front doors of the fully connected layer y = x W^T + b (qgru.h): argument checks,
 * then dispatch to the device's backend (core/linear_cpu.c, kernels/linear.cu).
 */
#include "backend.h"

/* Checks W [O, In], x [N, In], the output-shaped tensor y [N, O] and the bias-shaped b [O] (may be
 * NULL), all f32; fills N, O, In. */
static qg_status check_linear(qg_ctx *ctx, const char *fn, const char *yname, const qg_tensor *y, const char *bname,
                              const qg_tensor *b, const qg_tensor *x, const qg_tensor *W, int64_t *N, int64_t *O, int64_t *In) {
  QG_CHECK(qg_check_tensor(ctx, fn, "W", W, QG_F32, 2, NULL));
  *O = W->dims[0]; *In = W->dims[1];
  int64_t xd[2] = {-1, *In};
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 2, xd));
  *N = x->dims[0];
  int64_t yd[2] = {*N, *O}, bd[1] = {*O};
  QG_CHECK(qg_check_tensor(ctx, fn, yname, y, QG_F32, 2, yd));
  if (b) QG_CHECK(qg_check_tensor(ctx, fn, bname, b, QG_F32, 1, bd));
  return QG_OK;
}

qg_status qg_linear_forward(qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t N, O, In;
  QG_CHECK(check_linear(ctx, fn, "y", y, "b", b, x, W, &N, &O, &In));
  const qg_tensor *ts[] = {y, x, W, b};
  const char *names[] = {"y", "x", "W", "b"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 4, ts, names));
  return QG_DISPATCH(ctx, dev, linear_forward, y, x, W, b);
}

qg_status qg_linear_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db,
                             const qg_tensor *dy, const qg_tensor *x, const qg_tensor *W) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t N, O, In;
  QG_CHECK(check_linear(ctx, fn, "dy", dy, "db", db, x, W, &N, &O, &In));
  if (dW) QG_CHECK(qg_check_tensor(ctx, fn, "dW", dW, QG_F32, 2, W->dims));
  if (dx) QG_CHECK(qg_check_tensor(ctx, fn, "dx", dx, QG_F32, 2, x->dims));
  const qg_tensor *ts[] = {dx, dW, db, dy, x, W};
  const char *names[] = {"dx", "dW", "db", "dy", "x", "W"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 6, ts, names));
  return QG_DISPATCH(ctx, dev, linear_backward, dx, dW, db, dy, x, W);
}

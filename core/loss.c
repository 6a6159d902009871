/*
 * loss.c: front doors of the losses and the classification count (qgru.h): cross-entropy with
 * logits, mean squared error and qg_count_correct. Shapes, dtypes and devices are checked once;
 * the work (and the checks that read tensor values, such as class indices in range) is the
 * backend's (core/loss_cpu.c, kernels/loss.cu).
 */
#include "backend.h"

/* logits [N, K] f32 (N, K >= 1), target i64 [N], the logits-shaped d (may be NULL); fills dev. */
static qg_status check_classes(qg_ctx *ctx, const char *fn, int *dev, const char *dname, const qg_tensor *d,
                               const qg_tensor *logits, const qg_tensor *target) {
  QG_CHECK(qg_check_tensor(ctx, fn, "logits", logits, QG_F32, 2, NULL));
  int64_t td[1] = {logits->dims[0]};
  QG_CHECK(qg_check_tensor(ctx, fn, "target", target, QG_I64, 1, td));
  if (d) QG_CHECK(qg_check_tensor(ctx, fn, dname, d, QG_F32, 2, logits->dims));
  if (logits->dims[0] == 0) return qg_fail(ctx, QG_ERR_ARG, fn, "empty batch");
  if (logits->dims[1] == 0) return qg_fail(ctx, QG_ERR_ARG, fn, "logits has no classes (shape [%lld, 0])", (long long)logits->dims[0]);
  const qg_tensor *ts[] = {d, logits, target};
  const char *names[] = {dname, "logits", "target"};
  return qg_common_device(ctx, fn, dev, 3, ts, names);
}

qg_status qg_cross_entropy(qg_ctx *ctx, double *loss, qg_tensor *dlogits,
                           const qg_tensor *logits, const qg_tensor *target, double scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!loss) return qg_fail(ctx, QG_ERR_ARG, fn, "loss is NULL");
  int dev;
  QG_CHECK(check_classes(ctx, fn, &dev, "dlogits", dlogits, logits, target));
  return QG_DISPATCH(ctx, dev, cross_entropy, loss, dlogits, logits, target, scale);
}

qg_status qg_count_correct(qg_ctx *ctx, int64_t *correct, const qg_tensor *logits, const qg_tensor *target) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!correct) return qg_fail(ctx, QG_ERR_ARG, fn, "correct is NULL");
  int dev;
  QG_CHECK(check_classes(ctx, fn, &dev, "(none)", NULL, logits, target));
  return QG_DISPATCH(ctx, dev, count_correct, correct, logits, target);
}

qg_status qg_mse(qg_ctx *ctx, double *loss, qg_tensor *dpred,
                 const qg_tensor *pred, const qg_tensor *target, double scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!loss) return qg_fail(ctx, QG_ERR_ARG, fn, "loss is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "pred", pred, QG_F32, -1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "target", target, QG_F32, pred->ndim, pred->dims));
  if (dpred) QG_CHECK(qg_check_tensor(ctx, fn, "dpred", dpred, QG_F32, pred->ndim, pred->dims));
  if (pred->numel == 0) return qg_fail(ctx, QG_ERR_ARG, fn, "empty input");
  const qg_tensor *ts[] = {dpred, pred, target};
  const char *names[] = {"dpred", "pred", "target"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 3, ts, names));
  return QG_DISPATCH(ctx, dev, mse, loss, dpred, pred, target, scale);
}

/*
 * loss_cpu.c: cross-entropy with logits and mean squared error on the CPU. Losses are computed in
 * double and averaged over the batch; the gradient is written in the same pass when asked for.
 */
#include "internal.h"

#include <math.h>

qg_status qg_cross_entropy(qg_ctx *ctx, double *loss, qg_tensor *dlogits,
                           const qg_tensor *logits, const qg_tensor *target, double scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!loss) return qg_fail(ctx, QG_ERR_ARG, fn, "loss is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "logits", logits, QG_F32, 2, NULL));
  int64_t N = logits->dims[0], K = logits->dims[1], td[1] = {N};
  QG_CHECK(qg_check_tensor(ctx, fn, "target", target, QG_I64, 1, td));
  if (dlogits) QG_CHECK(qg_check_tensor(ctx, fn, "dlogits", dlogits, QG_F32, 2, logits->dims));
  if (logits->device != QG_CPU || target->device != QG_CPU || (dlogits && dlogits->device != QG_CPU))
    return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "cuda tensors: the CUDA loss kernels are not in this build yet");
  if (N == 0) return qg_fail(ctx, QG_ERR_ARG, fn, "empty batch");
  const int64_t *tp = (const int64_t *)target->data;
  for (int64_t n = 0; n < N; n++)
    if (tp[n] < 0 || tp[n] >= K)
      return qg_fail(ctx, QG_ERR_ARG, fn, "target[%lld] = %lld is not a class index in [0, %lld)", (long long)n,
                     (long long)tp[n], (long long)K);
  const float *lp = (const float *)logits->data;
  double total = 0;
  for (int64_t n = 0; n < N; n++) {
    const float *row = lp + n * K;
    double mx = row[0];
    for (int64_t k = 1; k < K; k++) if (row[k] > mx) mx = row[k];
    double se = 0;
    for (int64_t k = 0; k < K; k++) se += exp((double)row[k] - mx);
    double lse = mx + log(se);
    total += lse - row[tp[n]];
    if (dlogits) {
      float *d = (float *)dlogits->data + n * K;
      for (int64_t k = 0; k < K; k++) {
        double p = exp((double)row[k] - lse);
        d[k] = (float)(scale * (p - (k == tp[n] ? 1.0 : 0.0)) / (double)N);
      }
    }
  }
  *loss = total / (double)N;
  return QG_OK;
}

qg_status qg_mse(qg_ctx *ctx, double *loss, qg_tensor *dpred,
                 const qg_tensor *pred, const qg_tensor *target, double scale) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!loss) return qg_fail(ctx, QG_ERR_ARG, fn, "loss is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "pred", pred, QG_F32, -1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "target", target, QG_F32, pred->ndim, pred->dims));
  if (dpred) QG_CHECK(qg_check_tensor(ctx, fn, "dpred", dpred, QG_F32, pred->ndim, pred->dims));
  if (pred->device != QG_CPU || target->device != QG_CPU || (dpred && dpred->device != QG_CPU))
    return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "cuda tensors: the CUDA loss kernels are not in this build yet");
  if (pred->numel == 0) return qg_fail(ctx, QG_ERR_ARG, fn, "empty input");
  const float *p = (const float *)pred->data, *t = (const float *)target->data;
  double total = 0, inv = 1.0 / (double)pred->numel;
  for (int64_t i = 0; i < pred->numel; i++) {
    double d = (double)p[i] - (double)t[i];
    total += d * d;
    if (dpred) ((float *)dpred->data)[i] = (float)(scale * 2.0 * d * inv);
  }
  *loss = total * inv;
  return QG_OK;
}

/*
 * loss_cpu.c: the CPU backends of the losses (front doors in loss.c): cross-entropy with logits
 * and mean squared error, computed in double and averaged over the batch, the gradient written
 * in the same pass when asked for; and the count of rows whose argmax is the target class.
 */
#include "backend.h"

#include <math.h>

qg_status qg_cpu_cross_entropy(qg_ctx *ctx, double *loss, qg_tensor *dlogits,
                               const qg_tensor *logits, const qg_tensor *target, double scale) {
  const int64_t N = logits->dims[0], K = logits->dims[1];
  const int64_t *tp = (const int64_t *)target->data;
  for (int64_t n = 0; n < N; n++)
    if (tp[n] < 0 || tp[n] >= K)
      return qg_fail(ctx, QG_ERR_ARG, "qg_cross_entropy", "target[%lld] = %lld is not a class index in [0, %lld)",
                     (long long)n, (long long)tp[n], (long long)K);
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

qg_status qg_cpu_count_correct(qg_ctx *ctx, int64_t *correct, const qg_tensor *logits, const qg_tensor *target) {
  (void)ctx;
  const int64_t N = logits->dims[0], K = logits->dims[1];
  const float *lp = (const float *)logits->data;
  const int64_t *tp = (const int64_t *)target->data;
  int64_t c = 0;
  for (int64_t n = 0; n < N; n++) {
    const float *row = lp + n * K;
    int64_t best = 0;
    for (int64_t k = 1; k < K; k++) if (row[k] > row[best]) best = k;
    c += best == tp[n];
  }
  *correct = c;
  return QG_OK;
}

qg_status qg_cpu_mse(qg_ctx *ctx, double *loss, qg_tensor *dpred,
                     const qg_tensor *pred, const qg_tensor *target, double scale) {
  (void)ctx;
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

/*
 * tensor_checks.c: checks of a tensor's values that loaders and the training loop use to report
 * bad data by name: qg_count_nonfinite counts NaN and +-Inf entries (f32/f64 on the CPU) and
 * finds the first one, so a weights file or batch with non-finite values is reported, not used.
 */
#include "internal.h"

#include <math.h>

qg_status qg_count_nonfinite(qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!count || !first_index) return qg_fail(ctx, QG_ERR_ARG, fn, "count or first_index is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "t", t, -1, -1, NULL));
  if (t->device != QG_CPU) return qg_fail(ctx, QG_ERR_DEVICE, fn, "t must be a cpu tensor (copy it to the cpu first)");
  int64_t n = 0, first = -1;
  if (t->dtype == QG_F32) {
    const float *p = (const float *)t->data;
    for (int64_t i = 0; i < t->numel; i++)
      if (!isfinite(p[i])) { if (first < 0) first = i; n++; }
  } else if (t->dtype == QG_F64) {
    const double *p = (const double *)t->data;
    for (int64_t i = 0; i < t->numel; i++)
      if (!isfinite(p[i])) { if (first < 0) first = i; n++; }
  }
  *count = n;
  *first_index = first;
  return QG_OK;
}

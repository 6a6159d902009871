/*
 * tensor_checks.c: checks of a tensor's values that loaders and the training loop use to report
 * bad data by name: qg_count_nonfinite counts NaN and +-Inf entries (f32/f64, any device) and
 * finds the first one, so a weights file or batch with non-finite values is reported, not used.
 * The front door; the backends are in core/tensor_cpu.c and kernels/tensor.cu.
 */
#include "backend.h"

qg_status qg_count_nonfinite(qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!count || !first_index) return qg_fail(ctx, QG_ERR_ARG, fn, "count or first_index is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "t", t, -1, -1, NULL));
  return QG_DISPATCH(ctx, t->device, count_nonfinite, count, first_index, t);
}

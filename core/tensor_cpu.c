/*
 * tensor_cpu.c: the CPU backends of the small tensor operations (front doors in tensor.c):
 * axpy, scale, sum of squares (in double, element order), argmax of rows (first on ties),
 * index_select along dim 0 (indices checked here: they are values) and the dim-0/1 transpose.
 */
#include "backend.h"

#include <string.h>

qg_status qg_cpu_axpy(qg_ctx *ctx, qg_tensor *y, double alpha, const qg_tensor *x) {
  (void)ctx;
  if (y->dtype == QG_F32) {
    float *d = (float *)y->data; const float *s = (const float *)x->data; const float a = (float)alpha;
    for (int64_t i = 0; i < y->numel; i++) d[i] += a * s[i];
  } else {
    double *d = (double *)y->data; const double *s = (const double *)x->data;
    for (int64_t i = 0; i < y->numel; i++) d[i] += alpha * s[i];
  }
  return QG_OK;
}

qg_status qg_cpu_scale(qg_ctx *ctx, qg_tensor *t, double alpha) {
  (void)ctx;
  if (t->dtype == QG_F32) {
    float *d = (float *)t->data; const float a = (float)alpha;
    for (int64_t i = 0; i < t->numel; i++) d[i] *= a;
  } else {
    double *d = (double *)t->data;
    for (int64_t i = 0; i < t->numel; i++) d[i] *= alpha;
  }
  return QG_OK;
}

qg_status qg_cpu_sum_squares(qg_ctx *ctx, double *out, const qg_tensor *t) {
  (void)ctx;
  double s = 0;
  if (t->dtype == QG_F32) {
    const float *d = (const float *)t->data;
    for (int64_t i = 0; i < t->numel; i++) s += (double)d[i] * d[i];
  } else {
    const double *d = (const double *)t->data;
    for (int64_t i = 0; i < t->numel; i++) s += d[i] * d[i];
  }
  *out = s;
  return QG_OK;
}

qg_status qg_cpu_argmax_rows(qg_ctx *ctx, qg_tensor *out, const qg_tensor *x) {
  (void)ctx;
  const int64_t N = x->dims[0], K = x->dims[1];
  const float *d = (const float *)x->data;
  int64_t *o = (int64_t *)out->data;
  for (int64_t n = 0; n < N; n++) {
    int64_t best = 0;
    for (int64_t k = 1; k < K; k++) if (d[n * K + k] > d[n * K + best]) best = k;
    o[n] = best;
  }
  return QG_OK;
}

qg_status qg_cpu_index_select(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src, const qg_tensor *index) {
  const int64_t *idx = (const int64_t *)index->data;
  const int64_t rows = src->dims[0];
  const int64_t row_bytes = rows ? qg_tensor_bytes(src) / rows : 0;
  for (int64_t i = 0; i < index->numel; i++)
    if (idx[i] < 0 || idx[i] >= rows)
      return qg_fail(ctx, QG_ERR_ARG, "qg_index_select", "index[%lld] = %lld is outside [0, %lld)", (long long)i,
                     (long long)idx[i], (long long)rows);
  for (int64_t i = 0; i < index->numel; i++)
    memcpy((char *)out->data + i * row_bytes, (const char *)src->data + idx[i] * row_bytes, (size_t)row_bytes);
  return QG_OK;
}

qg_status qg_cpu_transpose01(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src) {
  (void)ctx;
  const int64_t A = src->dims[0], B = src->dims[1];
  const int64_t inner = (A > 0 && B > 0) ? qg_tensor_bytes(src) / (A * B) : 0;
  for (int64_t a = 0; a < A; a++)
    for (int64_t b = 0; b < B; b++)
      memcpy((char *)out->data + (b * A + a) * inner, (const char *)src->data + (a * B + b) * inner, (size_t)inner);
  return QG_OK;
}

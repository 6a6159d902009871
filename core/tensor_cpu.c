/*
 * tensor_cpu.c: the CPU backends of the small tensor operations (front doors in tensor.c and
 * tensor_checks.c): fill and dtype conversion (C casts), axpy, scale, sum of squares (in double,
 * element order), argmax of rows (first on ties), index_select along dim 0 (indices checked here:
 * they are values), the dim-0/1 transpose and the count of non-finite values.
 */
#include "backend.h"

#include <math.h>
#include <string.h>

/* Reads element i of a CPU tensor as double / writes it from double (C casts). */
static double get_as_double(const qg_tensor *t, int64_t i) {
  switch (t->dtype) {
    case QG_F32: return ((const float *)t->data)[i];
    case QG_F64: return ((const double *)t->data)[i];
    case QG_I8: return ((const int8_t *)t->data)[i];
    case QG_U8: return ((const uint8_t *)t->data)[i];
    case QG_I16: return ((const int16_t *)t->data)[i];
    case QG_I32: return ((const int32_t *)t->data)[i];
    case QG_I64: return (double)((const int64_t *)t->data)[i];
  }
  return 0;
}

static void set_from_double(qg_tensor *t, int64_t i, double v) {
  switch (t->dtype) {
    case QG_F32: ((float *)t->data)[i] = (float)v; break;
    case QG_F64: ((double *)t->data)[i] = v; break;
    case QG_I8: ((int8_t *)t->data)[i] = (int8_t)v; break;
    case QG_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case QG_I16: ((int16_t *)t->data)[i] = (int16_t)v; break;
    case QG_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case QG_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
  }
}

qg_status qg_cpu_fill(qg_ctx *ctx, qg_tensor *t, double value) {
  (void)ctx;
  if (value == 0.0) memset(t->data, 0, (size_t)qg_tensor_bytes(t));
  else if (t->dtype == QG_F32) { float v = (float)value, *d = (float *)t->data; for (int64_t i = 0; i < t->numel; i++) d[i] = v; }
  else for (int64_t i = 0; i < t->numel; i++) set_from_double(t, i, value);
  return QG_OK;
}

qg_status qg_cpu_convert(qg_ctx *ctx, qg_tensor *dst, const qg_tensor *src) {
  (void)ctx;
  if (dst->dtype == QG_F32 && src->dtype == QG_U8) {   /* the data loader's hot case */
    float *d = (float *)dst->data; const uint8_t *s = (const uint8_t *)src->data;
    for (int64_t i = 0; i < src->numel; i++) d[i] = s[i];
  } else if (dst->dtype == QG_I64 && src->dtype == QG_U8) {
    int64_t *d = (int64_t *)dst->data; const uint8_t *s = (const uint8_t *)src->data;
    for (int64_t i = 0; i < src->numel; i++) d[i] = s[i];
  } else {
    for (int64_t i = 0; i < src->numel; i++) set_from_double(dst, i, get_as_double(src, i));
  }
  return QG_OK;
}

qg_status qg_cpu_count_nonfinite(qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t) {
  (void)ctx;
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

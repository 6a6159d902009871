/*
 * tensor.c: qg_tensor creation, views, copies between host and device and random init (memory
 * movement: CPU tensors are written here, CUDA tensors through the device interface), and the
 * front doors of the small compute operations the Lua side needs (fill, dtype conversion in
 * qg_copy, axpy, scale, sum of squares, argmax, index_select, transpose), whose backends are
 * core/tensor_cpu.c and kernels/tensor.cu. Random numbers are always drawn on the host from the
 * context RNG, so an initialisation is identical whichever device the tensor lives on.
 */
#include "backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int qg_dtype_size(int dtype) {
  switch (dtype) {
    case QG_F32: return 4; case QG_F64: return 8; case QG_I8: return 1; case QG_U8: return 1;
    case QG_I16: return 2; case QG_I32: return 4; case QG_I64: return 8;
  }
  return 0;
}

const char *qg_dtype_name(int dtype) {
  switch (dtype) {
    case QG_F32: return "f32"; case QG_F64: return "f64"; case QG_I8: return "i8"; case QG_U8: return "u8";
    case QG_I16: return "i16"; case QG_I32: return "i32"; case QG_I64: return "i64";
  }
  return "unknown-dtype";
}

int64_t qg_tensor_bytes(const qg_tensor *t) { return t->numel * qg_dtype_size(t->dtype); }

static qg_status check_shape(qg_ctx *ctx, const char *fn, int ndim, const int64_t *dims, int64_t *numel) {
  if (ndim < 1 || ndim > QG_MAX_DIMS)
    return qg_fail(ctx, QG_ERR_ARG, fn, "ndim must be 1..%d, got %d", QG_MAX_DIMS, ndim);
  if (!dims) return qg_fail(ctx, QG_ERR_ARG, fn, "dims is NULL");
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (dims[i] < 0) return qg_fail(ctx, QG_ERR_ARG, fn, "dim %d is negative (%lld)", i, (long long)dims[i]);
    if (dims[i] > 0 && n > INT64_MAX / 16 / dims[i])
      return qg_fail(ctx, QG_ERR_ARG, fn, "shape too large");
    n *= dims[i];
  }
  *numel = n;
  return QG_OK;
}

qg_status qg_tensor_create(qg_ctx *ctx, qg_tensor **out, int dtype, int device, int ndim, const int64_t *dims) {
  if (!ctx || !out) return QG_ERR_ARG;
  *out = NULL;
  int es = qg_dtype_size(dtype);
  if (!es) return qg_fail(ctx, QG_ERR_ARG, __func__, "unknown dtype %d", dtype);
  if (device != QG_CPU && device != QG_CUDA) return qg_fail(ctx, QG_ERR_ARG, __func__, "unknown device %d", device);
  if (device == QG_CUDA && ctx->device != QG_CUDA)
    return qg_fail(ctx, QG_ERR_DEVICE, __func__, "a cuda tensor needs a cuda context (this one is cpu)");
  int64_t numel;
  QG_CHECK(check_shape(ctx, __func__, ndim, dims, &numel));
  qg_tensor *t = (qg_tensor *)calloc(1, sizeof *t);
  if (!t) return qg_fail(ctx, QG_ERR_MEMORY, __func__, "out of host memory");
  t->ndim = ndim; t->dtype = dtype; t->device = device; t->numel = numel; t->owns_data = 1;
  memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
  size_t nbytes = (size_t)(numel * es);
  if (device == QG_CPU) {
    t->data = calloc(nbytes ? nbytes : 1, 1);
    if (!t->data) { free(t); return qg_fail(ctx, QG_ERR_MEMORY, __func__, "cannot allocate %zu bytes", nbytes); }
  } else {
    qg_status s = qg_dev_malloc(ctx, &t->data, (int64_t)(nbytes ? nbytes : 1));
    if (s == QG_OK) s = qg_dev_memset0(ctx, t->data, (int64_t)nbytes);
    if (s != QG_OK) { qg_dev_free(t->data); free(t); return s; }
  }
  *out = t;
  return QG_OK;
}

qg_status qg_tensor_view(qg_ctx *ctx, qg_tensor **out, const qg_tensor *src, int64_t offset, int ndim, const int64_t *dims) {
  if (!ctx || !out) return QG_ERR_ARG;
  *out = NULL;
  if (!src) return qg_fail(ctx, QG_ERR_ARG, __func__, "src is NULL");
  int64_t numel;
  QG_CHECK(check_shape(ctx, __func__, ndim, dims, &numel));
  if (offset < 0 || offset + numel > src->numel) {
    char b[96];
    return qg_fail(ctx, QG_ERR_ARG, __func__, "view of %lld elements at offset %lld does not fit in a tensor of shape %s",
                   (long long)numel, (long long)offset, qg_shape_str(b, sizeof b, src->ndim, src->dims));
  }
  qg_tensor *t = (qg_tensor *)calloc(1, sizeof *t);
  if (!t) return qg_fail(ctx, QG_ERR_MEMORY, __func__, "out of host memory");
  *t = *src;
  t->owns_data = 0;
  t->ndim = ndim; t->numel = numel;
  memset(t->dims, 0, sizeof t->dims);
  memcpy(t->dims, dims, (size_t)ndim * sizeof *dims);
  t->data = (char *)src->data + offset * qg_dtype_size(src->dtype);
  *out = t;
  return QG_OK;
}

void qg_tensor_free(qg_tensor *t) {
  if (!t) return;
  if (t->owns_data) {
    if (t->device == QG_CUDA) qg_dev_free(t->data);
    else free(t->data);
  }
  free(t);
}

qg_status qg_copy(qg_ctx *ctx, qg_tensor *dst, const qg_tensor *src) {
  if (!ctx) return QG_ERR_ARG;
  if (!dst || !src) return qg_fail(ctx, QG_ERR_ARG, __func__, "dst or src is NULL");
  if (dst->numel != src->numel) {
    char a[96], b[96];
    return qg_fail(ctx, QG_ERR_ARG, __func__, "element counts differ: dst %s, src %s",
                   qg_shape_str(a, sizeof a, dst->ndim, dst->dims), qg_shape_str(b, sizeof b, src->ndim, src->dims));
  }
  if (dst->dtype != src->dtype) {
    if (dst->device != src->device)
      return qg_fail(ctx, QG_ERR_UNSUPPORTED, __func__, "a dtype conversion (%s -> %s) runs on one device, got %s -> %s: "
                     "convert on one device, then copy", qg_dtype_name(src->dtype), qg_dtype_name(dst->dtype),
                     src->device == QG_CUDA ? "cuda" : "cpu", dst->device == QG_CUDA ? "cuda" : "cpu");
    if (dst->data == src->data) return qg_fail(ctx, QG_ERR_ARG, __func__, "a dtype conversion needs distinct dst and src memory");
    return QG_DISPATCH(ctx, dst->device, convert, dst, src);
  }
  int64_t nbytes = qg_tensor_bytes(src);
  if (dst->data == src->data || nbytes == 0) return QG_OK;
  if (dst->device == QG_CPU && src->device == QG_CPU) { memmove(dst->data, src->data, (size_t)nbytes); return QG_OK; }
  int kind = src->device == QG_CPU ? 0 : (dst->device == QG_CPU ? 1 : 2);
  return qg_dev_memcpy(ctx, dst->data, src->data, nbytes, kind);
}

qg_status qg_copy_from_host(qg_ctx *ctx, qg_tensor *dst, const void *host, int64_t nbytes) {
  if (!ctx) return QG_ERR_ARG;
  if (!dst || (!host && nbytes)) return qg_fail(ctx, QG_ERR_ARG, __func__, "dst or host is NULL");
  if (nbytes != qg_tensor_bytes(dst))
    return qg_fail(ctx, QG_ERR_ARG, __func__, "expected %lld bytes, got %lld", (long long)qg_tensor_bytes(dst), (long long)nbytes);
  if (!nbytes) return QG_OK;
  if (dst->device == QG_CPU) { memcpy(dst->data, host, (size_t)nbytes); return QG_OK; }
  return qg_dev_memcpy(ctx, dst->data, host, nbytes, 0);
}

qg_status qg_copy_to_host(qg_ctx *ctx, void *host, const qg_tensor *src, int64_t nbytes) {
  if (!ctx) return QG_ERR_ARG;
  if (!src || (!host && nbytes)) return qg_fail(ctx, QG_ERR_ARG, __func__, "src or host is NULL");
  if (nbytes != qg_tensor_bytes(src))
    return qg_fail(ctx, QG_ERR_ARG, __func__, "expected %lld bytes, got %lld", (long long)qg_tensor_bytes(src), (long long)nbytes);
  if (!nbytes) return QG_OK;
  if (src->device == QG_CPU) { memcpy(host, src->data, (size_t)nbytes); return QG_OK; }
  return qg_dev_memcpy(ctx, host, src->data, nbytes, 1);
}

/* Random initialisation draws on the host (the same numbers whichever device the tensor is on)
 * and uploads the values for a CUDA tensor: one copy, at initialisation only. */
static qg_status stage_to_device(qg_ctx *ctx, qg_tensor *t, const qg_tensor *host_view) {
  return qg_dev_memcpy(ctx, t->data, host_view->data, qg_tensor_bytes(t), 0);
}

static qg_status host_view_for(qg_ctx *ctx, const char *fn, qg_tensor *t, qg_tensor *hv) {
  *hv = *t;
  hv->device = QG_CPU;
  hv->owns_data = 0;
  if (t->device == QG_CPU) return QG_OK;
  return qg_workspace(ctx, fn, qg_tensor_bytes(t), &hv->data);
}

qg_status qg_fill(qg_ctx *ctx, qg_tensor *t, double value) {
  if (!ctx) return QG_ERR_ARG;
  QG_CHECK(qg_check_tensor(ctx, __func__, "t", t, -1, -1, NULL));
  return QG_DISPATCH(ctx, t->device, fill, t, value);
}

/* Element i of an f32 or f64 host tensor = v (rounded to f32 by a C cast). */
static void set_real(qg_tensor *t, int64_t i, double v) {
  if (t->dtype == QG_F32) ((float *)t->data)[i] = (float)v;
  else ((double *)t->data)[i] = v;
}

static qg_status check_float(qg_ctx *ctx, const char *fn, const char *arg, const qg_tensor *t) {
  QG_CHECK(qg_check_tensor(ctx, fn, arg, t, -1, -1, NULL));
  if (t->dtype != QG_F32 && t->dtype != QG_F64)
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: expected dtype f32 or f64, got %s", arg, qg_dtype_name(t->dtype));
  return QG_OK;
}

qg_status qg_uniform(qg_ctx *ctx, qg_tensor *t, double lo, double hi) {
  if (!ctx) return QG_ERR_ARG;
  QG_CHECK(check_float(ctx, __func__, "t", t));
  if (!(lo <= hi)) return qg_fail(ctx, QG_ERR_ARG, __func__, "need lo <= hi, got [%g, %g)", lo, hi);
  qg_tensor hv;
  QG_CHECK(host_view_for(ctx, __func__, t, &hv));
  for (int64_t i = 0; i < hv.numel; i++) set_real(&hv, i, lo + (hi - lo) * qg_rng_uniform01(ctx->rng));
  return t->device == QG_CPU ? QG_OK : stage_to_device(ctx, t, &hv);
}

qg_status qg_normal(qg_ctx *ctx, qg_tensor *t, double mean, double std) {
  if (!ctx) return QG_ERR_ARG;
  QG_CHECK(check_float(ctx, __func__, "t", t));
  if (!(std >= 0)) return qg_fail(ctx, QG_ERR_ARG, __func__, "std must be >= 0, got %g", std);
  qg_tensor hv;
  QG_CHECK(host_view_for(ctx, __func__, t, &hv));
  for (int64_t i = 0; i < hv.numel; i += 2) {   /* Box-Muller, both outputs used */
    double u1 = 1.0 - qg_rng_uniform01(ctx->rng), u2 = qg_rng_uniform01(ctx->rng);
    double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    set_real(&hv, i, mean + std * rad * cos(th));
    if (i + 1 < hv.numel) set_real(&hv, i + 1, mean + std * rad * sin(th));
  }
  return t->device == QG_CPU ? QG_OK : stage_to_device(ctx, t, &hv);
}

qg_status qg_randperm(qg_ctx *ctx, qg_tensor *out, uint64_t seed) {
  if (!ctx) return QG_ERR_ARG;
  QG_CHECK(qg_check_tensor(ctx, __func__, "out", out, QG_I64, 1, NULL));
  if (out->device != QG_CPU) return qg_fail(ctx, QG_ERR_DEVICE, __func__, "out must be a cpu tensor");
  int64_t *p = (int64_t *)out->data, n = out->numel;
  uint64_t s[4];
  qg_rng_seed_state(s, seed);
  for (int64_t i = 0; i < n; i++) p[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {           /* Fisher-Yates, Lemire-free modulo is fine here */
    int64_t j = (int64_t)(qg_rng_uniform01(s) * (double)(i + 1));
    int64_t tmp = p[i]; p[i] = p[j]; p[j] = tmp;
  }
  return QG_OK;
}

qg_status qg_index_select(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src, const qg_tensor *index) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "src", src, -1, -1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "index", index, QG_I64, 1, NULL));
  int64_t want[4];
  memcpy(want, src->dims, sizeof want);
  want[0] = index->numel;
  QG_CHECK(qg_check_tensor(ctx, fn, "out", out, src->dtype, src->ndim, want));
  const qg_tensor *ts[] = {out, src, index};
  const char *names[] = {"out", "src", "index"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 3, ts, names));
  return QG_DISPATCH(ctx, dev, index_select, out, src, index);
}

qg_status qg_axpy(qg_ctx *ctx, qg_tensor *y, double alpha, const qg_tensor *x) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_float(ctx, fn, "y", y));
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, y->dtype, y->ndim, y->dims));
  const qg_tensor *ts[] = {y, x};
  const char *names[] = {"y", "x"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 2, ts, names));
  return QG_DISPATCH(ctx, dev, axpy, y, alpha, x);
}

qg_status qg_scale(qg_ctx *ctx, qg_tensor *t, double alpha) {
  if (!ctx) return QG_ERR_ARG;
  QG_CHECK(check_float(ctx, __func__, "t", t));
  return QG_DISPATCH(ctx, t->device, scale, t, alpha);
}

qg_status qg_sum_squares(qg_ctx *ctx, double *out, const qg_tensor *t) {
  if (!ctx) return QG_ERR_ARG;
  if (!out) return qg_fail(ctx, QG_ERR_ARG, __func__, "out is NULL");
  QG_CHECK(check_float(ctx, __func__, "t", t));
  return QG_DISPATCH(ctx, t->device, sum_squares, out, t);
}

qg_status qg_argmax_rows(qg_ctx *ctx, qg_tensor *out, const qg_tensor *x) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 2, NULL));
  int64_t want[1] = {x->dims[0]};
  QG_CHECK(qg_check_tensor(ctx, fn, "out", out, QG_I64, 1, want));
  const qg_tensor *ts[] = {out, x};
  const char *names[] = {"out", "x"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 2, ts, names));
  return QG_DISPATCH(ctx, dev, argmax_rows, out, x);
}

qg_status qg_transpose01(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "src", src, -1, -1, NULL));
  if (src->ndim < 2) return qg_fail(ctx, QG_ERR_ARG, fn, "src needs at least 2 dims, got %d", src->ndim);
  int64_t want[4];
  memcpy(want, src->dims, sizeof want);
  want[0] = src->dims[1]; want[1] = src->dims[0];
  QG_CHECK(qg_check_tensor(ctx, fn, "out", out, src->dtype, src->ndim, want));
  if (out->data == src->data) return qg_fail(ctx, QG_ERR_ARG, fn, "out and src must not alias");
  const qg_tensor *ts[] = {out, src};
  const char *names[] = {"out", "src"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 2, ts, names));
  return QG_DISPATCH(ctx, dev, transpose01, out, src);
}

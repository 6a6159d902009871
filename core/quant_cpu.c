/*
 * quant_cpu.c: quantizers on the CPU: grids, scalar quantization and requantization (the entry
 * points the specs test against hand-computed cases), per-channel / per-tensor fake quantization
 * of weights, and the activation tables of the integer GRU step.
 */
#include "internal.h"
#include "quant_math.h"

#include <stdio.h>
#include <string.h>

qg_status qg_check_qspec(qg_ctx *ctx, const char *fn, const char *what, int bitwidth, int is_unsigned, int e, int z) {
  if (bitwidth < 1 || bitwidth > 32) return qg_fail(ctx, QG_ERR_ARG, fn, "%s: bitwidth must be 1..32, got %d", what, bitwidth);
  if (e < -31 || e > 31) return qg_fail(ctx, QG_ERR_ARG, fn, "%s: exp2_inv must be in -31..31, got %d", what, e);
  qg_qp q = qg_qp_make(bitwidth, is_unsigned, e, z);
  /* The zero point is a code: it lies on the grid (real 0 is exactly representable). */
  if (z < q.qmin || z > q.qmax)
    return qg_fail(ctx, QG_ERR_ARG, fn, "%s: zero_point %d is outside the %d-bit %s grid [%lld, %lld]", what, z, bitwidth,
                   is_unsigned ? "unsigned" : "signed", (long long)q.qmin, (long long)q.qmax);
  return QG_OK;
}

qg_status qg_quant_grid(qg_ctx *ctx, int bitwidth, int is_unsigned, int64_t *qmin, int64_t *qmax) {
  if (!ctx) return QG_ERR_ARG;
  if (!qmin || !qmax) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL output");
  if (bitwidth < 1 || bitwidth > 32) return qg_fail(ctx, QG_ERR_ARG, __func__, "bitwidth must be 1..32, got %d", bitwidth);
  qg_qp q = qg_qp_make(bitwidth, is_unsigned, 0, 0);
  *qmin = q.qmin; *qmax = q.qmax;
  return QG_OK;
}

qg_status qg_quantize_scalar(qg_ctx *ctx, int64_t *q, int *in_range, double x, const qg_qspec *spec) {
  if (!ctx) return QG_ERR_ARG;
  if (!q || !in_range || !spec) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL argument");
  QG_CHECK(qg_check_qspec(ctx, __func__, "spec", spec->bitwidth, spec->is_unsigned, spec->exp2_inv, spec->zero_point));
  *q = qg_quant_real(x, qg_qp_make(spec->bitwidth, spec->is_unsigned, spec->exp2_inv, spec->zero_point), in_range);
  return QG_OK;
}

qg_status qg_requant_scalar(qg_ctx *ctx, int64_t *q, int *in_range, int64_t v, int s, const qg_qspec *spec) {
  if (!ctx) return QG_ERR_ARG;
  if (!q || !in_range || !spec) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL argument");
  QG_CHECK(qg_check_qspec(ctx, __func__, "spec", spec->bitwidth, spec->is_unsigned, spec->exp2_inv, spec->zero_point));
  if (s < -64 || s > 64) return qg_fail(ctx, QG_ERR_ARG, __func__, "source exponent %d outside -64..64", s);
  *q = qg_requant((qg_i128)v, s, qg_qp_make(spec->bitwidth, spec->is_unsigned, spec->exp2_inv, spec->zero_point), in_range);
  return QG_OK;
}

qg_status qg_fake_quant(qg_ctx *ctx, qg_tensor *fq, qg_tensor *codes, qg_tensor *mask, const qg_tensor *x,
                        const qg_tensor *exps, const qg_tensor *zps, int bitwidth, int is_unsigned) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, -1, NULL));
  if (x->ndim > 2) return qg_fail(ctx, QG_ERR_ARG, fn, "x must be [rows, cols] or [rows], got %d dims", x->ndim);
  int64_t rows = x->dims[0], cols = x->ndim == 2 ? x->dims[1] : 1;
  QG_CHECK(qg_check_tensor(ctx, fn, "exps", exps, QG_I32, 1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "zps", zps, QG_I32, 1, exps->dims));
  int per_channel = exps->numel != 1 || rows == 1;
  if (exps->numel != 1 && exps->numel != rows)
    return qg_fail(ctx, QG_ERR_ARG, fn, "exps has %lld entries; expected 1 (per tensor) or %lld (per channel)",
                   (long long)exps->numel, (long long)rows);
  if (fq) QG_CHECK(qg_check_tensor(ctx, fn, "fq", fq, QG_F32, x->ndim, x->dims));
  if (codes) QG_CHECK(qg_check_tensor(ctx, fn, "codes", codes, QG_I32, x->ndim, x->dims));
  if (mask) QG_CHECK(qg_check_tensor(ctx, fn, "mask", mask, QG_U8, x->ndim, x->dims));
  const qg_tensor *all[6] = {fq, codes, mask, x, exps, zps};
  for (int i = 0; i < 6; i++)
    if (all[i] && all[i]->device != QG_CPU) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "cuda tensors: CPU only in this build");
  const int32_t *ep = (const int32_t *)exps->data, *zp = (const int32_t *)zps->data;
  for (int64_t r = 0; r < exps->numel; r++) {
    char what[48];
    snprintf(what, sizeof what, "channel %lld", (long long)r);
    QG_CHECK(qg_check_qspec(ctx, fn, what, bitwidth, is_unsigned, ep[r], zp[r]));
  }
  const float *xp = (const float *)x->data;
  for (int64_t r = 0; r < rows; r++) {
    int64_t c0 = per_channel && exps->numel == rows ? r : 0;
    qg_qp q = qg_qp_make(bitwidth, is_unsigned, ep[c0], zp[c0]);
    for (int64_t c = 0; c < cols; c++) {
      int64_t i = r * cols + c;
      int m;
      int64_t code = qg_quant_real((double)xp[i], q, &m);
      if (fq) ((float *)fq->data)[i] = (float)qg_deq(code, q);
      if (codes) ((int32_t *)codes->data)[i] = (int32_t)code;
      if (mask) ((uint8_t *)mask->data)[i] = (uint8_t)m;
    }
  }
  return QG_OK;
}

qg_status qg_qgru_build_lut(qg_ctx *ctx, qg_tensor *lut, const qg_qspec *pre, const qg_qspec *out, int fn_kind) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!pre || !out) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL quantizer");
  QG_CHECK(qg_check_qspec(ctx, fn, "pre-activation", pre->bitwidth, pre->is_unsigned, pre->exp2_inv, pre->zero_point));
  QG_CHECK(qg_check_qspec(ctx, fn, "output", out->bitwidth, out->is_unsigned, out->exp2_inv, out->zero_point));
  if (pre->bitwidth > 16) return qg_fail(ctx, QG_ERR_ARG, fn, "tables need a pre-activation of <= 16 bits, got %d", pre->bitwidth);
  if (fn_kind != 0 && fn_kind != 1) return qg_fail(ctx, QG_ERR_ARG, fn, "fn must be 0 (sigmoid) or 1 (tanh), got %d", fn_kind);
  int64_t n = (int64_t)1 << pre->bitwidth, want[1] = {2 * n};
  QG_CHECK(qg_check_tensor(ctx, fn, "lut", lut, QG_I32, 1, want));
  if (lut->device != QG_CPU) return qg_fail(ctx, QG_ERR_DEVICE, fn, "lut must be a cpu tensor");
  qg_qp P = qg_qp_make(pre->bitwidth, pre->is_unsigned, pre->exp2_inv, pre->zero_point);
  qg_qp O = qg_qp_make(out->bitwidth, out->is_unsigned, out->exp2_inv, out->zero_point);
  int32_t *t = (int32_t *)lut->data;
  for (int64_t i = 0; i < n; i++) {
    double v = qg_deq(P.qmin + i, P);
    double f = fn_kind == 0 ? 1.0 / (1.0 + exp(-v)) : tanh(v);
    int m;
    t[i] = (int32_t)qg_quant_real(f, O, &m);
    t[n + i] = m;
  }
  return QG_OK;
}

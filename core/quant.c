/*
 * quant.c: the quantizer definitions every other part reads: the 17 operator names (the Lua side
 * asks here instead of keeping its own list), grids, the rounding rule, fixed output ranges,
 * quantizer validation, scalar quantization and requantization (the entry points the specs test
 * against hand-computed cases), activation tables, and the front door of fake quantization
 * (backend: quant_cpu.c).
 */
#include "backend.h"
#include "quant_math.h"

#include <stdio.h>
#include <string.h>

/* The 17 operators in the seed config's order, with their slot (QG_Q_* or QG_W_*). */
static const struct { const char *name; int is_weight, slot; } OPS[QG_NUM_OPS] = {
  {"input.x", 0, QG_Q_INPUT_X},     {"output.h", 0, QG_Q_OUTPUT_H},   {"weight.W", 1, QG_W_W},
  {"weight.R", 1, QG_W_R},          {"weight.bw", 1, QG_W_BX},        {"weight.br", 1, QG_W_BR},
  {"matmul.Wx", 0, QG_Q_MATMUL_WX}, {"matmul.Rh", 0, QG_Q_MATMUL_RH}, {"gate.z_pre", 0, QG_Q_Z_PRE},
  {"gate.z_out", 0, QG_Q_Z_OUT},    {"gate.r_pre", 0, QG_Q_R_PRE},    {"gate.r_out", 0, QG_Q_R_OUT},
  {"gate.g_pre", 0, QG_Q_G_PRE},    {"gate.g_out", 0, QG_Q_G_OUT},    {"op.rRh", 0, QG_Q_RRH},
  {"op.old_contrib", 0, QG_Q_OLD},  {"op.new_contrib", 0, QG_Q_NEW}};

const char *qg_op_name(int i) { return i >= 0 && i < QG_NUM_OPS ? OPS[i].name : NULL; }

const char *qg_act_name(int op) {
  for (int i = 0; i < QG_NUM_OPS; i++) if (!OPS[i].is_weight && OPS[i].slot == op) return OPS[i].name;
  return "unknown operator";
}

const char *qg_weight_name(int w) {
  for (int i = 0; i < QG_NUM_OPS; i++) if (OPS[i].is_weight && OPS[i].slot == w) return OPS[i].name;
  return "unknown weight";
}

qg_status qg_op_lookup(qg_ctx *ctx, const char *name, int *index, int *is_weight, int *slot) {
  if (!ctx) return QG_ERR_ARG;
  if (!name || !index || !is_weight || !slot) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL argument");
  if (strcmp(name, "weight.bx") == 0) name = "weight.bw";   /* aliases of QUANT_SPEC.md section 2 */
  if (strcmp(name, "input.h") == 0) name = "output.h";
  for (int i = 0; i < QG_NUM_OPS; i++)
    if (strcmp(OPS[i].name, name) == 0) { *index = i; *is_weight = OPS[i].is_weight; *slot = OPS[i].slot; return QG_OK; }
  return qg_fail(ctx, QG_ERR_NOT_FOUND, __func__, "unknown operator \"%s\"", name);
}

double qg_round_half_even(double x) { return nearbyint(x); }

qg_status qg_fixed_range(qg_ctx *ctx, int32_t *exp2_inv, int32_t *zero_point, int fn, int bitwidth, int is_unsigned) {
  if (!ctx) return QG_ERR_ARG;
  if (!exp2_inv || !zero_point) return qg_fail(ctx, QG_ERR_ARG, __func__, "NULL output");
  if (bitwidth < 1 || bitwidth > 32) return qg_fail(ctx, QG_ERR_ARG, __func__, "bitwidth must be 1..32, got %d", bitwidth);
  if (fn == 0) { *exp2_inv = is_unsigned ? bitwidth : bitwidth - 1; *zero_point = 0; }      /* sigmoid: [0, 1) */
  else if (fn == 1) {                                                                      /* tanh: [-1, 1) */
    *exp2_inv = bitwidth - 1;
    *zero_point = is_unsigned ? (int32_t)(((uint32_t)1) << (bitwidth - 1)) : 0;   /* unsigned: code 2^(b-1) is 0 */
  } else return qg_fail(ctx, QG_ERR_ARG, __func__, "fn must be 0 (sigmoid) or 1 (tanh), got %d", fn);
  return QG_OK;
}


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
  int64_t rows = x->dims[0];
  QG_CHECK(qg_check_tensor(ctx, fn, "exps", exps, QG_I32, 1, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "zps", zps, QG_I32, 1, exps->dims));
  if (exps->numel != 1 && exps->numel != rows)
    return qg_fail(ctx, QG_ERR_ARG, fn, "exps has %lld entries; expected 1 (per tensor) or %lld (per channel)",
                   (long long)exps->numel, (long long)rows);
  if (fq) QG_CHECK(qg_check_tensor(ctx, fn, "fq", fq, QG_F32, x->ndim, x->dims));
  if (codes) QG_CHECK(qg_check_tensor(ctx, fn, "codes", codes, QG_I32, x->ndim, x->dims));
  if (mask) QG_CHECK(qg_check_tensor(ctx, fn, "mask", mask, QG_U8, x->ndim, x->dims));
  if (exps->device != QG_CPU || zps->device != QG_CPU)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "exps and zps are given as cpu tensors");
  const int32_t *ep = (const int32_t *)exps->data, *zp = (const int32_t *)zps->data;
  for (int64_t r = 0; r < exps->numel; r++) {
    char what[48];
    snprintf(what, sizeof what, "channel %lld", (long long)r);
    QG_CHECK(qg_check_qspec(ctx, fn, what, bitwidth, is_unsigned, ep[r], zp[r]));
  }
  const qg_tensor *ts[] = {fq, codes, mask, x};
  const char *names[] = {"fq", "codes", "mask", "x"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 4, ts, names));
  return QG_DISPATCH(ctx, dev, fake_quant, fq, codes, mask, x, exps, zps, bitwidth, is_unsigned);
}

qg_status qg_build_act_table(qg_ctx *ctx, qg_tensor *lut, const qg_qspec *pre, const qg_qspec *out, int fn_kind) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!pre || !out) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL quantizer");
  QG_CHECK(qg_check_qspec(ctx, fn, "pre-activation", pre->bitwidth, pre->is_unsigned, pre->exp2_inv, pre->zero_point));
  QG_CHECK(qg_check_qspec(ctx, fn, "output", out->bitwidth, out->is_unsigned, out->exp2_inv, out->zero_point));
  if (pre->bitwidth > QG_LUT_MAX_BITS) return qg_fail(ctx, QG_ERR_ARG, fn, "tables need a pre-activation of <= 16 bits, got %d", pre->bitwidth);
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

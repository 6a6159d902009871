/*
 * int_gru.c: the integer GRU layer handle (qg_int_gru of qgru.h): creation, the quantizer
 * setters, the activation and derivative tables, and the front doors of its forward and
 * backward, which validate once and dispatch to the device's backend (int_gru_cpu.c,
 * kernels/int_gru.cu).
 *
 * A setter checks its arguments completely before it changes the handle, so a failed call
 * leaves the layer as it was. Weight quantizers are set from the host (qg_int_gru_set_weight_quant)
 * or derived from the weights' values (qg_int_gru_calibrate_weight): on a GPU, symmetric minmax
 * writes the device copy directly, stream-ordered, and the host copy of the exponents is marked
 * stale and read back only when something on the host needs it (qg_int_gru_host_exps).
 * Tables are rebuilt lazily, once, by the first forward after a quantizer they depend on changed; they are built on the host in double precision (the one
 * definition of QUANT_SPEC.md section 3) and copied to the layer's device.
 */
#include "backend.h"
#include "int_gru.h"
#include "stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory on the layer's device ---- */
static qg_status mem_alloc(qg_ctx *ctx, int device, void **p, int64_t bytes) {
  if (bytes < 1) bytes = 1;
  if (device == QG_CUDA) return qg_dev_malloc(ctx, p, bytes);
  *p = calloc((size_t)bytes, 1);
  return *p ? QG_OK : qg_fail(ctx, QG_ERR_MEMORY, "qg_int_gru", "cannot allocate %lld bytes", (long long)bytes);
}

static void mem_free(int device, void *p) {
  if (device == QG_CUDA) qg_dev_free(p);
  else free(p);
}

static qg_status mem_upload(qg_ctx *ctx, int device, void *dst, const void *src, int64_t bytes) {
  if (bytes <= 0) return QG_OK;
  if (device == QG_CUDA) return qg_dev_memcpy(ctx, dst, src, bytes, 0);
  memcpy(dst, src, (size_t)bytes);
  return QG_OK;
}

qg_status qg_int_gru_create(qg_ctx *ctx, qg_int_gru **out, int64_t input_size, int64_t hidden_size) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!out) return qg_fail(ctx, QG_ERR_ARG, fn, "out is NULL");
  *out = NULL;
  if (input_size < 1 || input_size > (1 << 20) || hidden_size < 1 || hidden_size > (1 << 20))
    return qg_fail(ctx, QG_ERR_ARG, fn, "input_size and hidden_size must be in 1..2^20 (exact integer sums), got %lld and %lld",
                   (long long)input_size, (long long)hidden_size);
  qg_int_gru *g = (qg_int_gru *)calloc(1, sizeof *g);
  if (!g) return qg_fail(ctx, QG_ERR_MEMORY, fn, "out of host memory");
  g->device = ctx->device;
  g->C = input_size; g->H = hidden_size;
  const int64_t H3 = 3 * hidden_size;
  /* exps + zps (8 x [3H] i32), then per weight: codes (i32), fq (f32), mask (u8); the flag */
  int64_t nw[QG_W_NUM], total = 8 * H3 * 4 + 64;
  for (int w = 0; w < QG_W_NUM; w++) { nw[w] = H3 * qg_int_gru_weight_cols(g, w); total += nw[w] * 9 + 64; }
  g->mem_bytes = total;
  qg_status st = mem_alloc(ctx, g->device, &g->mem, total);
  if (st != QG_OK) { free(g); return st; }
  char *p = (char *)g->mem;
  for (int w = 0; w < QG_W_NUM; w++) { g->w_exp[w] = (int32_t *)p; p += H3 * 4; g->w_zp[w] = (int32_t *)p; p += H3 * 4; }
  for (int w = 0; w < QG_W_NUM; w++) {
    g->codes[w] = (int32_t *)p; p += nw[w] * 4;
    g->fq[w] = (float *)p; p += nw[w] * 4;
    g->mask[w] = (uint8_t *)p; p += (nw[w] + 63) & ~(int64_t)63;
  }
  g->c32_flag = (int32_t *)p;
  int32_t *host = (int32_t *)calloc((size_t)(10 * H3), sizeof(int32_t));
  if (!host) { mem_free(g->device, g->mem); free(g); return qg_fail(ctx, QG_ERR_MEMORY, fn, "out of host memory"); }
  for (int w = 0; w < QG_W_NUM; w++) { g->w_exp_host[w] = host + 2 * w * H3; g->w_zp_host[w] = host + (2 * w + 1) * H3; }
  g->w_scratch = host + 8 * H3;
  g->tables_dirty = 1;
  *out = g;
  return QG_OK;
}

void qg_int_gru_free(qg_int_gru *g) {
  if (!g) return;
  mem_free(g->device, g->mem);
  if (g->tables) mem_free(g->device, g->tables);
  free(g->w_exp_host[0]);
  free(g);
}

qg_status qg_int_gru_set_act(qg_ctx *ctx, qg_int_gru *g, int op, const qg_qspec *spec) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!g || !spec) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL layer or spec");
  if (op < 0 || op >= QG_Q_NUM_ACT) return qg_fail(ctx, QG_ERR_ARG, fn, "operator %d outside 0..%d", op, QG_Q_NUM_ACT - 1);
  QG_CHECK(qg_check_qspec(ctx, fn, qg_act_name(op), spec->bitwidth, spec->is_unsigned, spec->exp2_inv, spec->zero_point));
  if (op == QG_Q_Z_OUT && spec->exp2_inv < 0)
    return qg_fail(ctx, QG_ERR_ARG, fn, "gate.z_out: exp2_inv must be >= 0 (1 - z is computed as 2^e - (q - z)), got %d",
                   spec->exp2_inv);
  const qg_qspec old = g->act[op];
  g->act[op] = *spec;
  if (!g->act_set[op] || memcmp(&old, spec, sizeof old) != 0) g->tables_dirty = 1;
  g->act_set[op] = 1;
  return QG_OK;
}

/* Validates (e, z) of every channel of weight w (host arrays ep, zp [3H]), then sets them: the
 * device copy, the host copy, the grid. Changes nothing on failure. */
static qg_status set_weight_host(qg_ctx *ctx, const char *fn, qg_int_gru *g, int w, int bitwidth, int is_unsigned,
                                 const int32_t *ep, const int32_t *zp) {
  const int64_t H3 = 3 * g->H;
  char what[96];
  const qg_qp grid = qg_qp_make(bitwidth >= 1 && bitwidth <= 32 ? bitwidth : 8, is_unsigned, 0, 0);
  for (int64_t j = 0; j < H3; j++) {
    if (bitwidth >= 1 && bitwidth <= 32 && ep[j] >= -31 && ep[j] <= 31 && zp[j] >= grid.qmin && zp[j] <= grid.qmax) continue;
    snprintf(what, sizeof what, "%s channel %lld", qg_weight_name(w), (long long)j);   /* named only when it fails */
    QG_CHECK(qg_check_qspec(ctx, fn, what, bitwidth, is_unsigned, ep[j], zp[j]));
  }
  QG_CHECK(mem_upload(ctx, g->device, g->w_exp[w], ep, H3 * 4));
  QG_CHECK(mem_upload(ctx, g->device, g->w_zp[w], zp, H3 * 4));
  if (g->w_exp_host[w] != ep) memcpy(g->w_exp_host[w], ep, (size_t)H3 * 4);
  if (g->w_zp_host[w] != zp) memcpy(g->w_zp_host[w], zp, (size_t)H3 * 4);
  g->w_exp_stale[w] = 0;
  g->w_bits[w] = bitwidth; g->w_unsigned[w] = is_unsigned ? 1 : 0; g->w_set[w] = 1;
  g->weights_quantized = 0;
  return QG_OK;
}

qg_status qg_int_gru_set_weight_quant(qg_ctx *ctx, qg_int_gru *g, int w, int bitwidth, int is_unsigned,
                                      const qg_tensor *exps, const qg_tensor *zps) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!g) return qg_fail(ctx, QG_ERR_ARG, fn, "layer is NULL");
  if (w < 0 || w >= QG_W_NUM) return qg_fail(ctx, QG_ERR_ARG, fn, "weight %d outside 0..%d", w, QG_W_NUM - 1);
  const int64_t H3 = 3 * g->H, d[1] = {H3};
  char what[96];
  snprintf(what, sizeof what, "%s exponents", qg_weight_name(w));
  QG_CHECK(qg_check_tensor(ctx, fn, what, exps, QG_I32, 1, d));
  snprintf(what, sizeof what, "%s zero points", qg_weight_name(w));
  QG_CHECK(qg_check_tensor(ctx, fn, what, zps, QG_I32, 1, d));
  if (exps->device != QG_CPU || zps->device != QG_CPU)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "%s: exponents and zero points are given as cpu tensors", qg_weight_name(w));
  return set_weight_host(ctx, fn, g, w, bitwidth, is_unsigned, (const int32_t *)exps->data, (const int32_t *)zps->data);
}

/* Weights with specs[w].calibrate, validated completely first; the device-side ones (symmetric
 * minmax on a GPU) in one launch, the others on the host one by one. */
static qg_status calibrate_weights(qg_ctx *ctx, const char *fn, qg_int_gru *g, const qg_wcalib *specs, const qg_tensor *const *ts) {
  if (!g) return qg_fail(ctx, QG_ERR_ARG, fn, "layer is NULL");
  if (!specs) return qg_fail(ctx, QG_ERR_ARG, fn, "specs is NULL");
  const int64_t H3 = 3 * g->H;
  int on_device[QG_W_NUM], n = 0;
  int32_t *dexp[QG_W_NUM], *dzp[QG_W_NUM];
  const qg_tensor *dval[QG_W_NUM];
  int dbits[QG_W_NUM], dsym[QG_W_NUM], duns[QG_W_NUM];
  for (int w = 0; w < QG_W_NUM; w++) {
    const qg_wcalib *s = &specs[w];
    on_device[w] = 0;
    if (!s->calibrate) continue;
    const int64_t d2[2] = {H3, qg_int_gru_weight_cols(g, w)};
    QG_CHECK(qg_check_tensor(ctx, fn, qg_weight_name(w), ts[w], QG_F32, w < 2 ? 2 : 1, d2));
    if (ts[w]->device != g->device || ctx->device != g->device)
      return qg_fail(ctx, QG_ERR_DEVICE, fn, "%s is on %s and the context is %s but the layer lives on %s", qg_weight_name(w),
                     ts[w]->device == QG_CUDA ? "cuda" : "cpu", ctx->device == QG_CUDA ? "cuda" : "cpu",
                     g->device == QG_CUDA ? "cuda" : "cpu");
    if (s->bitwidth < 1 || s->bitwidth > 32)
      return qg_fail(ctx, QG_ERR_ARG, fn, "%s: bitwidth must be 1..32, got %d", qg_weight_name(w), s->bitwidth);
    QG_CHECK(qg_check_calib_method(ctx, fn, s->method, s->percentile));
    if (s->method == QG_CALIB_MINMAX && s->is_symmetric && g->device == QG_CUDA) {
      on_device[w] = 1;
      dexp[n] = g->w_exp[w]; dzp[n] = g->w_zp[w]; dval[n] = ts[w];
      dbits[n] = s->bitwidth; dsym[n] = 1; duns[n] = s->is_unsigned ? 1 : 0;
      n++;
    }
  }
  if (n > 0) {
    /* on the device, into the layer's device copy; the rule gives z = 0 (symmetric), so only the
     * host copy of the exponents goes stale */
    QG_CHECK(QG_DISPATCH(ctx, g->device, channel_minmax_quant, n, dexp, dzp, dval, dbits, dsym, duns));
    for (int w = 0; w < QG_W_NUM; w++) {
      if (!on_device[w]) continue;
      memset(g->w_zp_host[w], 0, (size_t)H3 * 4);
      g->w_exp_stale[w] = 1;
      g->w_bits[w] = specs[w].bitwidth; g->w_unsigned[w] = specs[w].is_unsigned ? 1 : 0; g->w_set[w] = 1;
      g->weights_quantized = 0;
    }
  }
  /* on the host (the CPU layer; other methods and asymmetric quantizers on a GPU), then set */
  for (int w = 0; w < QG_W_NUM; w++) {
    const qg_wcalib *s = &specs[w];
    if (!s->calibrate || on_device[w]) continue;
    int32_t *ep = g->w_scratch, *zp = g->w_scratch + H3;
    if (s->method == QG_CALIB_MINMAX && g->device == QG_CPU) {
      int bits = s->bitwidth, sym = s->is_symmetric ? 1 : 0, uns = s->is_unsigned ? 1 : 0;
      QG_CHECK(QG_DISPATCH(ctx, g->device, channel_minmax_quant, 1, &ep, &zp, &ts[w], &bits, &sym, &uns));
    } else {
      QG_CHECK(qg_calibrate_channels_host(ctx, fn, ep, zp, ts[w], s->bitwidth, s->is_symmetric, s->is_unsigned, s->method,
                                          s->percentile));
    }
    QG_CHECK(set_weight_host(ctx, fn, g, w, s->bitwidth, s->is_unsigned, ep, zp));
  }
  return QG_OK;
}

qg_status qg_int_gru_calibrate_weight(qg_ctx *ctx, qg_int_gru *g, int w, const qg_tensor *values, int bitwidth,
                                      int is_symmetric, int is_unsigned, int method, double percentile) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (w < 0 || w >= QG_W_NUM) return qg_fail(ctx, QG_ERR_ARG, fn, "weight %d outside 0..%d", w, QG_W_NUM - 1);
  qg_wcalib specs[QG_W_NUM];
  const qg_tensor *ts[QG_W_NUM] = {NULL, NULL, NULL, NULL};
  memset(specs, 0, sizeof specs);
  specs[w].calibrate = 1;
  specs[w].bitwidth = bitwidth; specs[w].is_symmetric = is_symmetric; specs[w].is_unsigned = is_unsigned;
  specs[w].method = method; specs[w].percentile = percentile;
  ts[w] = values;
  return calibrate_weights(ctx, fn, g, specs, ts);
}

qg_status qg_int_gru_calibrate_weights(qg_ctx *ctx, qg_int_gru *g, const qg_wcalib *specs, const qg_tensor *W,
                                       const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br) {
  if (!ctx) return QG_ERR_ARG;
  const qg_tensor *ts[QG_W_NUM] = {W, R, bx, br};
  return calibrate_weights(ctx, __func__, g, specs, ts);
}

qg_status qg_int_gru_host_exps(qg_ctx *ctx, qg_int_gru *g, int w) {
  if (!g->w_exp_stale[w]) return QG_OK;
  if (g->device == QG_CUDA) QG_CHECK(qg_dev_memcpy(ctx, g->w_exp_host[w], g->w_exp[w], 3 * g->H * 4, 1));
  else memcpy(g->w_exp_host[w], g->w_exp[w], (size_t)(3 * g->H) * 4);
  g->w_exp_stale[w] = 0;
  return QG_OK;
}

qg_status qg_int_gru_weight_quant(qg_ctx *ctx, qg_int_gru *g, int w, qg_tensor *exps, qg_tensor *zps) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!g) return qg_fail(ctx, QG_ERR_ARG, fn, "layer is NULL");
  if (w < 0 || w >= QG_W_NUM) return qg_fail(ctx, QG_ERR_ARG, fn, "weight %d outside 0..%d", w, QG_W_NUM - 1);
  if (!g->w_set[w]) return qg_fail(ctx, QG_ERR_ARG, fn, "%s: the quantizer has not been set", qg_weight_name(w));
  const int64_t H3 = 3 * g->H, d[1] = {H3};
  char what[96];
  snprintf(what, sizeof what, "%s exponents", qg_weight_name(w));
  if (exps) QG_CHECK(qg_check_tensor(ctx, fn, what, exps, QG_I32, 1, d));
  snprintf(what, sizeof what, "%s zero points", qg_weight_name(w));
  if (zps) QG_CHECK(qg_check_tensor(ctx, fn, what, zps, QG_I32, 1, d));
  if ((exps && exps->device != QG_CPU) || (zps && zps->device != QG_CPU))
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "%s: exponents and zero points are read into cpu tensors", qg_weight_name(w));
  if (exps && g->w_exp_stale[w]) {
    if (ctx->device != g->device)
      return qg_fail(ctx, QG_ERR_DEVICE, fn, "the layer lives on %s but the context is %s", g->device == QG_CUDA ? "cuda" : "cpu",
                     ctx->device == QG_CUDA ? "cuda" : "cpu");
    QG_CHECK(qg_int_gru_host_exps(ctx, g, w));
  }
  if (exps) memcpy(exps->data, g->w_exp_host[w], (size_t)H3 * 4);
  if (zps) memcpy(zps->data, g->w_zp_host[w], (size_t)H3 * 4);
  return QG_OK;
}

int qg_int_gru_ready(const qg_int_gru *g, const char **missing) {
  if (!g) return 0;
  for (int i = 0; i < QG_Q_NUM_ACT; i++)
    if (!g->act_set[i]) { if (missing) *missing = qg_act_name(i); return 0; }
  for (int w = 0; w < QG_W_NUM; w++)
    if (!g->w_set[w]) { if (missing) *missing = qg_weight_name(w); return 0; }
  if (missing) *missing = NULL;
  return 1;
}

static int narrow_of(const qg_qspec *a) {
  return a[QG_Q_Z_PRE].bitwidth <= 16 && a[QG_Q_R_PRE].bitwidth <= 16 && a[QG_Q_G_PRE].bitwidth <= 16 &&
         a[QG_Q_MATMUL_RH].bitwidth <= 16;
}

int qg_int_gru_cell_bytes(const qg_int_gru *g) { return g ? qg_cell_bytes(narrow_of(g->act)) : 0; }

/* Rebuilds the cell's resolved quantizers and every table when a quantizer changed. */
static qg_status refresh_tables(qg_ctx *ctx, const char *fn, qg_int_gru *g) {
  if (!g->tables_dirty) return QG_OK;
  qg_cell_q *c = &g->cell;
  for (int i = 0; i < QG_Q_NUM_ACT; i++)
    c->a[i] = qg_qp_make(g->act[i].bitwidth, g->act[i].is_unsigned, g->act[i].exp2_inv, g->act[i].zero_point);
  c->narrow = narrow_of(g->act);
  int64_t n[3], bytes = 0;
  for (int k = 0; k < 3; k++) {
    const int b = g->act[QG_Q_Z_PRE + k].bitwidth;
    n[k] = b <= QG_LUT_MAX_BITS ? (int64_t)1 << b : 0;
    bytes += n[k] * (2 * 4 + 2 * 4);   /* lut codes + masks (i32), values + derivatives (f32) */
  }
  /* build on the host (workspace), then copy to the layer's device in one go */
  char *host;
  QG_CHECK(qg_workspace(ctx, fn, bytes + 64, (void **)&host));
  qg_cell_q hostq = *c;
  for (int k = 0; k < 3; k++) { hostq.lut[k] = NULL; hostq.lut_n[k] = n[k]; }
  int64_t off = 0;
  int64_t lut_off[3], val_off[3], der_off[3];
  for (int k = 0; k < 3; k++) {
    lut_off[k] = off; off += n[k] * 8;
    val_off[k] = off; off += n[k] * 4;
    der_off[k] = off; off += n[k] * 4;
  }
  for (int k = 0; k < 3; k++) {
    if (!n[k]) continue;
    int32_t *lut = (int32_t *)(host + lut_off[k]);
    const qg_qp P = c->a[QG_Q_Z_PRE + k], O = c->a[QG_Q_Z_OUT + k];
    for (int64_t i = 0; i < n[k]; i++) {
      const double v = qg_deq(P.qmin + i, P);
      int m;
      lut[i] = (int32_t)qg_quant_real(k < 2 ? 1.0 / (1.0 + exp(-v)) : tanh(v), O, &m);
      lut[n[k] + i] = m;
    }
    hostq.lut[k] = lut;
  }
  for (int k = 0; k < 3; k++) {
    if (!n[k]) continue;
    float *val = (float *)(host + val_off[k]), *der = (float *)(host + der_off[k]);
    const qg_qp P = c->a[QG_Q_Z_PRE + k];
    for (int64_t i = 0; i < n[k]; i++) qg_cell_act_value(&hostq, k, P.qmin + i, &val[i], &der[i]);
  }
  if (bytes > g->tables_bytes) {
    void *p;
    QG_CHECK(mem_alloc(ctx, g->device, &p, bytes));
    if (g->tables) mem_free(g->device, g->tables);
    g->tables = p;
    g->tables_bytes = bytes;
  }
  QG_CHECK(mem_upload(ctx, g->device, g->tables, host, bytes));
  char *d = (char *)g->tables;
  for (int k = 0; k < 3; k++) {
    c->lut[k] = n[k] ? (const int32_t *)(d + lut_off[k]) : NULL;
    c->lut_n[k] = n[k];
    g->bwd.val[k] = n[k] ? (const float *)(d + val_off[k]) : NULL;
    g->bwd.der[k] = n[k] ? (const float *)(d + der_off[k]) : NULL;
  }
  /* the backward uses tables only when all three exist */
  if (!(n[0] && n[1] && n[2]))
    for (int k = 0; k < 3; k++) { g->bwd.val[k] = NULL; g->bwd.der[k] = NULL; }
  g->tables_dirty = 0;
  return QG_OK;
}

static qg_status check_ready(qg_ctx *ctx, const char *fn, qg_int_gru *g) {
  if (!g) return qg_fail(ctx, QG_ERR_ARG, fn, "layer is NULL");
  const char *missing;
  if (!qg_int_gru_ready(g, &missing))
    return qg_fail(ctx, QG_ERR_ARG, fn, "quantizer %s has not been set (calibrate or load the quantization parameters first)", missing);
  if (g->device != ctx->device)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "the layer lives on %s but the context is %s", g->device == QG_CUDA ? "cuda" : "cpu",
                   ctx->device == QG_CUDA ? "cuda" : "cpu");
  return refresh_tables(ctx, fn, g);
}

static qg_status check_weights(qg_ctx *ctx, const char *fn, const qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                               const qg_tensor *bx, const qg_tensor *br) {
  const int64_t wd[2] = {3 * g->H, g->C}, rd[2] = {3 * g->H, g->H}, bd[1] = {3 * g->H};
  QG_CHECK(qg_check_tensor(ctx, fn, "W", W, QG_F32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "R", R, QG_F32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "bx", bx, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "br", br, QG_F32, 1, bd));
  return QG_OK;
}

/* Every non-NULL tensor of ts on the layer's device. */
static qg_status check_on_layer(qg_ctx *ctx, const char *fn, const qg_int_gru *g, int n, const qg_tensor *const *ts,
                                const char *const *names) {
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, n, ts, names));
  for (int i = 0; i < n; i++)
    if (ts[i] && ts[i]->device != g->device)
      return qg_fail(ctx, QG_ERR_DEVICE, fn, "%s is on %s but the layer lives on %s", names[i], ts[i]->device == QG_CUDA ? "cuda" : "cpu",
                     g->device == QG_CUDA ? "cuda" : "cpu");
  return QG_OK;
}

qg_status qg_int_gru_quantize_weights(qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                                      const qg_tensor *bx, const qg_tensor *br) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_ready(ctx, fn, g));
  QG_CHECK(check_weights(ctx, fn, g, W, R, bx, br));
  const qg_tensor *ts[] = {W, R, bx, br};
  const char *names[] = {"W", "R", "bx", "br"};
  QG_CHECK(check_on_layer(ctx, fn, g, 4, ts, names));
  QG_CHECK(QG_DISPATCH(ctx, g->device, int_gru_quantize_weights, g, W, R, bx, br));
  g->weights_quantized = 1;
  return QG_OK;
}

qg_status qg_int_gru_weights(qg_ctx *ctx, const qg_int_gru *g, int w, qg_tensor *codes, qg_tensor *fq, qg_tensor *mask) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!g) return qg_fail(ctx, QG_ERR_ARG, fn, "layer is NULL");
  if (w < 0 || w >= QG_W_NUM) return qg_fail(ctx, QG_ERR_ARG, fn, "weight %d outside 0..%d", w, QG_W_NUM - 1);
  if (!g->weights_quantized) return qg_fail(ctx, QG_ERR_ARG, fn, "no weights quantized yet (run a forward or qg_int_gru_quantize_weights)");
  const int64_t cols = qg_int_gru_weight_cols(g, w), n = 3 * g->H * cols;
  const int64_t d2[2] = {3 * g->H, cols};
  const int nd = w < 2 ? 2 : 1;
  qg_tensor *outs[3] = {codes, fq, mask};
  const int dtypes[3] = {QG_I32, QG_F32, QG_U8};
  const void *src[3] = {g->codes[w], g->fq[w], g->mask[w]};
  const char *names[3] = {"codes", "fq", "mask"};
  for (int i = 0; i < 3; i++)
    if (outs[i]) QG_CHECK(qg_check_tensor(ctx, fn, names[i], outs[i], dtypes[i], nd, d2));
  for (int i = 0; i < 3; i++) {
    if (!outs[i]) continue;
    qg_tensor from = *outs[i];
    from.data = (void *)src[i];
    from.device = g->device;
    from.owns_data = 0;
    from.numel = n;
    QG_CHECK(qg_copy(ctx, outs[i], &from));
  }
  return QG_OK;
}

/* Every check of qg_int_gru_forward's arguments (and the layer's tables refreshed); runs nothing. */
static qg_status forward_checks(qg_ctx *ctx, const char *fn, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn,
                                const qg_int_gru_saved *saved, const qg_stats *stats, const qg_tensor *x, const qg_tensor *W,
                                const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br, const qg_tensor *h0,
                                const qg_tensor *lengths) {
  QG_CHECK(check_ready(ctx, fn, g));
  const int64_t xd[3] = {-1, -1, g->C};
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 3, xd));
  const int64_t T = x->dims[0], N = x->dims[1], C = g->C, H = g->H;
  QG_CHECK(check_weights(ctx, fn, g, W, R, bx, br));
  const int64_t yd[3] = {T, N, -1}, nh[2] = {N, H};
  QG_CHECK(qg_check_tensor(ctx, fn, "y", y, QG_F32, 3, yd));
  if (y_offset < 0 || y_offset + H > y->dims[2])
    return qg_fail(ctx, QG_ERR_ARG, fn, "y: columns [%d, %lld) do not fit in its last dim %lld", y_offset, (long long)(y_offset + H),
                   (long long)y->dims[2]);
  if (hn) QG_CHECK(qg_check_tensor(ctx, fn, "hn", hn, QG_F32, 2, nh));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, nh));
  QG_CHECK(qg_check_gru_lengths(ctx, fn, lengths, T, N));
  QG_CHECK(qg_check_gru_stats(ctx, fn, stats));
  const qg_tensor *sv[4] = {NULL, NULL, NULL, NULL};
  if (saved) {
    const int64_t hqd[3] = {T + 1, N, H}, cd[4] = {T, N, H, qg_int_gru_cell_bytes(g)}, xqd[3] = {T, N, C};
    QG_CHECK(qg_check_tensor(ctx, fn, "saved.hq", saved->hq, QG_I32, 3, hqd));
    QG_CHECK(qg_check_tensor(ctx, fn, "saved.cell", saved->cell, QG_U8, 4, cd));
    QG_CHECK(qg_check_tensor(ctx, fn, "saved.xq", saved->xq, QG_I32, 3, xqd));
    QG_CHECK(qg_check_tensor(ctx, fn, "saved.xmask", saved->xmask, QG_U8, 3, xqd));
    sv[0] = saved->hq; sv[1] = saved->cell; sv[2] = saved->xq; sv[3] = saved->xmask;
  }
  const qg_tensor *ts[] = {y, hn, x, W, R, bx, br, h0, lengths, sv[0], sv[1], sv[2], sv[3],
                           stats ? stats->range : NULL, stats ? stats->counts : NULL};
  const char *names[] = {"y", "hn", "x", "W", "R", "bx", "br", "h0", "lengths", "saved.hq", "saved.cell", "saved.xq",
                         "saved.xmask", "stats.range", "stats.counts"};
  return check_on_layer(ctx, fn, g, 15, ts, names);
}

qg_status qg_int_gru_forward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn,
                             const qg_int_gru_saved *saved, const qg_stats *stats, const qg_tensor *x,
                             const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                             const qg_tensor *h0, const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(forward_checks(ctx, fn, g, y, y_offset, hn, saved, stats, x, W, R, bx, br, h0, lengths));
  QG_CHECK(QG_DISPATCH(ctx, g->device, int_gru_quantize_weights, g, W, R, bx, br));
  g->weights_quantized = 1;
  return QG_DISPATCH(ctx, g->device, int_gru_forward, g, y, y_offset, hn, saved, stats, x, h0, lengths, reverse);
}

int qg_int_gru_cell_path(const qg_int_gru *g) {
  if (!g) return QG_CELL_NONE;
  return g->cell_path_read ? g->cell_path_read(g) : g->cell_path;
}

/* Every check of qg_int_gru_backward's arguments; runs nothing. */
static qg_status backward_checks(qg_ctx *ctx, const char *fn, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                                 qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                                 const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                                 const qg_tensor *lengths) {
  QG_CHECK(check_ready(ctx, fn, g));
  if (!saved || !saved->hq || !saved->cell || !saved->xq || !saved->xmask)
    return qg_fail(ctx, QG_ERR_ARG, fn, "saved state missing: run the forward in training mode first");
  if (!g->weights_quantized) return qg_fail(ctx, QG_ERR_ARG, fn, "no forward has run on this layer");
  QG_CHECK(qg_check_tensor(ctx, fn, "saved.xq", saved->xq, QG_I32, 3, NULL));
  const int64_t T = saved->xq->dims[0], N = saved->xq->dims[1], C = g->C, H = g->H;
  const int64_t xd[3] = {T, N, C}, hqd[3] = {T + 1, N, H}, cd[4] = {T, N, H, qg_int_gru_cell_bytes(g)}, nh[2] = {N, H};
  const int64_t wd[2] = {3 * H, C}, rd[2] = {3 * H, H}, bd[1] = {3 * H};
  QG_CHECK(qg_check_tensor(ctx, fn, "saved.xq", saved->xq, QG_I32, 3, xd));
  QG_CHECK(qg_check_tensor(ctx, fn, "saved.xmask", saved->xmask, QG_U8, 3, xd));
  QG_CHECK(qg_check_tensor(ctx, fn, "saved.hq", saved->hq, QG_I32, 3, hqd));
  QG_CHECK(qg_check_tensor(ctx, fn, "saved.cell", saved->cell, QG_U8, 4, cd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dW", dW, QG_F32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dR", dR, QG_F32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbx", dbx, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbr", dbr, QG_F32, 1, bd));
  if (dx) QG_CHECK(qg_check_tensor(ctx, fn, "dx", dx, QG_F32, 3, xd));
  if (dh0) QG_CHECK(qg_check_tensor(ctx, fn, "dh0", dh0, QG_F32, 2, nh));
  if (dhn) QG_CHECK(qg_check_tensor(ctx, fn, "dhn", dhn, QG_F32, 2, nh));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, nh));
  if (dy) {
    const int64_t yd[3] = {T, N, -1};
    QG_CHECK(qg_check_tensor(ctx, fn, "dy", dy, QG_F32, 3, yd));
    if (y_offset < 0 || y_offset + H > dy->dims[2])
      return qg_fail(ctx, QG_ERR_ARG, fn, "dy: columns [%d, %lld) do not fit in its last dim %lld", y_offset, (long long)(y_offset + H),
                     (long long)dy->dims[2]);
  }
  QG_CHECK(qg_check_gru_lengths(ctx, fn, lengths, T, N));
  const qg_tensor *ts[] = {dx, dW, dR, dbx, dbr, dh0, dy, dhn, saved->hq, saved->cell, saved->xq, saved->xmask, h0, lengths};
  const char *names[] = {"dx", "dW", "dR", "dbx", "dbr", "dh0", "dy", "dhn", "saved.hq", "saved.cell", "saved.xq", "saved.xmask",
                         "h0", "lengths"};
  return check_on_layer(ctx, fn, g, 14, ts, names);
}

qg_status qg_int_gru_backward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                              qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                              const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                              const qg_tensor *lengths, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(backward_checks(ctx, fn, g, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, saved, h0, lengths));
  return QG_DISPATCH(ctx, g->device, int_gru_backward, g, dx, dW, dR, dbx, dbr, dh0, dy, y_offset, dhn, saved, h0, lengths,
                     reverse);
}

/* ---- both directions of a bidirectional layer ------------------------------------------------
 * Every argument of both directions is checked before anything runs (nothing half-applied), then
 * the backend runs them: the CPU one after the other, the GPU at the same time. */

/* The two layers of a bidirectional call: both given, the same sizes. */
static qg_status check_pair(qg_ctx *ctx, const char *fn, qg_int_gru *const *g) {
  if (!g || !g[0] || !g[1]) return qg_fail(ctx, QG_ERR_ARG, fn, "g must hold the two directions' layers, got %s", g ? "a NULL entry" : "NULL");
  if (g[0] == g[1]) return qg_fail(ctx, QG_ERR_ARG, fn, "g[0] and g[1] are the same layer: each direction needs its own");
  if (g[0]->C != g[1]->C || g[0]->H != g[1]->H)
    return qg_fail(ctx, QG_ERR_ARG, fn, "the directions' layers differ in size: g[0] is C %lld H %lld, g[1] C %lld H %lld",
                   (long long)g[0]->C, (long long)g[0]->H, (long long)g[1]->C, (long long)g[1]->H);
  return QG_OK;
}

#define QG_AT(a, d) ((a) ? (a)[d] : NULL)

qg_status qg_int_gru_forward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *y, qg_tensor *const *hn,
                                   const qg_int_gru_saved *const *saved, const qg_tensor *x, const qg_tensor *const *W,
                                   const qg_tensor *const *R, const qg_tensor *const *bx, const qg_tensor *const *br,
                                   const qg_tensor *const *h0, const qg_tensor *lengths) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_pair(ctx, fn, g));
  if (!W || !R || !bx || !br) return qg_fail(ctx, QG_ERR_ARG, fn, "W, R, bx and br must be arrays of the two directions' weights");
  if (saved && (!saved[0] || !saved[1])) return qg_fail(ctx, QG_ERR_ARG, fn, "saved must be NULL or hold both directions' saved state");
  for (int d = 0; d < 2; d++)
    QG_CHECK(forward_checks(ctx, fn, g[d], y, d ? (int)g[0]->H : 0, QG_AT(hn, d), QG_AT(saved, d), NULL, x, W[d], R[d], bx[d], br[d],
                            QG_AT(h0, d), lengths));
  for (int d = 0; d < 2; d++) {
    QG_CHECK(QG_DISPATCH(ctx, g[d]->device, int_gru_quantize_weights, g[d], W[d], R[d], bx[d], br[d]));
    g[d]->weights_quantized = 1;
  }
  return QG_DISPATCH(ctx, g[0]->device, int_gru_forward_bidir, g, y, hn, saved, x, h0, lengths);
}

qg_status qg_int_gru_backward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *dx, qg_tensor *const *dW,
                                    qg_tensor *const *dR, qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0,
                                    const qg_tensor *dy, const qg_tensor *const *dhn, const qg_int_gru_saved *const *saved,
                                    const qg_tensor *const *h0, const qg_tensor *lengths) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(check_pair(ctx, fn, g));
  if (!dW || !dR || !dbx || !dbr) return qg_fail(ctx, QG_ERR_ARG, fn, "dW, dR, dbx and dbr must be arrays of the two directions' gradients");
  if (!saved || !saved[0] || !saved[1])
    return qg_fail(ctx, QG_ERR_ARG, fn, "saved state missing: run the forward in training mode first (both directions)");
  for (int d = 0; d < 2; d++)
    QG_CHECK(backward_checks(ctx, fn, g[d], dx, dW[d], dR[d], dbx[d], dbr[d], QG_AT(dh0, d), dy, d ? (int)g[0]->H : 0, QG_AT(dhn, d),
                             saved[d], QG_AT(h0, d), lengths));
  if (saved[0]->xq->dims[0] != saved[1]->xq->dims[0] || saved[0]->xq->dims[1] != saved[1]->xq->dims[1])
    return qg_fail(ctx, QG_ERR_ARG, fn, "the directions' saved states differ in T or N: from different forwards");
  return QG_DISPATCH(ctx, g[0]->device, int_gru_backward_bidir, g, dx, dW, dR, dbx, dbr, dh0, dy, dhn, saved, h0, lengths);
}

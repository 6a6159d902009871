/*
 * calib.c: calibration statistics and the methods that choose a quantizer's power-of-two scale
 * and zero point (QUANT_SPEC.md section 5): minmax, histogram (SQNR search with clipped bins
 * weighted x3), mse (the same search, weight x1) and percentile. Per-channel calibration of
 * weights builds one statistics row per channel from the values and runs the same methods.
 *
 * The search, precisely (the specs' brute-force reference follows this text):
 *   candidates e = e_minmax .. e_minmax + 8 (within -31..31), in that order;
 *   symmetric: z = 0; asymmetric: 21 zero points per e, from window starts
 *   a + k (b - a) / 20, k = 0..20, where W = (qmax - qmin) 2^-e is the grid's width and
 *   a = min(lo, hi - W), b = max(lo, hi - W) over the data range [lo, hi] (widened to include 0);
 *   z = clamp(qmin - rne(start 2^e), qmin, qmax);
 *   cost = sum over bins of count * w * (mid - FQ(mid))^2, w = 3 (histogram) or 1 (mse) where the
 *   bin's midpoint is clipped (outside the grid), else 1; the lowest cost wins, a tie keeps the
 *   earlier candidate (the wider range first).
 */
#include "backend.h"
#include "stats.h"

#include <float.h>
#include <string.h>

/* stats: range f64 [rows, 4] and counts i64 [rows, QG_STATS_BINS]; fills rows. */
static qg_status check_stats(qg_ctx *ctx, const char *fn, const qg_stats *stats, int64_t *rows) {
  if (!stats) return qg_fail(ctx, QG_ERR_ARG, fn, "stats is NULL");
  QG_CHECK(qg_check_tensor(ctx, fn, "stats.range", stats->range, QG_F64, 2, NULL));
  const int64_t rd[2] = {stats->range->dims[0], 4}, cd[2] = {stats->range->dims[0], QG_STATS_BINS};
  QG_CHECK(qg_check_tensor(ctx, fn, "stats.range", stats->range, QG_F64, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "stats.counts", stats->counts, QG_I64, 2, cd));
  const qg_tensor *ts[] = {stats->range, stats->counts};
  const char *names[] = {"stats.range", "stats.counts"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 2, ts, names));
  *rows = rd[0];
  return QG_OK;
}

/* Reads every row's range into host memory (workspace), whatever the device. */
static qg_status ranges_to_host(qg_ctx *ctx, const char *fn, const qg_stats *stats, int64_t rows, double **out) {
  QG_CHECK(qg_workspace(ctx, fn, rows * 4 * (int64_t)sizeof(double), (void **)out));
  return qg_copy_to_host(ctx, *out, stats->range, rows * 4 * (int64_t)sizeof(double));
}

static void range_reset(double *r) { r[0] = INFINITY; r[1] = -INFINITY; r[2] = r[3] = 0; }

static void range_begin_hist(double *r) {
  double lo = r[0] < 0 ? r[0] : 0, hi = r[1] > 0 ? r[1] : 0;
  if (!(r[0] <= r[1])) lo = hi = 0;   /* nothing seen */
  if (hi <= lo) hi = lo + 1e-30;      /* all zeros: a tiny range keeps the counts */
  r[2] = lo; r[3] = hi;
}

qg_status qg_stats_reset(qg_ctx *ctx, const qg_stats *stats) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t rows = 0;
  QG_CHECK(check_stats(ctx, fn, stats, &rows));
  double *r;
  QG_CHECK(qg_workspace(ctx, fn, rows * 4 * (int64_t)sizeof(double), (void **)&r));
  for (int64_t i = 0; i < rows; i++) range_reset(r + 4 * i);
  QG_CHECK(qg_copy_from_host(ctx, stats->range, r, rows * 4 * (int64_t)sizeof(double)));
  return qg_fill(ctx, stats->counts, 0.0);
}

qg_status qg_stats_begin_histogram(qg_ctx *ctx, const qg_stats *stats) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t rows = 0;
  QG_CHECK(check_stats(ctx, fn, stats, &rows));
  double *r;
  QG_CHECK(ranges_to_host(ctx, fn, stats, rows, &r));
  for (int64_t i = 0; i < rows; i++) range_begin_hist(r + 4 * i);
  QG_CHECK(qg_copy_from_host(ctx, stats->range, r, rows * 4 * (int64_t)sizeof(double)));
  return qg_fill(ctx, stats->counts, 0.0);
}

qg_status qg_stats_add(qg_ctx *ctx, const qg_stats *stats, int row, const qg_tensor *values) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t rows = 0;
  QG_CHECK(check_stats(ctx, fn, stats, &rows));
  if (row < 0 || row >= rows) return qg_fail(ctx, QG_ERR_ARG, fn, "row %d outside [0, %lld)", row, (long long)rows);
  QG_CHECK(qg_check_tensor(ctx, fn, "values", values, -1, -1, NULL));
  if (values->dtype != QG_F32 && values->dtype != QG_F64)
    return qg_fail(ctx, QG_ERR_ARG, fn, "values: expected f32 or f64, got %s", qg_dtype_name(values->dtype));
  const qg_tensor *ts[] = {stats->range, values};
  const char *names[] = {"stats", "values"};
  int dev;
  QG_CHECK(qg_common_device(ctx, fn, &dev, 2, ts, names));
  return QG_DISPATCH(ctx, dev, stats_add, stats, row, values);
}

qg_status qg_cpu_stats_add(qg_ctx *ctx, const qg_stats *stats, int row, const qg_tensor *values) {
  (void)ctx;
  double *range = (double *)stats->range->data + 4 * (int64_t)row;
  int64_t *counts = (int64_t *)stats->counts->data + (int64_t)QG_STATS_BINS * row;
  if (values->dtype == QG_F32)
    for (int64_t i = 0; i < values->numel; i++) qg_stats_observe(range, counts, ((const float *)values->data)[i]);
  else
    for (int64_t i = 0; i < values->numel; i++) qg_stats_observe(range, counts, ((const double *)values->data)[i]);
  return QG_OK;
}

static int64_t clamp_z(int64_t z, qg_qp g) { return z < g.qmin ? g.qmin : (z > g.qmax ? g.qmax : z); }

/* The minmax rule on the range [lo, hi] (widened to include 0): one host/device function. */
static void minmax_rule(double lo, double hi, int bits, int sym, int uns, int32_t *e, int32_t *z) {
  qg_minmax_rule(lo, hi, bits, sym, uns, e, z);
}

static double search_cost(const double *row, const int64_t *counts, const int *nz, int nnz, qg_qp q, double clip_weight) {
  double lo = row[2], w = (row[3] - row[2]) / QG_STATS_BINS, cost = 0;
  for (int k = 0; k < nnz; k++) {
    int b = nz[k];
    double mid = lo + (b + 0.5) * w;
    int m;
    double fq = qg_deq(qg_quant_real(mid, q, &m), q);
    double d = mid - fq;
    cost += (double)counts[b] * (m ? 1.0 : clip_weight) * d * d;
  }
  return cost;
}

/* (e, z) of one statistics row. */
static qg_status calibrate(qg_ctx *ctx, const char *fn, const double *row, const int64_t *counts, int bits, int sym, int uns, int method,
                           double pct, int32_t *e, int32_t *z, double *cost) {
  *cost = 0;
  double lo = row[0], hi = row[1];
  if (!(lo <= hi)) { lo = hi = 0; }   /* nothing seen: degenerate */
  int has_hist = row[3] > row[2];
  if (method == QG_CALIB_MINMAX) { minmax_rule(lo, hi, bits, sym, uns, e, z); return QG_OK; }
  if (!has_hist)
    return qg_fail(ctx, QG_ERR_ARG, fn, "method %d needs a histogram (qg_stats_begin_histogram, then a second pass)", method);
  double total = 0;
  for (int b = 0; b < QG_STATS_BINS; b++) total += (double)counts[b];
  double bw = (row[3] - row[2]) / QG_STATS_BINS;
  if (method == QG_CALIB_PERCENTILE) {
    if (!(pct > 50 && pct <= 100)) return qg_fail(ctx, QG_ERR_ARG, fn, "percentile must be in (50, 100], got %g", pct);
    double tail = total * (100.0 - pct) / 200.0, cum = 0;
    int bl = 0, bh = QG_STATS_BINS - 1;
    for (bl = 0; bl < QG_STATS_BINS; bl++) { cum += (double)counts[bl]; if (cum > tail) break; }
    cum = 0;
    for (bh = QG_STATS_BINS - 1; bh >= 0; bh--) { cum += (double)counts[bh]; if (cum > tail) break; }
    double plo = row[2] + bl * bw, phi = row[2] + (bh + 1) * bw;
    if (plo < lo) plo = lo;
    if (phi > hi) phi = hi;
    minmax_rule(plo, phi, bits, sym, uns, e, z);
    return QG_OK;
  }
  if (method != QG_CALIB_HISTOGRAM && method != QG_CALIB_MSE) return qg_fail(ctx, QG_ERR_ARG, fn, "unknown method %d", method);
  double clip_w = method == QG_CALIB_HISTOGRAM ? 3.0 : 1.0;
  int32_t e0, z0;
  minmax_rule(lo, hi, bits, sym, uns, &e0, &z0);
  if (lo > 0) lo = 0;
  if (hi < 0) hi = 0;
  if (!(hi > lo)) { *e = e0; *z = z0; return QG_OK; }   /* degenerate */
  int nz[QG_STATS_BINS], nnz = 0;
  for (int b = 0; b < QG_STATS_BINS; b++) if (counts[b] > 0) nz[nnz++] = b;
  qg_qp g = qg_qp_make(bits, uns, 0, 0);
  double best = DBL_MAX;
  int32_t be = e0, bz = z0;
  for (int ee = e0; ee <= e0 + 8 && ee <= 31; ee++) {
    int64_t prev_z = INT64_MIN;
    int nzc = sym ? 1 : 21;
    double width = ldexp((double)(g.qmax - g.qmin), -ee);
    double a = lo < hi - width ? lo : hi - width, b = lo < hi - width ? hi - width : lo;
    for (int k = 0; k < nzc; k++) {
      int64_t zz = 0;
      if (!sym) {
        double start = a + (b - a) * k / 20.0;
        zz = clamp_z(g.qmin - (int64_t)nearbyint(ldexp(start, ee)), g);
        if (zz == prev_z) continue;
        prev_z = zz;
      }
      qg_qp q = qg_qp_make(bits, uns, ee, (int32_t)zz);
      double c = search_cost(row, counts, nz, nnz, q, clip_w);
      if (c < best) { best = c; be = ee; bz = (int32_t)zz; }
    }
  }
  *e = be; *z = bz; *cost = best;
  return QG_OK;
}

qg_status qg_calibrate_row(qg_ctx *ctx, int32_t *exp2_inv, int32_t *zero_point, double *cost,
                           const qg_stats *stats, int row, int bitwidth, int is_symmetric, int is_unsigned,
                           int method, double percentile) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  if (!exp2_inv || !zero_point || !cost) return qg_fail(ctx, QG_ERR_ARG, fn, "NULL output");
  int64_t rows = 0;
  QG_CHECK(check_stats(ctx, fn, stats, &rows));
  if (row < 0 || row >= rows) return qg_fail(ctx, QG_ERR_ARG, fn, "row %d outside [0, %lld)", row, (long long)rows);
  if (bitwidth < 1 || bitwidth > 32) return qg_fail(ctx, QG_ERR_ARG, fn, "bitwidth must be 1..32, got %d", bitwidth);
  /* the search runs on the host: one row copied out, whatever the device */
  char *host;
  const int64_t rb = 4 * (int64_t)sizeof(double), cbytes = QG_STATS_BINS * (int64_t)sizeof(int64_t);
  QG_CHECK(qg_workspace(ctx, fn, rb + cbytes, (void **)&host));
  qg_tensor rv = *stats->range, cv = *stats->counts;
  rv.data = (char *)rv.data + row * rb; rv.numel = 4; rv.ndim = 1; rv.dims[0] = 4;
  cv.data = (char *)cv.data + row * cbytes; cv.numel = QG_STATS_BINS; cv.ndim = 1; cv.dims[0] = QG_STATS_BINS;
  QG_CHECK(qg_copy_to_host(ctx, host, &rv, rb));
  QG_CHECK(qg_copy_to_host(ctx, host + rb, &cv, cbytes));
  return calibrate(ctx, fn, (const double *)host, (const int64_t *)(host + rb), bitwidth, is_symmetric, is_unsigned, method,
                   percentile, exp2_inv, zero_point, cost);
}

qg_status qg_cpu_channel_minmax(qg_ctx *ctx, double *range, const qg_tensor *w) {
  (void)ctx;
  const int64_t rows = w->dims[0], cols = w->ndim == 2 ? w->dims[1] : 1;
  const float *wp = (const float *)w->data;
  for (int64_t r = 0; r < rows; r++) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t c = 0; c < cols; c++) {
      const double v = wp[r * cols + c];
      if (v < lo) lo = v;   /* NaN compares false both ways */
      if (v > hi) hi = v;
    }
    range[2 * r] = lo;
    range[2 * r + 1] = hi;
  }
  return QG_OK;
}

/* Per job, per row: min and max of w (as qg_cpu_channel_minmax), then the minmax rule. */
qg_status qg_cpu_channel_minmax_quant(qg_ctx *ctx, int n, int32_t *const *exps, int32_t *const *zps, const qg_tensor *const *w,
                                      const int *bitwidth, const int *is_symmetric, const int *is_unsigned) {
  (void)ctx;
  for (int i = 0; i < n; i++) {
    const int64_t rows = w[i]->dims[0], cols = w[i]->ndim == 2 ? w[i]->dims[1] : 1;
    const float *wp = (const float *)w[i]->data;
    for (int64_t r = 0; r < rows; r++) {
      double lo = INFINITY, hi = -INFINITY;
      for (int64_t c = 0; c < cols; c++) {
        const double v = wp[r * cols + c];
        if (v < lo) lo = v;   /* NaN compares false both ways */
        if (v > hi) hi = v;
      }
      if (!(lo <= hi)) lo = hi = 0;   /* nothing seen (a row of NaNs): degenerate */
      qg_minmax_rule(lo, hi, bitwidth[i], is_symmetric[i], is_unsigned[i], exps[i] + r, zps[i] + r);
    }
  }
  return QG_OK;
}

qg_status qg_check_calib_method(qg_ctx *ctx, const char *fn, int method, double percentile) {
  if (method != QG_CALIB_MINMAX && method != QG_CALIB_HISTOGRAM && method != QG_CALIB_MSE && method != QG_CALIB_PERCENTILE)
    return qg_fail(ctx, QG_ERR_ARG, fn, "unknown method %d", method);
  if (method == QG_CALIB_PERCENTILE && !(percentile > 50 && percentile <= 100))
    return qg_fail(ctx, QG_ERR_ARG, fn, "percentile must be in (50, 100], got %g", percentile);
  return QG_OK;
}

qg_status qg_calibrate_channels_host(qg_ctx *ctx, const char *fn, int32_t *ep, int32_t *zp, const qg_tensor *w, int bitwidth,
                                     int is_symmetric, int is_unsigned, int method, double percentile) {
  const int64_t rows = w->dims[0], cols = w->ndim == 2 ? w->dims[1] : 1;
  double cost;
  int32_t e, z;
  if (method == QG_CALIB_MINMAX) {
    /* Only the range matters: reduce rows on w's device, decide on the host. */
    double *range;
    QG_CHECK(qg_workspace(ctx, fn, 2 * rows * (int64_t)sizeof(double), (void **)&range));
    QG_CHECK(QG_DISPATCH(ctx, w->device, channel_minmax, range, w));
    for (int64_t r = 0; r < rows; r++) {
      const double row[4] = {range[2 * r], range[2 * r + 1], 0, 0};
      QG_CHECK(calibrate(ctx, fn, row, NULL, bitwidth, is_symmetric, is_unsigned, method, percentile, &e, &z, &cost));
      ep[r] = e; zp[r] = z;
    }
    return QG_OK;
  }
  const int64_t wbytes = w->device == QG_CPU ? 0 : ((rows * cols * (int64_t)sizeof(float) + 63) & ~(int64_t)63);
  char *ws;
  QG_CHECK(qg_workspace(ctx, fn, wbytes + 4 * (int64_t)sizeof(double) + QG_STATS_BINS * (int64_t)sizeof(int64_t), (void **)&ws));
  const float *wp = (const float *)w->data;
  if (w->device != QG_CPU) {
    QG_CHECK(qg_copy_to_host(ctx, ws, w, rows * cols * (int64_t)sizeof(float)));
    wp = (const float *)ws;
  }
  double *row = (double *)(ws + wbytes);
  int64_t *counts = (int64_t *)(row + 4);
  for (int64_t r = 0; r < rows; r++) {
    range_reset(row);
    for (int64_t c = 0; c < cols; c++) qg_stats_observe(row, counts, wp[r * cols + c]);   /* min, max only */
    range_begin_hist(row);
    memset(counts, 0, QG_STATS_BINS * sizeof(int64_t));
    for (int64_t c = 0; c < cols; c++) qg_stats_observe(row, counts, wp[r * cols + c]);
    QG_CHECK(calibrate(ctx, fn, row, counts, bitwidth, is_symmetric, is_unsigned, method, percentile, &e, &z, &cost));
    ep[r] = e; zp[r] = z;
  }
  return QG_OK;
}

qg_status qg_calibrate_channels(qg_ctx *ctx, qg_tensor *exps, qg_tensor *zps, const qg_tensor *w, int bitwidth,
                                int is_symmetric, int is_unsigned, int method, double percentile) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "w", w, QG_F32, -1, NULL));
  if (w->ndim > 2) return qg_fail(ctx, QG_ERR_ARG, fn, "w must be [rows, cols] or [rows]");
  int64_t rows = w->dims[0], rd[1] = {rows};
  QG_CHECK(qg_check_tensor(ctx, fn, "exps", exps, QG_I32, 1, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "zps", zps, QG_I32, 1, rd));
  if (exps->device != QG_CPU || zps->device != QG_CPU)
    return qg_fail(ctx, QG_ERR_DEVICE, fn, "exps and zps must be cpu tensors (the host mirrors of the quantizer)");
  if (bitwidth < 1 || bitwidth > 32) return qg_fail(ctx, QG_ERR_ARG, fn, "bitwidth must be 1..32, got %d", bitwidth);
  return qg_calibrate_channels_host(ctx, fn, (int32_t *)exps->data, (int32_t *)zps->data, w, bitwidth, is_symmetric,
                                    is_unsigned, method, percentile);
}

/*
 * stats.h: how one value enters a calibration statistics row (QUANT_SPEC.md section 5), shared by
 * every observer (float and integer forwards, CPU and CUDA) so that binning is the same function
 * everywhere. A row is range[4] = {min, max, lo, hi} (f64) and counts[QG_STATS_BINS] (i64):
 * min/max always; the count of the bin of v over [lo, hi] when hi > lo (values outside go to the
 * edge bins); NaN is ignored. Counts are integers and min/max do not depend on order, so a GPU can
 * fill a row with integer atomics and get the CPU's row exactly.
 */
#ifndef QGRU_STATS_H
#define QGRU_STATS_H

#include "qgru.h"
#include "quant_math.h"

/* The bin of v over [lo, hi] (hi > lo): floor((v - lo) / (hi - lo) * bins), clamped. No fused
 * multiply-add can form here (subtract, divide, multiply), so host and device agree. An
 * infinite range or value can make f NaN (inf / inf): bin 0, never an index outside the row. */
QG_HD int qg_stats_bin(double lo, double hi, double v) {
  const double f = (v - lo) / (hi - lo) * (double)QG_STATS_BINS;
  return !(f >= 0) ? 0 : (f >= QG_STATS_BINS ? QG_STATS_BINS - 1 : (int)f);
}

/* Host observer: adds v to one row. */
static inline void qg_stats_observe(double *range, int64_t *counts, double v) {
  if (v != v) return;
  if (v < range[0]) range[0] = v;
  if (v > range[1]) range[1] = v;
  if (range[3] > range[2]) counts[qg_stats_bin(range[2], range[3], v)] += 1;
}

/* Calibration internals shared by the per-channel front doors (core/calib.c, core/int_gru.c). */
/* A known method (QG_CALIB_*) and, for percentile, a percentile in (50, 100]. */
qg_status qg_check_calib_method(qg_ctx *ctx, const char *fn, int method, double percentile);
/* (e, z) of every row of w (f32 [rows, cols] or [rows], on either device; checked by the caller)
 * into the host arrays ep, zp [rows]: minmax reduces the rows on w's device (qg_channel_minmax),
 * the other methods copy w to the host. Uses the host workspace. */
qg_status qg_calibrate_channels_host(qg_ctx *ctx, const char *fn, int32_t *ep, int32_t *zp, const qg_tensor *w, int bitwidth,
                                     int is_symmetric, int is_unsigned, int method, double percentile);

#endif

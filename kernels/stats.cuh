/*
 * stats.cuh: the CUDA observer of calibration statistics (QUANT_SPEC.md section 5; the host
 * observer is core/stats.h). A statistics row lives on the device as range[4] = {min, max, lo, hi}
 * (f64) and counts[QG_STATS_BINS] (i64). Any thread may observe any value: min and max are updated
 * with compare-and-swap loops and counts with integer atomics, both independent of the order in
 * which threads arrive, so a row filled here equals the CPU's row exactly. The bin comes from the
 * shared qg_stats_bin (no fused multiply-add can form in it).
 */
#ifndef QGRU_STATS_CUH
#define QGRU_STATS_CUH

#include "../core/stats.h"

__device__ __forceinline__ void qg_atomic_min_f64(double *addr, double v) {
  unsigned long long *p = (unsigned long long *)addr;
  unsigned long long old = *p;
  while (v < __longlong_as_double((long long)old)) {
    unsigned long long seen = atomicCAS(p, old, (unsigned long long)__double_as_longlong(v));
    if (seen == old) break;
    old = seen;
  }
}

__device__ __forceinline__ void qg_atomic_max_f64(double *addr, double v) {
  unsigned long long *p = (unsigned long long *)addr;
  unsigned long long old = *p;
  while (v > __longlong_as_double((long long)old)) {
    unsigned long long seen = atomicCAS(p, old, (unsigned long long)__double_as_longlong(v));
    if (seen == old) break;
    old = seen;
  }
}

/* Adds v to one row (range: 4 doubles, counts: QG_STATS_BINS i64). NaN is ignored. */
__device__ __forceinline__ void qg_stats_observe_dev(double *range, int64_t *counts, double v) {
  if (v != v) return;
  qg_atomic_min_f64(range, v);
  qg_atomic_max_f64(range + 1, v);
  const double lo = range[2], hi = range[3];
  if (hi > lo) atomicAdd((unsigned long long *)(counts + qg_stats_bin(lo, hi, v)), 1ull);
}

#endif

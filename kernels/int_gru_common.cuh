/*
 * int_gru_common.cuh: the small helpers both halves of the integer GRU's CUDA backend use
 * (kernels/int_gru.cu: weight quantization and the forward; kernels/int_gru_backward.cu: the
 * straight-through backward): a row's number of valid steps from device lengths, and the
 * 256-aligned carving of one device workspace into named parts.
 */
#ifndef QGRU_INT_GRU_COMMON_CUH
#define QGRU_INT_GRU_COMMON_CUH

#include "cuda_common.cuh"
#include "../core/int_gru.h"

/* Row n's number of valid steps: T without lengths, else L[n] clamped into 0..T (device values
 * are not read by the host; the CPU front door rejects values outside 1..T). */
__device__ __forceinline__ int64_t length_at(const int64_t *L, int64_t n, int64_t T) {
  if (!L) return T;
  const int64_t l = L[n];
  return l < 0 ? 0 : (l > T ? T : l);
}

static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Bytes from a running offset, 256-aligned; returns the offset. */
static inline int64_t take(int64_t *total, int64_t bytes) {
  const int64_t o = *total;
  *total += round_up(bytes > 0 ? bytes : 1, 256);
  return o;
}

#endif

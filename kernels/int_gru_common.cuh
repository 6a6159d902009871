/*
 * int_gru_common.cuh: the small helpers both halves of the integer GRU's CUDA backend use
 * (kernels/int_gru.cu: weight quantization and the forward; kernels/int_gru_backward.cu and
 * int_gru_bwd_persist.cu: the straight-through backward): a row's number of valid steps from device lengths, and the
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

/* Copies the cell's three activation tables (codes then masks, 2 lut_n[k] words each) into
 * shared memory from lut on, strided over threads tid of nthr, and points q's tables there; the
 * caller synchronizes before the first look-up. Q: qg_cell_q or qg_cell32 (both hold lut[3] and
 * lut_n[3]). Every GPU forward that keeps the tables on chip calls this. */
template <class Q>
__device__ __forceinline__ void cell_luts_to_smem(Q *q, int32_t *lut, int tid, int nthr) {
#pragma unroll
  for (int k = 0; k < 3; k++) {
    const int64_t n = 2 * q->lut_n[k];
    for (int64_t e = tid; e < n; e += nthr) lut[e] = q->lut[k][e];
    q->lut[k] = lut;
    lut += n;
  }
}

/* qg_cell32_unit for hidden unit i of a layer with H units, from the layer's per-row arrays [3H]
 * (gates z, r, g at rows k H + i): the exponents of W and R, the bias codes, zero points and
 * exponents of bx and br. Writes the unit's rows into column u of P (leading dimension ld);
 * returns 0 where a bound of the 32-bit cell fails. */
__device__ __forceinline__ int cell32_unit_rows(int32_t *P, int64_t ld, int64_t u, const qg_cell_q *q, int64_t H, int64_t i,
                                                const int32_t *eW, const int32_t *eR, const int32_t *bxc, const int32_t *bxz,
                                                const int32_t *bxe, const int32_t *brc, const int32_t *brz, const int32_t *bre) {
  int ew[3], er[3], ebx[3], ebr[3];
  int64_t bx[3], br[3];
#pragma unroll
  for (int k = 0; k < 3; k++) {
    const int64_t j = k * H + i;
    ew[k] = eW[j]; er[k] = eR[j];
    ebx[k] = bxe[j]; ebr[k] = bre[j];
    bx[k] = (int64_t)bxc[j] - bxz[j];
    br[k] = (int64_t)brc[j] - brz[j];
  }
  return qg_cell32_unit(P, ld, u, q, ew, er, bx, ebx, br, ebr);
}

static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Bytes from a running offset, 256-aligned; returns the offset. */
static inline int64_t take(int64_t *total, int64_t bytes) {
  const int64_t o = *total;
  *total += round_up(bytes > 0 ? bytes : 1, 256);
  return o;
}

#endif

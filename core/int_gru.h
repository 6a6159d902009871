/*
 * int_gru.h: the inside of a qg_int_gru handle (the integer GRU layer of qgru.h), shared by its
 * front door (int_gru.c) and its backends (int_gru_cpu.c; kernels/int_gru.cu). Not public.
 *
 * Memory: `mem` is one allocation on the layer's device holding, in order, the per-channel
 * exponents and zero points of the four weight quantizers (i32 [3H] each), the weight codes
 * (i32), fake-quantized weights (f32) and masks (u8) of W, R, bx, br, and one i32 flag a backend
 * may use (c32_flag: the CUDA forward's 32-bit mode). `tables` is a second
 * allocation, sized by the pre-activation bitwidths, holding the three forward tables (i32
 * codes then masks) and the backward's value and derivative tables (f32); it is rebuilt on the
 * host and copied over whenever a quantizer it depends on changes.
 */
#ifndef QGRU_INT_GRU_H
#define QGRU_INT_GRU_H

#include "int_gru_cell.h"
#include "internal.h"

struct qg_int_gru {
  int device;
  int64_t C, H;
  qg_qspec act[QG_Q_NUM_ACT];
  int act_set[QG_Q_NUM_ACT];
  int w_bits[QG_W_NUM], w_unsigned[QG_W_NUM], w_set[QG_W_NUM];
  int weights_quantized;          /* codes / fq / masks hold the last weights given */
  /* views into mem (device pointers on a GPU) */
  int32_t *w_exp[QG_W_NUM], *w_zp[QG_W_NUM];
  int32_t *codes[QG_W_NUM];
  float *fq[QG_W_NUM];
  uint8_t *mask[QG_W_NUM];
  void *mem;
  int64_t mem_bytes;
  /* host copies of the per-channel exponents and zero points (the GEMM exactness checks and
   * the bias alignment read them on the host). w_exp_stale[w]: weight w's exponents were derived
   * on the device (qg_int_gru_calibrate_weight) and not read back since: the host copy is old
   * until qg_int_gru_host_exps refreshes it (the zero points are then known: symmetric, all 0).
   * w_scratch: host room for one weight's exponents and zero points (2 x [3H]). */
  int32_t *w_exp_host[QG_W_NUM], *w_zp_host[QG_W_NUM];
  int w_exp_stale[QG_W_NUM];
  int32_t *w_scratch;
  /* tables (device pointers on a GPU): the cell's lut pointers and the backward's tables */
  void *tables;
  int64_t tables_bytes;
  int tables_dirty;
  qg_cell_q cell;                 /* resolved quantizers + forward tables */
  qg_cell_tables bwd;             /* value / derivative tables (NULL entries when pre > 16 bits) */
  int cell_path;                  /* QG_CELL_* of the last forward (set by the backend) */
  int32_t *c32_flag;              /* in mem: set by a CUDA forward when a unit ran outside the 32-bit cell */
  int (*cell_path_read)(const qg_int_gru *g);   /* when the backend left the path on the device: reads it
                                                 * (qg_int_gru_cell_path calls it), else NULL */
};

/* The weight's rows x cols (W [3H, C], R [3H, H], bx and br [3H] x 1). */
static inline int64_t qg_int_gru_weight_cols(const qg_int_gru *g, int w) {
  return w == QG_W_W ? g->C : (w == QG_W_R ? g->H : 1);
}

/* Brings weight w's exponents to the host copy when they are stale (waits for the device then);
 * defined in int_gru.c. */
#ifdef __cplusplus
extern "C"
#endif
qg_status qg_int_gru_host_exps(qg_ctx *ctx, qg_int_gru *g, int w);

/* Whether the layer needs the 128-bit cell: the 64-bit one is exact (and cheaper) when
 * qg_cell_fits64 holds for its quantizers and the range of its bias exponents. Decided once per
 * forward on the host, the same way on every device, from the host copies of the bias exponents
 * (current: see w_exp_stale). */
static inline int qg_int_gru_needs_wide(const qg_int_gru *g) {
  int ebx[2] = {31, -31}, ebr[2] = {31, -31};
  for (int64_t j = 0; j < 3 * g->H; j++) {
    const int a = g->w_exp_host[QG_W_BX][j], b = g->w_exp_host[QG_W_BR][j];
    if (a < ebx[0]) ebx[0] = a;
    if (a > ebx[1]) ebx[1] = a;
    if (b < ebr[0]) ebr[0] = b;
    if (b > ebr[1]) ebr[1] = b;
  }
  return !qg_cell_fits64(g->act, g->w_bits[QG_W_BX], ebx[0], ebx[1], g->w_bits[QG_W_BR], ebr[0], ebr[1]);
}

#endif

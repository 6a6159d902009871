/*
 * int_gru_small.cuh: the interface between the integer GRU forward (kernels/int_gru.cu, which
 * decides the path and prepares the operands) and its small-H recurrence (kernels/int_gru_small.cu:
 * one CTA holds all of R, no cluster). What the kernel reads and writes (isk_params), the launch
 * shape (isk_plan) and the two host calls: the planner and the launcher. See int_gru_small.cu.
 */
#ifndef QGRU_INT_GRU_SMALL_CUH
#define QGRU_INT_GRU_SMALL_CUH

#include "cuda_common.cuh"
#include "../core/int_gru.h"

/* Limits of the small kernel: at most ISK_MAX_THREADS threads (S lanes per unit, every unit of the
 * layer in one CTA), at most ISK_MAX_KW words of R per lane and gate (registers). */
enum { ISK_MAX_THREADS = 256, ISK_MAX_KW = 16, ISK_RING = 4 };

/* A launch shape: NB batch rows per CTA, S lanes per hidden unit (a power of two, S >= NB: lane b
 * of a unit runs row b's cell), KW words (4 int8 each) of each gate row of R per lane, so that
 * 4 S KW >= H (Kp = 4 S KW: R's plane and the h rows are padded with zeros to Kp bytes). */
struct isk_plan {
  int NB, S, KW, threads, lut_smem;
  int ws;                         /* the cell over two roles of warps (int_gru_small_ws_kernel) */
  int64_t Kp, blocks, off_ring, off_P, off_x, off_lut, smem;
};

struct isk_params {
  qg_cell_q cell;                 /* quantizers, activation tables (device) */
  qg_cell32 c32;                  /* the per-tensor part of the 32-bit cell (P, H set per thread) */
  int64_t T, N, H, Kp;
  int S;
  const int32_t *qwx;             /* [T N, 3H] int32 W x accumulators, time order */
  const int8_t *Rp;               /* [3H][Kp] R's single int8 plane (r = q - base) */
  const int64_t *rconst, *roff;   /* [3H] the zero-point terms (int_gru.cu's header) */
  int need_sh;                    /* some roff != 0: per-step row sums of the h plane */
  int64_t baseH;                  /* h plane: r = code - baseH */
  const int32_t *bxc, *brc, *bxz, *brz, *bxe, *bre;   /* bias codes, zero points, exponents [3H] */
  const int32_t *eR, *eW;         /* weight.R and weight.W exponents [3H] */
  int eX;                         /* input.x's exponent */
  int wide;                       /* the general cell's width (a unit outside the 32-bit bounds) */
  const int64_t *L;
  int reverse;
  float *y;
  int64_t Hy;
  int y_offset;
  float *hn;                      /* [N, H] or NULL */
  uint8_t *cell_out;              /* [T, N, H, 12] (narrow) or NULL */
  int32_t *hq;                    /* saved output.h codes [T+1, N, H] (h0 at 0), or NULL */
  int32_t *hping;                 /* without saved state: two [N, H] buffers, h0 in the first */
  int32_t *c32_flag;              /* set when a unit runs the general cell (zeroed before) */
  int64_t off_ring, off_P, off_x, off_lut;   /* off_x: the two roles' exchange */
  int lut_smem;
};

/* The shape for T steps of N rows of H units, y rows of Hy columns (forced_rows, forced_splits > 0: qg_ctx_set_persist_shape's
 * rows and splits); ws: the cell over two roles of warps never (0), only (1: storage 5) or
 * wherever it holds the layer (2: auto); *found = 0 when the kernel cannot hold the layer.
 * lut_bytes: the activation tables (0: not all tables exist). */
qg_status isk_choose(qg_ctx *ctx, const char *fn, int64_t T, int64_t N, int64_t H, int64_t Hy, int forced_rows, int forced_splits, int ws,
                     int64_t lut_bytes, isk_plan *out, int *found);
/* Launches the recurrence of plan pl on the context's stream (p: everything but the layout, which
 * is taken from pl). */
qg_status isk_launch(qg_ctx *ctx, const char *fn, const isk_plan *pl, isk_params *p);

#endif

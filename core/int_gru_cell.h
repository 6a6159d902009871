/*
 * int_gru_cell.h: the integer GRU cell of QUANT_SPEC.md, written once for every device.
 *
 * What is per (step, batch row, hidden unit) lives here as inline functions usable from C and
 * CUDA (QG_HD): steps 3-8 of the integer update (section 3), the straight-through cell of the
 * backward (section 4), the layout of the 17 mask bits, and the packing of the per-unit saved
 * state. The CPU loop (int_gru_cpu.c) and the CUDA kernels call exactly this code, so the
 * integer forward is bit-exact across devices by construction, not by retyping.
 *
 * Two arithmetic forms of the same update, bit-exact with each other: qg_cell_forward (64- or
 * 128-bit sums, any bitwidth, optional statistics) and qg_cell32_forward (32-bit lanes with
 * per-unit constants resolved once per forward, for layers within its bounds; written so a loop
 * over units vectorizes). Variants are compile-time: qg_cell_forward's `observe` is passed as a
 * literal 0 or 1 by its callers, so the compiler drops the statistics work from the training and
 * inference loops.
 * Everything here is integer or exact (ldexp) except the STE cell's float32 math and the
 * >16-bit activation fallback (f in double, documented as not integer-deployable).
 */
#ifndef QGRU_INT_GRU_CELL_H
#define QGRU_INT_GRU_CELL_H

#include "qgru.h"
#include "quant_math.h"

#include <string.h>

/* Bits of the per-unit mask word (1 = in range, the gradient passes). */
enum {
  QG_MB_H = 0, QG_MB_OLD, QG_MB_NEW, QG_MB_GOUT, QG_MB_GPRE, QG_MB_RRH, QG_MB_RHB, QG_MB_ZOUT, QG_MB_ZPRE, QG_MB_ROUT,
  QG_MB_RPRE, QG_MB_WX_Z, QG_MB_WX_R, QG_MB_WX_G, QG_MB_RH_Z, QG_MB_RH_R, QG_MB_RH_G
};

/* The resolved quantizers a cell needs, plus its activation tables (device pointers on a GPU).
 *   a[QG_Q_*]   the 13 activation quantizers
 *   lut[k]      k = 0 z, 1 r, 2 g: int32 [2 * 2^bits(pre)], codes then masks, indexed by
 *               q - qmin(pre); NULL when the pre-activation has more than 16 bits
 *   narrow      saved codes as uint16 offsets from qmin (all four saved codes have <= 16 bits)  */
typedef struct {
  qg_qp a[QG_Q_NUM_ACT];
  const int32_t *lut[3];
  int64_t lut_n[3];
  int narrow;
} qg_cell_q;

/* Bytes of saved state per unit: four codes (z_pre, r_pre, g_pre, Rh_g + br_g) and the mask word. */
QG_HD int qg_cell_bytes(int narrow) { return narrow ? 4 * 2 + 4 : 4 * 4 + 4; }

/* The inputs of one unit: requantized W x and R h codes of its three gate rows (z, r, g) with
 * their in-range mask bits already placed at QG_MB_WX_* / QG_MB_RH_*, the centered bias codes
 * with their per-channel exponents, and the previous output.h code. */
typedef struct {
  int64_t wx[3], rh[3];
  int64_t bx[3], br[3];   /* code - zero point */
  int ebx[3], ebr[3];
  int64_t hprev;
  uint32_t mask;
} qg_cell_in;

/* The outputs: the new output.h code, the codes saved for the backward and the full mask word. */
typedef struct {
  int64_t h, zpre, rpre, gpre, rhb;
  uint32_t mask;
} qg_cell_out;

/* Real values of every operator before its quantizer (calibration statistics). */
typedef struct {
  double zpre, rpre, zout, rout, rhb, rrh, gpre, gout, old, nw, h;
} qg_cell_reals;

/* ---- 64-bit twins of quant_math.h's 128-bit alignment and requantization -------------------
 * Exactly the same results wherever no intermediate leaves +-2^62: the layer checks that bound
 * once per forward (qg_cell_fits64) and then runs the cheaper variant (`wide` = 0). */
QG_HD int64_t qg_rshift_rne64(int64_t v, int k) {
  if (k >= 63) return 0;    /* |v| < 2^62: the quotient rounds to 0 */
  int64_t fl = v >> k;      /* floor (arithmetic shift) */
  const int64_t p = (int64_t)1 << k;
  const int64_t rem = v - fl * p, half = p >> 1;
  if (rem > half || (rem == half && (fl & 1))) fl += 1;
  return fl;
}

QG_HD int64_t qg_requant64(int64_t v, int s, qg_qp q, int *m) {
  const int k = s - q.e;
  int64_t r;
  if (k > 0) {
    r = qg_rshift_rne64(v, k);
  } else {
    const int l = -k;
    const int64_t limit = (int64_t)1 << 62;   /* beyond any grid of <= 32 bits: clamps either way */
    if (v == 0) r = 0;
    else if (l >= 62 || (v > 0 ? v : -v) >= (limit >> l)) r = v > 0 ? limit : -limit;
    else r = v * ((int64_t)1 << l);
  }
  r += q.z;
  if (r < q.qmin) { *m = 0; return q.qmin; }
  if (r > q.qmax) { *m = 0; return q.qmax; }
  *m = 1;
  return r;
}

/* Output code (and in-range mask) of activation k (0 z, 1 r, 2 g) for pre-activation code qpre. */
QG_HD int64_t qg_cell_act(const qg_cell_q *q, int k, int64_t qpre, int *m) {
  const qg_qp P = q->a[QG_Q_Z_PRE + k];
  if (q->lut[k]) {
    const int64_t i = qpre - P.qmin;
    *m = q->lut[k][q->lut_n[k] + i];
    return q->lut[k][i];
  }
  const double v = qg_deq(qpre, P);
  return qg_quant_real(k < 2 ? 1.0 / (1.0 + exp(-v)) : tanh(v), q->a[QG_Q_Z_OUT + k], m);
}

/* Sum of n centered codes c[i] at exponents e[i], aligned exactly to the finest scale, requantized
 * to Q, on 128 bits (wide) or 64 bits. *real gets the real value of the sum when observing. */
QG_HD int64_t qg_cell_aligned_sum(int n, const int64_t *c, const int *e, qg_qp Q, int *m, const int wide, int observe,
                                  double *real) {
  int emax = e[0];
  for (int i = 1; i < n; i++) if (e[i] > emax) emax = e[i];
  if (wide) {
    qg_i128 sum = 0;
    for (int i = 0; i < n; i++) sum += qg_align(c[i], e[i], emax);
    if (observe) *real = ldexp((double)sum, -emax);
    return qg_requant(sum, emax, Q, m);
  }
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += c[i] * ((int64_t)1 << (emax - e[i]));
  if (observe) *real = ldexp((double)sum, -emax);
  return qg_requant64(sum, emax, Q, m);
}

/* a * b (centered codes) requantized from scale 2^-s to Q, on 128 or 64 bits. */
QG_HD int64_t qg_cell_product(int64_t a, int64_t b, int s, qg_qp Q, int *m, const int wide, int observe, double *real) {
  if (wide) {
    const qg_i128 prod = (qg_i128)a * b;
    if (observe) *real = ldexp((double)prod, -s);
    return qg_requant(prod, s, Q, m);
  }
  const int64_t prod = a * b;
  if (observe) *real = ldexp((double)prod, -s);
  return qg_requant64(prod, s, Q, m);
}

/* Whether the 64-bit variant is exact for these quantizers: every activation code of at most
 * 16 bits (products of two centered codes and of 1 - z stay below 2^49), and every aligned sum
 * below 2^61: for each sum, max over its terms of (bits + shift to the finest exponent) + 2 <=
 * 61. ebx_max / ebx_min (ebr_*) bound the per-channel bias exponents, bx_bits / br_bits their
 * bitwidths. */
static inline int qg_cell_fits64(const qg_qspec *a, int bx_bits, int ebx_min, int ebx_max, int br_bits, int ebr_min,
                                 int ebr_max) {
  for (int i = 0; i < QG_Q_NUM_ACT; i++) if (a[i].bitwidth > 16) return 0;
  if (bx_bits > 16 || br_bits > 16) return 0;
  /* one sum: terms (bits, lowest exponent, highest exponent); the finest scale is the highest e */
  const struct { int n; int bits[4], elo[4], ehi[4]; } sums[5] = {
    {4, {a[QG_Q_MATMUL_WX].bitwidth, a[QG_Q_MATMUL_RH].bitwidth, bx_bits, br_bits},
        {a[QG_Q_MATMUL_WX].exp2_inv, a[QG_Q_MATMUL_RH].exp2_inv, ebx_min, ebr_min},
        {a[QG_Q_MATMUL_WX].exp2_inv, a[QG_Q_MATMUL_RH].exp2_inv, ebx_max, ebr_max}},            /* z_pre, r_pre */
    {2, {a[QG_Q_MATMUL_RH].bitwidth, br_bits, 0, 0}, {a[QG_Q_MATMUL_RH].exp2_inv, ebr_min, 0, 0},
        {a[QG_Q_MATMUL_RH].exp2_inv, ebr_max, 0, 0}},                                          /* Rh_g + br_g */
    {3, {a[QG_Q_MATMUL_WX].bitwidth, bx_bits, a[QG_Q_RRH].bitwidth, 0},
        {a[QG_Q_MATMUL_WX].exp2_inv, ebx_min, a[QG_Q_RRH].exp2_inv, 0},
        {a[QG_Q_MATMUL_WX].exp2_inv, ebx_max, a[QG_Q_RRH].exp2_inv, 0}},                        /* g_pre */
    {2, {a[QG_Q_OLD].bitwidth, a[QG_Q_NEW].bitwidth, 0, 0}, {a[QG_Q_OLD].exp2_inv, a[QG_Q_NEW].exp2_inv, 0, 0},
        {a[QG_Q_OLD].exp2_inv, a[QG_Q_NEW].exp2_inv, 0, 0}},                                    /* h */
    {0, {0}, {0}, {0}}};
  for (int k = 0; sums[k].n; k++) {
    int emax = sums[k].ehi[0];
    for (int i = 1; i < sums[k].n; i++) if (sums[k].ehi[i] > emax) emax = sums[k].ehi[i];
    for (int i = 0; i < sums[k].n; i++)
      if (sums[k].bits[i] + (emax - sums[k].elo[i]) + 2 > 61) return 0;
  }
  return 1;
}

/* Steps 3-8 of QUANT_SPEC.md section 3 for one unit. wide (128-bit sums, else 64-bit where
 * qg_cell_fits64 holds) and observe (fill *re with the real value of each operator before its
 * quantizer) are literals at every call site, so each variant compiles to its own loop. */
QG_HD void qg_cell_forward(const qg_cell_q *q, const qg_cell_in *in, qg_cell_out *out, const int wide, const int observe,
                           qg_cell_reals *re) {
  const qg_qp QWX = q->a[QG_Q_MATMUL_WX], QRH = q->a[QG_Q_MATMUL_RH], QH = q->a[QG_Q_OUTPUT_H];
  const qg_qp QZ = q->a[QG_Q_Z_OUT], QR = q->a[QG_Q_R_OUT], QG = q->a[QG_Q_G_OUT];
  const qg_qp QRRH = q->a[QG_Q_RRH], QOLD = q->a[QG_Q_OLD], QNEW = q->a[QG_Q_NEW];
  uint32_t mask = in->mask;
  int m;
  /* z and r: four aligned terms each */
  const int64_t cz[4] = {in->wx[0] - QWX.z, in->rh[0] - QRH.z, in->bx[0], in->br[0]};
  const int ez[4] = {QWX.e, QRH.e, in->ebx[0], in->ebr[0]};
  const int64_t qzpre = qg_cell_aligned_sum(4, cz, ez, q->a[QG_Q_Z_PRE], &m, wide, observe, &re->zpre);
  mask |= (uint32_t)m << QG_MB_ZPRE;
  const int64_t cr[4] = {in->wx[1] - QWX.z, in->rh[1] - QRH.z, in->bx[1], in->br[1]};
  const int er[4] = {QWX.e, QRH.e, in->ebx[1], in->ebr[1]};
  const int64_t qrpre = qg_cell_aligned_sum(4, cr, er, q->a[QG_Q_R_PRE], &m, wide, observe, &re->rpre);
  mask |= (uint32_t)m << QG_MB_RPRE;
  const int64_t qz = qg_cell_act(q, 0, qzpre, &m);
  mask |= (uint32_t)m << QG_MB_ZOUT;
  const int64_t qr = qg_cell_act(q, 1, qrpre, &m);
  mask |= (uint32_t)m << QG_MB_ROUT;
  if (observe) {
    re->zout = 1.0 / (1.0 + exp(-qg_deq(qzpre, q->a[QG_Q_Z_PRE])));
    re->rout = 1.0 / (1.0 + exp(-qg_deq(qrpre, q->a[QG_Q_R_PRE])));
  }
  /* Rh_g + br_g with matmul.Rh's quantizer (the seed's fused Rh + br) */
  const int64_t cb[2] = {in->rh[2] - QRH.z, in->br[2]};
  const int eb[2] = {QRH.e, in->ebr[2]};
  const int64_t qrhb = qg_cell_aligned_sum(2, cb, eb, QRH, &m, wide, observe, &re->rhb);
  mask |= (uint32_t)m << QG_MB_RHB;
  /* r * Rhb */
  const int64_t qrrh = qg_cell_product(qr - QR.z, qrhb - QRH.z, QR.e + QRH.e, QRRH, &m, wide, observe, &re->rrh);
  mask |= (uint32_t)m << QG_MB_RRH;
  /* g */
  const int64_t cg[3] = {in->wx[2] - QWX.z, in->bx[2], qrrh - QRRH.z};
  const int eg[3] = {QWX.e, in->ebx[2], QRRH.e};
  const int64_t qgpre = qg_cell_aligned_sum(3, cg, eg, q->a[QG_Q_G_PRE], &m, wide, observe, &re->gpre);
  mask |= (uint32_t)m << QG_MB_GPRE;
  const int64_t qg = qg_cell_act(q, 2, qgpre, &m);
  mask |= (uint32_t)m << QG_MB_GOUT;
  if (observe) re->gout = tanh(qg_deq(qgpre, q->a[QG_Q_G_PRE]));
  /* old = z h, new = (1 - z) g, h = old + new */
  const int64_t qold = qg_cell_product(qz - QZ.z, in->hprev - QH.z, QZ.e + QH.e, QOLD, &m, wide, observe, &re->old);
  mask |= (uint32_t)m << QG_MB_OLD;
  const int64_t one_z = (int64_t)1 << QZ.e;   /* 1 in z_out's scale (e >= 0 is checked when set) */
  const int64_t qnew = qg_cell_product(one_z - (qz - QZ.z), qg - QG.z, QZ.e + QG.e, QNEW, &m, wide, observe, &re->nw);
  mask |= (uint32_t)m << QG_MB_NEW;
  const int64_t ch[2] = {qold - QOLD.z, qnew - QNEW.z};
  const int eh[2] = {QOLD.e, QNEW.e};
  out->h = qg_cell_aligned_sum(2, ch, eh, QH, &m, wide, observe, &re->h);
  mask |= (uint32_t)m << QG_MB_H;
  out->zpre = qzpre; out->rpre = qrpre; out->gpre = qgpre; out->rhb = qrhb;
  out->mask = mask;
}

/* ---- the 32-bit cell --------------------------------------------------------------------------
 * The same steps 3-8, with the requantizations of W x and R h (step 2) folded in, every
 * intermediate held in 32 bits, for layers whose bounds allow it (qg_cell32_setup checks them
 * once per forward): every operator of at most 16 bits, the W x and R h accumulators exact
 * integers of magnitude at most 2^29 (QG_C32_BOUND; the CPU's float32 GEMMs guarantee exactness
 * only below 2^24 and check that, the GPU's int32 sums check 2^29), and every aligned sum and
 * product below 2^29 in magnitude. What depends
 * only on the quantizers and the bias codes is resolved once per forward: per unit, the
 * multipliers that align each term, the bias terms aligned and summed, and the rounding constants
 * of each requantization (qg_cell32_unit). What is left per (step, row, unit) is branch-free
 * 32-bit integer arithmetic and table look-ups, so a loop over units vectorizes (16 units per
 * AVX-512 vector on the CPU) and a GPU thread runs one unit. The results equal qg_cell_forward's
 * bit for bit (tests/c/test_cell.c compares them on random quantizers and inputs). */

/* Rounding constants of v * 2^-k, rounded half to even, for |v| <= 2^29 (qg_rs32_make). v is
 * clamped to +-lim and multiplied by mul = 2^l (exact: |v mul| <= 2^30), then shifted right by
 * kr >= 1 with ties to even: (v + bias + ((v >> kr) & 1)) >> kr, bias = 2^(kr-1) - 1.
 * k > 0: l = 0, lim = 2^29, kr = min(k, 30) (for k > 30 every |v| <= 2^29 rounds to 0 either way).
 * k <= 0: l = min(1 - k, 29), lim = 2^(29-l), kr = 1 (the extra bit is shifted out again,
 * exactly); a value beyond 2^(29-l) saturates to +-2^28, which every grid of this cell (16 bits)
 * clamps alike.
 * Why |v| <= 2^29 is exact (this is the bound on the W x and R h accumulators):
 *   k > 0: no such v is clamped; v + bias + 1 <= 2^29 + 2^29 < 2^31 does not overflow, and
 *     floor((v + 2^(kr-1) - 1 + odd) / 2^kr), odd = bit kr of v, is v 2^-kr rounded half to even
 *     (remainder above half: carries; exactly half: carries iff the quotient is odd; below: does
 *     not). For kr = 30 < k, |v 2^-k| <= 1/4 and the formula gives 0 as well (v = +-2^29
 *     included: (2^29 + 2^29 - 1) >> 30 = 0, (-2^29 + 2^29 - 1 + 1) >> 30 = 0).
 *   k <= 0: unclamped (|v| <= 2^(29-l)), v 2^l is even and exact, so the result is v 2^(l-1) =
 *     v 2^-k when l = 1 - k; clamped, the result is +-2^28 and the true value |v| 2^-k > 2^28
 *     (or >= 2^29 when l is capped at 29): either lies beyond any grid of at most 16 bits plus its
 *     zero point, so the code and the mask bit agree.
 *   k = 0 without the clamp (l = 1): |v 2| <= 2^30 does not overflow and (2 v + (v & 1)) >> 1 = v,
 *     beyond 2^28 clamped by the grid as the saturated value is.
 * So where k >= 0 (mul <= 2) the clamp changes nothing: qg_rs32_round alone (the multiply and
 * the rounding shift) is exact. A layer whose every requantization has k >= 0 (qg_cell32_unit_fast
 * and qg_cell32's `fast`, the common case: accumulators requantized to coarser grids or kept)
 * runs the cell with `fast` set, two dependent instructions fewer per requantization. */
typedef struct {
  int32_t lim, mul, kr, bias;
} qg_rs32;

QG_HD qg_rs32 qg_rs32_make(int k) {
  qg_rs32 p;
  int l;
  if (k > 0) { l = 0; p.kr = k < 30 ? k : 30; }
  else { l = 1 - k < 29 ? 1 - k : 29; p.kr = 1; }
  p.lim = (int32_t)1 << (29 - l);
  p.mul = (int32_t)1 << l;
  p.bias = ((int32_t)1 << (p.kr - 1)) - 1;
  return p;
}

/* The multiply and the rounding shift: exact for |v| <= 2^29 when the constants come from a k >= 0. */
QG_HD int32_t qg_rs32_round(int32_t v, int32_t mul, int32_t kr, int32_t bias) {
  v *= mul;
  return (v + bias + ((v >> kr) & 1)) >> kr;   /* >> of a negative value: arithmetic (GCC, nvcc) */
}

QG_HD int32_t qg_rs32_apply(int32_t v, int32_t lim, int32_t mul, int32_t kr, int32_t bias) {
  v = v < -lim ? -lim : v;
  v = v > lim ? lim : v;
  return qg_rs32_round(v, mul, kr, bias);
}

/* A per-tensor quantizer of the 32-bit cell: zero point, grid, and the grid around the zero
 * point (lo = qmin - z, hi = qmax - z: the cell works on centered codes, code - z). */
typedef struct {
  int32_t z, qmin, qmax, lo, hi;
} qg_q32;

/* The centered code of r (a value at the quantizer's scale, before its zero point): r clamped
 * to [lo, hi]; *m the in-range bit. The code is the result plus z. */
QG_HD int32_t qg_q32_centered(int32_t r, qg_q32 q, uint32_t *m) {
  *m = (uint32_t)(r >= q.lo) & (uint32_t)(r <= q.hi);
  r = r < q.lo ? q.lo : r;
  return r > q.hi ? q.hi : r;
}

/* Rows of the per-unit constants P [QG_C32_ROWS, H] (row r of unit i at P[r H + i]). A
 * requantization takes four rows (lim, mul, kr, bias of qg_rs32). */
enum {
  QG_C32_WX = 0,    /* gates z, r, g: requantization of the W x accumulator of row g H + i (4 rows each) */
  QG_C32_RH = 12,   /* the same for R h */
  QG_C32_Z = 24,    /* z_pre: multiplier of W x, of R h, the aligned bias terms, then its requantization */
  QG_C32_R = 31,    /* r_pre: the same */
  QG_C32_RHB = 38,  /* Rh_g + br_g: multiplier of R h, the aligned bias term, then its requantization */
  QG_C32_G = 44,    /* g_pre: multiplier of W x, of rRh, the aligned bias term, then its requantization */
  QG_C32_ROWS = 51
};

/* Everything the 32-bit cell reads: the per-unit rows, the per-tensor quantizers and rounding
 * constants, the forward tables (codes, then masks at + lut_n). */
typedef struct {
  const int32_t *P;
  int64_t H;
  const int32_t *lut[3];
  int32_t lut_n[3];
  qg_q32 wx, rh, zp, rp, gp, zo, ro, go, rrh, old, nw, h;
  qg_rs32 s_rrh, s_old, s_new, s_h;
  int32_t m_old, m_new;   /* h = old 2^(emax - e_old) + new 2^(emax - e_new), emax the larger */
  int32_t one_z;          /* 2^e of gate.z_out: 1 in its scale */
  int fast;               /* the four per-tensor requantizations above have k >= 0 (qg_rs32) */
} qg_cell32;

typedef struct {
  int32_t h, zpre, rpre, gpre, rhb;
  uint32_t mask;
} qg_cell32_out;

QG_HD int64_t qg_cell32_cmax(qg_qp q) { return q.qmax - q.z > q.z - q.qmin ? q.qmax - q.z : q.z - q.qmin; }
QG_HD qg_q32 qg_q32_of(qg_qp q) {
  qg_q32 r;
  r.z = q.z; r.qmin = (int32_t)q.qmin; r.qmax = (int32_t)q.qmax;
  r.lo = r.qmin - r.z; r.hi = r.qmax - r.z;
  return r;
}

/* Largest exponent difference a term may be shifted by (|centered code| >= 1 reaches 2^29 there). */
enum { QG_C32_SHIFT_MAX = 28, QG_C32_BOUND = 1 << 29 };

/* The per-tensor part of c (P, H left to the caller) from the resolved quantizers q (forward
 * tables set). Returns 1 when the 32-bit cell is exact for them (the per-unit bounds are checked
 * by qg_cell32_unit), else 0. gemm_exact: the W x and R h accumulators are exact integers of
 * magnitude at most 2^29 (the caller's check: max|centered weight| max|centered input| K). */
QG_HD int qg_cell32_setup(qg_cell32 *c, const qg_cell_q *q, int gemm_exact) {
  const qg_qp *a = q->a;
  memset(c, 0, sizeof *c);
  if (!gemm_exact) return 0;
  for (int k = 0; k < QG_Q_NUM_ACT; k++)
    if (a[k].qmax - a[k].qmin >= 65536) return 0;   /* at most 16 bits */
  for (int k = 0; k < 3; k++) {
    if (!q->lut[k]) return 0;
    c->lut[k] = q->lut[k];
    c->lut_n[k] = (int32_t)q->lut_n[k];
  }
  c->wx = qg_q32_of(a[QG_Q_MATMUL_WX]); c->rh = qg_q32_of(a[QG_Q_MATMUL_RH]);
  c->zp = qg_q32_of(a[QG_Q_Z_PRE]); c->rp = qg_q32_of(a[QG_Q_R_PRE]); c->gp = qg_q32_of(a[QG_Q_G_PRE]);
  c->zo = qg_q32_of(a[QG_Q_Z_OUT]); c->ro = qg_q32_of(a[QG_Q_R_OUT]); c->go = qg_q32_of(a[QG_Q_G_OUT]);
  c->rrh = qg_q32_of(a[QG_Q_RRH]); c->old = qg_q32_of(a[QG_Q_OLD]); c->nw = qg_q32_of(a[QG_Q_NEW]);
  c->h = qg_q32_of(a[QG_Q_OUTPUT_H]);
  const qg_qp QZ = a[QG_Q_Z_OUT], QR = a[QG_Q_R_OUT], QG = a[QG_Q_G_OUT], QRH = a[QG_Q_MATMUL_RH], QH = a[QG_Q_OUTPUT_H];
  const qg_qp QOLD = a[QG_Q_OLD], QNEW = a[QG_Q_NEW];
  /* products: r Rhb, z h, (1 - z) g; the h sum */
  if (qg_cell32_cmax(QR) * qg_cell32_cmax(QRH) >= QG_C32_BOUND) return 0;
  if (qg_cell32_cmax(QZ) * qg_cell32_cmax(QH) >= QG_C32_BOUND) return 0;
  if (QZ.e > QG_C32_SHIFT_MAX || (((int64_t)1 << QZ.e) + qg_cell32_cmax(QZ)) * qg_cell32_cmax(QG) >= QG_C32_BOUND) return 0;
  const int eh = QOLD.e > QNEW.e ? QOLD.e : QNEW.e;
  if (eh - QOLD.e > QG_C32_SHIFT_MAX || eh - QNEW.e > QG_C32_SHIFT_MAX) return 0;
  if (qg_cell32_cmax(QOLD) * ((int64_t)1 << (eh - QOLD.e)) + qg_cell32_cmax(QNEW) * ((int64_t)1 << (eh - QNEW.e)) >= QG_C32_BOUND)
    return 0;
  c->s_rrh = qg_rs32_make(QR.e + QRH.e - a[QG_Q_RRH].e);
  c->s_old = qg_rs32_make(QZ.e + QH.e - QOLD.e);
  c->s_new = qg_rs32_make(QZ.e + QG.e - QNEW.e);
  c->s_h = qg_rs32_make(eh - QH.e);
  c->m_old = (int32_t)1 << (eh - QOLD.e);
  c->m_new = (int32_t)1 << (eh - QNEW.e);
  c->one_z = (int32_t)1 << QZ.e;
  c->fast = c->s_rrh.mul <= 2 && c->s_old.mul <= 2 && c->s_new.mul <= 2 && c->s_h.mul <= 2;
  return 1;
}

/* One aligned sum of the 32-bit cell: terms (bound on |centered code|, exponent), n of them;
 * the first nv are variable (their multipliers go to mul[]), the rest are constant centered codes
 * (summed into *cst). Requantized to q: its rounding constants go to P rows rq..rq+3. Returns 0
 * when the sum can reach 2^29 in both forms below. The requantized value depends only on the real
 * value of the sum, so:
 * - exact form (tried first): the common scale is the finest of the terms that can be nonzero
 *   (a zero bias at a fine exponent does not force the others to shift);
 * - sticky form, where a constant term sits so far below the others that the exact form would
 *   shift them past 2^29 (a bias code near zero gets a per-channel exponent up to 31, e.g.
 *   93 2^-27 beside W x at 2^-5): the scale f = max(finest variable exponent, q.e + 1) and one
 *   bit more, s = f + 1. At scale f the variable terms are integers V and the constants sum to
 *   B = Bi + Bf (Bi = floor(B), 0 <= Bf < 1, computed exactly in 128 bits); the sum is held at
 *   scale s as 2 (V + Bi) + [Bf > 0]. The exact value 2 (V + Bi) + 2 Bf and that one lie in the
 *   same open interval (2 M, 2 M + 2), M = V + Bi (or are equal, Bf = 0), and the rounding of
 *   rne(x 2^-k), k = s - q.e >= 2, changes only at x = j 2^k + 2^(k-1), even integers, none of
 *   them inside that interval: the code and the in-range bit are the exact sum's. */
QG_HD int qg_cell32_sum(int n, int nv, const int64_t *v, const int *e, qg_qp q, int32_t *mul, int32_t *cst, int32_t *P,
                        int64_t H, int64_t i, int rq) {
  int s = e[0];
  for (int k = 1; k < n; k++) if (e[k] > s && (k < nv || v[k] != 0)) s = e[k];
  int64_t bound = 0, sum = 0;
  int exact = 1;
  for (int k = 0; k < n && exact; k++) {
    if (k >= nv && v[k] == 0) continue;   /* a zero bias term: nothing to align */
    if (s - e[k] > QG_C32_SHIFT_MAX) { exact = 0; break; }
    const int64_t m = (int64_t)1 << (s - e[k]);
    if (k < nv) { mul[k] = (int32_t)m; bound += v[k] * m; }
    else { sum += v[k] * m; bound += (v[k] < 0 ? -v[k] : v[k]) * m; }
  }
  if (!exact || bound >= QG_C32_BOUND) {   /* the sticky form */
    int f = q.e + 1;
    for (int k = 0; k < nv; k++) if (e[k] > f) f = e[k];
    s = f + 1;
    int c = f;   /* the constants' exact sum at scale 2^-c, c >= f */
    for (int k = nv; k < n; k++) if (v[k] != 0 && e[k] > c) c = e[k];
    if (c - f > 90) return 0;   /* beyond any exponent a quantizer has (|e| <= 31 with 16-bit codes) */
    qg_i128 b = 0;
    for (int k = nv; k < n; k++) {
      if (v[k] == 0) continue;
      if (c - e[k] > 90) return 0;
      b += (qg_i128)v[k] * ((qg_i128)1 << (c - e[k]));
    }
    const qg_i128 bi = b >> (c - f);   /* floor (arithmetic shift) */
    const qg_i128 cs = 2 * bi + (b != bi * ((qg_i128)1 << (c - f)) ? 1 : 0);
    qg_i128 bnd = cs < 0 ? -cs : cs;
    for (int k = 0; k < nv; k++) {
      if (s - e[k] > QG_C32_SHIFT_MAX) return 0;
      mul[k] = (int32_t)1 << (s - e[k]);
      bnd += (qg_i128)v[k] * mul[k];
    }
    if (bnd >= QG_C32_BOUND) return 0;
    sum = (int64_t)cs;
  }
  *cst = (int32_t)sum;
  const qg_rs32 r = qg_rs32_make(s - q.e);
  P[(rq + 0) * H + i] = r.lim; P[(rq + 1) * H + i] = r.mul; P[(rq + 2) * H + i] = r.kr; P[(rq + 3) * H + i] = r.bias;
  return 1;
}

/* Unit i's rows of P: e_w and e_r the per-row exponents of W and R (rows g H + i), bx and br the
 * centered bias codes and ebx, ebr their exponents (gates z, r, g); q the resolved quantizers;
 * e_x the exponent of input.x, so W x row j sits at scale 2^-(e_w + e_x) (R h: e_r + e_h).
 * Returns 0 when a bound of the 32-bit cell fails for this unit. */
QG_HD int qg_cell32_unit(int32_t *P, int64_t H, int64_t i, const qg_cell_q *q, const int *e_w, const int *e_r,
                         const int64_t *bx, const int *ebx, const int64_t *br, const int *ebr) {
  const qg_qp *a = q->a;
  const qg_qp QX = a[QG_Q_INPUT_X], QH = a[QG_Q_OUTPUT_H], QWX = a[QG_Q_MATMUL_WX], QRH = a[QG_Q_MATMUL_RH];
  for (int g = 0; g < 3; g++) {
    const qg_rs32 w = qg_rs32_make(e_w[g] + QX.e - QWX.e), r = qg_rs32_make(e_r[g] + QH.e - QRH.e);
    const int bw = QG_C32_WX + 4 * g, brr = QG_C32_RH + 4 * g;
    P[bw * H + i] = w.lim; P[(bw + 1) * H + i] = w.mul; P[(bw + 2) * H + i] = w.kr; P[(bw + 3) * H + i] = w.bias;
    P[brr * H + i] = r.lim; P[(brr + 1) * H + i] = r.mul; P[(brr + 2) * H + i] = r.kr; P[(brr + 3) * H + i] = r.bias;
  }
  const int64_t cwx = qg_cell32_cmax(QWX), crh = qg_cell32_cmax(QRH), crrh = qg_cell32_cmax(a[QG_Q_RRH]);
  int32_t mul[2], cst;
  for (int g = 0; g < 2; g++) {   /* z_pre, r_pre: W x, R h, bx, br */
    const int64_t v[4] = {cwx, crh, bx[g], br[g]};
    const int e[4] = {QWX.e, QRH.e, ebx[g], ebr[g]};
    const int row = g ? QG_C32_R : QG_C32_Z;
    if (!qg_cell32_sum(4, 2, v, e, a[QG_Q_Z_PRE + g], mul, &cst, P, H, i, row + 3)) return 0;
    P[row * H + i] = mul[0]; P[(row + 1) * H + i] = mul[1]; P[(row + 2) * H + i] = cst;
  }
  {   /* Rh_g + br_g with matmul.Rh's quantizer */
    const int64_t v[2] = {crh, br[2]};
    const int e[2] = {QRH.e, ebr[2]};
    if (!qg_cell32_sum(2, 1, v, e, QRH, mul, &cst, P, H, i, QG_C32_RHB + 2)) return 0;
    P[QG_C32_RHB * H + i] = mul[0]; P[(QG_C32_RHB + 1) * H + i] = cst;
  }
  {   /* g_pre: W x, rRh, bx */
    const int64_t v[3] = {cwx, crrh, bx[2]};
    const int e[3] = {QWX.e, a[QG_Q_RRH].e, ebx[2]};
    if (!qg_cell32_sum(3, 2, v, e, a[QG_Q_G_PRE], mul, &cst, P, H, i, QG_C32_G + 3)) return 0;
    P[QG_C32_G * H + i] = mul[0]; P[(QG_C32_G + 1) * H + i] = mul[1]; P[(QG_C32_G + 2) * H + i] = cst;
  }
  return 1;
}

/* Whether every requantization of unit i's rows has k >= 0 (qg_rs32: mul <= 2), so that the cell
 * may run with `fast` set for it (together with qg_cell32's per-tensor `fast`). */
QG_HD int qg_cell32_unit_fast(const int32_t *P, int64_t H, int64_t i) {
  const int rq[10] = {QG_C32_WX, QG_C32_WX + 4, QG_C32_WX + 8, QG_C32_RH, QG_C32_RH + 4, QG_C32_RH + 8,
                      QG_C32_Z + 3, QG_C32_R + 3, QG_C32_RHB + 2, QG_C32_G + 3};
  for (int k = 0; k < 10; k++)
    if (P[(int64_t)(rq[k] + 1) * H + i] > 2) return 0;
  return 1;
}

/* Steps 2 (requantization) to 8 for unit i of one row, in three phases that qg_cell32_forward
 * composes (a kernel may run them on different threads: the z half does not depend on r and g):
 *   qg_cell32_z   W x and R h of row z requantized, z_pre, z = lut(z_pre), old = z h_{t-1}
 *   qg_cell32_rg  W x and R h of rows r and g, r_pre, r, Rh_g + br_g, r Rhb, g_pre, g
 *   qg_cell32_h   new = (1 - z) g, h = old + new
 * Each phase returns its own bits of the mask word (disjoint); the word is their OR. Arguments:
 * aw*, ar* the W x and R h accumulators of the unit's rows z, r, g (exact integers of magnitude at
 * most 2^29 = QG_C32_BOUND, see qg_rs32), hprev the previous output.h code. Inside, every value is
 * a centered code (code - zero point: qg_q32_centered); codes are formed only where they leave.
 * fast (a literal at every call site): the requantizations without their clamps (qg_rs32_round),
 * allowed where c->fast and qg_cell32_unit_fast(unit) hold; the same results as fast = 0 there. */
typedef struct {
  int32_t zpre, cz, cold;   /* z_pre's code, z's centered code, old's centered code */
  uint32_t mask;
} qg_cell32_zo;

typedef struct {
  int32_t rpre, gpre, rhb, g;   /* codes of r_pre, g_pre, Rh_g + br_g and g */
  uint32_t mask;
} qg_cell32_rgo;

#define QG_C32P(row) P[(int64_t)(row) * H + i]
#define QG_C32RQ(v, row)                                                                                   \
  (fast ? qg_rs32_round((v), QG_C32P((row) + 1), QG_C32P((row) + 2), QG_C32P((row) + 3))                   \
        : qg_rs32_apply((v), QG_C32P(row), QG_C32P((row) + 1), QG_C32P((row) + 2), QG_C32P((row) + 3)))
#define QG_C32RS(v, s) (fast ? qg_rs32_round((v), (s).mul, (s).kr, (s).bias) : qg_rs32_apply((v), (s).lim, (s).mul, (s).kr, (s).bias))
/* qg_cell32_z after W x's requantization: wz the centered matmul.Wx code of row z (its in-range
 * bit is the caller's); the other mask bits of the z phase in o->mask. */
QG_HD void qg_cell32_z_w(const qg_cell32 *c, int64_t i, int32_t wz, int32_t arz, int32_t hprev, qg_cell32_zo *o, const int fast) {
  const int32_t *P = c->P;
  const int64_t H = c->H;
  uint32_t m, mask;
  const int32_t rz = qg_q32_centered(QG_C32RQ(arz, QG_C32_RH), c->rh, &m);
  mask = m << QG_MB_RH_Z;
  const int32_t czpre =
      qg_q32_centered(QG_C32RQ(wz * QG_C32P(QG_C32_Z) + rz * QG_C32P(QG_C32_Z + 1) + QG_C32P(QG_C32_Z + 2), QG_C32_Z + 3), c->zp, &m);
  mask |= m << QG_MB_ZPRE;
  const int32_t iz = czpre - c->zp.lo;
  const int32_t qz = c->lut[0][iz];
  mask |= (uint32_t)c->lut[0][c->lut_n[0] + iz] << QG_MB_ZOUT;
  const int32_t cz = qz - c->zo.z;
  o->cold = qg_q32_centered(QG_C32RS(cz * (hprev - c->h.z), c->s_old), c->old, &m);
  mask |= m << QG_MB_OLD;
  o->zpre = czpre + c->zp.z; o->cz = cz;
  o->mask = mask;
}

/* W x's requantization (step 2) of gate k (0 z, 1 r, 2 g) of unit i: the centered matmul.Wx code
 * of the accumulator aw, *m its in-range bit. */
#define QG_C32_WXC(aw, k, m) qg_q32_centered(QG_C32RQ((aw), QG_C32_WX + 4 * (k)), c->wx, (m))

QG_HD void qg_cell32_z(const qg_cell32 *c, int64_t i, int32_t awz, int32_t arz, int32_t hprev, qg_cell32_zo *o, const int fast) {
  const int32_t *P = c->P;
  const int64_t H = c->H;
  uint32_t m;
  const int32_t wz = QG_C32_WXC(awz, 0, &m);
  qg_cell32_z_w(c, i, wz, arz, hprev, o, fast);
  o->mask |= m << QG_MB_WX_Z;
}

/* qg_cell32_rg after W x's requantization: wr, wg the centered matmul.Wx codes of rows r and g
 * (their in-range bits are the caller's). */
QG_HD void qg_cell32_rg_w(const qg_cell32 *c, int64_t i, int32_t wr, int32_t wg, int32_t arr, int32_t arg, qg_cell32_rgo *o,
                          const int fast) {
  const int32_t *P = c->P;
  const int64_t H = c->H;
  uint32_t m, mask;
  const int32_t rr = qg_q32_centered(QG_C32RQ(arr, QG_C32_RH + 4), c->rh, &m);
  mask = m << QG_MB_RH_R;
  const int32_t rg = qg_q32_centered(QG_C32RQ(arg, QG_C32_RH + 8), c->rh, &m);
  mask |= m << QG_MB_RH_G;
  const int32_t crpre =
      qg_q32_centered(QG_C32RQ(wr * QG_C32P(QG_C32_R) + rr * QG_C32P(QG_C32_R + 1) + QG_C32P(QG_C32_R + 2), QG_C32_R + 3), c->rp, &m);
  mask |= m << QG_MB_RPRE;
  const int32_t ir = crpre - c->rp.lo;
  const int32_t qr = c->lut[1][ir];
  mask |= (uint32_t)c->lut[1][c->lut_n[1] + ir] << QG_MB_ROUT;
  /* Rh_g + br_g, r * Rhb, g */
  const int32_t crhb = qg_q32_centered(QG_C32RQ(rg * QG_C32P(QG_C32_RHB) + QG_C32P(QG_C32_RHB + 1), QG_C32_RHB + 2), c->rh, &m);
  mask |= m << QG_MB_RHB;
  const int32_t crrh = qg_q32_centered(QG_C32RS((qr - c->ro.z) * crhb, c->s_rrh), c->rrh, &m);
  mask |= m << QG_MB_RRH;
  const int32_t cgpre = qg_q32_centered(
      QG_C32RQ(wg * QG_C32P(QG_C32_G) + crrh * QG_C32P(QG_C32_G + 1) + QG_C32P(QG_C32_G + 2), QG_C32_G + 3), c->gp, &m);
  mask |= m << QG_MB_GPRE;
  const int32_t ig = cgpre - c->gp.lo;
  o->g = c->lut[2][ig];
  mask |= (uint32_t)c->lut[2][c->lut_n[2] + ig] << QG_MB_GOUT;
  o->rpre = crpre + c->rp.z; o->gpre = cgpre + c->gp.z; o->rhb = crhb + c->rh.z;
  o->mask = mask;
}

QG_HD void qg_cell32_rg(const qg_cell32 *c, int64_t i, int32_t awr, int32_t awg, int32_t arr, int32_t arg, qg_cell32_rgo *o,
                        const int fast) {
  const int32_t *P = c->P;
  const int64_t H = c->H;
  uint32_t mr, mg;
  const int32_t wr = QG_C32_WXC(awr, 1, &mr);
  const int32_t wg = QG_C32_WXC(awg, 2, &mg);
  qg_cell32_rg_w(c, i, wr, wg, arr, arg, o, fast);
  o->mask |= mr << QG_MB_WX_R | mg << QG_MB_WX_G;
}

/* The h code from z's centered code cz, old's centered code cold and g's code; *mask gets the
 * bits of new and h. */
QG_HD int32_t qg_cell32_h(const qg_cell32 *c, int32_t cz, int32_t cold, int32_t qg, uint32_t *mask, const int fast) {
  uint32_t m;
  const int32_t cnew = qg_q32_centered(QG_C32RS((c->one_z - cz) * (qg - c->go.z), c->s_new), c->nw, &m);
  *mask = m << QG_MB_NEW;
  const int32_t ch = qg_q32_centered(QG_C32RS(cold * c->m_old + cnew * c->m_new, c->s_h), c->h, &m);
  *mask |= m << QG_MB_H;
  return ch + c->h.z;
}
#undef QG_C32_WXC
#undef QG_C32P
#undef QG_C32RQ
#undef QG_C32RS

/* The whole cell: the three phases on one thread. */
QG_HD void qg_cell32_forward(const qg_cell32 *c, int64_t i, int32_t awz, int32_t awr, int32_t awg, int32_t arz, int32_t arr,
                             int32_t arg, int32_t hprev, qg_cell32_out *o, const int fast) {
  qg_cell32_zo z;
  qg_cell32_rgo r;
  uint32_t mh;
  qg_cell32_z(c, i, awz, arz, hprev, &z, fast);
  qg_cell32_rg(c, i, awr, awg, arr, arg, &r, fast);
  o->h = qg_cell32_h(c, z.cz, z.cold, r.g, &mh, fast);
  o->zpre = z.zpre; o->rpre = r.rpre; o->gpre = r.gpre; o->rhb = r.rhb;
  o->mask = z.mask | r.mask | mh;
}

/* ---- W x requantized ahead of the cell --------------------------------------------------------
 * Step 2 for W x depends on the accumulator and its row only, not on R h or h: qg_cell32_wx_code
 * with r = the rows QG_C32_WX + 4 k of unit i's P (qg_rs32_make(e_w[j] + e_x - matmul.Wx's e))
 * and wx = qg_cell32's wx. So a caller may requantize W x before R h is ready, off the
 * recurrence's critical path (tc_grid_kernel's cells do it for the next half-step while they
 * wait), and run the rest of the cell from the codes: qg_cell32_forward_w. Each code travels
 * with its in-range bit as one word, 2 c + m (c the centered code: |c| < 2^16 for every grid of
 * the cell). */
QG_HD int32_t qg_cell32_wx_code(int32_t aw, qg_rs32 r, qg_q32 wx, uint32_t *m) {
  return qg_q32_centered(qg_rs32_apply(aw, r.lim, r.mul, r.kr, r.bias), wx, m);   /* QG_C32_WXC with the clamps */
}
QG_HD int32_t qg_wx_word(int32_t c, uint32_t m) { return 2 * c + (int32_t)m; }
QG_HD int32_t qg_wx_word_code(int32_t w) { return w >> 1; }   /* arithmetic shift: floor((2 c + m) / 2) = c */
QG_HD uint32_t qg_wx_word_bit(int32_t w) { return (uint32_t)w & 1u; }

/* qg_cell32_forward from W x's words w* (qg_wx_word of qg_cell32_wx_code's code and bit): the same outputs. */
QG_HD void qg_cell32_forward_w(const qg_cell32 *c, int64_t i, int32_t wz, int32_t wr, int32_t wg, int32_t arz, int32_t arr,
                               int32_t arg, int32_t hprev, qg_cell32_out *o, const int fast) {
  qg_cell32_zo z;
  qg_cell32_rgo r;
  uint32_t mh;
  qg_cell32_z_w(c, i, qg_wx_word_code(wz), arz, hprev, &z, fast);
  qg_cell32_rg_w(c, i, qg_wx_word_code(wr), qg_wx_word_code(wg), arr, arg, &r, fast);
  o->h = qg_cell32_h(c, z.cz, z.cold, r.g, &mh, fast);
  o->zpre = z.zpre; o->rpre = r.rpre; o->gpre = r.gpre; o->rhb = r.rhb;
  o->mask = z.mask | r.mask | mh | qg_wx_word_bit(wz) << QG_MB_WX_Z | qg_wx_word_bit(wr) << QG_MB_WX_R | qg_wx_word_bit(wg) << QG_MB_WX_G;
}

/* Saved state of one unit: the four codes (as uint16 offsets from qmin when narrow, else int32)
 * followed by the mask word; qg_cell_bytes(narrow) bytes, byte-copied (no alignment needed). */
QG_HD void qg_cell_pack(uint8_t *dst, const qg_cell_q *q, const qg_cell_out *o) {
  if (q->narrow) {
    const uint16_t c[4] = {(uint16_t)(o->zpre - q->a[QG_Q_Z_PRE].qmin), (uint16_t)(o->rpre - q->a[QG_Q_R_PRE].qmin),
                           (uint16_t)(o->gpre - q->a[QG_Q_G_PRE].qmin), (uint16_t)(o->rhb - q->a[QG_Q_MATMUL_RH].qmin)};
    memcpy(dst, c, 8);
    memcpy(dst + 8, &o->mask, 4);
  } else {
    const int32_t c[4] = {(int32_t)o->zpre, (int32_t)o->rpre, (int32_t)o->gpre, (int32_t)o->rhb};
    memcpy(dst, c, 16);
    memcpy(dst + 16, &o->mask, 4);
  }
}

QG_HD void qg_cell_unpack(const uint8_t *src, const qg_cell_q *q, qg_cell_out *o) {
  if (q->narrow) {
    uint16_t c[4];
    memcpy(c, src, 8);
    memcpy(&o->mask, src + 8, 4);
    o->zpre = c[0] + q->a[QG_Q_Z_PRE].qmin; o->rpre = c[1] + q->a[QG_Q_R_PRE].qmin;
    o->gpre = c[2] + q->a[QG_Q_G_PRE].qmin; o->rhb = c[3] + q->a[QG_Q_MATMUL_RH].qmin;
  } else {
    int32_t c[4];
    memcpy(c, src, 16);
    memcpy(&o->mask, src + 16, 4);
    o->zpre = c[0]; o->rpre = c[1]; o->gpre = c[2]; o->rhb = c[3];
  }
  o->h = 0;
}

/* The narrow saved state of one unit (qg_cell_pack with narrow set) as three 32-bit words, as
 * they lie in memory on a little-endian machine (x86-64, CUDA devices): word 0 = zpre | rpre << 16,
 * word 1 = gpre | rhb << 16 (offsets from each qmin), word 2 = the mask. A loop over units can
 * write and read these with 32-bit lanes (stride 3) instead of byte copies. */
QG_HD void qg_cell_narrow_words(const qg_cell_q *q, int64_t zpre, int64_t rpre, int64_t gpre, int64_t rhb, uint32_t mask,
                                uint32_t *w) {
  w[0] = (uint32_t)(zpre - q->a[QG_Q_Z_PRE].qmin) | (uint32_t)(rpre - q->a[QG_Q_R_PRE].qmin) << 16;
  w[1] = (uint32_t)(gpre - q->a[QG_Q_G_PRE].qmin) | (uint32_t)(rhb - q->a[QG_Q_MATMUL_RH].qmin) << 16;
  w[2] = mask;
}

/* Per pre-activation code of activation k: the dequantized output deq_out(act(q)) and the
 * derivative of f at deq_pre(q) (s (1 - s) or 1 - t^2), so the backward's inner loop does no
 * transcendental math. val[k], der[k] hold 2^bits(pre) floats indexed by q - qmin(pre); NULL
 * when the pre-activation has more than 16 bits (then they are computed per unit). */
typedef struct {
  const float *val[3], *der[3];
} qg_cell_tables;

/* The table entries (or their direct computation) of activation k at pre-activation code qpre. */
QG_HD void qg_cell_act_value(const qg_cell_q *q, int k, int64_t qpre, float *val, float *der) {
  const qg_qp P = q->a[QG_Q_Z_PRE + k];
  int m;
  const double v = qg_deq(qpre, P);
  *val = (float)qg_deq(qg_cell_act(q, k, qpre, &m), q->a[QG_Q_Z_OUT + k]);
  if (k < 2) { const float s = (float)(1.0 / (1.0 + exp(-v))); *der = s * (1.0f - s); }
  else { const float t = (float)tanh(v); *der = 1.0f - t * t; }
}

/* Gradients of one unit (QUANT_SPEC.md section 4) in float32, given dH, the gradient reaching h_t
 * (from the output and from step t+1):
 *   dp[3]    gradient of the W x accumulators of rows z, r, g (masked by matmul.Wx)
 *   dq[3]    gradient of the R h accumulators (masked by matmul.Rh)
 *   dbx[3], dbr[3]  gradient of the biases (before the weight masks)
 *   dhprev   the direct part of dL/dh_{t-1} (dold * z; the caller adds R^T dq)
 * The expression order is fixed; the CUDA files that call this are built without FMA
 * contraction so both devices round alike. */
typedef struct {
  float dp[3], dq[3], dbx[3], dbr[3], dhprev;
} qg_cell_grad;

/* The STE cell on values: mk the unit's mask word; z, rr, g the dequantized gate outputs and dsz,
 * dsr, dtg the derivatives at the dequantized pre-activations (qg_cell_tables); hp and rhb the
 * dequantized h_{t-1} and Rh_g + br_g; dH as below. */
QG_HD void qg_cell_backward_values(uint32_t mk, float z, float rr, float g, float dsz, float dsr, float dtg, float hp, float rhb,
                                   float dH, qg_cell_grad *o) {
#define QG_MBF(b) ((float)((mk >> (b)) & 1u))
  const float d = dH * QG_MBF(QG_MB_H);
  const float dold = d * QG_MBF(QG_MB_OLD), dnew = d * QG_MBF(QG_MB_NEW);
  const float dz = dold * hp - dnew * g;
  const float dg = dnew * (1.0f - z);
  const float dgpre = dg * QG_MBF(QG_MB_GOUT) * dtg * QG_MBF(QG_MB_GPRE);
  const float drrh = dgpre * QG_MBF(QG_MB_RRH);
  const float dr = drrh * rhb;
  const float drhb = drrh * rr * QG_MBF(QG_MB_RHB);
  const float dzpre = dz * QG_MBF(QG_MB_ZOUT) * dsz * QG_MBF(QG_MB_ZPRE);
  const float drpre = dr * QG_MBF(QG_MB_ROUT) * dsr * QG_MBF(QG_MB_RPRE);
  o->dp[0] = dzpre * QG_MBF(QG_MB_WX_Z); o->dp[1] = drpre * QG_MBF(QG_MB_WX_R); o->dp[2] = dgpre * QG_MBF(QG_MB_WX_G);
  o->dq[0] = dzpre * QG_MBF(QG_MB_RH_Z); o->dq[1] = drpre * QG_MBF(QG_MB_RH_R); o->dq[2] = drhb * QG_MBF(QG_MB_RH_G);
#undef QG_MBF
  o->dbx[0] = dzpre; o->dbx[1] = drpre; o->dbx[2] = dgpre;
  o->dbr[0] = dzpre; o->dbr[1] = drpre; o->dbr[2] = drhb;
  o->dhprev = dold * z;
}

/* The values the STE cell of one unit needs besides dH (qg_cell_backward_values' arguments): they
 * depend only on the saved state, so a recurrence can derive them a step ahead of dH. */
typedef struct {
  float z, rr, g, dsz, dsr, dtg, hp, rhb;
  uint32_t mask;
} qg_cell_bvals;

QG_HD void qg_cell_backward_prepare(const qg_cell_q *q, const qg_cell_tables *tb, const qg_cell_out *s, int64_t hprev,
                                    qg_cell_bvals *v) {
  const qg_qp QH = q->a[QG_Q_OUTPUT_H], QRH = q->a[QG_Q_MATMUL_RH];
  if (tb->val[0]) {
    const int64_t iz = s->zpre - q->a[QG_Q_Z_PRE].qmin, ir = s->rpre - q->a[QG_Q_R_PRE].qmin, ig = s->gpre - q->a[QG_Q_G_PRE].qmin;
    v->z = tb->val[0][iz]; v->rr = tb->val[1][ir]; v->g = tb->val[2][ig];
    v->dsz = tb->der[0][iz]; v->dsr = tb->der[1][ir]; v->dtg = tb->der[2][ig];
  } else {
    qg_cell_act_value(q, 0, s->zpre, &v->z, &v->dsz);
    qg_cell_act_value(q, 1, s->rpre, &v->rr, &v->dsr);
    qg_cell_act_value(q, 2, s->gpre, &v->g, &v->dtg);
  }
  v->hp = (float)((double)(hprev - QH.z) * ldexp(1.0, -QH.e));
  v->rhb = (float)((double)(s->rhb - QRH.z) * ldexp(1.0, -QRH.e));
  v->mask = s->mask;
}

QG_HD void qg_cell_backward(const qg_cell_q *q, const qg_cell_tables *tb, const qg_cell_out *s, int64_t hprev, float dH,
                            qg_cell_grad *o) {
  qg_cell_bvals v;
  qg_cell_backward_prepare(q, tb, s, hprev, &v);
  qg_cell_backward_values(v.mask, v.z, v.rr, v.g, v.dsz, v.dsr, v.dtg, v.hp, v.rhb, dH, o);
}

#endif

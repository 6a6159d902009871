/*
 * int_gru_cell.h: the integer GRU cell of QUANT_SPEC.md, written once for every device.
 *
 * What is per (step, batch row, hidden unit) lives here as inline functions usable from C and
 * CUDA (QG_HD): steps 3-8 of the integer update (section 3), the straight-through cell of the
 * backward (section 4), the layout of the 17 mask bits, and the packing of the per-unit saved
 * state. The CPU loop (int_gru_cpu.c) and the CUDA kernels call exactly this code, so the
 * integer forward is bit-exact across devices by construction, not by retyping.
 *
 * Variants are compile-time: qg_cell_forward's `observe` is passed as a literal 0 or 1 by its
 * callers, so the compiler drops the statistics work from the training and inference loops.
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

QG_HD void qg_cell_backward(const qg_cell_q *q, const qg_cell_tables *tb, const qg_cell_out *s, int64_t hprev, float dH,
                            qg_cell_grad *o) {
  const qg_qp QH = q->a[QG_Q_OUTPUT_H], QRH = q->a[QG_Q_MATMUL_RH];
  float z, rr, g, dsz, dsr, dtg;
  if (tb->val[0]) {
    const int64_t iz = s->zpre - q->a[QG_Q_Z_PRE].qmin, ir = s->rpre - q->a[QG_Q_R_PRE].qmin, ig = s->gpre - q->a[QG_Q_G_PRE].qmin;
    z = tb->val[0][iz]; rr = tb->val[1][ir]; g = tb->val[2][ig];
    dsz = tb->der[0][iz]; dsr = tb->der[1][ir]; dtg = tb->der[2][ig];
  } else {
    qg_cell_act_value(q, 0, s->zpre, &z, &dsz);
    qg_cell_act_value(q, 1, s->rpre, &rr, &dsr);
    qg_cell_act_value(q, 2, s->gpre, &g, &dtg);
  }
  const uint32_t mk = s->mask;
#define QG_MBF(b) ((float)((mk >> (b)) & 1u))
  const float hp = (float)((double)(hprev - QH.z) * ldexp(1.0, -QH.e));
  const float rhb = (float)((double)(s->rhb - QRH.z) * ldexp(1.0, -QRH.e));
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

#endif

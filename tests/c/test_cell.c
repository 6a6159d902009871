/*
 * test_cell.c: the integer cells of core/int_gru_cell.h against each other. The 32-bit cell
 * (qg_cell32_*: per-unit constants resolved once, branch-free 32-bit lanes) must give exactly
 * what the general cell gives (qg_requant64 of the W x and R h accumulators, then
 * qg_cell_forward on 128 bits, the path checked against the independent Lua reference by
 * tests/lua/quant_step_spec.lua) for every quantizer setting its bounds accept: random
 * bitwidths (2..16), signedness, exponents (left and right shifts, shifts beyond 30) and zero
 * points, random tables, bias codes and accumulators of magnitude up to 2^29 (QG_C32_BOUND,
 * the bound of the GPU's int32 accumulators; the CPU's float32 ones stay below 2^24), +-2^29
 * itself and ties included. Also checks
 * that the bounds accept the common 8-bit settings and refuse settings past them, and that the
 * saved state written as 32-bit words (qg_cell_narrow_words) is qg_cell_pack's, byte for byte.
 */
#include "int_gru_cell.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0, checks = 0;
#define CHECK(cond) do { checks++; if (!(cond)) { failures++; if (failures < 20) fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static int64_t uni(int64_t lo, int64_t hi) { return lo + (int64_t)(next() % (uint64_t)(hi - lo + 1)); }

/* A random quantizer of bits in [bmin, bmax] with exponent in [emin, emax]. */
static qg_qp rand_q(int bmin, int bmax, int emin, int emax, int allow_unsigned) {
  const int bits = (int)uni(bmin, bmax), uns = allow_unsigned && uni(0, 3) == 0;
  qg_qp g = qg_qp_make(bits, uns, 0, 0);
  const int z = uni(0, 2) == 0 ? 0 : (int)uni(g.qmin, g.qmax);
  return qg_qp_make(bits, uns, (int)uni(emin, emax), uns ? (int)uni(g.qmin, g.qmax) : z);
}

/* A random value with magnitude below 2^bits, ties (multiples of powers of two plus a half)
 * made likely. */
static int64_t rand_mag(int bits) {
  int64_t v = (int64_t)(next() & (((uint64_t)1 << uni(0, bits)) - 1));
  if (uni(0, 3) == 0) { const int k = (int)uni(1, 12); v = (v >> k << k) | ((int64_t)1 << (k - 1)); }
  if (v >= ((int64_t)1 << bits)) v = ((int64_t)1 << bits) - 1;
  return uni(0, 1) ? -v : v;
}

/* An accumulator: magnitude below 2^24 (the CPU's float32 bound), up to 2^29 (the bound of
 * qg_cell32_forward, reached by the GPU's int32 sums), or exactly +-2^29. */
static int64_t acc_draw(void) {
  const int64_t k = uni(0, 9);
  if (k == 0) return uni(0, 1) ? QG_C32_BOUND : -(int64_t)QG_C32_BOUND;
  return rand_mag(k < 5 ? 24 : 29);
}

enum { H = 7 };

/* One random layer; returns 1 when the 32-bit cell accepted it (and was compared). */
/* mode 0, 1: exponents over a narrow or a wide range (left and right shifts everywhere); mode 2:
 * exponents drawn so that most requantizations shift right or not at all (k >= 0), the settings
 * where the clamp-free variant (qg_cell32_unit_fast) runs; mode 3: mode 2 with bias exponents up
 * to 31 (per-channel biases near zero), which the exact alignment cannot hold in 32 bits and the
 * sticky form of qg_cell32_sum does. */
static int one_layer(int mode, int *n_compared, int *n_fast, int *n_wx) {
  qg_cell_q q;
  const int wide_exps = mode == 1, er = wide_exps ? 24 : 10;
  for (int k = 0; k < QG_Q_NUM_ACT; k++) q.a[k] = rand_q(2, uni(0, 3) ? 8 : 16, -er / 2, er, 1);
  q.a[QG_Q_Z_OUT] = rand_q(2, 12, 0, er, 1);   /* z_out: e >= 0 */
  if (mode >= 2) {
    static const int low[] = {QG_Q_Z_PRE, QG_Q_R_PRE, QG_Q_G_PRE, QG_Q_RRH, QG_Q_OLD, QG_Q_NEW};
    for (int k = 0; k < QG_Q_NUM_ACT; k++) q.a[k] = rand_q(2, uni(0, 3) ? 8 : 16, 2, 6, 1);
    for (int k = 0; k < 6; k++) q.a[low[k]] = rand_q(2, uni(0, 3) ? 8 : 16, 0, 2, 1);
    const int eh = (int)uni(0, q.a[QG_Q_OLD].e < q.a[QG_Q_NEW].e ? q.a[QG_Q_OLD].e : q.a[QG_Q_NEW].e);
    q.a[QG_Q_OUTPUT_H] = rand_q(2, 8, eh, eh, 1);
    q.a[QG_Q_Z_OUT] = rand_q(2, 12, 2, 8, 1);
  }
  q.narrow = 1;
  int32_t *lut[3];
  for (int k = 0; k < 3; k++) {
    const qg_qp P = q.a[QG_Q_Z_PRE + k], O = q.a[QG_Q_Z_OUT + k];
    const int64_t n = P.qmax - P.qmin + 1;
    lut[k] = (int32_t *)malloc((size_t)(2 * n) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) { lut[k][i] = (int32_t)uni(O.qmin, O.qmax); lut[k][n + i] = (int32_t)uni(0, 1); }
    q.lut[k] = lut[k];
    q.lut_n[k] = n;
  }
  const qg_qp QWX = q.a[QG_Q_MATMUL_WX], QRH = q.a[QG_Q_MATMUL_RH], QX = q.a[QG_Q_INPUT_X], QH = q.a[QG_Q_OUTPUT_H];
  /* per unit: weight row exponents, bias codes (centered) and exponents */
  int ew[H][3], erw[H][3], ebx[H][3], ebr[H][3];
  int64_t bx[H][3], br[H][3];
  for (int i = 0; i < H; i++)
    for (int g = 0; g < 3; g++) {
      ew[i][g] = mode >= 2 ? (int)uni(4, 12) : (int)uni(-4, er);
      erw[i][g] = mode >= 2 ? (int)uni(6, 12) : (int)uni(-4, er);
      ebx[i][g] = (int)uni(-4, er + 6); ebr[i][g] = (int)uni(-4, er + 6);
      if (mode == 3) { ebx[i][g] = (int)uni(er, 31); ebr[i][g] = (int)uni(er, 31); }   /* biases near zero: fine exponents */
      const int bb = (int)uni(2, 16);
      bx[i][g] = uni(0, 5) == 0 ? 0 : rand_mag(bb - 1); br[i][g] = uni(0, 5) == 0 ? 0 : rand_mag(bb - 1);
    }
  qg_cell32 c;
  int32_t P[QG_C32_ROWS * H];
  int ok = qg_cell32_setup(&c, &q, 1);
  for (int i = 0; ok && i < H; i++) ok = qg_cell32_unit(P, H, i, &q, ew[i], erw[i], bx[i], ebx[i], br[i], ebr[i]);
  if (ok) {
    c.P = P;
    c.H = H;
    for (int rep = 0; rep < 400; rep++) {
      const int i = (int)uni(0, H - 1);
      int64_t awx[3], arh[3];
      for (int g = 0; g < 3; g++) { awx[g] = acc_draw(); arh[g] = acc_draw(); }
      const int64_t hprev = uni(QH.qmin, QH.qmax);
      /* the general path: requant64 of the accumulators (int_gru_cpu.c's requant_row), the 128-bit cell */
      qg_cell_in in;
      in.mask = 0;
      for (int g = 0; g < 3; g++) {
        int m;
        in.wx[g] = qg_requant64(awx[g], ew[i][g] + QX.e, QWX, &m);
        in.mask |= (uint32_t)m << (QG_MB_WX_Z + g);
        in.rh[g] = qg_requant64(arh[g], erw[i][g] + QH.e, QRH, &m);
        in.mask |= (uint32_t)m << (QG_MB_RH_Z + g);
        in.bx[g] = bx[i][g]; in.br[g] = br[i][g]; in.ebx[g] = ebx[i][g]; in.ebr[g] = ebr[i][g];
      }
      in.hprev = hprev;
      qg_cell_out ref;
      qg_cell_reals re;
      qg_cell_forward(&q, &in, &ref, 1, 0, &re);
      qg_cell32_out o;
      qg_cell32_forward(&c, i, (int32_t)awx[0], (int32_t)awx[1], (int32_t)awx[2], (int32_t)arh[0], (int32_t)arh[1], (int32_t)arh[2],
                        (int32_t)hprev, &o, 0);
      CHECK(o.h == ref.h && o.zpre == ref.zpre && o.rpre == ref.rpre && o.gpre == ref.gpre && o.rhb == ref.rhb &&
            o.mask == ref.mask);
      if (c.fast && qg_cell32_unit_fast(P, H, i)) {   /* the clamp-free rounding, where its condition holds */
        qg_cell32_out of;
        qg_cell32_forward(&c, i, (int32_t)awx[0], (int32_t)awx[1], (int32_t)awx[2], (int32_t)arh[0], (int32_t)arh[1],
                          (int32_t)arh[2], (int32_t)hprev, &of, 1);
        CHECK(of.h == ref.h && of.zpre == ref.zpre && of.rpre == ref.rpre && of.gpre == ref.gpre && of.rhb == ref.rhb &&
              of.mask == ref.mask);
        (*n_fast)++;
      }
      /* W x requantized ahead of the cell (tc_grid_kernel's cells): each code and bit against
       * requant64's (the reference above), then the cell from the words, with the clamps and
       * (where the unit allows it) without */
      for (int f = 0; f <= (c.fast && qg_cell32_unit_fast(P, H, i)); f++) {
        int32_t w[3];
        for (int g = 0; g < 3; g++) {
          uint32_t m;
          const int b = QG_C32_WX + 4 * g;
          const qg_rs32 r = {P[b * H + i], P[(b + 1) * H + i], P[(b + 2) * H + i], P[(b + 3) * H + i]};
          const int32_t cc = qg_cell32_wx_code((int32_t)awx[g], r, c.wx, &m);
          CHECK(cc + QWX.z == in.wx[g] && m == ((in.mask >> (QG_MB_WX_Z + g)) & 1u));
          w[g] = qg_wx_word(cc, m);
          CHECK(qg_wx_word_code(w[g]) == cc && qg_wx_word_bit(w[g]) == m);
        }
        qg_cell32_out ow;
        qg_cell32_forward_w(&c, i, w[0], w[1], w[2], (int32_t)arh[0], (int32_t)arh[1], (int32_t)arh[2], (int32_t)hprev, &ow, f);
        CHECK(ow.h == ref.h && ow.zpre == ref.zpre && ow.rpre == ref.rpre && ow.gpre == ref.gpre && ow.rhb == ref.rhb &&
              ow.mask == ref.mask);
        (*n_wx)++;
      }
      /* the saved state as 32-bit words is qg_cell_pack's narrow layout, byte for byte */
      uint8_t packed[20];   /* qg_cell_pack writes 20 bytes when not narrow */
      uint32_t words[3];
      qg_cell_pack(packed, &q, &ref);
      qg_cell_narrow_words(&q, o.zpre, o.rpre, o.gpre, o.rhb, o.mask, words);
      CHECK(memcmp(packed, words, 12) == 0);
      (*n_compared)++;
    }
  }
  for (int k = 0; k < 3; k++) free(lut[k]);
  return ok;
}

/* The bounds: 8-bit default settings fit; a 16-bit product does not; gemm_exact = 0 does not. */
static void test_bounds(void) {
  qg_cell_q q;
  for (int k = 0; k < QG_Q_NUM_ACT; k++) q.a[k] = qg_qp_make(8, 0, 4, 0);
  q.a[QG_Q_Z_OUT] = qg_qp_make(8, 1, 8, 0); q.a[QG_Q_R_OUT] = qg_qp_make(8, 1, 8, 0); q.a[QG_Q_G_OUT] = qg_qp_make(8, 0, 7, 0);
  int32_t lut[512] = {0};
  for (int k = 0; k < 3; k++) { q.lut[k] = lut; q.lut_n[k] = 256; }
  q.narrow = 1;
  qg_cell32 c;
  CHECK(qg_cell32_setup(&c, &q, 1) == 1);
  CHECK(qg_cell32_setup(&c, &q, 0) == 0);
  int32_t P[QG_C32_ROWS];
  const int ew[3] = {7, 7, 7}, ebx[3] = {9, 9, 9}, ezero[3] = {31, 31, 31};
  const int64_t b[3] = {100, -100, 3}, bz[3] = {0, 0, 0};
  CHECK(qg_cell32_unit(P, 1, 0, &q, ew, ew, b, ebx, b, ebx) == 1);
  CHECK(qg_cell32_unit(P, 1, 0, &q, ew, ew, bz, ezero, bz, ezero) == 1);   /* zero biases at any exponent */
  const int efar[3] = {31, 31, 31};   /* bias 27 exponents finer than W x: the sticky form holds it */
  CHECK(qg_cell32_unit(P, 1, 0, &q, ew, ew, b, efar, b, ebx) == 1);
  /* by hand: z_pre's terms W x, R h at 2^-4, 100 2^-31 and 100 2^-9; f = max(4, e_zpre + 1) = 5,
   * scale 6: multipliers 4, the constants 100 2^-26 + 100 2^-4 = 6.25 + 1.5e-6 at scale 5, so
   * 2 * 6 + 1 = 13; requantized by 2 bits (kr 2, mul 1) */
  CHECK(P[QG_C32_Z] == 4 && P[QG_C32_Z + 1] == 4 && P[QG_C32_Z + 2] == 13 && P[QG_C32_Z + 4] == 1 && P[QG_C32_Z + 5] == 2);
  /* variable terms 36 exponents apart (R h at 2^-40): no form holds it */
  qg_cell_q qf = q;
  qf.a[QG_Q_MATMUL_RH] = qg_qp_make(8, 0, 40, 0);
  CHECK(qg_cell32_unit(P, 1, 0, &qf, ew, ew, b, efar, b, ebx) == 0);
  /* the tie the sticky bit decides: z_pre = W x + 2^-5 + 2^-31 with W x = w 2^-4 is (w + 1/2 +
   * 2^-27) 2^-4, which rounds to w + 1 for every w (without the 2^-31 term, even w would tie
   * down to w) */
  const int e31[3] = {31, 31, 31}, e5[3] = {5, 5, 5};
  const int64_t one[3] = {1, 1, 1};
  CHECK(qg_cell32_setup(&c, &q, 1) == 1);
  CHECK(qg_cell32_unit(P, 1, 0, &q, ew, ew, one, e31, one, e5) == 1);
  c.P = P;
  c.H = 1;
  for (int w = -100; w <= 100; w++) {
    qg_cell32_out o;
    qg_cell32_forward(&c, 0, w * 128, 0, 0, 0, 0, 0, 0, &o, 0);   /* W x accumulator at 2^-(7 + 4): w 2^7 is w at 2^-4 */
    CHECK(o.zpre == w + 1);
  }
  q.a[QG_Q_R_OUT] = qg_qp_make(16, 1, 16, 0); q.a[QG_Q_MATMUL_RH] = qg_qp_make(16, 0, 4, 0);
  CHECK(qg_cell32_setup(&c, &q, 1) == 0);
}

int main(void) {
  test_bounds();
  int accepted = 0, layers = 0, compared = 0, fast = 0, fine = 0, wx = 0;
  for (int l = 0; l < 4000; l++, layers++) {
    const int a = one_layer(l % 4, &compared, &fast, &wx);
    accepted += a;
    if (l % 4 == 3) fine += a;
  }
  printf("test_cell: %d layers, %d within the 32-bit bounds (%d of %d with fine bias exponents), %d cells compared, %d of them also "
         "without clamps, %d from W x's words\n", layers, accepted, fine, layers / 4, compared, fast, wx);
  CHECK(accepted > layers / 10);   /* the comparison reached many settings */
  CHECK(fine > layers / 4 / 4);    /* and the sticky form many of them */
  CHECK(fast > compared / 10);     /* and the clamp-free variant many of them */
  CHECK(wx >= compared);           /* and every cell from W x's words */
  printf("test_cell: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}

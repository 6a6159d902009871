/*
 * qgru_cpu.c: the quantized GRU on the CPU: the integer step of QUANT_SPEC.md section 3 (the
 * QAT forward, which is integer inference by construction), its straight-through backward
 * (section 4), and the float forward that records calibration statistics (section 5, pass 1).
 *
 * Forward of one layer and direction:
 *   x -> input.x codes; one exact GEMM of centered codes (integers in fp32 when every partial sum
 *   stays below 2^24, e.g. 8-bit codes and K <= 256, else in fp64) for W x over all
 *   steps, requantized to matmul.Wx; per step one GEMM R h (h held as output.h codes) requantized
 *   to matmul.Rh, then a pointwise loop doing steps 3-8 with 128-bit alignment sums.
 * Saved for the backward per (step, batch, unit): codes of z_pre, r_pre, g_pre and Rh_g + br_g
 * (2 bytes each when all have <= 16 bits, else 4) and one word of 17 mask bits; z, r, g are
 * recomputed from the tables. With the output.h codes (4 bytes) that is 16 (or 24) bytes.
 */
#include "internal.h"
#include "quant_math.h"

#include <cblas.h>
#include <string.h>

/* Mask bits of the saved word. */
enum {
  MB_H = 0, MB_OLD, MB_NEW, MB_GOUT, MB_GPRE, MB_RRH, MB_RHB, MB_ZOUT, MB_ZPRE, MB_ROUT, MB_RPRE,
  MB_WX_Z, MB_WX_R, MB_WX_G, MB_RH_Z, MB_RH_R, MB_RH_G
};

/* The parameters of qg_qgru_params, validated and resolved. */
typedef struct {
  qg_qp a[QG_Q_NUM_ACT];
  int bits[QG_Q_NUM_ACT];
  const int32_t *we[QG_W_NUM], *wz[QG_W_NUM];
  int wbits[QG_W_NUM];
  const int32_t *lut[3];
  int64_t lut_n[3];
  int narrow;           /* saved codes as uint16 offsets from qmin */
  int saved_bytes;
} qres;

static const char *act_name(int i) {
  static const char *names[QG_Q_NUM_ACT] = {"input.x", "output.h", "matmul.Wx", "matmul.Rh", "gate.z_pre", "gate.r_pre",
                                            "gate.g_pre", "gate.z_out", "gate.r_out", "gate.g_out", "op.rRh",
                                            "op.old_contrib", "op.new_contrib"};
  return names[i];
}

static int narrow_ok(const qg_qgru_params *p) {
  return p->act[QG_Q_Z_PRE].bitwidth <= 16 && p->act[QG_Q_R_PRE].bitwidth <= 16 && p->act[QG_Q_G_PRE].bitwidth <= 16 &&
         p->act[QG_Q_MATMUL_RH].bitwidth <= 16;
}

int qg_qgru_saved_bytes(const qg_qgru_params *p) { return p ? (narrow_ok(p) ? 4 * 2 + 4 : 4 * 4 + 4) : 0; }

static qg_status resolve(qg_ctx *ctx, const char *fn, const qg_qgru_params *p, int64_t H, qres *r) {
  if (!p) return qg_fail(ctx, QG_ERR_ARG, fn, "params is NULL");
  memset(r, 0, sizeof *r);
  for (int i = 0; i < QG_Q_NUM_ACT; i++) {
    const qg_qspec *s = &p->act[i];
    QG_CHECK(qg_check_qspec(ctx, fn, act_name(i), s->bitwidth, s->is_unsigned, s->exp2_inv, s->zero_point));
    r->a[i] = qg_qp_make(s->bitwidth, s->is_unsigned, s->exp2_inv, s->zero_point);
    r->bits[i] = s->bitwidth;
  }
  if (p->act[QG_Q_Z_OUT].exp2_inv < 0)
    return qg_fail(ctx, QG_ERR_ARG, fn, "gate.z_out: exp2_inv must be >= 0 (1 - z is computed as 2^e - (q - z)), got %d",
                   p->act[QG_Q_Z_OUT].exp2_inv);
  static const char *wnames[QG_W_NUM] = {"weight.W", "weight.R", "weight.bw", "weight.br"};
  int64_t d3[1] = {3 * H};
  for (int w = 0; w < QG_W_NUM; w++) {
    char what[64];
    snprintf(what, sizeof what, "%s exponents", wnames[w]);
    QG_CHECK(qg_check_tensor(ctx, fn, what, p->w_exp[w], QG_I32, 1, d3));
    snprintf(what, sizeof what, "%s zero points", wnames[w]);
    QG_CHECK(qg_check_tensor(ctx, fn, what, p->w_zp[w], QG_I32, 1, d3));
    r->we[w] = (const int32_t *)p->w_exp[w]->data;
    r->wz[w] = (const int32_t *)p->w_zp[w]->data;
    r->wbits[w] = p->w_bits[w];
    for (int64_t j = 0; j < 3 * H; j++) {
      snprintf(what, sizeof what, "%s channel %lld", wnames[w], (long long)j);
      QG_CHECK(qg_check_qspec(ctx, fn, what, p->w_bits[w], p->w_unsigned[w], r->we[w][j], r->wz[w][j]));
    }
  }
  static const int pre_of[3] = {QG_Q_Z_PRE, QG_Q_R_PRE, QG_Q_G_PRE};
  for (int k = 0; k < 3; k++) {
    if (!p->lut[k]) continue;
    int b = r->bits[pre_of[k]];
    if (b > 16) return qg_fail(ctx, QG_ERR_ARG, fn, "lut[%d] given for a %d-bit pre-activation (tables need <= 16 bits)", k, b);
    int64_t want[1] = {2 * ((int64_t)1 << b)};
    QG_CHECK(qg_check_tensor(ctx, fn, "lut", p->lut[k], QG_I32, 1, want));
    r->lut[k] = (const int32_t *)p->lut[k]->data;
    r->lut_n[k] = want[0] / 2;
  }
  r->narrow = narrow_ok(p);
  r->saved_bytes = qg_qgru_saved_bytes(p);
  return QG_OK;
}

/* Output code (and in-range mask) of activation k (0 z, 1 r, 2 g) for pre-activation code qpre. */
static inline int64_t act_out(const qres *r, int k, int64_t qpre, int *m) {
  static const int pre_of[3] = {QG_Q_Z_PRE, QG_Q_R_PRE, QG_Q_G_PRE}, out_of[3] = {QG_Q_Z_OUT, QG_Q_R_OUT, QG_Q_G_OUT};
  const qg_qp P = r->a[pre_of[k]];
  if (r->lut[k]) {
    int64_t i = qpre - P.qmin;
    *m = r->lut[k][r->lut_n[k] + i];
    return r->lut[k][i];
  }
  double v = qg_deq(qpre, P);
  return qg_quant_real(k < 2 ? 1.0 / (1.0 + exp(-v)) : tanh(v), r->a[out_of[k]], m);
}

/* adds v to the statistics row of operator op when statistics are being collected */
#define STAT(op, v) do { if (st) qg_stats_row_add(st + (op) * QG_STATS_WIDTH, (v)); } while (0)

/* Saved state accessors. */
static inline void save_unit(uint8_t *dst, const qres *r, int64_t zpre, int64_t rpre, int64_t gpre, int64_t rhb, uint32_t mask) {
  if (r->narrow) {
    uint16_t c[4] = {(uint16_t)(zpre - r->a[QG_Q_Z_PRE].qmin), (uint16_t)(rpre - r->a[QG_Q_R_PRE].qmin),
                     (uint16_t)(gpre - r->a[QG_Q_G_PRE].qmin), (uint16_t)(rhb - r->a[QG_Q_MATMUL_RH].qmin)};
    memcpy(dst, c, 8);
    memcpy(dst + 8, &mask, 4);
  } else {
    int32_t c[4] = {(int32_t)zpre, (int32_t)rpre, (int32_t)gpre, (int32_t)rhb};
    memcpy(dst, c, 16);
    memcpy(dst + 16, &mask, 4);
  }
}

static inline void load_unit(const uint8_t *src, const qres *r, int64_t *zpre, int64_t *rpre, int64_t *gpre, int64_t *rhb, uint32_t *mask) {
  if (r->narrow) {
    uint16_t c[4];
    memcpy(c, src, 8);
    memcpy(mask, src + 8, 4);
    *zpre = c[0] + r->a[QG_Q_Z_PRE].qmin; *rpre = c[1] + r->a[QG_Q_R_PRE].qmin;
    *gpre = c[2] + r->a[QG_Q_G_PRE].qmin; *rhb = c[3] + r->a[QG_Q_MATMUL_RH].qmin;
  } else {
    int32_t c[4];
    memcpy(c, src, 16);
    memcpy(mask, src + 16, 4);
    *zpre = c[0]; *rpre = c[1]; *gpre = c[2]; *rhb = c[3];
  }
}

static qg_status check_cpu(qg_ctx *ctx, const char *fn, const qg_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++)
    if (ts[i] && ts[i]->device != QG_CPU) return qg_fail(ctx, QG_ERR_UNSUPPORTED, fn, "cuda tensors: the quantized GRU is CPU only in this build");
  return QG_OK;
}

/* Largest |q - z| of a grid over every zero point in zps (n of them). */
static int64_t max_centered(int bits, int uns, const int32_t *zps, int64_t n, int32_t z1) {
  qg_qp g = qg_qp_make(bits, uns, 0, 0);
  int64_t m = 0;
  for (int64_t i = 0; i < (zps ? n : 1); i++) {
    int64_t z = zps ? zps[i] : z1;
    int64_t a = g.qmax - z > z - g.qmin ? g.qmax - z : z - g.qmin;
    if (a > m) m = a;
  }
  return m;
}

/* Whether a GEMM of centered codes is exact in float32: every partial sum is an integer below
 * 2^24 when max|a| max|b| K < 2^24, whatever the summation order. */
static int exact_in_f32(int64_t amax, int64_t bmax, int64_t K) {
  return amax > 0 && bmax > 0 && (double)amax * (double)bmax * (double)K < 16777216.0;
}

/* acc [M, 3H] = A [M, K] B [3H, K]^T over centered codes (in fp32 when use_f32, else fp64: A and
 * B are given in both precisions), then every entry requantized to q from the scale
 * 2^-(wexp[j] + e_in) of its column j: codes and in-range masks [M, 3H]; each accumulator's real
 * value goes to the statistics row st_row when given. exact: the fp64 sums are exact integers. */
static void matmul_requant(int64_t M, int64_t H3, int64_t K, int use_f32, int exact, const float *Af, const float *Bf,
                           float *accf, const double *Ad, const double *Bd, double *acc, const int32_t *wexp, int e_in,
                           qg_qp q, int64_t *codes, uint8_t *masks, double *st_row) {
  if (M > 0 && H3 > 0 && K > 0 && use_f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)H3, (int)K, 1.0f, Af, (int)K, Bf, (int)K, 0.0f, accf, (int)H3);
    for (int64_t i = 0; i < M * H3; i++) acc[i] = (double)accf[i];
  } else if (M > 0 && H3 > 0 && K > 0) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)H3, (int)K, 1.0, Ad, (int)K, Bd, (int)K, 0.0, acc, (int)H3);
  } else {
    memset(acc, 0, (size_t)(M * H3) * sizeof(double));
  }
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < H3; j++) {
      const int s = wexp[j] + e_in;
      const double a = acc[i * H3 + j];
      int m;
      codes[i * H3 + j] = exact ? qg_requant((qg_i128)(int64_t)a, s, q, &m) : qg_requant_real(a, s, q, &m);
      masks[i * H3 + j] = (uint8_t)m;
      if (st_row) qg_stats_row_add(st_row, ldexp(a, -s));
    }
}

/* Sum of aligned terms (centered codes at exponents e[i]) requantized to q. Returns the code. */
static inline int64_t aligned_sum(int n, const int64_t *c, const int *e, qg_qp q, int *m, double *real) {
  int emax = e[0];
  for (int i = 1; i < n; i++) if (e[i] > emax) emax = e[i];
  qg_i128 sum = 0;
  for (int i = 0; i < n; i++) sum += qg_align(c[i], e[i], emax);
  if (real) *real = ldexp((double)sum, -emax);
  return qg_requant(sum, emax, q, m);
}

qg_status qg_qgru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hq, qg_tensor *saved,
                          qg_tensor *xq, qg_tensor *xmask, qg_tensor *stats,
                          const qg_tensor *x, const qg_tensor *Wq, const qg_tensor *Rq,
                          const qg_tensor *bxq, const qg_tensor *brq, const qg_tensor *h0,
                          const qg_qgru_params *p, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "x", x, QG_F32, 3, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "Rq", Rq, QG_I32, 2, NULL));
  const int64_t T = x->dims[0], N = x->dims[1], C = x->dims[2], H = Rq->dims[1], H3 = 3 * H;
  int64_t wd[2] = {H3, C}, rd[2] = {H3, H}, bd[1] = {H3}, xd[3] = {T, N, C}, hqd[3] = {T + 1, N, H}, yd[3] = {T, N, -1};
  int64_t h0d[2] = {N, H}, std_[2] = {QG_Q_NUM_ACT, QG_STATS_WIDTH};
  QG_CHECK(qg_check_tensor(ctx, fn, "Wq", Wq, QG_I32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "Rq", Rq, QG_I32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "bxq", bxq, QG_I32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "brq", brq, QG_I32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "y", y, QG_F32, 3, yd));
  if (y_offset < 0 || y_offset + H > y->dims[2])
    return qg_fail(ctx, QG_ERR_ARG, fn, "y: columns [%d, %lld) do not fit in its last dim %lld", y_offset, (long long)(y_offset + H), (long long)y->dims[2]);
  QG_CHECK(qg_check_tensor(ctx, fn, "hq", hq, QG_I32, 3, hqd));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, h0d));
  if (stats) QG_CHECK(qg_check_tensor(ctx, fn, "stats", stats, QG_F64, 2, std_));
  qres r;
  QG_CHECK(resolve(ctx, fn, p, H, &r));
  if (saved) {
    int64_t sd[4] = {T, N, H, r.saved_bytes};
    QG_CHECK(qg_check_tensor(ctx, fn, "saved", saved, QG_U8, 4, sd));
    if (!xq || !xmask) return qg_fail(ctx, QG_ERR_ARG, fn, "training (saved given) needs xq and xmask too");
  }
  if (xq) QG_CHECK(qg_check_tensor(ctx, fn, "xq", xq, QG_I32, 3, xd));
  if (xmask) QG_CHECK(qg_check_tensor(ctx, fn, "xmask", xmask, QG_U8, 3, xd));
  const qg_tensor *all[] = {y, hq, saved, xq, xmask, stats, x, Wq, Rq, bxq, brq, h0};
  QG_CHECK(check_cpu(ctx, fn, all, 12));
  if (C > (1 << 20) || H > (1 << 20)) return qg_fail(ctx, QG_ERR_ARG, fn, "C and H must be <= 2^20 for exact integer sums");

  const int64_t TN = T * N;
  /* workspace: doubles Xc [TN, C], Wc [3H, C], Rc [3H, H], accWx [TN, 3H], Hc [N, H], accRh [N, 3H];
   * int64 qWx [TN, 3H], qRh [N, 3H]; bytes mWx [TN, 3H], mRh [N, 3H]; int32 xcodes [TN, C] */
  int64_t nd = TN * C + H3 * C + H3 * H + TN * H3 + N * H + N * H3, ni = TN * H3 + N * H3, nb = TN * H3 + N * H3;
  int64_t bytes = nd * 8 + ni * 8 + TN * C * 4 + nb + nd * 4 + 128;   /* + float copies of the GEMM operands */
  char *ws;
  QG_CHECK(qg_workspace(ctx, fn, bytes, (void **)&ws));
  double *Xc = (double *)ws, *Wc = Xc + TN * C, *Rc = Wc + H3 * C, *accWx = Rc + H3 * H, *Hc = accWx + TN * H3, *accRh = Hc + N * H;
  int64_t *qWx = (int64_t *)(accRh + N * H3), *qRh = qWx + TN * H3;
  int32_t *xcodes = (int32_t *)(qRh + N * H3);
  uint8_t *mWx = (uint8_t *)(xcodes + TN * C), *mRh = mWx + TN * H3;
  float *Xf = (float *)(((uintptr_t)(mRh + N * H3) + 63) & ~(uintptr_t)63), *Wf = Xf + TN * C, *Rf = Wf + H3 * C;
  float *accWxf = Rf + H3 * H, *Hf = accWxf + TN * H3, *accRhf = Hf + N * H;

  double *st = stats ? (double *)stats->data : NULL;
  const qg_qp QX = r.a[QG_Q_INPUT_X], QH = r.a[QG_Q_OUTPUT_H], QWX = r.a[QG_Q_MATMUL_WX], QRH = r.a[QG_Q_MATMUL_RH];
  const int exact_wx = r.bits[QG_Q_INPUT_X] <= 16 && r.wbits[QG_W_W] <= 16;
  const int exact_rh = r.bits[QG_Q_OUTPUT_H] <= 16 && r.wbits[QG_W_R] <= 16;
  /* Small grids: the same exact integer GEMMs in float32 (twice as fast as fp64). */
  const int f32_wx = exact_wx && exact_in_f32(max_centered(r.bits[QG_Q_INPUT_X], p->act[QG_Q_INPUT_X].is_unsigned, NULL, 1, QX.z),
                                              max_centered(r.wbits[QG_W_W], p->w_unsigned[QG_W_W], r.wz[QG_W_W], H3, 0), C);
  const int f32_rh = exact_rh && exact_in_f32(max_centered(r.bits[QG_Q_OUTPUT_H], p->act[QG_Q_OUTPUT_H].is_unsigned, NULL, 1, QH.z),
                                              max_centered(r.wbits[QG_W_R], p->w_unsigned[QG_W_R], r.wz[QG_W_R], H3, 0), H);

  /* 1. input.x codes */
  const float *xp = (const float *)x->data;
  for (int64_t i = 0; i < TN * C; i++) {
    int m;
    int64_t q = qg_quant_real((double)xp[i], QX, &m);
    STAT(QG_Q_INPUT_X, (double)xp[i]);
    xcodes[i] = (int32_t)q;
    Xc[i] = (double)(q - QX.z);
    Xf[i] = (float)(q - QX.z);
    if (xq) ((int32_t *)xq->data)[i] = (int32_t)q;
    if (xmask) ((uint8_t *)xmask->data)[i] = (uint8_t)m;
  }
  /* 2. centered weight codes and the W x GEMM over all steps */
  const int32_t *Wqp = (const int32_t *)Wq->data, *Rqp = (const int32_t *)Rq->data;
  for (int64_t j = 0; j < H3; j++) {
    for (int64_t k = 0; k < C; k++) Wf[j * C + k] = (float)(Wc[j * C + k] = (double)((int64_t)Wqp[j * C + k] - r.wz[QG_W_W][j]));
    for (int64_t k = 0; k < H; k++) Rf[j * H + k] = (float)(Rc[j * H + k] = (double)((int64_t)Rqp[j * H + k] - r.wz[QG_W_R][j]));
  }
  matmul_requant(TN, H3, C, f32_wx, exact_wx, Xf, Wf, accWxf, Xc, Wc, accWx, r.we[QG_W_W], QX.e, QWX, qWx, mWx,
                 st ? st + QG_Q_MATMUL_WX * QG_STATS_WIDTH : NULL);
  /* 3. h0 */
  int32_t *hqp = (int32_t *)hq->data;
  for (int64_t i = 0; i < N * H; i++) {
    int m;
    double v = h0 ? (double)((const float *)h0->data)[i] : 0.0;
    hqp[i] = (int32_t)qg_quant_real(v, QH, &m);
    if (h0) STAT(QG_Q_OUTPUT_H, v);
  }
  const int32_t *bxc = (const int32_t *)bxq->data, *brc = (const int32_t *)brq->data;
  const int32_t *ebx = r.we[QG_W_BX], *ebr = r.we[QG_W_BR], *zbx = r.wz[QG_W_BX], *zbr = r.wz[QG_W_BR];
  const qg_qp QZP = r.a[QG_Q_Z_PRE], QRP = r.a[QG_Q_R_PRE], QGP = r.a[QG_Q_G_PRE], QZ = r.a[QG_Q_Z_OUT], QR = r.a[QG_Q_R_OUT];
  const qg_qp QG = r.a[QG_Q_G_OUT], QRRH = r.a[QG_Q_RRH], QOLD = r.a[QG_Q_OLD], QNEW = r.a[QG_Q_NEW];
  const int64_t one_z = (int64_t)1 << QZ.e;   /* 1 in z_out's scale */
  const double scale_h = ldexp(1.0, -QH.e);
  float *yp = (float *)y->data;
  const int64_t Hy = y->dims[2];
  uint8_t *sp = saved ? (uint8_t *)saved->data : NULL;

  for (int64_t s = 0; s < T; s++) {
    const int64_t t = reverse ? T - 1 - s : s;
    const int32_t *hprev = hqp + s * N * H;
    int32_t *hnext = hqp + (s + 1) * N * H;
    if (f32_rh) for (int64_t i = 0; i < N * H; i++) Hf[i] = (float)((int64_t)hprev[i] - QH.z);
    else for (int64_t i = 0; i < N * H; i++) Hc[i] = (double)((int64_t)hprev[i] - QH.z);
    matmul_requant(N, H3, H, f32_rh, exact_rh, Hf, Rf, accRhf, Hc, Rc, accRh, r.we[QG_W_R], QH.e, QRH, qRh, mRh,
                   st ? st + QG_Q_MATMUL_RH * QG_STATS_WIDTH : NULL);
    for (int64_t n = 0; n < N; n++) {
      const int64_t *wx = qWx + (t * N + n) * H3, *rh = qRh + n * H3;
      const uint8_t *mwx = mWx + (t * N + n) * H3, *mrh = mRh + n * H3;
      for (int64_t i = 0; i < H; i++) {
        const int64_t jz = i, jr = H + i, jg = 2 * H + i;
        int m;
        uint32_t mask = 0;
        double real, *rp = st ? &real : NULL;
        mask |= (uint32_t)mwx[jz] << MB_WX_Z | (uint32_t)mwx[jr] << MB_WX_R | (uint32_t)mwx[jg] << MB_WX_G;
        mask |= (uint32_t)mrh[jz] << MB_RH_Z | (uint32_t)mrh[jr] << MB_RH_R | (uint32_t)mrh[jg] << MB_RH_G;
        /* z and r: four aligned terms each */
        int64_t cz[4] = {wx[jz] - QWX.z, rh[jz] - QRH.z, (int64_t)bxc[jz] - zbx[jz], (int64_t)brc[jz] - zbr[jz]};
        int ez[4] = {QWX.e, QRH.e, ebx[jz], ebr[jz]};
        int64_t qzpre = aligned_sum(4, cz, ez, QZP, &m, rp);
        mask |= (uint32_t)m << MB_ZPRE;
        STAT(QG_Q_Z_PRE, real);
        int64_t cr[4] = {wx[jr] - QWX.z, rh[jr] - QRH.z, (int64_t)bxc[jr] - zbx[jr], (int64_t)brc[jr] - zbr[jr]};
        int er[4] = {QWX.e, QRH.e, ebx[jr], ebr[jr]};
        int64_t qrpre = aligned_sum(4, cr, er, QRP, &m, rp);
        mask |= (uint32_t)m << MB_RPRE;
        STAT(QG_Q_R_PRE, real);
        int64_t qz = act_out(&r, 0, qzpre, &m);
        mask |= (uint32_t)m << MB_ZOUT;
        if (st) STAT(QG_Q_Z_OUT, 1.0 / (1.0 + exp(-qg_deq(qzpre, QZP))));
        int64_t qr = act_out(&r, 1, qrpre, &m);
        mask |= (uint32_t)m << MB_ROUT;
        if (st) STAT(QG_Q_R_OUT, 1.0 / (1.0 + exp(-qg_deq(qrpre, QRP))));
        /* Rh_g + br_g with matmul.Rh's quantizer */
        int64_t cb[2] = {rh[jg] - QRH.z, (int64_t)brc[jg] - zbr[jg]};
        int eb[2] = {QRH.e, ebr[jg]};
        int64_t qrhb = aligned_sum(2, cb, eb, QRH, &m, rp);
        mask |= (uint32_t)m << MB_RHB;
        STAT(QG_Q_MATMUL_RH, real);
        /* r * Rhb */
        qg_i128 prod = (qg_i128)(qr - QR.z) * (qrhb - QRH.z);
        if (st) STAT(QG_Q_RRH, ldexp((double)prod, -(QR.e + QRH.e)));
        int64_t qrrh = qg_requant(prod, QR.e + QRH.e, QRRH, &m);
        mask |= (uint32_t)m << MB_RRH;
        /* g */
        int64_t cg[3] = {wx[jg] - QWX.z, (int64_t)bxc[jg] - zbx[jg], qrrh - QRRH.z};
        int eg[3] = {QWX.e, ebx[jg], QRRH.e};
        int64_t qgpre = aligned_sum(3, cg, eg, QGP, &m, rp);
        mask |= (uint32_t)m << MB_GPRE;
        STAT(QG_Q_G_PRE, real);
        int64_t qg = act_out(&r, 2, qgpre, &m);
        mask |= (uint32_t)m << MB_GOUT;
        if (st) STAT(QG_Q_G_OUT, tanh(qg_deq(qgpre, QGP)));
        /* old, new, h */
        int64_t qhp = hprev[n * H + i];
        prod = (qg_i128)(qz - QZ.z) * (qhp - QH.z);
        if (st) STAT(QG_Q_OLD, ldexp((double)prod, -(QZ.e + QH.e)));
        int64_t qold = qg_requant(prod, QZ.e + QH.e, QOLD, &m);
        mask |= (uint32_t)m << MB_OLD;
        prod = (qg_i128)(one_z - (qz - QZ.z)) * (qg - QG.z);
        if (st) STAT(QG_Q_NEW, ldexp((double)prod, -(QZ.e + QG.e)));
        int64_t qnew = qg_requant(prod, QZ.e + QG.e, QNEW, &m);
        mask |= (uint32_t)m << MB_NEW;
        int64_t ch[2] = {qold - QOLD.z, qnew - QNEW.z};
        int eh[2] = {QOLD.e, QNEW.e};
        int64_t qh = aligned_sum(2, ch, eh, QH, &m, rp);
        mask |= (uint32_t)m << MB_H;
        STAT(QG_Q_OUTPUT_H, real);
        hnext[n * H + i] = (int32_t)qh;
        yp[(t * N + n) * Hy + y_offset + i] = (float)((double)(qh - QH.z) * scale_h);
        if (sp) save_unit(sp + ((s * N + n) * H + i) * r.saved_bytes, &r, qzpre, qrpre, qgpre, qrhb, mask);
      }
    }
  }
  return QG_OK;
}

static inline float sigmoid_d(double v) { return (float)(1.0 / (1.0 + exp(-v))); }

/* For activation k (0 z, 1 r, 2 g) and every pre-activation code q (pre of <= 16 bits): the
 * dequantized output deq_out(act(q)) and the derivative of f at deq_pre(q) (s(1-s) or 1-t^2),
 * so the backward's inner loop does no transcendental math. val and der hold 2^bits floats. */
static void act_tables(const qres *r, int k, float *val, float *der) {
  static const int pre_of[3] = {QG_Q_Z_PRE, QG_Q_R_PRE, QG_Q_G_PRE}, out_of[3] = {QG_Q_Z_OUT, QG_Q_R_OUT, QG_Q_G_OUT};
  const qg_qp P = r->a[pre_of[k]], O = r->a[out_of[k]];
  const int64_t n = (int64_t)1 << r->bits[pre_of[k]];
  for (int64_t i = 0; i < n; i++) {
    int m;
    const double v = qg_deq(P.qmin + i, P);
    val[i] = (float)qg_deq(act_out(r, k, P.qmin + i, &m), O);
    if (k < 2) { const float sg = sigmoid_d(v); der[i] = sg * (1.0f - sg); }
    else { const float t = (float)tanh(v); der[i] = 1.0f - t * t; }
  }
}

qg_status qg_qgru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                           qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0,
                           const qg_tensor *dy, int y_offset, const qg_tensor *dhn,
                           const qg_tensor *xq, const qg_tensor *xmask, const qg_tensor *Wfq, const qg_tensor *Rfq,
                           const qg_tensor *Wmask, const qg_tensor *Rmask, const qg_tensor *bxmask,
                           const qg_tensor *brmask, const qg_tensor *hq, const qg_tensor *saved,
                           const qg_tensor *h0, const qg_qgru_params *p, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  QG_CHECK(qg_check_tensor(ctx, fn, "xq", xq, QG_I32, 3, NULL));
  QG_CHECK(qg_check_tensor(ctx, fn, "Rfq", Rfq, QG_F32, 2, NULL));
  const int64_t T = xq->dims[0], N = xq->dims[1], C = xq->dims[2], H = Rfq->dims[1], H3 = 3 * H, TN = T * N;
  int64_t wd[2] = {H3, C}, rd[2] = {H3, H}, bd[1] = {H3}, hqd[3] = {T + 1, N, H}, nh[2] = {N, H};
  QG_CHECK(qg_check_tensor(ctx, fn, "xmask", xmask, QG_U8, 3, xq->dims));
  QG_CHECK(qg_check_tensor(ctx, fn, "Wfq", Wfq, QG_F32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "Rfq", Rfq, QG_F32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "Wmask", Wmask, QG_U8, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "Rmask", Rmask, QG_U8, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "bxmask", bxmask, QG_U8, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "brmask", brmask, QG_U8, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dW", dW, QG_F32, 2, wd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dR", dR, QG_F32, 2, rd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbx", dbx, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "dbr", dbr, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "hq", hq, QG_I32, 3, hqd));
  if (dx) QG_CHECK(qg_check_tensor(ctx, fn, "dx", dx, QG_F32, 3, xq->dims));
  if (dh0) QG_CHECK(qg_check_tensor(ctx, fn, "dh0", dh0, QG_F32, 2, nh));
  if (dhn) QG_CHECK(qg_check_tensor(ctx, fn, "dhn", dhn, QG_F32, 2, nh));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, nh));
  if (dy) {
    int64_t yd[3] = {T, N, -1};
    QG_CHECK(qg_check_tensor(ctx, fn, "dy", dy, QG_F32, 3, yd));
    if (y_offset < 0 || y_offset + H > dy->dims[2]) return qg_fail(ctx, QG_ERR_ARG, fn, "dy: columns out of range");
  }
  qres r;
  QG_CHECK(resolve(ctx, fn, p, H, &r));
  if (!saved) return qg_fail(ctx, QG_ERR_ARG, fn, "saved is NULL: run the forward in training mode first");
  int64_t sd[4] = {T, N, H, r.saved_bytes};
  QG_CHECK(qg_check_tensor(ctx, fn, "saved", saved, QG_U8, 4, sd));
  const qg_tensor *all[] = {dx, dW, dR, dbx, dbr, dh0, dy, dhn, xq, xmask, Wfq, Rfq, Wmask, Rmask, bxmask, brmask, hq, saved, h0};
  QG_CHECK(check_cpu(ctx, fn, all, 19));

  /* workspace floats: dp [TN, 3H], dq [TN, 3H], dh, dh_next [N, H], Xf [TN, C], Hf [TN, H],
   * tmpX [TN, C], tmpW [3H, C], tmpR [3H, H], activation tables (values, derivatives) for z, r, g;
   * doubles dbx~, dbr~ [3H] */
  int use_tab = r.bits[QG_Q_Z_PRE] <= 16 && r.bits[QG_Q_R_PRE] <= 16 && r.bits[QG_Q_G_PRE] <= 16;
  int64_t ntab = use_tab ? 2 * (((int64_t)1 << r.bits[QG_Q_Z_PRE]) + ((int64_t)1 << r.bits[QG_Q_R_PRE]) + ((int64_t)1 << r.bits[QG_Q_G_PRE])) : 0;
  int64_t nf = 2 * TN * H3 + 2 * N * H + 2 * TN * C + TN * H + H3 * C + H3 * H + ntab;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, nf * 4 + 2 * H3 * 8 + 64, (void **)&ws));
  float *dp = ws, *dq = dp + TN * H3, *dh = dq + TN * H3, *dh_next = dh + N * H, *Xf = dh_next + N * H, *Hf = Xf + TN * C;
  float *tmpX = Hf + TN * H, *tmpW = tmpX + TN * C, *tmpR = tmpW + H3 * C;
  float *tab = tmpR + H3 * H, *tval[3] = {NULL, NULL, NULL}, *tder[3] = {NULL, NULL, NULL};
  if (use_tab) {
    for (int k = 0; k < 3; k++) {
      int64_t n = (int64_t)1 << r.bits[k == 0 ? QG_Q_Z_PRE : (k == 1 ? QG_Q_R_PRE : QG_Q_G_PRE)];
      tval[k] = tab; tder[k] = tab + n; tab += 2 * n;
      act_tables(&r, k, tval[k], tder[k]);
    }
  }
  double *sbx = (double *)(((uintptr_t)tab + 7) & ~(uintptr_t)7), *sbr = sbx + H3;
  memset(sbx, 0, (size_t)(2 * H3) * sizeof(double));
  const double sh = ldexp(1.0, -r.a[QG_Q_OUTPUT_H].e), srhb = ldexp(1.0, -r.a[QG_Q_MATMUL_RH].e);

  const qg_qp QX = r.a[QG_Q_INPUT_X], QH = r.a[QG_Q_OUTPUT_H], QRH = r.a[QG_Q_MATMUL_RH];
  const qg_qp QZP = r.a[QG_Q_Z_PRE], QRP = r.a[QG_Q_R_PRE], QGP = r.a[QG_Q_G_PRE];
  const qg_qp QZ = r.a[QG_Q_Z_OUT], QR = r.a[QG_Q_R_OUT], QG = r.a[QG_Q_G_OUT];
  const int32_t *hqp = (const int32_t *)hq->data;
  const uint8_t *sp = (const uint8_t *)saved->data;
  const float *dyp = dy ? (const float *)dy->data : NULL;
  const int64_t Hy = dy ? dy->dims[2] : 0;
  if (dhn) memcpy(dh, dhn->data, (size_t)(N * H) * sizeof(float));
  else memset(dh, 0, (size_t)(N * H) * sizeof(float));

  for (int64_t s = T - 1; s >= 0; s--) {
    const int64_t t = reverse ? T - 1 - s : s;
    const int32_t *hprev = hqp + s * N * H;
    for (int64_t n = 0; n < N; n++) {
      float *dpr = dp + (t * N + n) * H3, *dqr = dq + (s * N + n) * H3;
      for (int64_t i = 0; i < H; i++) {
        int64_t qzpre, qrpre, qgpre, qrhb;
        uint32_t mk;
        load_unit(sp + ((s * N + n) * H + i) * r.saved_bytes, &r, &qzpre, &qrpre, &qgpre, &qrhb, &mk);
        float z, rr, g, dsz, dsr, dtg;
        if (use_tab) {
          const int64_t iz = qzpre - QZP.qmin, ir = qrpre - QRP.qmin, ig = qgpre - QGP.qmin;
          z = tval[0][iz]; rr = tval[1][ir]; g = tval[2][ig];
          dsz = tder[0][iz]; dsr = tder[1][ir]; dtg = tder[2][ig];
        } else {
          int m;
          z = (float)qg_deq(act_out(&r, 0, qzpre, &m), QZ);
          rr = (float)qg_deq(act_out(&r, 1, qrpre, &m), QR);
          g = (float)qg_deq(act_out(&r, 2, qgpre, &m), QG);
          const float sz = sigmoid_d(qg_deq(qzpre, QZP)), sr = sigmoid_d(qg_deq(qrpre, QRP));
          const float tg = (float)tanh(qg_deq(qgpre, QGP));
          dsz = sz * (1.0f - sz); dsr = sr * (1.0f - sr); dtg = 1.0f - tg * tg;
        }
        const float hp = (float)((double)((int64_t)hprev[n * H + i] - QH.z) * sh);
        const float rhb = (float)((double)(qrhb - QRH.z) * srhb);
#define MB(b) ((float)((mk >> (b)) & 1u))
        const float dH = dh[n * H + i] + (dyp ? dyp[(t * N + n) * Hy + y_offset + i] : 0.0f);
        const float d = dH * MB(MB_H);
        const float dold = d * MB(MB_OLD), dnew = d * MB(MB_NEW);
        const float dz = dold * hp - dnew * g;
        const float dg = dnew * (1.0f - z);
        const float dgpre = dg * MB(MB_GOUT) * dtg * MB(MB_GPRE);
        const float drrh = dgpre * MB(MB_RRH);
        const float dr = drrh * rhb;
        const float drhb = drrh * rr * MB(MB_RHB);
        const float dzpre = dz * MB(MB_ZOUT) * dsz * MB(MB_ZPRE);
        const float drpre = dr * MB(MB_ROUT) * dsr * MB(MB_RPRE);
        dpr[i] = dzpre * MB(MB_WX_Z); dpr[H + i] = drpre * MB(MB_WX_R); dpr[2 * H + i] = dgpre * MB(MB_WX_G);
        dqr[i] = dzpre * MB(MB_RH_Z); dqr[H + i] = drpre * MB(MB_RH_R); dqr[2 * H + i] = drhb * MB(MB_RH_G);
#undef MB
        sbx[i] += dzpre; sbx[H + i] += drpre; sbx[2 * H + i] += dgpre;
        sbr[i] += dzpre; sbr[H + i] += drpre; sbr[2 * H + i] += drhb;
        dh_next[n * H + i] = dold * z;
      }
    }
    if (N > 0 && H > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)H3, 1.0f, dq + s * N * H3, (int)H3,
                  (const float *)Rfq->data, (int)H, 1.0f, dh_next, (int)H);
    float *tmp = dh; dh = dh_next; dh_next = tmp;
  }
  if (dh0) {
    float *o = (float *)dh0->data;
    for (int64_t i = 0; i < N * H; i++) {
      int m = 1;
      if (h0) qg_quant_real((double)((const float *)h0->data)[i], QH, &m);
      o[i] = dh[i] * (float)m;
    }
  }
  /* dequantized x and h_{t-1} for the weight gradients */
  const int32_t *xqp = (const int32_t *)xq->data;
  for (int64_t i = 0; i < TN * C; i++) Xf[i] = (float)qg_deq(xqp[i], QX);
  for (int64_t i = 0; i < TN * H; i++) Hf[i] = (float)qg_deq(hqp[i], QH);
  const uint8_t *xm = (const uint8_t *)xmask->data, *wm = (const uint8_t *)Wmask->data, *rm = (const uint8_t *)Rmask->data;
  if (TN > 0 && H > 0) {
    if (dx && C > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)TN, (int)C, (int)H3, 1.0f, dp, (int)H3,
                  (const float *)Wfq->data, (int)C, 0.0f, tmpX, (int)C);
      float *o = (float *)dx->data;
      for (int64_t i = 0; i < TN * C; i++) o[i] += xm[i] ? tmpX[i] : 0.0f;
    }
    if (C > 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)C, (int)TN, 1.0f, dp, (int)H3, Xf, (int)C, 0.0f, tmpW, (int)C);
      float *o = (float *)dW->data;
      for (int64_t i = 0; i < H3 * C; i++) o[i] += wm[i] ? tmpW[i] : 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H3, (int)H, (int)TN, 1.0f, dq, (int)H3, Hf, (int)H, 0.0f, tmpR, (int)H);
    float *o = (float *)dR->data;
    for (int64_t i = 0; i < H3 * H; i++) o[i] += rm[i] ? tmpR[i] : 0.0f;
  }
  const uint8_t *bxm = (const uint8_t *)bxmask->data, *brm = (const uint8_t *)brmask->data;
  for (int64_t j = 0; j < H3; j++) {
    ((float *)dbx->data)[j] += bxm[j] ? (float)sbx[j] : 0.0f;
    ((float *)dbr->data)[j] += brm[j] ? (float)sbr[j] : 0.0f;
  }
  return QG_OK;
}

/* ---- calibration pass 1: the float recurrence, with every operator's value recorded ---- */
qg_status qg_gru_forward_stats(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *stats,
                               const qg_tensor *x, const qg_tensor *W, const qg_tensor *R,
                               const qg_tensor *bx, const qg_tensor *br, const qg_tensor *h0, int reverse) {
  if (!ctx) return QG_ERR_ARG;
  const char *fn = __func__;
  int64_t T, N, C, H;
  QG_CHECK(qg_check_gru_args(ctx, fn, x, W, R, &T, &N, &C, &H));
  const int64_t H3 = 3 * H;
  int64_t bd[1] = {H3}, yd[3] = {T, N, -1}, nh[2] = {N, H};
  int64_t std_[2] = {QG_Q_NUM_ACT, QG_STATS_WIDTH};
  QG_CHECK(qg_check_tensor(ctx, fn, "bx", bx, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "br", br, QG_F32, 1, bd));
  QG_CHECK(qg_check_tensor(ctx, fn, "y", y, QG_F32, 3, yd));
  QG_CHECK(qg_check_tensor(ctx, fn, "stats", stats, QG_F64, 2, std_));
  if (h0) QG_CHECK(qg_check_tensor(ctx, fn, "h0", h0, QG_F32, 2, nh));
  if (y_offset < 0 || y_offset + H > y->dims[2]) return qg_fail(ctx, QG_ERR_ARG, fn, "y: columns out of range");
  const qg_tensor *all[] = {y, stats, x, W, R, bx, br, h0};
  QG_CHECK(check_cpu(ctx, fn, all, 8));
  const int64_t TN = T * N;
  float *ws;
  QG_CHECK(qg_workspace(ctx, fn, (TN * H3 + N * H3 + 2 * N * H) * 4 + 64, (void **)&ws));
  float *Wx = ws, *Rh = Wx + TN * H3, *h = Rh + N * H3, *hn = h + N * H;
  double *st = (double *)stats->data;
  const float *xp = (const float *)x->data, *bxp = (const float *)bx->data, *brp = (const float *)br->data;
  for (int64_t i = 0; i < TN * C; i++) STAT(QG_Q_INPUT_X, (double)xp[i]);
  if (TN > 0 && C > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)TN, (int)H3, (int)C, 1.0f, xp, (int)C, (const float *)W->data, (int)C, 0.0f, Wx, (int)H3);
  else memset(Wx, 0, (size_t)(TN * H3) * sizeof(float));
  for (int64_t i = 0; i < TN * H3; i++) STAT(QG_Q_MATMUL_WX, (double)Wx[i]);
  for (int64_t i = 0; i < N * H; i++) {
    h[i] = h0 ? ((const float *)h0->data)[i] : 0.0f;
    if (h0) STAT(QG_Q_OUTPUT_H, (double)h[i]);
  }
  float *yp = (float *)y->data;
  const int64_t Hy = y->dims[2];
  for (int64_t s = 0; s < T; s++) {
    const int64_t t = reverse ? T - 1 - s : s;
    if (N > 0 && H > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)H3, (int)H, 1.0f, h, (int)H, (const float *)R->data, (int)H, 0.0f, Rh, (int)H3);
    for (int64_t i = 0; i < N * H3; i++) STAT(QG_Q_MATMUL_RH, (double)Rh[i]);
    for (int64_t n = 0; n < N; n++) {
      const float *wx = Wx + (t * N + n) * H3, *rh = Rh + n * H3;
      for (int64_t i = 0; i < H; i++) {
        const float zpre = wx[i] + bxp[i] + rh[i] + brp[i];
        const float rpre = wx[H + i] + bxp[H + i] + rh[H + i] + brp[H + i];
        const float z = 1.0f / (1.0f + expf(-zpre)), r = 1.0f / (1.0f + expf(-rpre));
        const float rhb = rh[2 * H + i] + brp[2 * H + i];
        const float rrh = r * rhb;
        const float gpre = wx[2 * H + i] + bxp[2 * H + i] + rrh;
        const float g = tanhf(gpre);
        const float old = z * h[n * H + i], nw = (1.0f - z) * g;
        const float hv = old + nw;
        STAT(QG_Q_Z_PRE, zpre); STAT(QG_Q_R_PRE, rpre); STAT(QG_Q_Z_OUT, z); STAT(QG_Q_R_OUT, r);
        STAT(QG_Q_MATMUL_RH, rhb); STAT(QG_Q_RRH, rrh); STAT(QG_Q_G_PRE, gpre); STAT(QG_Q_G_OUT, g);
        STAT(QG_Q_OLD, old); STAT(QG_Q_NEW, nw); STAT(QG_Q_OUTPUT_H, hv);
        hn[n * H + i] = hv;
        yp[(t * N + n) * Hy + y_offset + i] = hv;
      }
    }
    float *tmp = h; h = hn; hn = tmp;
  }
  return QG_OK;
}

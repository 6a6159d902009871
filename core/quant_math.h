/*
 * quant_math.h: the scalar arithmetic of QUANT_SPEC.md section 1, shared by every path that
 * quantizes (fake quantization, the integer GRU step, activation tables, calibration), so there
 * is one rounding rule: round half to even. Written for C and (through QG_HD) CUDA.
 *
 * Values being aligned or requantized are 128-bit integers (qg_i128): codes of up to 32 bits
 * shifted left by up to 62 bits still fit, so alignment is exact for every legal exponent.
 * Left shifts are written as multiplications by 2^k (a left shift of a negative value is
 * undefined behaviour in C); every product is bounded, so the results are bit-identical.
 */
#ifndef QGRU_QUANT_MATH_H
#define QGRU_QUANT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QG_HD __host__ __device__ __forceinline__
#else
#define QG_HD static inline
#endif

typedef __int128 qg_i128;

typedef struct {
  int32_t e, z;
  int64_t qmin, qmax;
} qg_qp;   /* a resolved quantizer: exponent, zero point, grid */

QG_HD qg_qp qg_qp_make(int bits, int is_unsigned, int e, int z) {
  qg_qp q;
  q.e = e; q.z = z;
  if (is_unsigned) { q.qmin = 0; q.qmax = (int64_t)((((uint64_t)1) << bits) - 1); }
  else { q.qmin = -(int64_t)(((uint64_t)1) << (bits - 1)); q.qmax = (int64_t)((((uint64_t)1) << (bits - 1)) - 1); }
  return q;
}

/* ldexp(x, e) as a product by 2^e built from its bits where 2^e is a normal double: the exact
 * x 2^e rounded once, which is what ldexp returns (correctly rounded, also where the result is
 * subnormal or overflows), so the same bits, without ldexp's general path (on the device a
 * library call per element: the weight and input quantization kernels spend their time there).
 * The product is exact wherever it is normal, so a caller's add that the compiler contracts with
 * it into an FMA rounds the same. */
QG_HD double qg_ldexp(double x, int e) {
  if (e < -1022 || e > 1023) return ldexp(x, e);
#ifdef __CUDA_ARCH__
  return x * __longlong_as_double((long long)(1023 + e) << 52);
#else
  const uint64_t u = (uint64_t)(1023 + e) << 52;
  double p;
  memcpy(&p, &u, sizeof p);
  return x * p;
#endif
}

/* quant(x) of a real value: clamp(rne(x * 2^e) + z). The scaling is exact (qg_ldexp); nearbyint
 * rounds half to even in the default rounding mode. *m = the in-range mask. */
QG_HD int64_t qg_quant_real(double x, qg_qp q, int *m) {
  double r = nearbyint(qg_ldexp(x, q.e)) + (double)q.z;
  if (r < (double)q.qmin) { *m = 0; return q.qmin; }
  if (r > (double)q.qmax) { *m = 0; return q.qmax; }
  if (r != r) { *m = 0; return q.z; }   /* NaN: the code of zero, masked */
  *m = 1;
  return (int64_t)r;
}

QG_HD double qg_deq(int64_t code, qg_qp q) { return qg_ldexp((double)(code - q.z), -q.e); }

/* 2^e as a float for e in [-126, 127] (a normal float, exact). */
QG_HD float qg_pow2f(int e) {
#ifdef __CUDA_ARCH__
  return __int_as_float((127 + e) << 23);
#else
  const uint32_t u = (uint32_t)(127 + e) << 23;
  float p;
  memcpy(&p, &u, sizeof p);
  return p;
#endif
}

/* qg_quant_real((double)x, q, m) for a float x in float arithmetic (the device kernels that
 * quantize whole weight and input tensors): x 2^e is exact in float wherever it is normal, so
 * rintf rounds the same exact value half to even; where it overflows (inf) or underflows
 * (|x 2^e| < 2^-126, rounding to 0 either way) the clamps and the code are those of the double
 * path; the sum with z and the clamps in 64-bit integers are exact. Exponents outside
 * [-126, 127] take the double path. tests/c/test_loaders.c compares the two over every grid
 * width, exponent range and special value. */
QG_HD int64_t qg_quant_f32(float x, qg_qp q, int *m) {
  if (q.e < -126 || q.e > 127) return qg_quant_real((double)x, q, m);
  const float r = rintf(x * qg_pow2f(q.e));
  if (!(r == r)) { *m = 0; return q.z; }   /* NaN: the code of zero, masked */
  if (r < -0x1p62f || r > 0x1p62f) { *m = 0; return r < 0 ? q.qmin : q.qmax; }   /* beyond every grid */
  const int64_t v = (int64_t)r + q.z;
  if (v < q.qmin) { *m = 0; return q.qmin; }
  if (v > q.qmax) { *m = 0; return q.qmax; }
  *m = 1;
  return v;
}

/* qg_quant_f32 with the quantizer's constants prepared once (qg_qf32_make) and the clamp done in
 * float: for the kernels that quantize whole tensors with one quantizer per row or tensor, where
 * qg_quant_f32's 64-bit integer clamps made x_quant4_kernel bound by its integer pipe (ncu at
 * T100 N256 C512 on an H200: 48 instructions an element, 62% of the issue slots, 1.9 TB/s).
 * ok = 0 where it does not apply: exponents outside [-126, 127], or a grid whose ends relative to
 * z are not exact floats (|q - z| > 2^24) or whose codes leave int32; then qg_quant_f32.
 * Where ok, the same code and mask as qg_quant_f32 for every float x (tests/c/test_loaders.c):
 * r = rintf(x 2^e) is the same float; for finite r, r < lo = qmin - z exactly when r + z < qmin,
 * so the float clamp picks the same end, and between the ends r is an integer of magnitude at most
 * 2^24, exact in int32; +-inf clamp to the ends; NaN (fmaxf returns lo, which differs from r) is
 * masked and replaced by 0, the code z. */
typedef struct {
  float s, lo, hi;   /* 2^e, qmin - z, qmax - z */
  int32_t z;
  int ok;
} qg_qf32;

QG_HD qg_qf32 qg_qf32_make(qg_qp q) {
  qg_qf32 f;
  const int64_t lo = q.qmin - q.z, hi = q.qmax - q.z, lim = (int64_t)1 << 24;
  f.ok = q.e >= -126 && q.e <= 127 && lo >= -lim && hi <= lim && q.qmin >= INT32_MIN && q.qmax <= INT32_MAX;
  f.s = f.ok ? qg_pow2f(q.e) : 1.0f;
  f.lo = (float)lo; f.hi = (float)hi;
  f.z = q.z;
  return f;
}

QG_HD int32_t qg_quant_qf32(float x, const qg_qf32 *f, int *m) {
  const float r = rintf(x * f->s);
  const float c = fminf(fmaxf(r, f->lo), f->hi);
  *m = c == r;
  return (int32_t)(r == r ? c : 0.0f) + f->z;
}

/* (float)qg_deq(code, q) in float arithmetic where that is exact: for |code - z| < 2^24 (exact in
 * float) and |e| <= 100 the product (code - z) 2^-e is zero or a normal float, exactly the value
 * the double path rounds to float; elsewhere the double path. */
QG_HD float qg_deq_f32(int64_t code, qg_qp q) {
  const int64_t c = code - q.z;
  if (c > -(1 << 24) && c < (1 << 24) && q.e >= -100 && q.e <= 100) return (float)c * qg_pow2f(-q.e);
  return (float)qg_deq(code, q);
}

/* v / 2^k rounded half to even, k >= 1 (arithmetic on 128 bits). */
QG_HD qg_i128 qg_rshift_rne(qg_i128 v, int k) {
  if (k >= 126) return 0;   /* |v| < 2^100 in every caller: the quotient rounds to 0 */
  qg_i128 fl = v >> k;      /* floor (arithmetic shift) */
  qg_i128 rem = v - fl * (((qg_i128)1) << k);   /* fl * 2^k: |fl| * 2^k <= |v| + 2^k */
  qg_i128 half = ((qg_i128)1) << (k - 1);
  if (rem > half || (rem == half && (fl & 1))) fl += 1;
  return fl;
}

/* Requantization of integer v at scale 2^-s to q: k = s - e; rounding shift right or exact shift
 * left, then + z and clamp. *m = the in-range mask. */
QG_HD int64_t qg_requant(qg_i128 v, int s, qg_qp q, int *m) {
  int k = s - q.e;
  qg_i128 r;
  if (k > 0) {
    r = qg_rshift_rne(v, k);
  } else {
    int l = -k;
    const qg_i128 limit = ((qg_i128)1) << 96;   /* anything beyond clamps either way */
    if (v == 0) r = 0;
    else if (l >= 96 || (v > 0 ? v : -v) >= (limit >> l)) r = v > 0 ? limit : -limit;
    else r = v * (((qg_i128)1) << l);   /* |v| * 2^l < 2^96 here */
  }
  r += q.z;
  if (r < q.qmin) { *m = 0; return q.qmin; }
  if (r > q.qmax) { *m = 0; return q.qmax; }
  *m = 1;
  return (int64_t)r;
}

/* Requantization of a real accumulator a (held at scale 2^-s) that is not an exact integer
 * (GEMM operands above 16 bits, simulated in double). */
QG_HD int64_t qg_requant_real(double a, int s, qg_qp q, int *m) {
  double r = nearbyint(qg_ldexp(a, q.e - s)) + (double)q.z;
  if (r < (double)q.qmin) { *m = 0; return q.qmin; }
  if (r > (double)q.qmax) { *m = 0; return q.qmax; }
  *m = 1;
  return (int64_t)r;
}

/* The minmax rule of QUANT_SPEC.md section 5 on the range [lo, hi] (widened to include 0), for a
 * quantizer of `bits` bits: *e, *z. Degenerate ranges (nothing but zeros) give e = bits - 1,
 * z = 0; symmetric: e = floor(log2(qmax / max|x|)), z = 0; asymmetric: e from
 * (qmax - qmin) / (hi - lo), then z = qmin - rne(lo 2^e), e stepped down by one while rne(hi 2^e)
 * + z would clip (at most three tries). e is clamped to -31..31 (an infinite ratio gives 31, a
 * zero one -31) and z to the grid.
 * One function for the host (calibration, core/calib.c) and the device (the tracked weight
 * quantizers, kernels/stats.cu). Everything but log2 is exact (comparisons, ldexp, nearbyint
 * rounding half to even); log2 may differ by an ulp between the C library and CUDA, which cannot
 * move floor() in the symmetric case on f32 data: qmax is an integer below 2^32 and max|x| an f32
 * value, so qmax / max|x| is either exactly a power of two (log2 exact on both) or at least 2^-32
 * away from one relatively, far beyond an ulp of log2. The device uses it for symmetric
 * quantizers only. */
QG_HD int qg_clamp_exp(double f) { return f != f || f < -31 ? -31 : (f > 31 ? 31 : (int)f); }

QG_HD void qg_minmax_rule(double lo, double hi, int bits, int sym, int uns, int32_t *e, int32_t *z) {
  if (lo > 0) lo = 0;
  if (hi < 0) hi = 0;
  const qg_qp g = qg_qp_make(bits, uns, 0, 0);
  if (!(hi > lo) || (sym && uns && !(hi > 0))) {   /* degenerate */
    *e = qg_clamp_exp((double)(bits - 1));
    *z = 0;
    return;
  }
  if (sym) {
    const double m = uns ? hi : (hi > -lo ? hi : -lo);
    const double top = g.qmax > 0 ? (double)g.qmax : 1.0;
    *e = qg_clamp_exp(floor(log2(top / m)));
    *z = 0;
    return;
  }
  int ee = qg_clamp_exp(floor(log2((double)(g.qmax - g.qmin) / (hi - lo))));
  for (int tries = 0; tries < 3; tries++) {
    const int64_t zz = g.qmin - (int64_t)nearbyint(ldexp(lo, ee));
    if ((int64_t)nearbyint(ldexp(hi, ee)) + zz > g.qmax && ee > -31) { ee--; continue; }
    *e = ee;
    *z = (int32_t)(zz < g.qmin ? g.qmin : (zz > g.qmax ? g.qmax : zz));
    return;
  }
  const int64_t zz = g.qmin - (int64_t)nearbyint(ldexp(lo, ee));
  *e = ee;
  *z = (int32_t)(zz < g.qmin ? g.qmin : (zz > g.qmax ? g.qmax : zz));
}

/* (code - z) shifted from scale 2^-e up to the finer scale 2^-emax (emax >= e). */
QG_HD qg_i128 qg_align(int64_t centered, int e, int emax) { return ((qg_i128)centered) * (((qg_i128)1) << (emax - e)); }

#endif

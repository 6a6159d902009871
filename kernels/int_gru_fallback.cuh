/*
 * int_gru_fallback.cuh: the integer GRU forward's per-step recurrence for operands above 16 bits
 * (fallback_step_kernel: R h in double with the transposed centered R, as the CPU's simulated
 * GEMM, then the 128-bit cell), one launch per step.
 * Included once by kernels/int_gru.cu, after int_gru_grid.cuh.
 */

/* ---- operands above 16 bits: one kernel per step in double ----
 * Block: FB_UNITS units x FB_NB rows, one thread per (unit, row): R h with the transposed centered
 * R in double (as the CPU's simulated GEMM: identical while the double sums are exact; the rows of
 * a unit read the same R entries, from L1) and the rows' centered h codes staged in shared memory
 * FB_KT at a time; then the (128-bit) cell. */
enum { FB_UNITS = 64, FB_NB = 4, FB_THREADS = FB_UNITS * FB_NB, FB_KT = 256 };

template <int OBS>
__global__ void __launch_bounds__(FB_THREADS) fallback_step_kernel(const __grid_constant__ rec_common c, const double *Rt, int64_t s) {
  __shared__ double hs[FB_NB][FB_KT];
  const int64_t H = c.H, H3 = 3 * H, N = c.N;
  const int r = threadIdx.x / FB_UNITS;
  const int64_t i = (int64_t)blockIdx.x * FB_UNITS + threadIdx.x % FB_UNITS, n = (int64_t)blockIdx.y * FB_NB + r;
  const qg_qp QH = c.cell.a[QG_Q_OUTPUT_H], QRH = c.cell.a[QG_Q_MATMUL_RH];
  const int32_t *hprev = h_at(c, s);
  int32_t *hnext = h_at(c, s + 1);
  const bool mine = i < H && n < N;
  double acc[3] = {0, 0, 0};
  for (int64_t k0 = 0; k0 < H; k0 += FB_KT) {
    for (int e = threadIdx.x; e < FB_NB * FB_KT; e += FB_THREADS) {
      const int rr = e / FB_KT, kk = e % FB_KT;
      const int64_t nn = (int64_t)blockIdx.y * FB_NB + rr, k = k0 + kk;
      hs[rr][kk] = (nn < N && k < H) ? (double)((int64_t)hprev[nn * H + k] - QH.z) : 0.0;
    }
    __syncthreads();
    if (mine) {
      const int kn = (int)(H - k0 < FB_KT ? H - k0 : FB_KT);
#pragma unroll 4
      for (int kk = 0; kk < kn; kk++) {
        const int64_t o = (k0 + kk) * H3 + i;
        const double hv = hs[r][kk];
        acc[0] += Rt[o] * hv;
        acc[1] += Rt[o + H] * hv;
        acc[2] += Rt[o + 2 * H] * hv;
      }
    }
    __syncthreads();
  }
  if (!mine) return;
  const int64_t Ln = length_at(c.L, n, c.T);
  const int64_t hp = hprev[n * H + i];
  int64_t hnew = hp;
  if (s >= Ln) {   /* padded step (t = s): the state stays, y = 0 */
    pad_cell(c, s, n, i, N);
  } else {
    const int64_t t = c.reverse ? Ln - 1 - s : s;
    qg_cell_in in;
    in.mask = 0;
    for (int k = 0; k < 3; k++) {
      const int sc = c.eR[k * H + i] + QH.e;
      int m;
      in.rh[k] = qg_requant_real(acc[k], sc, QRH, &m);
      if (OBS) observe(c.range, c.counts, QG_Q_MATMUL_RH, ldexp(acc[k], -sc));
      in.mask |= (uint32_t)m << (QG_MB_RH_Z + k);
    }
    cell_wx(c, t * N + n, i, &in);
    fill_bias(c, i, &in);
    in.hprev = hp;
    hnew = run_cell<1, OBS>(&c.cell, c, s, t, n, i, &in);
  }
  hnext[n * H + i] = (int32_t)hnew;
  if (s == c.T - 1 && c.hn) c.hn[n * H + i] = (float)qg_deq(hnew, QH);
}

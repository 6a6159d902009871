/*
 * xs_proto.cuh: what the two prototypes of the fused strict backward's step (bench/xs_grid_proto.cu,
 * bench/xs_cluster_proto.cu) share on the host: their inputs (R's codes [H][3H], K contiguous per
 * unit, uniform in [-127, 127]; dh [N][H] over 8 binades) and the fp64 check of one step of their
 * stand-in cell and product, dh'[n][i] = sum_g sum_j dq[n][g H + j] R[g H + j][i] with
 * dq = (dh c_g) scale formed in float exactly as the kernels form it; and on the device, R's slice
 * in shared memory and the balanced base-256 digits of a fixed-point value.
 */
#ifndef QGRU_XS_PROTO_CUH
#define QGRU_XS_PROTO_CUH

#include "cuda_bench.cuh"   /* CK */
#include "ptx.cuh"          /* cp_async16_s, commit / wait */

#include <math.h>
#include <stdint.h>
#include <vector>

/* R's shared rows of a CTA holding U units x K = 3H: unit u's 16-byte piece kc (K' = 16 kc ..
 * 16 kc + 15) at piece kc ^ (u & 7), so that ldmatrix reads 8 units from distinct banks. */
template <int K>
__device__ __forceinline__ uint32_t xs_proto_r_addr(uint32_t rs, int u, int kc) { return rs + (uint32_t)(u * K + ((kc ^ (u & 7)) << 4)); }

/* The CTA's R slice (units ub U .. ub U + U - 1 of RT [H][3H]) into shared memory at rs, K in chunk
 * order: K' = c 3U + g U + j <-> k = g H + U c + j (chunk c: unit block c's gate columns). */
template <int H, int U, int THREADS>
__device__ __forceinline__ void xs_proto_load_r(uint32_t rs, const int8_t *RT, int ub) {
  constexpr int K = 3 * H, KC = 3 * U;
  for (int e = threadIdx.x; e < U * (K / 16); e += THREADS) {
    const int u = e / (K / 16), kc = e % (K / 16), kp = kc * 16;
    const int c = kp / KC, g = (kp % KC) / U, j = kp % U;
    cp_async16_s(xs_proto_r_addr<K>(rs, u, kc), RT + (size_t)(ub * U + u) * K + g * H + c * U + j);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

/* x (|x| <= 2^(8 DIG - 2)) as DIG balanced base-256 digits, least significant first: the lower
 * ones in [-128, 127], the top one within [-64, 64]; x = sum_d 256^d dig[d]. */
template <int DIG>
__device__ __forceinline__ void xs_proto_digits(int x, int8_t (&dig)[DIG]) {
#pragma unroll
  for (int d = 0; d < DIG - 1; d++) {
    const int dv = ((x + 128) & 255) - 128;
    dig[d] = (int8_t)dv;
    x = (x - dv) >> 8;
  }
  dig[DIG - 1] = (int8_t)x;
}

static const float xs_proto_cg[3] = {0.5f, -0.25f, 0.375f};   /* the stand-in cell's gate factors */

static unsigned xs_proto_mix(unsigned h) { h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16; return h; }

static void xs_proto_inputs(int N, int H, std::vector<int8_t> &RT, std::vector<float> &dh0) {
  RT.resize((size_t)H * 3 * H);
  for (size_t i = 0; i < RT.size(); i++) RT[i] = (int8_t)((int)(xs_proto_mix((unsigned)i * 2654435761u) % 255u) - 127);
  dh0.resize((size_t)N * H);
  for (size_t i = 0; i < dh0.size(); i++) {
    const unsigned h = xs_proto_mix((unsigned)i * 2246822519u ^ 7u);
    dh0[i] = ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * exp2f(-(float)((h >> 24) % 8u));
  }
}

/* Largest |error| over the largest |value| of one step's dh' (out) against fp64. */
static double xs_proto_error(const std::vector<float> &out, const std::vector<int8_t> &RT, const std::vector<float> &dh0, int N, int H,
                             float scale) {
  double emax = 0, vmax = 0;
  for (int n = 0; n < N; n++)
    for (int i = 0; i < H; i++) {
      double s = 0;
      for (int g = 0; g < 3; g++)
        for (int j = 0; j < H; j++) {
          const float dq = (dh0[(size_t)n * H + j] * xs_proto_cg[g]) * scale;
          s += (double)dq * RT[(size_t)i * 3 * H + g * H + j];
        }
      emax = fmax(emax, fabs(s - out[(size_t)n * H + i]));
      vmax = fmax(vmax, fabs(s));
    }
  return emax / vmax;
}

/* One step (launch(1)), dh' copied back from dout and checked against fp64 as above. */
template <class Launch>
static double xs_proto_check_step(Launch launch, const float *dout, const std::vector<int8_t> &RT, const std::vector<float> &dh0, int N,
                                  int H, float scale) {
  launch(1);
  CK(cudaDeviceSynchronize());
  std::vector<float> out(dh0.size());
  CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  return xs_proto_error(out, RT, dh0, N, H, scale);
}

#endif

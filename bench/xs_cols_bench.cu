// xs_cols_bench.cu: how fast is the exact split's column split (kernels/exact_split.cuh,
// xs_cols_kernel), the DRAM-bound pass that the large strict STE backward runs twice after its
// per-step loop (dq's and dp's columns as K-contiguous digit planes for the dR and dW products)?
// Session 38's timeline had dq's at 0.275 ms for 630 MB (about 2.3 TB/s) at T100 N256 H1024.
//
// On one X [T, J] fp32 (default the large shape's dq: T = T N = 25600, J = 3H = 3072; values of
// spread magnitudes, a zero column, a column with an Inf), times with CUDA events (median of the
// repeats, after a warm-up):
//   - copy: cudaMemcpyAsync of X (its bytes read and written: the ceiling of a read + write pass);
//   - ref: session 22's kernel (64 x 64 tiles, byte stores into shared memory, 4-byte stores),
//     kept here as the reference;
//   - rows R: xs_cols_kernel<R> (R-row tiles x 32 columns; the library launches R = XC_ROWS);
//   - two: the library's kernel on X and on a second matrix of the same size, on two streams.
// Every variant's digit planes, shifts and corrections are compared byte for byte with ref's (a
// difference fails the run); bytes moved a pass = T J 4 (read) + 4 J Tp (written).
// Build and run: nvcc -arch=sm_90 -O3 -lineinfo -Ikernels -Ibench bench/xs_cols_bench.cu -lcublas -lcublasLt -o xs_cols_bench
//   && ./xs_cols_bench [T J reps]   (or the bench_programs test's target bench_xs_cols_bench)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "cuda_bench.cuh"   /* CK, median_call_ms */
#include "exact_split.cuh"

/* session 22's xs_cols_kernel (the library's until session 39), the reference */
__global__ void __launch_bounds__(XS_THREADS) cols_ref_kernel(int8_t *__restrict__ D, int *__restrict__ sh, long long *__restrict__ corr,
                                                              const float *__restrict__ X, const unsigned *__restrict__ mbits, int64_t T,
                                                              int64_t J, int64_t Tp, int zoff) {
  __shared__ __align__(16) int8_t tile[XS_DIGITS][XS_TILE][XS_TILE + 4];
  __shared__ long long csum[XS_TILE];
  const int64_t t0 = blockIdx.x * (int64_t)XS_TILE, j0 = blockIdx.y * (int64_t)XS_TILE;
  const int tx = threadIdx.x % XS_TILE, ty = threadIdx.x / XS_TILE;
  if (threadIdx.x < XS_TILE) csum[threadIdx.x] = 0;
  const int64_t j = j0 + tx;
  const int s = j < J ? xs_shift((double)__uint_as_float(mbits[j])) : 0;
  if (blockIdx.x == 0 && ty == 0 && j < J) sh[j] = s;
  __syncthreads();
  long long c = 0;
  constexpr int RPT = XS_TILE / (XS_THREADS / XS_TILE);
  float v[RPT];
#pragma unroll
  for (int i = 0; i < RPT; i++) {
    const int64_t t = t0 + ty + i * (XS_THREADS / XS_TILE);
    v[i] = t < T && j < J ? X[t * J + j] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < RPT; i++) {
    const int yy = ty + i * (XS_THREADS / XS_TILE);
    int8_t dg[XS_DIGITS];
    const int xi = xs_fixed(v[i], s);
    xs_digits(xi, dg);
    c += xi;
#pragma unroll
    for (int d = 0; d < XS_DIGITS; d++) tile[d][tx][yy] = dg[d];
  }
  if (zoff != 0) atomicAdd((unsigned long long *)&csum[tx], (unsigned long long)c);
  __syncthreads();
  if (ty == 0 && j < J && zoff != 0) atomicAdd((unsigned long long *)(corr + j), (unsigned long long)(csum[tx] * zoff));
  const int64_t plane = J * Tp;
  for (int w = threadIdx.x; w < XS_DIGITS * XS_TILE * (XS_TILE / 4); w += XS_THREADS) {
    const int d = w / (XS_TILE * (XS_TILE / 4)), jj = (w / (XS_TILE / 4)) % XS_TILE, q = w % (XS_TILE / 4);
    const int64_t jr = j0 + jj, tc = t0 + 4 * q;
    if (jr >= J || tc >= Tp) continue;
    *(uint32_t *)(D + d * plane + jr * Tp + tc) = *(const uint32_t *)&tile[d][jj][4 * q];
  }
}

struct split_out {
  int8_t *D;
  int *sh;
  long long *corr;
};

/* the median of reps calls of f after two untimed ones (cuda_bench.cuh) */
template <class F>
static float median_ms(F &&f, int reps, cudaStream_t st) { return median_call_ms(f, st, reps, 2); }

int main(int argc, char **argv) {
  const int64_t T = argc > 1 ? atoll(argv[1]) : 25600, J = argc > 2 ? atoll(argv[2]) : 3072;
  const int reps = argc > 3 ? atoi(argv[3]) : 21, zoff = 3;
  const int64_t Tp = xs_kpad(T), n = T * J, dbytes = XS_DIGITS * J * Tp;
  int dev = 0;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s, X [%lld, %lld] fp32, Tp %lld, %d repeats (median)\n", prop.name, (long long)T, (long long)J, (long long)Tp, reps);
  /* values of spread magnitudes (2^-24 .. 2^4, both signs, some zeros); column 1 all zero, column 2 with an Inf */
  std::vector<float> hx((size_t)n);
  uint64_t st64 = 88172645463325252ull;
  auto rnd = [&] { st64 ^= st64 << 13; st64 ^= st64 >> 7; st64 ^= st64 << 17; return st64; };
  for (int64_t i = 0; i < n; i++) {
    const uint64_t r = rnd();
    const int64_t col = i % J;
    float v = (float)ldexp(1.0 + (double)(r & 0xffffff) / 16777216.0, (int)((r >> 24) % 29) - 24);
    if ((r >> 40) & 1) v = -v;
    if (((r >> 41) & 63) == 0) v = 0.0f;
    if (col == 1) v = 0.0f;
    hx[(size_t)i] = v;
  }
  if (J > 2 && T > 5) hx[(size_t)(5 * J + 2)] = INFINITY;
  float *X, *X2;
  unsigned *mb;
  CK(cudaMalloc(&X, n * 4));
  CK(cudaMalloc(&X2, n * 4));
  CK(cudaMalloc(&mb, J * 4));
  CK(cudaMemcpy(X, hx.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(X2, hx.data(), n * 4, cudaMemcpyHostToDevice));
  cudaStream_t st, st2;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  CK(cudaMemsetAsync(mb, 0, J * 4, st));
  xs_colmax_kernel<<<dim3((unsigned)((J + XS_THREADS - 1) / XS_THREADS), (unsigned)((T + XS_COLMAX_ROWS - 1) / XS_COLMAX_ROWS)), XS_THREADS, 0, st>>>(
      mb, X, T, J, XS_COLMAX_ROWS);
  CK(cudaGetLastError());
  auto alloc = [&] {
    split_out o;
    CK(cudaMalloc(&o.D, dbytes));
    CK(cudaMalloc(&o.sh, J * 4));
    CK(cudaMalloc(&o.corr, J * 8));
    return o;
  };
  split_out ref = alloc(), got = alloc(), got2 = alloc();
  auto clear = [&](const split_out &o, cudaStream_t s) {
    CK(cudaMemsetAsync(o.D, 0x5a, dbytes, s));   /* garbage where the kernels must write, padding included */
    CK(cudaMemsetAsync(o.sh, 0x5a, J * 4, s));
    CK(cudaMemsetAsync(o.corr, 0, J * 8, s));
  };
  auto run_ref = [&](const split_out &o, const float *x, cudaStream_t s) {
    cols_ref_kernel<<<dim3((unsigned)((Tp + XS_TILE - 1) / XS_TILE), (unsigned)((J + XS_TILE - 1) / XS_TILE)), XS_THREADS, 0, s>>>(o.D, o.sh, o.corr,
                                                                                                                              x, mb, T, J, Tp, zoff);
    CK(cudaGetLastError());
  };
  auto run_rows = [&](int rows, const split_out &o, const float *x, cudaStream_t s) {
    const dim3 g((unsigned)((Tp + rows - 1) / rows), (unsigned)((J + XC_COLS - 1) / XC_COLS));
    if (rows == 64) xs_cols_kernel<64><<<g, XC_THREADS, 0, s>>>(o.D, o.sh, o.corr, x, mb, T, J, Tp, zoff);
    else if (rows == 128) xs_cols_kernel<128><<<g, XC_THREADS, 0, s>>>(o.D, o.sh, o.corr, x, mb, T, J, Tp, zoff);
    else xs_cols_kernel<256><<<g, XC_THREADS, 0, s>>>(o.D, o.sh, o.corr, x, mb, T, J, Tp, zoff);
    CK(cudaGetLastError());
  };
  /* the reference once */
  clear(ref, st);
  run_ref(ref, X, st);
  CK(cudaStreamSynchronize(st));
  std::vector<int8_t> hD((size_t)dbytes), gD((size_t)dbytes);
  std::vector<int> hs((size_t)J), gs((size_t)J);
  std::vector<long long> hc((size_t)J), gc((size_t)J);
  CK(cudaMemcpy(hD.data(), ref.D, dbytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hs.data(), ref.sh, J * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hc.data(), ref.corr, J * 8, cudaMemcpyDeviceToHost));
  int failures = 0;
  auto check = [&](const char *name, const split_out &o) {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gD.data(), o.D, dbytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gs.data(), o.sh, J * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gc.data(), o.corr, J * 8, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < dbytes; i++) bad += gD[(size_t)i] != hD[(size_t)i];
    for (int64_t j = 0; j < J; j++) bad += (gs[(size_t)j] != hs[(size_t)j]) + (gc[(size_t)j] != hc[(size_t)j]);
    printf("  %-8s %s (%lld differing bytes or values)\n", name, bad ? "DIFFERS from ref" : "identical to ref", (long long)bad);
    failures += bad != 0;
  };
  /* a sanity check of the reference itself: column 1 (all zero) has shift 0 and zero digits; column 2 (Inf) XS_NONFINITE */
  if (J > 2 && (hs[1] != 0 || hs[2] != XS_NONFINITE)) {
    printf("reference shifts unexpected: %d %d\n", hs[1], hs[2]);
    failures++;
  }
  const int rows_list[3] = {64, 128, 256};
  for (int rr : rows_list) {
    char nm[16];
    snprintf(nm, sizeof nm, "rows %d", rr);
    clear(got, st);
    run_rows(rr, got, X, st);
    check(nm, got);
  }
  clear(got, st);
  CK(xs_cols(got.D, got.sh, got.corr, X, mb, T, J, Tp, zoff, st));
  check("xs_cols", got);
  /* timings (corr is not cleared between repeats: its values do not matter here) */
  const double gb = (double)(n * 4 + dbytes) * 1e-9;
  auto report = [&](const char *name, float ms, double bytes_gb) {
    printf("%-26s %8.1f us  %6.2f TB/s\n", name, ms * 1e3, bytes_gb / (ms * 1e-3) * 1e-3);
  };
  report("copy (cudaMemcpyAsync)", median_ms([&] { CK(cudaMemcpyAsync(X2, X, n * 4, cudaMemcpyDeviceToDevice, st)); }, reps, st), 2.0 * n * 4 * 1e-9);
  report("ref (64 x 64, session 22)", median_ms([&] { run_ref(ref, X, st); }, reps, st), gb);
  for (int rr : rows_list) {
    char nm[32];
    snprintf(nm, sizeof nm, "xs_cols_kernel<%d>", rr);
    report(nm, median_ms([&] { run_rows(rr, got, X, st); }, reps, st), gb);
  }
  /* two matrices at once on two streams (as dq's and dp's splits could run), and one after the other */
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  auto two = [&](bool ref_kernel) {
    CK(cudaEventRecord(fork, st));
    CK(cudaStreamWaitEvent(st2, fork, 0));
    if (ref_kernel) { run_ref(got, X, st); run_ref(got2, X2, st2); }
    else { CK(xs_cols(got.D, got.sh, got.corr, X, mb, T, J, Tp, zoff, st)); CK(xs_cols(got2.D, got2.sh, got2.corr, X2, mb, T, J, Tp, zoff, st2)); }
    CK(cudaEventRecord(join, st2));
    CK(cudaStreamWaitEvent(st, join, 0));
  };
  report("two streams, ref", median_ms([&] { two(true); }, reps, st), 2 * gb);
  report("two streams, xs_cols", median_ms([&] { two(false); }, reps, st), 2 * gb);
  report("two in a row, xs_cols", median_ms([&] {
           CK(xs_cols(got.D, got.sh, got.corr, X, mb, T, J, Tp, zoff, st));
           CK(xs_cols(got2.D, got2.sh, got2.corr, X2, mb, T, J, Tp, zoff, st));
         }, reps, st), 2 * gb);
  printf("%s\n", failures ? "FAILED" : "all variants identical to the reference");
  return failures ? 1 : 0;
}

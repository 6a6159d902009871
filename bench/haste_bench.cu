/*
 * haste_bench.cu: Haste (lmnt-com/haste, the CUDA GRU/LSTM library) timed on the five bench shapes,
 * so that issue 7's comparison with Haste is a same-run measurement instead of quoted figures.
 * Our driver, not Haste's benchmark: it includes Haste's public header (haste.h -> haste/gru.h) and
 * links libhaste.a, built on the device from the carried Haste source by bench/haste_device.sh
 * (nothing of Haste is committed here).
 *
 * What one op is, mirroring Haste's PyTorch binding (frameworks/pytorch/gru.{cc,py}) call for call:
 *   infer: output[0] = h0; ForwardPass<float>(training=false).Run over all T steps.
 *   train: output[0] = h0; ForwardPass<float>(training=true).Run (keeps v, the activations); the
 *          transposes the binding's backward makes (x -> x_t [C][T N], W -> W_t [3H][C],
 *          R -> R_t [3H][H]); dW, dR, dbx, dbr, dh zeroed; BackwardPass<float>.Run over all T with
 *          dh_new = a fixed random gradient of the outputs [T+1][N][H]: gradients of x, h0, W, R,
 *          bx, br.
 * As in the binding, the passes are built per call on the legacy default stream (stream 0, what
 * PyTorch's current stream is by default), so Haste's two internal blocking streams order with it
 * and each pass's destructor waits for them; the CUDA events on stream 0 see all of the op,
 * host gaps between the two passes included (they are part of a real call too).
 * Buffers are allocated once per shape; random inputs and weights from a fixed-seed LCG (weights
 * uniform in +-1/sqrt(H), x in +-1, h0 in +-0.5, dh_new in +-1).
 *
 * Math modes. Haste's Run wraps its GEMMs in blas<void>::enable_tensor_cores, which sets the
 * handle to CUBLAS_TENSOR_OP_MATH, whatever the caller chose; cuBLAS 13 documents that mode as
 * "same effect as using CUBLAS_COMPUTE_32F_FAST_16F" (cublas_api.h): fp16 tensor cores for its
 * float GEMMs. So the driver links with -Wl,--wrap=cublasSetMathMode and, in the fp32 and tf32
 * modes, turns Haste's request for CUBLAS_TENSOR_OP_MATH into CUBLAS_DEFAULT_MATH or
 * CUBLAS_TF32_TENSOR_OP_MATH (the count of replaced requests is printed). math=shipped leaves the
 * request alone: Haste as its users get it.
 *
 * Timing: 5 warm-up calls, then the median of 20 (argv[1], argv[2] change them) calls, each
 * between two CUDA events on stream 0. Output, one line per (shape, math):
 *   haste shape=large math=tf32 train_ms=6.910 infer_ms=2.150 overrides=... check=ok
 * plus the device name and SM clock first, and per (shape, math) a checksum line of the outputs
 * and gradients. check=ok needs every output and gradient finite and, where the shape is small
 * enough for a float64 CPU reference of the forward and the backward (seed-small, seed-qat,
 * long-kws), the max error relative to the reference's largest magnitude under 1e-4 (fp32), 2e-2
 * (tf32, shipped fp16); the errors are printed (err_h, err_grad). A broken build cannot pass
 * silently: any failure prints check=FAIL and the exit status is 1. `haste_bench selftest` (no GPU
 * needed) checks the float64 reference's gradients against central differences first.
 *
 * Build (bench/haste_device.sh does it): nvcc -O3 -std=c++17 -arch=sm_90 -I<haste>/lib
 *   bench/haste_bench.cu <haste>/libhaste.a -lcublas -Xlinker --wrap=cublasSetMathMode
 */
#include <haste.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)
#define CB(x)                                                                                \
  do {                                                                                       \
    cublasStatus_t s_ = (x);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_);     \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

// ---- the math-mode override (see the header comment) ----
static int g_force = -1;       // -1: leave Haste's request; else the cublasMath_t to use instead
static long g_overrides = 0;   // requests for CUBLAS_TENSOR_OP_MATH replaced
static long g_tensor_req = 0;  // requests for CUBLAS_TENSOR_OP_MATH seen
extern "C" cublasStatus_t __real_cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
extern "C" cublasStatus_t __wrap_cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
  if (m == CUBLAS_TENSOR_OP_MATH) {
    g_tensor_req++;
    if (g_force >= 0) {
      m = (cublasMath_t)g_force;
      g_overrides++;
    }
  }
  return __real_cublasSetMathMode(h, m);
}

struct Shape { const char *name; int T, N, C, H; bool ref; };
static const Shape SHAPES[] = {
    {"seed-small", 100, 4, 128, 256, true},  {"seed-qat", 50, 32, 64, 128, true},
    {"medium", 100, 64, 256, 512, false},    {"large", 100, 256, 512, 1024, false},
    {"long-kws", 1000, 16, 40, 64, true},
};
struct Math { const char *name; int force; double tol; };
static const Math MATHS[] = {
    {"fp32", CUBLAS_DEFAULT_MATH, 1e-4},
    {"tf32", CUBLAS_TF32_TENSOR_OP_MATH, 2e-2},
    {"shipped", -1, 2e-2},
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(float a) {  // uniform in [-a, a)
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return a * (2.0f * (float)((g_rng >> 40) * (1.0 / 16777216.0)) - 1.0f);
}

// out[c][r] = in[r][c], in is rows x cols (row-major)
__global__ void transpose_k(const float *in, float *out, int rows, int cols) {
  __shared__ float tile[32][33];
  int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += 8)
    if (r0 + i < rows && c < cols) tile[i][threadIdx.x] = in[(size_t)(r0 + i) * cols + c];
  __syncthreads();
  int r = r0 + threadIdx.x, c0 = blockIdx.x * 32;
  for (int i = threadIdx.y; i < 32; i += 8)
    if (c0 + i < cols && r < rows) out[(size_t)(c0 + i) * rows + r] = tile[threadIdx.x][i];
}
static void transpose(const float *in, float *out, int rows, int cols) {
  dim3 g((cols + 31) / 32, (rows + 31) / 32), b(32, 8);
  transpose_k<<<g, b, 0, 0>>>(in, out, rows, cols);
  CK(cudaGetLastError());
}

static double sigm(double a) { return 1.0 / (1.0 + exp(-a)); }

// float64 reference of Haste's GRU (1406.1078v1, reset gate after R h; gate order z, r, g):
// forward outputs hs [T+1][N][H] and the gradients for dh_new [T+1][N][H] (entry 0 unused).
struct Ref { std::vector<double> hs, dx, dh0, dW, dR, dbx, dbr; };
static Ref reference(const Shape &s, const std::vector<float> &x, const std::vector<float> &h0,
                     const std::vector<float> &W, const std::vector<float> &R,
                     const std::vector<float> &bx, const std::vector<float> &br,
                     const std::vector<float> &dy) {
  const int T = s.T, N = s.N, C = s.C, H = s.H, G = 3 * H;
  Ref o;
  o.hs.assign((size_t)(T + 1) * N * H, 0.0);
  for (size_t i = 0; i < (size_t)N * H; i++) o.hs[i] = h0[i];
  std::vector<double> z((size_t)T * N * H), r(z.size()), g(z.size()), q(z.size()), a(G), b(G);
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      const float *xv = &x[((size_t)t * N + n) * C];
      const double *hv = &o.hs[((size_t)t * N + n) * H];
      for (int j = 0; j < G; j++) { a[j] = bx[j]; b[j] = br[j]; }
      for (int c = 0; c < C; c++)
        for (int j = 0; j < G; j++) a[j] += (double)xv[c] * W[(size_t)c * G + j];
      for (int k = 0; k < H; k++)
        for (int j = 0; j < G; j++) b[j] += hv[k] * R[(size_t)k * G + j];
      for (int k = 0; k < H; k++) {
        size_t i = ((size_t)t * N + n) * H + k;
        z[i] = sigm(a[k] + b[k]);
        r[i] = sigm(a[H + k] + b[H + k]);
        q[i] = b[2 * H + k];
        g[i] = tanh(a[2 * H + k] + r[i] * q[i]);
        o.hs[((size_t)(t + 1) * N + n) * H + k] = z[i] * hv[k] + (1.0 - z[i]) * g[i];
      }
    }
  o.dx.assign((size_t)T * N * C, 0.0);
  o.dh0.assign((size_t)N * H, 0.0);
  o.dW.assign((size_t)C * G, 0.0);
  o.dR.assign((size_t)H * G, 0.0);
  o.dbx.assign(G, 0.0);
  o.dbr.assign(G, 0.0);
  std::vector<double> dh((size_t)N * H, 0.0), da(G), db(G);
  for (int t = T - 1; t >= 0; t--)
    for (int n = 0; n < N; n++) {
      const double *hv = &o.hs[((size_t)t * N + n) * H];
      double *dhv = &dh[(size_t)n * H];
      for (int k = 0; k < H; k++) {
        size_t i = ((size_t)t * N + n) * H + k;
        double d = dhv[k] + dy[((size_t)(t + 1) * N + n) * H + k];
        double dz = d * (hv[k] - g[i]), dg = d * (1.0 - z[i]);
        double dag = dg * (1.0 - g[i] * g[i]);
        double dr = dag * q[i];
        da[k] = db[k] = dz * z[i] * (1.0 - z[i]);
        da[H + k] = db[H + k] = dr * r[i] * (1.0 - r[i]);
        da[2 * H + k] = dag;
        db[2 * H + k] = dag * r[i];
        dhv[k] = d * z[i];
      }
      const float *xv = &x[((size_t)t * N + n) * C];
      double *dxv = &o.dx[((size_t)t * N + n) * C];
      for (int j = 0; j < G; j++) { o.dbx[j] += da[j]; o.dbr[j] += db[j]; }
      for (int c = 0; c < C; c++)
        for (int j = 0; j < G; j++) {
          dxv[c] += W[(size_t)c * G + j] * da[j];
          o.dW[(size_t)c * G + j] += xv[c] * da[j];
        }
      for (int k = 0; k < H; k++)
        for (int j = 0; j < G; j++) {
          dhv[k] += R[(size_t)k * G + j] * db[j];
          o.dR[(size_t)k * G + j] += hv[k] * db[j];
        }
    }
  o.dh0 = dh;
  return o;
}

// max |got - want| / max |want|
static double rel_err(const std::vector<float> &got, const std::vector<double> &want) {
  double e = 0, m = 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    e = std::max(e, fabs((double)got[i] - want[i]));
    m = std::max(m, fabs(want[i]));
  }
  return e / m;
}

struct Stats { double sum = 0, asum = 0; bool finite = true; };
static Stats stats(const std::vector<float> &v) {
  Stats s;
  for (float f : v) {
    if (!std::isfinite(f)) s.finite = false;
    s.sum += f;
    s.asum += fabs(f);
  }
  return s;
}

static float *dalloc(size_t n) {
  float *p;
  CK(cudaMalloc(&p, n * sizeof(float)));
  return p;
}
static float *dupload(const std::vector<float> &v) {
  float *p = dalloc(v.size());
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}
static std::vector<float> download(const float *p, size_t n) {
  std::vector<float> v(n);
  CK(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

template <class F> static double median_ms(F fn, int warm, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; i++) fn();
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(a, 0));
    fn();
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// `haste_bench selftest` (no GPU): the reference's gradients against central differences of
// L = sum over t >= 1 of dh_new[t] . h[t], on a small shape, for a few entries of each input.
static int selftest() {
  const Shape s = {"selftest", 5, 3, 4, 6, true};
  const int G = 3 * s.H;
  std::vector<float> x(s.T * s.N * s.C), h0(s.N * s.H), W(s.C * G), R(s.H * G), bx(G), br(G),
      dy((s.T + 1) * s.N * s.H);
  for (auto *v : {&x, &h0, &W, &R, &bx, &br, &dy})
    for (auto &f : *v) f = urand(0.8f);
  Ref r = reference(s, x, h0, W, R, bx, br, dy);
  auto loss = [&] {
    Ref q = reference(s, x, h0, W, R, bx, br, dy);
    double l = 0;
    for (size_t i = (size_t)s.N * s.H; i < q.hs.size(); i++) l += dy[i] * q.hs[i];
    return l;
  };
  double worst = 0;
  std::vector<float> *in[] = {&x, &h0, &W, &R, &bx, &br};
  const std::vector<double> *gr[] = {&r.dx, &r.dh0, &r.dW, &r.dR, &r.dbx, &r.dbr};
  for (int k = 0; k < 6; k++)
    for (size_t i = 0; i < in[k]->size(); i += 5) {
      float keep = (*in[k])[i];
      const float eps = 1e-2f;
      (*in[k])[i] = keep + eps;
      double lp = loss();
      (*in[k])[i] = keep - eps;
      double lm = loss();
      (*in[k])[i] = keep;
      double fd = (lp - lm) / (2.0 * eps);
      worst = std::max(worst, fabs(fd - (*gr[k])[i]) / std::max(1.0, fabs(fd)));
    }
  printf("selftest: reference gradients vs central differences, worst error %.2e: %s\n", worst,
         worst < 1e-3 ? "ok" : "FAIL");
  return worst < 1e-3 ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "selftest")) return selftest();
  const int reps = argc > 1 ? atoi(argv[1]) : 20, warm = argc > 2 ? atoi(argv[2]) : 5;
  if (reps < 1 || warm < 0) {
    fprintf(stderr, "usage: haste_bench [reps>=1] [warmup>=0]\n");
    return 2;
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int clk = 0;
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  int rt = 0, cbv = 0;
  CK(cudaRuntimeGetVersion(&rt));
  cublasHandle_t hdl;
  CB(cublasCreate(&hdl));
  CB(cublasGetVersion(hdl, &cbv));
  CB(cublasSetMathMode(hdl, CUBLAS_DEFAULT_MATH));
  printf("device %s sm_%d%d, peak SM clock %d MHz, CUDA runtime %d, cuBLAS %d; warm-up %d, median "
         "of %d, CUDA events on stream 0\n",
         p.name, p.major, p.minor, clk / 1000, rt, cbv, warm, reps);
  int failures = 0;
  for (const Shape &s : SHAPES) {
    const int T = s.T, N = s.N, C = s.C, H = s.H, G = 3 * H;
    const size_t NH = (size_t)N * H, TN = (size_t)T * N;
    const float k = 1.0f / sqrtf((float)H);
    std::vector<float> x(TN * C), h0(NH), W((size_t)C * G), R((size_t)H * G), bx(G), br(G),
        dy((T + 1) * NH);
    for (auto &v : x) v = urand(1.0f);
    for (auto &v : h0) v = urand(0.5f);
    for (auto &v : W) v = urand(k);
    for (auto &v : R) v = urand(k);
    for (auto &v : bx) v = urand(k);
    for (auto &v : br) v = urand(k);
    for (auto &v : dy) v = urand(1.0f);
    Ref ref;
    if (s.ref) ref = reference(s, x, h0, W, R, bx, br, dy);
    float *dx_in = dupload(x), *dh0 = dupload(h0), *dW_ = dupload(W), *dR_ = dupload(R),
          *dbx_ = dupload(bx), *dbr_ = dupload(br), *ddy = dupload(dy);
    float *hI = dalloc((T + 1) * NH), *hT = dalloc((T + 1) * NH), *v = dalloc(TN * H * 4),
          *tWx = dalloc(TN * G), *tRh = dalloc(NH * 3), *xt = dalloc(TN * C),
          *Wt = dalloc((size_t)G * C), *Rt = dalloc((size_t)G * H), *gx = dalloc(TN * C),
          *gW = dalloc((size_t)C * G), *gR = dalloc((size_t)H * G), *gbx = dalloc(G),
          *gbr = dalloc(G), *gh = dalloc(NH), *dp = dalloc(TN * G), *dq = dalloc(TN * G);
    auto infer = [&] {
      CK(cudaMemcpyAsync(hI, dh0, NH * sizeof(float), cudaMemcpyDeviceToDevice, 0));
      haste::v0::gru::ForwardPass<float> f(false, N, C, H, hdl, 0);
      f.Run(T, dW_, dR_, dbx_, dbr_, dx_in, hI, nullptr, tWx, tRh, 0.0f, nullptr);
    };
    auto train = [&] {
      CK(cudaMemcpyAsync(hT, dh0, NH * sizeof(float), cudaMemcpyDeviceToDevice, 0));
      {
        haste::v0::gru::ForwardPass<float> f(true, N, C, H, hdl, 0);
        f.Run(T, dW_, dR_, dbx_, dbr_, dx_in, hT, v, tWx, tRh, 0.0f, nullptr);
      }
      transpose(dx_in, xt, (int)TN, C);
      transpose(dW_, Wt, C, G);
      transpose(dR_, Rt, H, G);
      CK(cudaMemsetAsync(gW, 0, (size_t)C * G * sizeof(float), 0));
      CK(cudaMemsetAsync(gR, 0, (size_t)H * G * sizeof(float), 0));
      CK(cudaMemsetAsync(gbx, 0, G * sizeof(float), 0));
      CK(cudaMemsetAsync(gbr, 0, G * sizeof(float), 0));
      CK(cudaMemsetAsync(gh, 0, NH * sizeof(float), 0));
      haste::v0::gru::BackwardPass<float> b(N, C, H, hdl, 0);
      b.Run(T, Wt, Rt, dbx_, dbr_, xt, hT, v, ddy, gx, gW, gR, gbx, gbr, gh, dp, dq, nullptr);
    };
    for (const Math &m : MATHS) {
      g_force = m.force;
      g_overrides = g_tensor_req = 0;
      double tr = median_ms(train, warm, reps), in = median_ms(infer, warm, reps);
      CK(cudaDeviceSynchronize());
      CK(cudaGetLastError());
      long req = g_tensor_req, ovr = g_overrides;
      std::vector<float> oI = download(hI, (T + 1) * NH), oT = download(hT, (T + 1) * NH),
                         ox = download(gx, TN * C), oh = download(gh, NH),
                         oW = download(gW, (size_t)C * G), oR = download(gR, (size_t)H * G),
                         obx = download(gbx, G), obr = download(gbr, G);
      bool ok = true;
      const std::vector<float> *all[] = {&oI, &oT, &ox, &oh, &oW, &oR, &obx, &obr};
      Stats st[8];
      for (int i = 0; i < 8; i++) {
        st[i] = stats(*all[i]);
        ok = ok && st[i].finite;
      }
      // the overrides must have happened (fp32, tf32) or not (shipped), and Haste must ask
      if (req == 0 || (m.force >= 0) != (ovr == req) || (m.force < 0 && ovr != 0)) ok = false;
      char errs[160] = "";
      if (s.ref) {
        double eh = std::max(rel_err(oI, ref.hs), rel_err(oT, ref.hs));
        double eg = std::max({rel_err(ox, ref.dx), rel_err(oh, ref.dh0), rel_err(oW, ref.dW),
                              rel_err(oR, ref.dR), rel_err(obx, ref.dbx), rel_err(obr, ref.dbr)});
        snprintf(errs, sizeof errs, " err_h=%.2e err_grad=%.2e tol=%.0e", eh, eg, m.tol);
        if (!(eh < m.tol && eg < m.tol)) ok = false;
      }
      if (!ok) failures++;
      printf("haste shape=%s T=%d N=%d C=%d H=%d math=%s train_ms=%.3f infer_ms=%.3f "
             "tensor_op_requests=%ld overrides=%ld%s check=%s\n",
             s.name, T, N, C, H, m.name, tr, in, req, ovr, errs, ok ? "ok" : "FAIL");
      printf("  checksum shape=%s math=%s h_infer=%.6e h_train=%.6e dx=%.6e dh0=%.6e dW=%.6e "
             "dR=%.6e dbx=%.6e dbr=%.6e (sums; |h_infer| sum %.6e)\n",
             s.name, m.name, st[0].sum, st[1].sum, st[2].sum, st[3].sum, st[4].sum, st[5].sum,
             st[6].sum, st[7].sum, st[0].asum);
      fflush(stdout);
    }
    float *bufs[] = {dx_in, dh0, dW_, dR_, dbx_, dbr_, ddy, hI, hT, v, tWx, tRh, xt,
                     Wt, Rt, gx, gW, gR, gbx, gbr, gh, dp, dq};
    for (float *b : bufs) CK(cudaFree(b));
  }
  CB(cublasDestroy(hdl));
  printf("haste done: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}

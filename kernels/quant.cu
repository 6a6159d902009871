/*
 * quant.cu: the CUDA backend of fake quantization (front door in core/quant.c, CPU backend in
 * core/quant_cpu.c): per-tensor or per-channel quant / dequant of f32 values into the fake-quantized
 * values, the integer codes and the in-range mask.
 *
 * Each element calls the same qg_quant_real / qg_deq of core/quant_math.h (host/device functions)
 * as the CPU, and this file is compiled with --fmad=false, so codes, masks and dequantized values
 * are bit-identical with the CPU's. The per-channel exponents and zero points arrive as CPU tensors;
 * they go to the device workspace with one small copy (per-tensor ones are kernel arguments).
 */
#include "cuda_common.cuh"
#include "reduce.cuh"
#include "../core/quant_math.h"

/* x [rows, cols]; channel r uses (e, z) = ez[2r], ez[2r+1] when ez is given, else (e0, z0). */
__global__ void fake_quant_forward_kernel(float *fq, int32_t *codes, uint8_t *mask, const float *x, const int32_t *ez, int32_t e0,
                                          int32_t z0, int64_t rows, int64_t cols, int bitwidth, int is_unsigned) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols;
    const qg_qp q = qg_qp_make(bitwidth, is_unsigned, ez ? ez[2 * r] : e0, ez ? ez[2 * r + 1] : z0);
    int m;
    const int64_t code = qg_quant_real((double)x[i], q, &m);
    if (fq) fq[i] = (float)qg_deq(code, q);
    if (codes) codes[i] = (int32_t)code;
    if (mask) mask[i] = (uint8_t)m;
  }
}

extern "C" qg_status qg_cuda_fake_quant(qg_ctx *ctx, qg_tensor *fq, qg_tensor *codes, qg_tensor *mask, const qg_tensor *x,
                                        const qg_tensor *exps, const qg_tensor *zps, int bitwidth, int is_unsigned) {
  const char *fn = "qg_fake_quant";
  const int64_t rows = x->dims[0], cols = x->ndim == 2 ? x->dims[1] : 1;
  if (rows * cols == 0) return QG_OK;
  const int per_channel = exps->numel == rows && (exps->numel != 1 || rows == 1);
  const int32_t *ep = (const int32_t *)exps->data, *zp = (const int32_t *)zps->data;
  int32_t *ez = NULL;
  if (per_channel && rows > 1) {
    /* (e, z) pairs staged in host workspace, then one copy to the device workspace */
    int32_t *h;
    QG_CHECK(qg_workspace(ctx, fn, 2 * rows * (int64_t)sizeof(int32_t), (void **)&h));
    for (int64_t r = 0; r < rows; r++) { h[2 * r] = ep[r]; h[2 * r + 1] = zp[r]; }
    QG_CHECK(qg_dev_workspace(ctx, fn, 2 * rows * (int64_t)sizeof(int32_t), (void **)&ez));
    QG_CHECK(qg_dev_memcpy(ctx, ez, h, 2 * rows * (int64_t)sizeof(int32_t), 0));
  }
  fake_quant_forward_kernel<<<qg_grid(rows * cols), QG_THREADS, 0, qg_cuda_stream(ctx)>>>(
      fq ? (float *)fq->data : NULL, codes ? (int32_t *)codes->data : NULL, mask ? (uint8_t *)mask->data : NULL,
      (const float *)x->data, ez, ep[0], zp[0], rows, cols, bitwidth, is_unsigned);
  return qg_cuda_launched(ctx, fn);
}

/*
 * quant_cpu.c: the CPU backend of fake quantization (quant.c validated the arguments): per-channel
 * or per-tensor quant / dequant of f32 values with the one rounding rule of quant_math.h.
 */
#include "backend.h"
#include "quant_math.h"

qg_status qg_cpu_fake_quant(qg_ctx *ctx, qg_tensor *fq, qg_tensor *codes, qg_tensor *mask, const qg_tensor *x,
                            const qg_tensor *exps, const qg_tensor *zps, int bitwidth, int is_unsigned) {
  (void)ctx;
  const int64_t rows = x->dims[0], cols = x->ndim == 2 ? x->dims[1] : 1;
  const int per_channel = exps->numel == rows && (exps->numel != 1 || rows == 1);
  const int32_t *ep = (const int32_t *)exps->data, *zp = (const int32_t *)zps->data;
  const float *xp = (const float *)x->data;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t c0 = per_channel ? r : 0;
    const qg_qp q = qg_qp_make(bitwidth, is_unsigned, ep[c0], zp[c0]);
    for (int64_t c = 0; c < cols; c++) {
      const int64_t i = r * cols + c;
      int m;
      const int64_t code = qg_quant_real((double)xp[i], q, &m);
      if (fq) ((float *)fq->data)[i] = (float)qg_deq(code, q);
      if (codes) ((int32_t *)codes->data)[i] = (int32_t)code;
      if (mask) ((uint8_t *)mask->data)[i] = (uint8_t)m;
    }
  }
  return QG_OK;
}

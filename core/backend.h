/*
 * backend.h: the seam between the public API and the devices.
 *
 * Every public compute call of qgru.h is a *front door* (core/<op>.c): it validates its
 * arguments once (shapes, dtypes, that all tensors sit on one device, values the host can read)
 * and then hands the call to the backend of that device with QG_DISPATCH:
 *
 *     return QG_DISPATCH(ctx, x->device, linear_forward, y, x, W, b);
 *
 * which calls qg_cpu_linear_forward(ctx, y, x, W, b) (core/<op>_cpu.c) or
 * qg_cuda_linear_forward(ctx, y, x, W, b) (kernels/<op>.cu). Backends trust their arguments; no
 * file other than the front doors asks which device a tensor is on.
 *
 * The backend functions are listed once, in backend_ops.h, as
 *     QG_OP(name, (parameter list), (argument names))
 * This header turns the list into declarations of qg_cpu_<name> and qg_cuda_<name>;
 * core/cuda_stubs.c turns it into weak qg_cuda_<name> stubs. A CPU-only build therefore links
 * stubs that return QG_ERR_NO_CUDA; a CUDA build links the kernels of kernels/, whose strong
 * definitions replace the stubs, and an operation without a kernel yet answers QG_ERR_UNSUPPORTED.
 *
 * Adding a backend function: add its QG_OP line to backend_ops.h, write qg_cpu_<name> in
 * core/<op>_cpu.c, call it through QG_DISPATCH from the front door; the CUDA kernel, when it
 * comes, is a qg_cuda_<name> definition in kernels/<op>.cu with the same parameters.
 */
#ifndef QGRU_BACKEND_H
#define QGRU_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QG_OP(name, params, args) qg_status qg_cpu_##name params; qg_status qg_cuda_##name params;
#include "backend_ops.h"
#undef QG_OP

/* Calls the backend of device dev (QG_CPU or QG_CUDA) for operation op with (ctx, ...). CUDA work
 * needs a CUDA context (its stream orders the work, its cuBLAS handle runs the GEMMs): CUDA tensors
 * given with a CPU context are a QG_ERR_DEVICE failure (qg_need_cuda_context), never a launch on
 * the legacy default stream. */
#define QG_DISPATCH(ctx, dev, op, ...)                                                                   \
  ((dev) == QG_CUDA ? ((ctx)->device == QG_CUDA ? qg_cuda_##op((ctx), __VA_ARGS__)                    \
                                                : qg_need_cuda_context((ctx), "qg_" #op))             \
                    : qg_cpu_##op((ctx), __VA_ARGS__))

/* The failure of a call on CUDA tensors through a CPU context (core/context.c). */
qg_status qg_need_cuda_context(qg_ctx *ctx, const char *fn);

/* The device shared by every non-NULL tensor of ts (n of them), or a QG_ERR_DEVICE failure naming
 * the first tensor that differs (names[i] is the argument name of ts[i]). *device gets the device;
 * when every tensor is NULL it is the context's device. */
qg_status qg_common_device(qg_ctx *ctx, const char *fn, int *device, int n, const qg_tensor *const *ts,
                           const char *const *names);

#ifdef __cplusplus
}
#endif
#endif

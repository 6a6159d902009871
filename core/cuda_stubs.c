/*
 * cuda_stubs.c: a weak qg_cuda_<name> for every backend function of backend_ops.h.
 *
 * In a CPU-only build they are the CUDA backend: each returns QG_ERR_NO_CUDA and says so (a
 * supported configuration, not an error of the caller). In a CUDA build the kernels of kernels/
 * define the same names strongly and the linker keeps those; an operation that has no kernel yet
 * keeps its stub, which answers QG_ERR_UNSUPPORTED naming the operation. Only qg_cuda_* functions
 * live here, so no file outside the front doors asks which device it runs on.
 */
#include "backend.h"

/* Takes the stub's arguments so that every parameter is used (-Wunused-parameter stays on). */
static void take_args(const qg_ctx *ctx, ...) { (void)ctx; }

static qg_status missing_cuda(qg_ctx *ctx, const char *op) {
  if (!qg_dev_available())
    return qg_fail(ctx, QG_ERR_NO_CUDA, op, "libqgru was built without CUDA (no CUDA compiler at configure time); "
                   "use cpu tensors or rebuild with nvcc on the PATH");
  return qg_fail(ctx, QG_ERR_UNSUPPORTED, op, "CUDA kernels for this operation are not in this build yet; use cpu tensors");
}

#define QG_OP(name, params, args) \
  __attribute__((weak)) qg_status qg_cuda_##name params { take_args args; return missing_cuda(ctx, "qg_" #name); }
#include "backend_ops.h"
#undef QG_OP

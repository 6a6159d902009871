/*
 * qgru.h: the public C API of libqgru, and the single source of truth for the LuaJIT FFI.
 *
 * Everything between the QGRU_CDEF_BEGIN and QGRU_CDEF_END markers is plain C99 that the Lua
 * loader (lua/qgru/clib.lua) hands verbatim to ffi.cdef: no macros, no includes, no float
 * constants, integer constants as enums. Nothing on the Lua side is hand-copied.
 *
 * Rules every entry point follows:
 *  - The first argument is the context (qg_ctx*). It owns the device, the CUDA stream, the BLAS
 *    handles, a grow-only workspace and the RNG. There are no hidden globals.
 *  - Every call returns qg_status. C never raises, exits or calls back; on failure the message
 *    (function, what, expected vs got) is kept in the context and read with qg_last_error(ctx).
 *    A failing call leaves its outputs untouched wherever that is possible (checks come first).
 *  - Memory is the caller's: outputs, parameters, gradients and saved activations are tensors
 *    the caller created. Scratch comes from the context workspace, which only grows; nothing is
 *    allocated inside a per-time-step loop.
 *  - Launchers list outputs first, then inputs, then options.
 *  - Gradients ACCUMULATE into their outputs (Torch7 convention) unless documented otherwise.
 *
 * GRU formulation (Haste / cuDNN / PyTorch, "reset after the recurrent matmul", two biases):
 *     z  = sigmoid(Wz x + bxz + Rz h + brz)
 *     r  = sigmoid(Wr x + bxr + Rr h + brr)
 *     g  = tanh   (Wg x + bxg + r * (Rg h + brg))
 *     h' = z * h + (1 - z) * g
 * Gate order is z, r, g. W is [3H, C], R is [3H, H], bx and br are [3H]; row block k*H..(k+1)*H
 * holds gate k. PyTorch's nn.GRU stores r, z, n: importers reorder the row blocks.
 * Sequences are time-major [T, N, C].
 */
#ifndef QGRU_H
#define QGRU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* QGRU_CDEF_BEGIN */

enum { QGRU_ABI_VERSION = 4 };
enum { QG_MAX_DIMS = 4 };

typedef enum {
  QG_OK = 0,
  QG_ERR_ARG = 1,         /* a bad argument: shape, dtype, range, NULL where not allowed */
  QG_ERR_DEVICE = 2,      /* tensors on the wrong device, or a CUDA runtime error */
  QG_ERR_NO_CUDA = 3,     /* the library was built without CUDA, or no CUDA device is present */
  QG_ERR_MEMORY = 4,      /* host or device allocation failed */
  QG_ERR_IO = 5,          /* a file could not be opened, read or written */
  QG_ERR_FORMAT = 6,      /* a file is corrupt or not in the expected format */
  QG_ERR_NOT_FOUND = 7,   /* a named entry does not exist */
  QG_ERR_UNSUPPORTED = 8  /* valid request that this build or backend does not implement */
} qg_status;

typedef enum { QG_F32 = 0, QG_F64 = 1, QG_I8 = 2, QG_U8 = 3, QG_I16 = 4, QG_I32 = 5, QG_I64 = 6 } qg_dtype;
typedef enum { QG_CPU = 0, QG_CUDA = 1 } qg_device;
/* Float GEMM precision on the GPU. STRICT: fp32 everywhere (the default; parity tests use it):
 * fp32 SGEMMs, or, for the integer GRU's STE backward where its weights, input.x and output.h are
 * grids of at most 8 bits, exact int8 split products (qg_exact_split below), which are at least as
 * accurate. TF32: the float GRU, Linear and STE-backward GEMMs may use TF32 tensor cores; the
 * integer GRU's STE backward on its per-step path, under the same condition, runs its GEMMs on
 * bf16 tensor cores instead, the gradient split into two bf16 pieces (16 significant bits, TF32
 * keeps 11; every product exact). The integer forward is exact in every mode; the CPU ignores the
 * setting. */
typedef enum { QG_MATH_STRICT = 0, QG_MATH_TF32 = 1 } qg_math;
/* The strict mode's exact int8 split products in the integer GRU's STE backward on the GPU
 * (kernels/exact_split.cuh): each float gradient as 30-bit fixed-point int8 digits times the
 * at-most-8-bit codes of the other operand on the int8 tensor cores, integer sums, one rounding to
 * fp32 (more accurate than SGEMM, and faster where the GEMMs are large). AUTO (the default): where
 * the operands allow it and the float GEMMs it replaces are large enough to gain (the per-step
 * product 2 N 3H H >= 6e7 flops, or H from 640 to 1024, or >= 2^28 flops above H 1024; the
 * products after the loop together >= 2^32); ON: wherever the operands allow it (tests); OFF: fp32
 * SGEMMs only (comparisons). TF32 mode and the CPU ignore it. */
typedef enum { QG_SPLIT_AUTO = 0, QG_SPLIT_ON = 1, QG_SPLIT_OFF = 2 } qg_exact_split;
/* Which GPU recurrence the GRU forwards/backwards run. AUTO (the default) picks the persistent
 * kernel (R on chip, one launch for all steps) where the shape fits it and the GEMM-per-step
 * fallback otherwise; PERSISTENT and FALLBACK force one (tests run both; a forced PERSISTENT on
 * a shape it cannot hold is a QG_ERR_UNSUPPORTED error naming the limit). The CPU ignores it. */
typedef enum { QG_PATH_AUTO = 0, QG_PATH_PERSISTENT = 1, QG_PATH_FALLBACK = 2 } qg_kernel_path;

typedef struct qg_ctx qg_ctx;

/* A contiguous row-major tensor of up to 4 dimensions. A view (owns_data = 0) points into the
 * memory of another tensor, which the caller keeps alive for as long as the view is used. */
typedef struct qg_tensor {
  void *data;
  int64_t dims[4];
  int32_t ndim;
  int32_t dtype;          /* qg_dtype */
  int32_t device;         /* qg_device */
  int32_t owns_data;
  int64_t numel;
} qg_tensor;

/* ---- library, context, errors ------------------------------------------------------------ */
int qgru_abi_version(void);
int qgru_has_cuda(void);                 /* 1 when built with CUDA, else 0 */
const char *qg_status_name(qg_status s);

/* device: QG_CPU or QG_CUDA; device_index selects the GPU (ignored for CPU). seed seeds the RNG. */
qg_status qg_ctx_create(qg_ctx **out, int device, int device_index, uint64_t seed);
/* qg_ctx_create, and where it fails (there is then no context to hold the message) the reason in
 * why: a caller's buffer of why_bytes bytes, always NUL-terminated, "" on success (why may be NULL
 * when why_bytes is 0). */
qg_status qg_ctx_create_why(qg_ctx **out, int device, int device_index, uint64_t seed, char *why, size_t why_bytes);
void qg_ctx_destroy(qg_ctx *ctx);        /* NULL is allowed */
const char *qg_last_error(const qg_ctx *ctx);
int qg_cuda_device_count(void);          /* 0 without CUDA or without a device */
qg_status qg_ctx_synchronize(qg_ctx *ctx);
int64_t qg_ctx_workspace_bytes(const qg_ctx *ctx);
qg_status qg_ctx_set_math(qg_ctx *ctx, int math);   /* math: a qg_math value */
int qg_ctx_math(const qg_ctx *ctx);
qg_status qg_ctx_set_kernel_path(qg_ctx *ctx, int path);   /* path: a qg_kernel_path value */
int qg_ctx_kernel_path(const qg_ctx *ctx);
qg_status qg_ctx_set_exact_split(qg_ctx *ctx, int mode);   /* mode: a qg_exact_split value */
int qg_ctx_exact_split(const qg_ctx *ctx);
/* Tests and tuning: the shape of the persistent GRU kernels, a cluster of `cluster` blocks (1, 2,
 * 4, 8 or 16) per group of `rows` batch rows (1, 2, 4 or 8), with `splits` threads sharing each
 * hidden unit's dot product (0: chosen; capped at what a block holds); 0, 0, 0 lets each call
 * choose (the default). storage: where R is held, 0 either (chosen), 1 shared memory, 2 registers
 * (small H only; 3 and 4 are taken as 2 by the float GRU). The integer GRU's persistent forward: with
 * storage 0, 1, 3 or 4, the cluster kernel (R's int8 planes in shared memory) with `cluster` CTAs
 * and tiles of 8 x `rows` batch rows (splits does not apply); with storage 2, the small-H kernel
 * (all of R in the registers of one CTA: cluster must be 1; `rows` batch rows per CTA, `splits`
 * lanes per hidden unit, 0 chosen; it runs the 32-bit cell with R and output.h of at most 8 bits,
 * H <= 128, 64 with 8 rows); with storage 5, the small-H kernel with the cell over two roles of
 * warps (the z half on one, the r -> g chain and h on the other; 1 row, 1 lane per unit, H <= 64).
 * Under the automatic shape (0, 0, 0) it takes the small-H kernel (the two-role variant where
 * that holds one row and one lane per unit) wherever that holds the layer in one wave of CTAs,
 * else the cluster kernel. Its STE backward
 * takes cluster, rows, splits and storage (R~ in shared memory: 1, in registers: 2, in registers
 * with the cell on warps of its own, one row per block: 3; as 3 with the cell's inputs prepared on
 * warps of their own: 4; 5 is taken as 2). A call that cannot run the forced
 * shape takes the fallback recurrence under QG_PATH_AUTO and fails with QG_ERR_UNSUPPORTED under
 * QG_PATH_PERSISTENT. */
qg_status qg_ctx_set_persist_shape(qg_ctx *ctx, int cluster, int rows, int splits, int storage);
/* Timing of the work enqueued on the context between the two calls, as a pair of CUDA events on
 * its stream measures it (the method of torch.cuda.Event, so benchmarks compare like with like);
 * on a CPU context, the wall clock between the calls. qg_ctx_timer_stop waits for the stream and
 * writes the elapsed milliseconds to *ms; a stop without a start is QG_ERR_ARG. */
qg_status qg_ctx_timer_start(qg_ctx *ctx);
qg_status qg_ctx_timer_stop(qg_ctx *ctx, double *ms);
/* BLAS threads for the CPU backend (OpenBLAS); n <= 0 leaves the default. */
qg_status qg_set_num_threads(qg_ctx *ctx, int n);
/* Monotonic wall clock in seconds (for progress lines and benchmarks). */
double qg_wall_time(void);

/* Creates directory path and its missing parents (like mkdir -p; mode 0777 & umask). An existing
 * directory is fine; an existing non-directory, or a failure, is an error naming the path
 * component that failed. No shell is involved: path is taken literally. */
qg_status qg_mkdir_p(qg_ctx *ctx, const char *path);

/* RNG: xoshiro256** state, saved in checkpoints. state is uint64_t[4]. */
qg_status qg_rng_seed(qg_ctx *ctx, uint64_t seed);
qg_status qg_rng_get_state(qg_ctx *ctx, uint64_t *state4);
qg_status qg_rng_set_state(qg_ctx *ctx, const uint64_t *state4);

/* ---- tensors ----------------------------------------------------------------------------- */
int qg_dtype_size(int dtype);            /* bytes per element; 0 for an unknown dtype */
const char *qg_dtype_name(int dtype);    /* "f32", ... */
/* New zero-filled tensor. dims has ndim (1..4) entries, each >= 0. */
qg_status qg_tensor_create(qg_ctx *ctx, qg_tensor **out, int dtype, int device, int ndim, const int64_t *dims);
/* A view of src's memory starting offset elements in, with a new shape (numel must fit). */
qg_status qg_tensor_view(qg_ctx *ctx, qg_tensor **out, const qg_tensor *src, int64_t offset, int ndim, const int64_t *dims);
void qg_tensor_free(qg_tensor *t);       /* NULL is allowed; frees data only when owned */

/* Non-finite values of t (f32/f64, any device): *count = how many entries are NaN or +-Inf,
 * *first_index = the flat (row-major) index of the first one, or -1 when there is none. Integer
 * dtypes have no non-finite values (count 0, first_index -1). A CUDA tensor is counted on the
 * device; the two numbers come back to the host (the call synchronizes the context's stream). */
qg_status qg_count_nonfinite(qg_ctx *ctx, int64_t *count, int64_t *first_index, const qg_tensor *t);

/* dst = src elementwise. Same numel; any devices (cpu<->cuda). dtypes may differ when dst and src
 * are on the same device (either one) and do not share memory: every value is converted as
 * (dst type)(double)src by C casts (float->int truncates toward zero; values outside the target
 * type's range are undefined, as in C). */
qg_status qg_copy(qg_ctx *ctx, qg_tensor *dst, const qg_tensor *src);
/* Every element of t (any dtype, any device) = (element type)value (a C cast; 0 and -0 give +0). */
qg_status qg_fill(qg_ctx *ctx, qg_tensor *t, double value);
/* Raw bytes in and out of host memory, for the Lua side (nbytes must equal t's byte size). */
qg_status qg_copy_from_host(qg_ctx *ctx, qg_tensor *dst, const void *host, int64_t nbytes);
qg_status qg_copy_to_host(qg_ctx *ctx, void *host, const qg_tensor *src, int64_t nbytes);
/* f32/f64: uniform in [lo, hi) and normal(mean, std), from the context RNG. */
qg_status qg_uniform(qg_ctx *ctx, qg_tensor *t, double lo, double hi);
qg_status qg_normal(qg_ctx *ctx, qg_tensor *t, double mean, double std);
/* out: i64 [n], a permutation of 0..n-1 drawn from its own generator seeded with seed
 * (stateless, so a data order is a pure function of (seed, epoch)). */
qg_status qg_randperm(qg_ctx *ctx, qg_tensor *out, uint64_t seed);
/* out [len(index), ...] = src[index[i], ...] along dim 0. index: i64 [k], each in [0, src.dims[0])
 * (checked before out is written; on a GPU the check's answer comes back to the host). */
qg_status qg_index_select(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src, const qg_tensor *index);
/* y += alpha * x (f32 or f64, same shape); t *= alpha. */
qg_status qg_axpy(qg_ctx *ctx, qg_tensor *y, double alpha, const qg_tensor *x);
qg_status qg_scale(qg_ctx *ctx, qg_tensor *t, double alpha);
/* *out = sum of squares of t (accumulated in double: in element order on the CPU, in a fixed order
 * that depends only on numel on a GPU, so a result is the same run to run). */
qg_status qg_sum_squares(qg_ctx *ctx, double *out, const qg_tensor *t);
/* out: i64 [N], the index of the largest value of each row of x [N, K] (first on ties). */
qg_status qg_argmax_rows(qg_ctx *ctx, qg_tensor *out, const qg_tensor *x);
/* out [d1, d0, ...] = src [d0, d1, ...] with the first two dims swapped (batch_first <-> time-major). */
qg_status qg_transpose01(qg_ctx *ctx, qg_tensor *out, const qg_tensor *src);

/* Calibration statistics observer (defined with the quantization section below). */
typedef struct qg_stats qg_stats;

/* ---- GRU (one layer, one direction) ----------------------------------------------------------
 * Sizes: T steps, N batch, C inputs, H hidden. All tensors on one device; float tensors f32.
 *   y       [T, N, Hy]  out: columns [y_offset, y_offset + H) of each row get h_t (Hy >= H; a
 *                       bidirectional layer writes fwd at offset 0 and bwd at offset H); 0 at the
 *                       padded time indices t in [L_n, T) of row n
 *   hs      [T+1, N, H] out: hidden states in processing order, hs[0] = h0 (zeros if h0 is NULL),
 *                       hs[s + 1] the state after processing step s; hs[T] is the final state h_n
 *   gates   [T, N, 4H]  out: saved for backward, in processing order like hs: [z, r, g, Rh_g + br_g]
 *                       (zeros at padded steps); NULL at inference
 *   stats   observer or NULL: when given, every operator's float value is added to its row
 *           (QG_Q_*) of stats->range f64 [13, 4] and stats->counts i64 [13, QG_STATS_BINS]:
 *           input.x, matmul.Wx (x W^T), output.h (h0 when given, and every new state),
 *           matmul.Rh (R h, and Rh_g + br_g), gate pre-activations and outputs, op.rRh,
 *           op.old_contrib (z h), op.new_contrib ((1 - z) g). Only valid steps are observed.
 *   x       [T, N, C]   W [3H, C]   R [3H, H]   bx [3H]   br [3H]   h0 [N, H] or NULL
 *   lengths i64 [N] or NULL (every row has T steps): row n has L_n = lengths[n] valid steps,
 *           1 <= L_n <= T (PyTorch's pack_padded_sequence). Processing step s (0..T-1) is valid
 *           for row n iff s < L_n, at time index t = reverse ? L_n - 1 - s : s; an invalid step
 *           leaves the row's state unchanged (hs[s + 1] = hs[s]). So hs[T] is h_n for both
 *           directions, and the reverse direction starts at each row's last valid time index.
 *           Checked on the host (a value outside 1..T is an error naming the row).
 *   reverse 0: process t = 0..L_n-1; 1: t = L_n-1..0
 * Workspace (CPU): about 3*T*N*H + 3*(N + threads)*H + 3*H*(H + C) floats.
 * Device workspace (CUDA): 3*T*N*H + 3*N*H floats per direction. The recurrence follows the
 * context's kernel path (qg_ctx_set_kernel_path) and the GEMMs its math mode (qg_ctx_set_math). */
qg_status qg_gru_forward(qg_ctx *ctx, qg_tensor *y, int y_offset, qg_tensor *hs, qg_tensor *gates, const qg_stats *stats,
                         const qg_tensor *x, const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                         const qg_tensor *h0, const qg_tensor *lengths, int reverse);
/* Backward of qg_gru_forward (training mode: gates must have been saved).
 *   dx      [T, N, C]  out, ACCUMULATED (a bidirectional layer adds both directions); NULL to skip;
 *                      0 is added at padded time indices
 *   dW [3H, C], dR [3H, H], dbx [3H], dbr [3H]  out, ACCUMULATED
 *   dh0     [N, H]     out, OVERWRITTEN with dL/dh0; NULL to skip
 *   dy      [T, N, Hy] gradient of y (columns [y_offset, y_offset + H)); NULL for none; ignored at
 *                      padded time indices
 *   dhn     [N, H]     gradient of the final state hs[T]; NULL for none
 *   x, W, R, hs, gates, lengths, reverse as given to / produced by the forward (padded steps
 *   pass the state gradient through unchanged).
 * Workspace (CPU): about 7*T*N*H + 3*H*H + 2*N*H + 8*threads*H floats.
 * Device workspace (CUDA): 6*T*N*H + 2*N*H + 768*H floats per direction.                        */
qg_status qg_gru_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR, qg_tensor *dbx, qg_tensor *dbr,
                          qg_tensor *dh0, const qg_tensor *dy, int y_offset, const qg_tensor *dhn, const qg_tensor *x,
                          const qg_tensor *W, const qg_tensor *R, const qg_tensor *hs, const qg_tensor *gates,
                          const qg_tensor *lengths, int reverse);

/* Both directions of one bidirectional layer in one call: direction 0 is qg_gru_forward with
 * reverse = 0 and y_offset = 0, direction 1 the one with reverse = 1 and y_offset = H. The GPU runs
 * the two directions at the same time (one persistent launch for both, or two streams); the CPU
 * runs them one after the other. Each array has 2 entries, indexed by direction:
 *   y       [T, N, Hy] with Hy >= 2H, shared (direction d writes columns [d H, (d + 1) H))
 *   hs[d], W[d], R[d], bx[d], br[d]  as in qg_gru_forward
 *   gates   NULL (inference) or an array of 2 gates tensors
 *   h0      NULL (zeros) or an array of 2 [N, H] tensors
 *   x, lengths  shared by both directions. No statistics observer (calibration runs the
 *               directions one by one with qg_gru_forward).                                   */
qg_status qg_gru_forward_bidir(qg_ctx *ctx, qg_tensor *y, qg_tensor *const *hs, qg_tensor *const *gates, const qg_tensor *x,
                               const qg_tensor *const *W, const qg_tensor *const *R, const qg_tensor *const *bx,
                               const qg_tensor *const *br, const qg_tensor *const *h0, const qg_tensor *lengths);
/* Backward of qg_gru_forward_bidir: both directions' qg_gru_backward in one call (at the same time
 * on the GPU). dx is ACCUMULATED with direction 0's gradient, then direction 1's (NULL to skip);
 * dW[d], dR[d], dbx[d], dbr[d] ACCUMULATED; dh0 NULL or an array of 2 (OVERWRITTEN); dy [T, N, Hy]
 * (Hy >= 2H) or NULL; dhn NULL or an array of 2; hs, gates: arrays of 2 as produced by the forward. */
qg_status qg_gru_backward_bidir(qg_ctx *ctx, qg_tensor *dx, qg_tensor *const *dW, qg_tensor *const *dR, qg_tensor *const *dbx,
                                qg_tensor *const *dbr, qg_tensor *const *dh0, const qg_tensor *dy, const qg_tensor *const *dhn,
                                const qg_tensor *x, const qg_tensor *const *W, const qg_tensor *const *R,
                                const qg_tensor *const *hs, const qg_tensor *const *gates, const qg_tensor *lengths);

/* ---- Linear: y [N, O] = x [N, I] W^T + b;  W [O, I], b [O] or NULL ------------------------ */
qg_status qg_linear_forward(qg_ctx *ctx, qg_tensor *y, const qg_tensor *x, const qg_tensor *W, const qg_tensor *b);
/* dx [N, I] OVERWRITTEN; dW [O, I] and db [O] ACCUMULATED. Each may be NULL to skip it. */
qg_status qg_linear_backward(qg_ctx *ctx, qg_tensor *dx, qg_tensor *dW, qg_tensor *db,
                             const qg_tensor *dy, const qg_tensor *x, const qg_tensor *W);

/* ---- losses (mean over the batch) ----------------------------------------------------------
 * Cross-entropy with logits: logits [N, K] f32, target i64 [N] in [0, K).
 * *loss = mean_n (logsumexp(logits_n) - logits_n[target_n]), computed in double. The host numbers
 * these calls return (*loss, *correct) come back from a GPU with one small copy each.
 * dlogits [N, K] OVERWRITTEN with d(mean loss)/dlogits, scaled by scale (NULL to skip).          */
qg_status qg_cross_entropy(qg_ctx *ctx, double *loss, qg_tensor *dlogits,
                           const qg_tensor *logits, const qg_tensor *target, double scale);
/* Classification count: *correct = the number of rows n of logits [N, K] f32 whose largest value
 * (the first one on ties, as qg_argmax_rows) is at index target[n] (target i64 [N]; N, K >= 1). */
qg_status qg_count_correct(qg_ctx *ctx, int64_t *correct, const qg_tensor *logits, const qg_tensor *target);
/* MSE: *loss = mean over all elements of (pred - target)^2; dpred OVERWRITTEN (NULL to skip). */
qg_status qg_mse(qg_ctx *ctx, double *loss, qg_tensor *dpred,
                 const qg_tensor *pred, const qg_tensor *target, double scale);

/* ---- optimizers: per parameter tensor (the reference form) and fused over an arena ------------
 * Per tensor (one parameter tensor per call; f32, all on one device):
 * SGD (PyTorch semantics): g = grad + wd * p; buf = momentum * buf + (1 - dampening) * g
 * (buf = g on the first step); g = nesterov ? g + momentum * buf : buf; p -= lr * g.
 * momentum_buf may be NULL when momentum == 0. first_step is 1 on the first update.           */
qg_status qg_sgd_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *momentum_buf, const qg_tensor *grad,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int first_step);
/* Adam / AdamW (PyTorch semantics). step is the 1-based update count. decoupled = 0: Adam with
 * L2 (g += wd * p); decoupled = 1: AdamW (p *= 1 - lr * wd). grad_scale multiplies the gradient
 * first (gradient-norm clipping passes its factor here, so the gradient itself is not modified). */
qg_status qg_adam_step(qg_ctx *ctx, qg_tensor *param, qg_tensor *exp_avg, qg_tensor *exp_avg_sq,
                       const qg_tensor *grad, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int decoupled, int64_t step, double grad_scale);
/* Fused over a parameter arena: one call per training step, no host round trip per tensor.
 * A model's parameters live in one f32 tensor params [P] and its gradients in grads [P] (see
 * Module:arena in lua/qgru/nn/module.lua); parameter tensor k is the slice [offsets[k], offsets[k+1])
 * of both. The optimizer state (momentum_buf, exp_avg, exp_avg_sq: f32 [P]) has the same layout.
 *   grad_norm  f64 [1] out, on the arena's device, or NULL: the global L2 norm of grads before
 *              clipping = sqrt(sum over k in order of (sum over slice k in element order of g^2,
 *              accumulated in double)): the order of one qg_sum_squares per parameter, fixed.
 *   params, state  f32 [P] in/out, updated in place;  grads f32 [P] in, not modified.
 *   offsets    i64 [K + 1] CPU tensor (the arena's layout, read by the host): 0 = offsets[0] <=
 *              offsets[1] <= ... <= offsets[K] = P, K >= 1.
 *   max_norm   gradient-norm clipping: when max_norm >= 0 and norm > max_norm, every gradient is
 *              multiplied by (float)(max_norm / (norm + 1e-6)) before the update; a negative value
 *              turns clipping off. NaN is an error.
 * Every element is then updated exactly as by qg_sgd_step / qg_adam_step (same hyperparameters,
 * grad_scale = the clip factor), so the result is bit-identical to K per-tensor calls.          */
qg_status qg_sgd_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *momentum_buf,
                            const qg_tensor *grads, const qg_tensor *offsets, double lr, double momentum,
                            double dampening, double weight_decay, int nesterov, int first_step, double max_norm);
qg_status qg_adam_arena_step(qg_ctx *ctx, qg_tensor *grad_norm, qg_tensor *params, qg_tensor *exp_avg,
                             qg_tensor *exp_avg_sq, const qg_tensor *grads, const qg_tensor *offsets, double lr,
                             double beta1, double beta2, double eps, double weight_decay, int decoupled,
                             int64_t step, double max_norm);

/* ---- files --------------------------------------------------------------------------------
 * IDX (MNIST format), optionally gzip-compressed: *out is a new CPU tensor of the file's dtype
 * (u8, i8, i16, i32, f32, f64) and shape (1..4 dims). Sizes are checked against the file length. */
qg_status qg_idx_load(qg_ctx *ctx, qg_tensor **out, const char *path);
/* NumPy .npy (version 1.x/2.x, little-endian, C order; dtypes f4 f8 i1 u1 i2 i4 i8, also b1 as u8). */
qg_status qg_npy_load(qg_ctx *ctx, qg_tensor **out, const char *path);
qg_status qg_npy_save(qg_ctx *ctx, const char *path, const qg_tensor *t);

/* safetensors: a header (u64 little-endian length + JSON) then raw little-endian data.
 * Reader: qg_st_open parses and validates the whole header (dtypes, shapes, offsets inside the
 * file, no overlaps); entries are then listed by index and read by name into a caller tensor of
 * the same dtype and shape (any device). */
typedef struct qg_st_file qg_st_file;
qg_status qg_st_open(qg_ctx *ctx, qg_st_file **out, const char *path);
void qg_st_close(qg_st_file *f);                                  /* NULL is allowed */
int64_t qg_st_count(const qg_st_file *f);
/* Entry i (0-based, sorted by name): its name, dtype, ndim and dims (int64_t[4]). */
qg_status qg_st_entry(qg_ctx *ctx, const qg_st_file *f, int64_t i, const char **name,
                      int *dtype, int *ndim, int64_t *dims);
qg_status qg_st_read(qg_ctx *ctx, const qg_st_file *f, const char *name, qg_tensor *dst);
/* __metadata__ value for key, or NULL when absent. Valid until qg_st_close. */
const char *qg_st_metadata(const qg_st_file *f, const char *key);
int64_t qg_st_metadata_count(const qg_st_file *f);
const char *qg_st_metadata_key(const qg_st_file *f, int64_t i);

/* Writer: add tensors (the writer keeps the pointer; the tensor must live until save) and
 * metadata strings, then save. The file is written to path.tmp and renamed, so a failed save
 * never leaves a half-written file at path. */
typedef struct qg_st_writer qg_st_writer;
qg_status qg_st_writer_create(qg_ctx *ctx, qg_st_writer **out);
void qg_st_writer_free(qg_st_writer *w);                          /* NULL is allowed */
qg_status qg_st_writer_add(qg_ctx *ctx, qg_st_writer *w, const char *name, const qg_tensor *t);
qg_status qg_st_writer_metadata(qg_ctx *ctx, qg_st_writer *w, const char *key, const char *value);
qg_status qg_st_writer_save(qg_ctx *ctx, qg_st_writer *w, const char *path);

/* ---- quantization (../shared/QUANT_SPEC.md) ------------------------------------------------
 * quant(x) = clamp(rne(x * 2^e) + z, qmin, qmax), deq(q) = (q - z) * 2^-e, rne = round half to
 * even. Grids: signed [-2^(b-1), 2^(b-1) - 1], unsigned [0, 2^b - 1]; bitwidth b in 1..32,
 * exponent e in -31..31. The activation operators of one GRU layer and direction, per tensor: */
enum {
  QG_Q_INPUT_X = 0, QG_Q_OUTPUT_H = 1, QG_Q_MATMUL_WX = 2, QG_Q_MATMUL_RH = 3,
  QG_Q_Z_PRE = 4, QG_Q_R_PRE = 5, QG_Q_G_PRE = 6, QG_Q_Z_OUT = 7, QG_Q_R_OUT = 8, QG_Q_G_OUT = 9,
  QG_Q_RRH = 10, QG_Q_OLD = 11, QG_Q_NEW = 12, QG_Q_NUM_ACT = 13
};
/* and per channel (3H rows, gate order z, r, g): */
enum { QG_W_W = 0, QG_W_R = 1, QG_W_BX = 2, QG_W_BR = 3, QG_W_NUM = 4 };
enum { QG_STATS_BINS = 2048 };
/* Calibration statistics of `rows` quantizers (QUANT_SPEC.md section 5), filled by observers
 * (the float and integer GRU forwards take a qg_stats* that is NULL when nothing is observed):
 *   range   f64 [rows, 4]              min, max, lo, hi of each row
 *   counts  i64 [rows, QG_STATS_BINS]  histogram counts over [lo, hi], kept when hi > lo
 * Counts are integers and min/max do not depend on order, so every device fills them alike.
 * The GRU forwards use one row per activation operator, indexed by QG_Q_*. */
struct qg_stats {
  qg_tensor *range;
  qg_tensor *counts;
};
enum { QG_CALIB_MINMAX = 0, QG_CALIB_HISTOGRAM = 1, QG_CALIB_MSE = 2, QG_CALIB_PERCENTILE = 3 };

/* One per-tensor quantizer. */
typedef struct qg_qspec {
  int32_t bitwidth;
  int32_t is_unsigned;
  int32_t exp2_inv;
  int32_t zero_point;
} qg_qspec;

/* ---- operators, grids, rounding: the one definition the Lua side reads -----------------------
 * The 17 operators in the seed config's order: i in 0..QG_NUM_OPS-1. *slot gets the QG_Q_* index of
 * an activation operator or the QG_W_* index of a weight operator, *is_weight which of the two.
 * qg_op_lookup also accepts the aliases weight.bx (= weight.bw) and input.h (= output.h) and
 * returns QG_ERR_NOT_FOUND for other names. qg_act_name(QG_Q_*) and qg_weight_name(QG_W_*) name
 * the slots. */
enum { QG_NUM_OPS = 17, QG_LUT_MAX_BITS = 16 };
const char *qg_op_name(int i);
qg_status qg_op_lookup(qg_ctx *ctx, const char *name, int *index, int *is_weight, int *slot);
const char *qg_act_name(int op);
const char *qg_weight_name(int w);
/* Round half to even of x (the one rounding rule), as a double holding an integer. */
double qg_round_half_even(double x);
/* (e, z) of a fixed-range activation output: fn 0 sigmoid [0, 1), 1 tanh [-1, 1). */
qg_status qg_fixed_range(qg_ctx *ctx, int32_t *exp2_inv, int32_t *zero_point, int fn, int bitwidth, int is_unsigned);

/* Grid of a quantizer; fails for a bitwidth outside 1..32. */
qg_status qg_quant_grid(qg_ctx *ctx, int bitwidth, int is_unsigned, int64_t *qmin, int64_t *qmax);
/* q = clamp(rne(x * 2^e) + z), *in_range = the mask M(x). */
qg_status qg_quantize_scalar(qg_ctx *ctx, int64_t *q, int *in_range, double x, const qg_qspec *spec);
/* Requantization of integer v held at scale 2^-s to spec (QUANT_SPEC.md section 1). */
qg_status qg_requant_scalar(qg_ctx *ctx, int64_t *q, int *in_range, int64_t v, int s, const qg_qspec *spec);

/* Fake quantization with one (e, z) per channel (rows of x [rows, cols], or elements of x [rows];
 * exps and zps i32 [rows]) or per tensor (exps and zps of one element).
 *   fq    f32 like x: deq(quant(x))        codes  i32 like x (or NULL)      mask  u8 like x (or NULL) */
qg_status qg_fake_quant(qg_ctx *ctx, qg_tensor *fq, qg_tensor *codes, qg_tensor *mask, const qg_tensor *x,
                        const qg_tensor *exps, const qg_tensor *zps, int bitwidth, int is_unsigned);

/* Activation table: lut i32 [2 * 2^bits(pre)] on the host: lut[q - qmin(pre)] = quant_out(f(deq_pre(q)))
 * and lut[2^bits(pre) + q - qmin(pre)] = its in-range mask; f in double; fn 0 = sigmoid, 1 = tanh.
 * pre must have at most QG_LUT_MAX_BITS bits. (The layer builds its own; this is for export and tests.) */
qg_status qg_build_act_table(qg_ctx *ctx, qg_tensor *lut, const qg_qspec *pre, const qg_qspec *out, int fn);

/* ---- the integer GRU layer (QUANT_SPEC.md sections 3 and 4) -----------------------------------
 * One handle per layer and direction, living on the context's device. It holds the resolved
 * quantizers, the activation tables of the forward and the value / derivative tables of the
 * backward (rebuilt once after a quantizer they depend on changes, never per call), and the
 * weight codes, fake-quantized weights and masks of the weights its last forward was given.
 * Setters validate everything and change nothing on failure. The forward is the integer step
 * (the QAT forward is integer inference by construction); the backward is the clipped STE.
 * GEMMs with operands of <= 16 bits are exact; wider operands are simulated in double and
 * pre-activations above 16 bits evaluate f in double (both not integer-deployable). */
typedef struct qg_int_gru qg_int_gru;
/* C inputs, H hidden units (each 1..2^20). */
qg_status qg_int_gru_create(qg_ctx *ctx, qg_int_gru **out, int64_t input_size, int64_t hidden_size);
void qg_int_gru_free(qg_int_gru *g);                     /* NULL is allowed */
/* Activation quantizer op (QG_Q_*). gate.z_out needs exp2_inv >= 0 (1 - z is 2^e - (q - z)). */
qg_status qg_int_gru_set_act(qg_ctx *ctx, qg_int_gru *g, int op, const qg_qspec *spec);
/* Weight quantizer w (QG_W_*), per channel: exps and zps i32 [3H] (cpu tensors), rows in gate order. */
qg_status qg_int_gru_set_weight_quant(qg_ctx *ctx, qg_int_gru *g, int w, int bitwidth, int is_unsigned,
                                      const qg_tensor *exps, const qg_tensor *zps);
/* Weight quantizer w (QG_W_*) derived per channel from the weight's current values, exactly as
 * qg_calibrate_channels would (method QG_CALIB_*, percentile in (50, 100] for QG_CALIB_PERCENTILE),
 * then set as qg_int_gru_set_weight_quant would. values: f32 W [3H, C], R [3H, H], bx or br [3H],
 * on the layer's device, with a context of that device. On a GPU, symmetric minmax (the default
 * for weights, and what tracking weights runs each forward) runs on the device, ordered on the
 * context's stream, with no host synchronisation and no allocation: the layer's copy is written
 * there and read back by qg_int_gru_weight_quant when asked. Other methods and asymmetric
 * quantizers read the weight to the host first. */
qg_status qg_int_gru_calibrate_weight(qg_ctx *ctx, qg_int_gru *g, int w, const qg_tensor *values, int bitwidth,
                                      int is_symmetric, int is_unsigned, int method, double percentile);
/* One weight's request for qg_int_gru_calibrate_weights: calibrate (0: leave the quantizer alone),
 * then the arguments of qg_int_gru_calibrate_weight. */
typedef struct qg_wcalib {
  int calibrate;
  int bitwidth, is_symmetric, is_unsigned, method;
  double percentile;
} qg_wcalib;
/* qg_int_gru_calibrate_weight for the four weights in one call: specs[QG_W_NUM] (QG_W_* order) and
 * the weights W [3H, C], R [3H, H], bx, br [3H] (f32 on the layer's device; those not calibrated
 * may be NULL). Every request is checked before any is applied; the ones that run on the device
 * share one launch (tracking weights calls this once per layer and forward). */
qg_status qg_int_gru_calibrate_weights(qg_ctx *ctx, qg_int_gru *g, const qg_wcalib *specs, const qg_tensor *W,
                                       const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br);
/* The per-channel exponents and zero points of weight quantizer w (QG_W_*) as the layer holds them,
 * into exps and zps: i32 [3H] cpu tensors, each may be NULL. After qg_int_gru_calibrate_weight on
 * a GPU this waits for the device (the context must be the layer's). */
qg_status qg_int_gru_weight_quant(qg_ctx *ctx, qg_int_gru *g, int w, qg_tensor *exps, qg_tensor *zps);
/* 1 when every quantizer has been set; else 0 and *missing names the first unset one. */
int qg_int_gru_ready(const qg_int_gru *g, const char **missing);
/* Bytes of saved cell state per (step, batch row, unit): codes of z_pre, r_pre, g_pre and
 * Rh_g + br_g (2 bytes each when all four have <= 16 bits, else 4) plus a 32-bit mask word. */
int qg_int_gru_cell_bytes(const qg_int_gru *g);
/* The weight quantizers applied to W [3H, C], R [3H, H], bx [3H], br [3H] (f32): the layer keeps
 * the codes, fake-quantized values and masks (the forward does this itself). */
qg_status qg_int_gru_quantize_weights(qg_ctx *ctx, qg_int_gru *g, const qg_tensor *W, const qg_tensor *R,
                                      const qg_tensor *bx, const qg_tensor *br);
/* Copies weight w's (QG_W_*) codes (i32), fake-quantized values (f32) and masks (u8), shaped like
 * the weight, into caller tensors on any device; each may be NULL. */
qg_status qg_int_gru_weights(qg_ctx *ctx, const qg_int_gru *g, int w, qg_tensor *codes, qg_tensor *fq, qg_tensor *mask);

/* What a training forward keeps for the backward (caller-owned, on the layer's device):
 *   hq     i32 [T+1, N, H]  output.h codes in processing order (hq[0] = codes of h0, or of 0)
 *   cell   u8 [T, N, H, qg_int_gru_cell_bytes(g)]  per-unit codes and mask bits
 *   xq     i32 [T, N, C]  input.x codes        xmask  u8 [T, N, C]  input.x in-range masks */
typedef struct qg_int_gru_saved {
  qg_tensor *hq;
  qg_tensor *cell;
  qg_tensor *xq;
  qg_tensor *xmask;
} qg_int_gru_saved;

/* Forward of one layer and direction over T steps.
 *   y      f32 [T, N, Hy]  out: columns [y_offset, y_offset + H) get deq_h(q_h) at valid steps, 0 at
 *                          padded ones (t >= lengths[n])
 *   hn     f32 [N, H] or NULL   out: the dequantized final state (after lengths[n] steps)
 *   saved  as above when training (the backward needs it); NULL at inference
 *   stats  NULL, or the observer of QG_Q_NUM_ACT rows: each operator's real value before its
 *          quantizer, at valid steps only
 *   x f32 [T, N, C]; W, R, bx, br f32 (float weights, quantized here); h0 f32 [N, H] or NULL;
 *   lengths NULL or i64 [N] in 1..T; reverse as in qg_gru_forward (same variable-length rules). */
qg_status qg_int_gru_forward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *y, int y_offset, qg_tensor *hn,
                             const qg_int_gru_saved *saved, const qg_stats *stats, const qg_tensor *x,
                             const qg_tensor *W, const qg_tensor *R, const qg_tensor *bx, const qg_tensor *br,
                             const qg_tensor *h0, const qg_tensor *lengths, int reverse);
/* Which integer arithmetic the layer's last forward ran (diagnostics and tests; each is bit-exact
 * with the others): QG_CELL_32 the vectorized cell on 32-bit lanes (int_gru_cell.h qg_cell32_*)
 * with float32 GEMMs of the codes (on CUDA: the same cell in the persistent kernel, int8
 * tensor-core GEMMs; reading it then waits for the device), QG_CELL_32_BYTES the same with byte
 * GEMMs (AVX-512 VNNI),
 * QG_CELL_64 and QG_CELL_128 the general cell on 64- or 128-bit integers; QG_CELL_NONE before any
 * forward, or when the backend does not say. */
enum { QG_CELL_NONE = 0, QG_CELL_32 = 1, QG_CELL_32_BYTES = 2, QG_CELL_64 = 3, QG_CELL_128 = 4 };
int qg_int_gru_cell_path(const qg_int_gru *g);
/* Straight-through backward of QUANT_SPEC.md section 4 (float32), after a training forward.
 *   dx [T, N, C] ACCUMULATED (masked by input.x), or NULL; dW, dR, dbx, dbr ACCUMULATED (masked by
 *   the weight masks); dh0 [N, H] OVERWRITTEN (masked by output.h on h0), or NULL;
 *   dy [T, N, Hy] (columns [y_offset, y_offset + H)) or NULL; dhn [N, H] or NULL;
 *   saved, h0, lengths, reverse as given to the forward. */
qg_status qg_int_gru_backward(qg_ctx *ctx, qg_int_gru *g, qg_tensor *dx, qg_tensor *dW, qg_tensor *dR,
                              qg_tensor *dbx, qg_tensor *dbr, qg_tensor *dh0, const qg_tensor *dy, int y_offset,
                              const qg_tensor *dhn, const qg_int_gru_saved *saved, const qg_tensor *h0,
                              const qg_tensor *lengths, int reverse);

/* Both directions of one quantized bidirectional layer in one call: direction 0 is
 * qg_int_gru_forward with reverse = 0 and y_offset = 0, direction 1 the one with reverse = 1 and
 * y_offset = H; the same results as those two calls, bit for bit. The GPU runs the two directions
 * at the same time: direction 1 on the context's peer, a second context on the same device that
 * the first such call creates (its own streams, cuBLAS handles and workspace; freed with the
 * context); the CPU runs them one after the other. Every argument of both directions is checked
 * before anything runs. Arrays of 2 entries, indexed by direction:
 *   g[d]              the directions' layers (distinct, the same C and H, on the context's device)
 *   W[d], R[d], bx[d], br[d]   as in qg_int_gru_forward
 *   hn     NULL, or an array of 2 ([N, H] or NULL each)
 *   saved  NULL (inference), or an array of 2 (training)
 *   h0     NULL (zeros), or an array of 2 ([N, H] or NULL each)
 *   y [T, N, Hy] with Hy >= 2H, x [T, N, C], lengths: shared by both directions. No statistics
 *   observer (calibration runs the directions one by one with qg_int_gru_forward). */
qg_status qg_int_gru_forward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *y, qg_tensor *const *hn,
                                   const qg_int_gru_saved *const *saved, const qg_tensor *x, const qg_tensor *const *W,
                                   const qg_tensor *const *R, const qg_tensor *const *bx, const qg_tensor *const *br,
                                   const qg_tensor *const *h0, const qg_tensor *lengths);
/* Backward of qg_int_gru_forward_bidir: both directions' qg_int_gru_backward in one call (at the
 * same time on the GPU, direction 1 on the peer). dx [T, N, C] ACCUMULATED with direction 0's
 * gradient, then direction 1's (on the GPU direction 1's goes to a buffer of the context first and
 * is added after both finish), or NULL; dW[d], dR[d], dbx[d], dbr[d] ACCUMULATED; dh0, dhn, h0 NULL
 * or arrays of 2 (entries may be NULL); dy [T, N, Hy] (Hy >= 2H) or NULL; saved: the array of 2
 * given to the training forward; lengths as given to it. */
qg_status qg_int_gru_backward_bidir(qg_ctx *ctx, qg_int_gru *const *g, qg_tensor *dx, qg_tensor *const *dW,
                                    qg_tensor *const *dR, qg_tensor *const *dbx, qg_tensor *const *dbr, qg_tensor *const *dh0,
                                    const qg_tensor *dy, const qg_tensor *const *dhn, const qg_int_gru_saved *const *saved,
                                    const qg_tensor *const *h0, const qg_tensor *lengths);

/* ---- calibration statistics and methods (QUANT_SPEC.md section 5) ---------------------------
 * qg_stats_reset: min = +inf, max = -inf, lo = hi = 0 (min/max mode), counts zeroed.
 * qg_stats_begin_histogram: lo, hi = the row's min, max (widened to include 0), counts zeroed;
 * later observations are also counted (values outside [lo, hi] go to the edge bins).
 * qg_stats_add: observes the values of an f32 or f64 tensor in row `row`. */
qg_status qg_stats_reset(qg_ctx *ctx, const qg_stats *stats);
qg_status qg_stats_begin_histogram(qg_ctx *ctx, const qg_stats *stats);
qg_status qg_stats_add(qg_ctx *ctx, const qg_stats *stats, int row, const qg_tensor *values);
/* Chooses (e, z) for a quantizer from a stats row (method QG_CALIB_*; percentile in (50, 100]).
 * *cost receives the method's cost of the choice (0 for minmax and percentile). */
qg_status qg_calibrate_row(qg_ctx *ctx, int32_t *exp2_inv, int32_t *zero_point, double *cost,
                           const qg_stats *stats, int row, int bitwidth, int is_symmetric, int is_unsigned,
                           int method, double percentile);
/* Per-channel calibration of weights w [rows, cols] or [rows] from their values: exps, zps i32 [rows]
 * on the host. w may live on either device: on a GPU the minmax method reduces each row there and
 * brings back two numbers per row; the other methods copy w to the host. */
qg_status qg_calibrate_channels(qg_ctx *ctx, qg_tensor *exps, qg_tensor *zps, const qg_tensor *w, int bitwidth,
                                int is_symmetric, int is_unsigned, int method, double percentile);

/* ---- JSON (cJSON), read-only DOM for the Lua side --------------------------------------------
 * qg_json_parse: errors give the line and column of the problem. Nodes are read with the accessors
 * (type QG_JSON_*, key in the parent object, first child, next sibling, number, string) and live
 * until qg_json_free(root). */
enum { QG_JSON_NULL = 0, QG_JSON_FALSE = 1, QG_JSON_TRUE = 2, QG_JSON_NUMBER = 3, QG_JSON_STRING = 4,
       QG_JSON_ARRAY = 5, QG_JSON_OBJECT = 6 };
typedef struct qg_json qg_json;
qg_status qg_json_parse(qg_ctx *ctx, qg_json **root, const char *text, int64_t length, const char *source_name);
void qg_json_free(qg_json *root);
int qg_json_type(const qg_json *node);
const char *qg_json_key(const qg_json *node);
const qg_json *qg_json_child(const qg_json *node);
const qg_json *qg_json_next(const qg_json *node);
double qg_json_number(const qg_json *node);
const char *qg_json_string(const qg_json *node);

/* QGRU_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* QGRU_H */

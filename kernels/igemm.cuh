/*
 * igemm.cuh: the host interface of kernels/igemm_sm90.cu, an int8 x int8 -> int32 GEMM on
 * Hopper's asynchronous tensor cores (wgmma) fed by the tensor memory accelerator (TMA), for the
 * exact split's products (exact_split.cuh) where cuBLAS cannot go: launched as a programmatic
 * dependent of the kernel before it, with the operand that kernel does not write (B: the weights'
 * codes) loaded before griddepcontrol.wait.
 *
 * C [slice][M][N] (int32, row stride ldc, slices slice_stride elements apart) = A [M][K] B [N][K]^T
 * over the slice's K range; A and B int8, K-contiguous (cuBLAS's "TN"), row strides multiples of
 * 16 bytes and bases 16-byte aligned (TMA's rules); M, N, K any (TMA fills the tiles beyond the
 * matrices with zeros; only the matrix's elements are stored). The sums are integers, exact in any
 * order: the same values as cublasGemmEx's CUBLAS_COMPUTE_32I product while 128 * 128 * K < 2^31.
 *
 * Needs sm_90 with the sm_90a instructions (igemm_sm90.cu is built for sm_90a only): ig_available
 * says whether the current device runs it; where it does not, callers keep cuBLAS.
 * Nothing is allocated: a plan holds the two tensor maps (encoded on the host, passed to the
 * kernel by value) and the sizes; launches take the caller's stream.
 */
#ifndef QGRU_IGEMM_CUH
#define QGRU_IGEMM_CUH

#include <cuda.h>   /* CUtensorMap */
#include <cuda_runtime.h>
#include <stdint.h>

/* A product's tensor maps and sizes, made by ig_plan_init and launched any number of times
 * while its matrices stay where they were. */
struct ig_plan {
  CUtensorMap ta, tb;
  int64_t M, N, K, ldc, slice_stride;
  int slices;    /* K slices actually used (<= the requested count: no slice is empty) */
  int k_tiles;   /* K tiles of 128 bytes per slice */
  int bn;        /* block tile columns: 64 or 128 */
};

/* 1 where the current device can run igemm_sm90.cu's kernels (compute capability 9.0 and a driver
 * with cuTensorMapEncodeTiled), else 0. */
int ig_available(void);

/* A [M][K] (row stride lda bytes), B [N][K] (ldb), C rows of ldc int32, up to `slices` K slices
 * slice_stride elements apart, block tiles of 128 x bn (bn 64 or 128). Returns 0, or -1 (a size
 * out of range, a layout TMA cannot take, no encoder) and leaves *p as it was. */
int ig_plan_init(ig_plan *p, const int8_t *A, int64_t lda, const int8_t *B, int64_t ldb, int64_t M, int64_t N, int64_t K, int64_t ldc,
                 int slices, int64_t slice_stride, int bn);

/* Enqueues the plan's product into C on stream st: as a programmatic dependent of the kernel before
 * it on st (pdl: A is read and C written only after that kernel has completed), b_first: B's
 * first stages loaded before that wait (B must not be written by that kernel). The kernel lets
 * its own programmatic dependents launch once its products are done. */
cudaError_t ig_launch(const ig_plan *p, int32_t *C, cudaStream_t st, int pdl, int b_first);

#if QG_KTRACE   /* timing-only builds (ktrace.cuh): the trace record of the next ig_launch */
struct kt_rec;
void ig_kt_set(kt_rec *r);
#endif

#endif

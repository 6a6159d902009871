/*
 * ptx_s8.cuh: the inline-PTX wrappers of the int8 tensor-core kernels that keep operands in shared
 * memory and hand work between blocks through global counters: mma.sync m16n8k32 s8, ldmatrix
 * .x4, a 16-byte cp.async to a shared address, and the acquire load / release add of an arrival
 * counter. One definition for the integer forward (kernels/int_gru.cu, int_gru_grid.cuh) and the
 * bench programs that prototype such kernels (bench/xs_grid_proto.cu).
 */
#ifndef QGRU_PTX_S8_CUH
#define QGRU_PTX_S8_CUH

#include <stdint.h>

/* D += A B on the int8 tensor cores: m16n8k32, A row-major (4 regs), B column-major (2 regs). */
__device__ __forceinline__ void mma_s8(int32_t *d, const uint32_t *a, const uint32_t *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ldmatrix .x4: four 8 x 16-byte matrices from shared memory, lane l giving the address of row
 * l % 8 of matrix l / 8; thread t receives the 4 bytes at row t / 4, bytes 4 (t % 4) of each, which
 * is the layout of an int8 mma.sync fragment register. */
__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(saddr));
}

/* 16 bytes global -> shared (a shared address, cvta'd once by the caller), bypassing L1 */
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t *p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* *p += v with release semantics at GPU scope (the writes this thread observed, the block's
 * stores ordered before it by a barrier included, are visible to an acquire that reads the sum) */
__device__ __forceinline__ void red_release_gpu(int32_t *p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

#endif

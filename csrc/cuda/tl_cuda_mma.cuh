/* The instructions of the pipelined tile kernels (tl_cuda_ig_pipelined.cu,
 * tl_cuda_fod_pipelined.cu), sm_80 and later: cp.async copies from global to
 * shared memory, ldmatrix fragment loads, the m16n8k16 tensor-core
 * multiply-add in fp16 and bf16 and the m16n8k8 one in TF32.  TL_PIPE_DEVICE is defined where they
 * exist; elsewhere each compiles to nothing (the kernels then trap, and
 * their host checks never launch them there). */
#ifndef TL_CUDA_MMA_CUH
#define TL_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TL_PIPE_DEVICE 1
#endif

/* 16 bytes from global src to shared dst, or 16 zero bytes when !valid
 * (src is then not read: its source size is 0). */
__device__ __forceinline__ void tl_cp_async16(void *dst, const void *src, bool valid) {
#ifdef TL_PIPE_DEVICE
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
#else
    (void)dst, (void)src, (void)valid;
#endif
}

__device__ __forceinline__ void tl_cp_commit() {
#ifdef TL_PIPE_DEVICE
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Waits until at most N of this thread's committed copy groups are pending.
 * The "memory" clobbers keep the compiler from moving a plain shared-memory
 * access (TF32 rounding reads its own copies right after this wait, before
 * any barrier) across the copy instructions. */
template <int N> __device__ __forceinline__ void tl_cp_wait() {
#ifdef TL_PIPE_DEVICE
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Four 8 x 8 matrices of 16-bit values from shared memory, lane l giving
 * the address of row l % 8 of matrix l / 8; r[i] receives matrix i's
 * (row lane / 4, columns 2 (lane % 4) + 0, 1), or with TRANS its
 * (rows 2 (lane % 4) + 0, 1, column lane / 4). */
template <bool TRANS> __device__ __forceinline__ void tl_ldmatrix4(unsigned r[4], const void *row) {
#ifdef TL_PIPE_DEVICE
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#else
    (void)row;
    r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

/* One mma.sync of SHAPE_TYPES ("m16n8k16.row.col.f32.f16.f16.f32", ...):
 * c[0..3] += a[0..3] b[0..1], in place. */
#define TL_MMA_SYNC(SHAPE_TYPES, c, a, b)                                                    \
    asm volatile("mma.sync.aligned." SHAPE_TYPES                                             \
                 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                  \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

/* c (16 x 8 fp32) += a (16 x 16) b (16 x 8), fp16 or bf16 operands in the
 * register layouts of PTX's mma.m16n8k16 (row.col). */
template <typename T>
__device__ __forceinline__ void tl_mma16816(float c[4], const unsigned a[4], const unsigned b[2]) {
#ifdef TL_PIPE_DEVICE
    if (std::is_same<T, __half>::value)
        TL_MMA_SYNC("m16n8k16.row.col.f32.f16.f16.f32", c, a, b);
    else
        TL_MMA_SYNC("m16n8k16.row.col.f32.bf16.bf16.f32", c, a, b);
#else
    (void)c, (void)a, (void)b;
#endif
}

/* c (16 x 8 fp32) += a (16 x 8) b (8 x 8), TF32 operands (already rounded)
 * in the register layouts of PTX's mma.m16n8k8 (row.col): a0..a3 at (row
 * lane / 4, + 8, + 0, + 8; column lane % 4, + 0, + 4, + 4), b0, b1 at
 * (k lane % 4, + 4; column lane / 4); c as mma.m16n8k16's. */
__device__ __forceinline__ void tl_mma1688_tf32(float c[4], const unsigned a[4],
                                                const unsigned b[2]) {
#ifdef TL_PIPE_DEVICE
    TL_MMA_SYNC("m16n8k8.row.col.f32.tf32.tf32.f32", c, a, b);
#else
    (void)c, (void)a, (void)b;
#endif
}

/* The 4 floats at p (16-byte aligned, shared memory) rounded to TF32 in
 * place (round to nearest, ties away: cvt.rna, as the tensor cores expect). */
__device__ __forceinline__ void tl_round_tf32x4(float *p) {
#ifdef TL_PIPE_DEVICE
    float4 v = *reinterpret_cast<float4 *>(p);
    float *e = &v.x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        unsigned u;
        asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(e[i]));
        e[i] = __uint_as_float(u);
    }
    *reinterpret_cast<float4 *>(p) = v;
#else
    (void)p;
#endif
}

/* Host side: whether the current device runs `kernel` (one of the
 * pipelined kernels) from sm_80 or later code.  A build whose only image for
 * this device is older PTX would JIT the trapping body. */
static inline bool tl_pipe_code_ok(const void *kernel) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError(); /* not the call's failure: the other kernel runs */
        return false;
    }
    return fa.ptxVersion >= 80;
}

#endif

// Instruction-set variants of bnn's core kernels: the Isa enum that the ops' `isa` attribute
// resolves to, what this CPU runs (__builtin_cpu_supports), and the per-function targets and
// loop pragmas the vector variants are compiled with.
//
// The vector kernels carry their own target attributes (BNN_TARGET_AVX2, BNN_TARGET_AVX512,
// BNN_TARGET_AVX512BW), so one build for a baseline x86-64 CPU holds every variant, and a caller
// picks one at run time from what the CPU has.
#ifndef BNN_NATIVE_CORE_CPU_H_
#define BNN_NATIVE_CORE_CPU_H_

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BNN_X86 1
// AVX-512 with VPOPCNTDQ: the xor-popcount kernels' popcount of 8 words per instruction.
#define BNN_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vpopcntdq")))
// AVX-512 F and BW only: the masked blends and stores of the sign patches.
#define BNN_TARGET_AVX512BW __attribute__((target("avx512f,avx512bw")))
#define BNN_TARGET_AVX2 __attribute__((target("avx2")))
#endif

// Fully unrolled loops let the compiler keep a tile's accumulators in registers (without it,
// GCC keeps a copy of the accumulator array on the stack and stores to it every iteration).
// BNN_UNROLL unrolls loops of up to 32 iterations, BNN_UNROLL8 up to 8.
#if defined(__clang__)
#define BNN_UNROLL _Pragma("unroll")
#define BNN_UNROLL8 _Pragma("unroll")
#elif defined(__GNUC__)
#define BNN_UNROLL _Pragma("GCC unroll 32")
#define BNN_UNROLL8 _Pragma("GCC unroll 8")
#else
#define BNN_UNROLL
#define BNN_UNROLL8
#endif

#define BNN_ALWAYS_INLINE inline __attribute__((always_inline))

namespace bnn {
namespace core {

// The instruction-set variants, slowest first: plain C++, AVX2, AVX-512 (with VPOPCNTDQ for the
// xor-popcount kernels). Each kernel family maps an Isa to the code it runs in its own `Select`
// or dispatch function (several families run their AVX2 code for kAvx512) and says with
// `CpuRuns` whether this CPU has the instructions that code needs.
enum Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr Isa kIsas[] = {kGeneric, kAvx2, kAvx512};
const char* const kIsaNames[] = {"generic", "avx2", "avx512"};

// Whether the CPU has AVX2 (false off x86).
inline bool HasAvx2() {
#ifdef BNN_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

// Whether the CPU has AVX-512 F and BW (false off x86).
inline bool HasAvx512Bw() {
#ifdef BNN_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

// Whether the CPU has AVX-512 F, BW, VL, DQ and VPOPCNTDQ (false off x86).
inline bool HasAvx512Vpopcntdq() {
#ifdef BNN_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vpopcntdq");
#else
  return false;
#endif
}

// Whether this CPU runs variant `isa` in full (kAvx512: with VPOPCNTDQ): the variants that
// BnnKernelVariants lists.
inline bool Supported(Isa isa) {
#ifdef BNN_X86
  if (isa == kAvx512) return HasAvx512Vpopcntdq();
  if (isa == kAvx2) return HasAvx2();
  return true;
#else
  return isa == kGeneric;
#endif
}

}  // namespace core
}  // namespace bnn

#endif  // BNN_NATIVE_CORE_CPU_H_

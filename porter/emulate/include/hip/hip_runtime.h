// porter's emulated HIP target: the HIP kernel language and the runtime calls torch extensions make, on the CPU.
// Written for porter (no vendor code). See porter_emu/runtime.h for what is modelled.
#pragma once

#include <porter_emu/runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <hip/hip_runtime_api.h>

// ---- qualifiers: host and device are one here
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
// shared memory: one copy per block in turn (porter_emu/runtime.h); thread_local keeps 'extern __shared__'
// valid too (porter.emulate.shared defines those arrays when the module is linked)
#define __shared__ thread_local
#define __forceinline__ inline __attribute__((always_inline))
// __noinline__ is left alone: libstdc++ spells its own attribute with that name
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define HIP_DYNAMIC_SHARED(type, var) extern thread_local type var[];
#define HIP_DYNAMIC_SHARED_ATTRIBUTE
#define __HIP_PLATFORM_AMD__ 1
#ifndef __AMDGCN_WAVEFRONT_SIZE
#define __AMDGCN_WAVEFRONT_SIZE PORTER_EMU_WAVE
#endif
#define PORTER_EMULATED_HIP 1

// ---- indices: the running fiber's
#define threadIdx (::porter_emu::self().tid)
#define blockIdx (::porter_emu::g_block->bid)
#define blockDim (::porter_emu::g_block->block)
#define gridDim (::porter_emu::g_block->grid)
#define hipThreadIdx_x (threadIdx.x)
#define hipThreadIdx_y (threadIdx.y)
#define hipThreadIdx_z (threadIdx.z)
#define hipBlockIdx_x (blockIdx.x)
#define hipBlockIdx_y (blockIdx.y)
#define hipBlockIdx_z (blockIdx.z)
#define hipBlockDim_x (blockDim.x)
#define hipBlockDim_y (blockDim.y)
#define hipBlockDim_z (blockDim.z)
#define hipGridDim_x (gridDim.x)
#define hipGridDim_y (gridDim.y)
#define hipGridDim_z (gridDim.z)

static constexpr int warpSize = PORTER_EMU_WAVE;

// ---- launch: every thread makes the call as written (the same template deduction and conversions as
// <<<...>>>: NULL for a pointer, a kernel template deduced from its arguments); an argument with side effects
// would be evaluated once per thread, which is not modelled
#define hipLaunchKernelGGL(kernel, grid, block, shared, stream, ...)                                          \
  ::porter_emu::launch(#kernel, __FILE__, __LINE__, dim3(grid), dim3(block), static_cast<std::size_t>(shared), \
                       [&]() { (kernel)(__VA_ARGS__); })
#define hipLaunchKernelNoBarrier hipLaunchKernelGGL

// ---- barriers and wave operations; each call site is told apart by its return address
#define PORTER_SITE const char *porter_file = __builtin_FILE(), int porter_line = __builtin_LINE()
#define PORTER_HERE porter_file, porter_line, __builtin_return_address(0)

inline void __syncthreads() { ::porter_emu::syncthreads(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
__attribute__((noinline)) inline int __syncthreads_count(int p) {
  static int count;
  ::porter_emu::syncthreads();
  count = 0;
  ::porter_emu::syncthreads();
  if (p) ++count;
  ::porter_emu::syncthreads();
  return count;
}
__attribute__((noinline)) inline int __syncthreads_or(int p) { return __syncthreads_count(p) != 0; }
__attribute__((noinline)) inline int __syncthreads_and(int p) {
  return __syncthreads_count(p) == static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}

inline unsigned __lane_id() { return static_cast<unsigned>(::porter_emu::lane_id()); }

template <typename T>
__attribute__((noinline)) T __shfl(T var, int src, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::Shfl, var, src, width, warpSize, PORTER_HERE);
}
template <typename T>
__attribute__((noinline)) T __shfl_up(T var, unsigned int delta, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflUp, var, static_cast<int>(delta), width, warpSize, PORTER_HERE);
}
template <typename T>
__attribute__((noinline)) T __shfl_down(T var, unsigned int delta, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflDown, var, static_cast<int>(delta), width, warpSize, PORTER_HERE);
}
template <typename T>
__attribute__((noinline)) T __shfl_xor(T var, int mask, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflXor, var, mask, width, warpSize, PORTER_HERE);
}
// the _sync forms: the mask is not modelled beyond this: every existing lane of the wavefront must take part
template <typename M, typename T>
__attribute__((noinline)) T __shfl_sync(M, T var, int src, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::Shfl, var, src, width, warpSize, PORTER_HERE);
}
template <typename M, typename T>
__attribute__((noinline)) T __shfl_up_sync(M, T var, unsigned int delta, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflUp, var, static_cast<int>(delta), width, warpSize, PORTER_HERE);
}
template <typename M, typename T>
__attribute__((noinline)) T __shfl_down_sync(M, T var, unsigned int delta, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflDown, var, static_cast<int>(delta), width, warpSize, PORTER_HERE);
}
template <typename M, typename T>
__attribute__((noinline)) T __shfl_xor_sync(M, T var, int mask, int width = warpSize, PORTER_SITE) {
  return ::porter_emu::wave_op(::porter_emu::Op::ShflXor, var, mask, width, warpSize, PORTER_HERE);
}
__attribute__((noinline)) inline unsigned long long __ballot(int p, PORTER_SITE) {
  return ::porter_emu::wave_op<unsigned long long>(::porter_emu::Op::Ballot, p != 0, 0, warpSize, warpSize,
                                                   PORTER_HERE);
}
__attribute__((noinline)) inline int __any(int p, PORTER_SITE) {
  return ::porter_emu::wave_op<int>(::porter_emu::Op::Any, p != 0, 0, warpSize, warpSize, PORTER_HERE);
}
__attribute__((noinline)) inline int __all(int p, PORTER_SITE) {
  return ::porter_emu::wave_op<int>(::porter_emu::Op::All, p != 0, 0, warpSize, warpSize, PORTER_HERE);
}
template <typename M>
__attribute__((noinline)) unsigned long long __ballot_sync(M, int p, PORTER_SITE) {
  return ::porter_emu::wave_op<unsigned long long>(::porter_emu::Op::Ballot, p != 0, 0, warpSize, warpSize,
                                                   PORTER_HERE);
}
template <typename M>
__attribute__((noinline)) int __any_sync(M, int p, PORTER_SITE) {
  return ::porter_emu::wave_op<int>(::porter_emu::Op::Any, p != 0, 0, warpSize, warpSize, PORTER_HERE);
}
template <typename M>
__attribute__((noinline)) int __all_sync(M, int p, PORTER_SITE) {
  return ::porter_emu::wave_op<int>(::porter_emu::Op::All, p != 0, 0, warpSize, warpSize, PORTER_HERE);
}
__attribute__((noinline)) inline void __syncwarp(unsigned long long = 0, PORTER_SITE) {
  ::porter_emu::wave_op<int>(::porter_emu::Op::WaveBarrier, 0, 0, warpSize, warpSize, PORTER_HERE);
}
// every existing lane: the emulator runs wave operations only where the wavefront is converged
inline unsigned long long __activemask() {
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int base = (::porter_emu::linear_id(::porter_emu::self()) / warpSize) * warpSize;
  const int lanes = n - base < warpSize ? n - base : warpSize;
  return lanes >= 64 ? ~0ull : ((1ull << lanes) - 1);
}

// ---- atomics: fibers switch only at the operations above, so a plain read-modify-write is atomic here
template <typename T> inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicSub(T* p, T v) { T o = *p; *p = o - v; return o; }
template <typename T> inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <typename T> inline T atomicMax(T* p, T v) { T o = *p; *p = o < v ? v : o; return o; }
template <typename T> inline T atomicMin(T* p, T v) { T o = *p; *p = v < o ? v : o; return o; }
template <typename T> inline T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }
template <typename T> inline T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> inline T atomicXor(T* p, T v) { T o = *p; *p = o ^ v; return o; }
template <typename T> inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
inline unsigned atomicInc(unsigned* p, unsigned v) { unsigned o = *p; *p = o >= v ? 0 : o + 1; return o; }
inline unsigned atomicDec(unsigned* p, unsigned v) { unsigned o = *p; *p = (o == 0 || o > v) ? v : o - 1; return o; }
template <typename T> inline T atomicAdd_system(T* p, T v) { return atomicAdd(p, v); }
template <typename T> inline T unsafeAtomicAdd(T* p, T v) { return atomicAdd(p, v); }

// ---- device math and bit intrinsics (the host's libm: AMDGPU's approximate forms are not modelled)
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline double __drcp_rn(double x) { return 1.0 / x; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
template <typename T> inline T __ldg(const T* p) { return *p; }
inline long long clock64() { return 0; }
inline long long wall_clock64() { return 0; }
inline long long __clock64() { return 0; }

// HIP's global min/max overloads for device code
using std::max;
using std::min;
inline float max(float a, int b) { return std::max(a, static_cast<float>(b)); }
inline float max(int a, float b) { return std::max(static_cast<float>(a), b); }
inline float min(float a, int b) { return std::min(a, static_cast<float>(b)); }
inline float min(int a, float b) { return std::min(static_cast<float>(a), b); }
inline unsigned max(unsigned a, int b) { return std::max(a, static_cast<unsigned>(b)); }
inline unsigned max(int a, unsigned b) { return std::max(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return std::min(a, static_cast<unsigned>(b)); }
inline unsigned min(int a, unsigned b) { return std::min(static_cast<unsigned>(a), b); }

#include <hip/hip_fp16.h>

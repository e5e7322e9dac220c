// porter's emulated HIP target: bfloat16 with HIP's names (__hip_bfloat16, __bf16 helpers), kept as its 16 bits,
// computed in float, rounded to nearest-even. Written for porter (no vendor code).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <hip/hip_vector_types.h>

struct alignas(2) __hip_bfloat16 {
  unsigned short data;
  __hip_bfloat16() = default;
  static __hip_bfloat16 from_float(float f) {
    __hip_bfloat16 r;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) { r.data = 0x7FC0; return r; }
    u += 0x7FFFu + ((u >> 16) & 1u);
    r.data = static_cast<unsigned short>(u >> 16);
    return r;
  }
  float to_float() const {
    uint32_t u = uint32_t(data) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __hip_bfloat16(float f) : data(from_float(f).data) {}
  __hip_bfloat16(double f) : data(from_float(static_cast<float>(f)).data) {}
  operator float() const { return to_float(); }
};
struct alignas(4) __hip_bfloat162 {
  __hip_bfloat16 x, y;
};
typedef __hip_bfloat16 hip_bfloat16;
typedef __hip_bfloat16 __nv_bfloat16;
typedef __hip_bfloat162 __nv_bfloat162;

inline __hip_bfloat16 __float2bfloat16(float f) { return __hip_bfloat16::from_float(f); }
inline __hip_bfloat16 __float2bfloat16_rn(float f) { return __hip_bfloat16::from_float(f); }
inline float __bfloat162float(__hip_bfloat16 v) { return v.to_float(); }
inline __hip_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }
inline __hip_bfloat162 __float2bfloat162_rn(float a) { return {__float2bfloat16(a), __float2bfloat16(a)}; }
inline __hip_bfloat162 __float22bfloat162_rn(float2 v) { return {__float2bfloat16(v.x), __float2bfloat16(v.y)}; }
inline float2 __bfloat1622float2(__hip_bfloat162 v) { return float2{v.x.to_float(), v.y.to_float()}; }
inline float __low2float(__hip_bfloat162 v) { return v.x.to_float(); }
inline float __high2float(__hip_bfloat162 v) { return v.y.to_float(); }
inline __hip_bfloat162 __halves2bfloat162(__hip_bfloat16 a, __hip_bfloat16 b) { return {a, b}; }
inline __hip_bfloat162 __bfloat162bfloat162(__hip_bfloat16 a) { return {a, a}; }
inline __hip_bfloat16 __low2bfloat16(__hip_bfloat162 v) { return v.x; }
inline __hip_bfloat16 __high2bfloat16(__hip_bfloat162 v) { return v.y; }
inline unsigned short __bfloat16_as_ushort(__hip_bfloat16 v) { return v.data; }
inline __hip_bfloat16 __ushort_as_bfloat16(unsigned short x) { __hip_bfloat16 r; r.data = x; return r; }
#define PORTER_B1(name, expr) inline __hip_bfloat16 name(__hip_bfloat16 a, __hip_bfloat16 b) { \
    float x = a.to_float(), y = b.to_float(); return __float2bfloat16(expr); }
PORTER_B1(__hadd, x + y)
PORTER_B1(__hsub, x - y)
PORTER_B1(__hmul, x * y)
PORTER_B1(__hdiv, x / y)
PORTER_B1(__hmax, x > y ? x : y)
PORTER_B1(__hmin, x < y ? x : y)
#undef PORTER_B1
inline __hip_bfloat162 __hadd2(__hip_bfloat162 a, __hip_bfloat162 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __hip_bfloat162 __hmul2(__hip_bfloat162 a, __hip_bfloat162 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __hip_bfloat162 __hsub2(__hip_bfloat162 a, __hip_bfloat162 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline __hip_bfloat16 __hfma(__hip_bfloat16 a, __hip_bfloat16 b, __hip_bfloat16 c) {
  return __float2bfloat16(std::fma(a.to_float(), b.to_float(), c.to_float()));
}
inline __hip_bfloat16 __hneg(__hip_bfloat16 a) { return __float2bfloat16(-a.to_float()); }
inline bool __hgt(__hip_bfloat16 a, __hip_bfloat16 b) { return a.to_float() > b.to_float(); }
inline bool __hlt(__hip_bfloat16 a, __hip_bfloat16 b) { return a.to_float() < b.to_float(); }
inline bool __hisnan(__hip_bfloat16 a) { return std::isnan(a.to_float()); }

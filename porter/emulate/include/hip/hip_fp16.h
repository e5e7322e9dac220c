// porter's emulated HIP target: __half and __half2 with HIP's names, computed in float and rounded to
// nearest-even (as the hardware's conversions do). Operators and implicit conversions follow HIP's switches
// __HIP_NO_HALF_OPERATORS__ / __HIP_NO_HALF_CONVERSIONS__, so what compiles here compiles for ROCm.
// Written for porter (no vendor code).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <hip/hip_vector_types.h>

struct __half_raw { unsigned short x; };
struct __half2_raw { unsigned short x, y; };

struct alignas(2) __half {
  _Float16 data;
  __half() = default;
  constexpr __half(__half_raw r) : data(__builtin_bit_cast(_Float16, r.x)) {}
  operator __half_raw() const { return __half_raw{__builtin_bit_cast(unsigned short, data)}; }
#if !defined(__HIP_NO_HALF_CONVERSIONS__)
  __half(float f) : data(static_cast<_Float16>(f)) {}
  __half(double f) : data(static_cast<_Float16>(f)) {}
  __half(int i) : data(static_cast<_Float16>(i)) {}
  __half(unsigned i) : data(static_cast<_Float16>(i)) {}
  __half(long long i) : data(static_cast<_Float16>(i)) {}
  operator float() const { return static_cast<float>(data); }
#endif
};
struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half a, __half b) : x(a), y(b) {}
  __half2(__half2_raw r) : x(__half_raw{r.x}), y(__half_raw{r.y}) {}
  operator __half2_raw() const { return __half2_raw{__half_raw(x).x, __half_raw(y).x}; }
};
typedef __half half;
typedef __half2 half2;

namespace porter_emu {
inline __half h(float f) { __half r; r.data = static_cast<_Float16>(f); return r; }
inline float f(__half v) { return static_cast<float>(v.data); }
}  // namespace porter_emu

inline __half __float2half(float f) { return porter_emu::h(f); }
inline __half __float2half_rn(float f) { return porter_emu::h(f); }
inline __half __double2half(double d) { __half r; r.data = static_cast<_Float16>(d); return r; }
inline float __half2float(__half v) { return porter_emu::f(v); }
inline __half2 __float2half2_rn(float f) { return __half2(porter_emu::h(f), porter_emu::h(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(porter_emu::h(a), porter_emu::h(b)); }
inline __half2 __float22half2_rn(float2 v) { return __half2(porter_emu::h(v.x), porter_emu::h(v.y)); }
inline float2 __half22float2(__half2 v) { return float2{porter_emu::f(v.x), porter_emu::f(v.y)}; }
inline float __low2float(__half2 v) { return porter_emu::f(v.x); }
inline float __high2float(__half2 v) { return porter_emu::f(v.y); }
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
inline __half __int2half_rn(int i) { return porter_emu::h(static_cast<float>(i)); }
inline int __half2int_rn(__half v) { return static_cast<int>(std::nearbyint(porter_emu::f(v))); }
inline int __half2int_rz(__half v) { return static_cast<int>(porter_emu::f(v)); }
inline unsigned short __half_as_ushort(__half v) { return __half_raw(v).x; }
inline short __half_as_short(__half v) { return static_cast<short>(__half_raw(v).x); }
inline __half __ushort_as_half(unsigned short x) { return __half(__half_raw{x}); }
inline __half __short_as_half(short x) { return __half(__half_raw{static_cast<unsigned short>(x)}); }

#define PORTER_H1(name, expr) inline __half name(__half a, __half b) { float x = porter_emu::f(a), y = porter_emu::f(b); return porter_emu::h(expr); }
PORTER_H1(__hadd, x + y)
PORTER_H1(__hsub, x - y)
PORTER_H1(__hmul, x * y)
PORTER_H1(__hdiv, x / y)
PORTER_H1(__hmax, x > y ? x : y)
PORTER_H1(__hmin, x < y ? x : y)
#undef PORTER_H1
#define PORTER_H2(name, fn) inline __half2 name(__half2 a, __half2 b) { return __half2(fn(a.x, b.x), fn(a.y, b.y)); }
PORTER_H2(__hadd2, __hadd)
PORTER_H2(__hsub2, __hsub)
PORTER_H2(__hmul2, __hmul)
PORTER_H2(__h2div, __hdiv)
PORTER_H2(__hmax2, __hmax)
PORTER_H2(__hmin2, __hmin)
#undef PORTER_H2
inline __half __hfma(__half a, __half b, __half c) { return porter_emu::h(std::fma(porter_emu::f(a), porter_emu::f(b), porter_emu::f(c))); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
inline __half __hneg(__half a) { return porter_emu::h(-porter_emu::f(a)); }
inline __half2 __hneg2(__half2 a) { return __half2(__hneg(a.x), __hneg(a.y)); }
inline __half __habs(__half a) { return porter_emu::h(std::fabs(porter_emu::f(a))); }
inline __half2 __habs2(__half2 a) { return __half2(__habs(a.x), __habs(a.y)); }
inline bool __heq(__half a, __half b) { return porter_emu::f(a) == porter_emu::f(b); }
inline bool __hne(__half a, __half b) { return porter_emu::f(a) != porter_emu::f(b); }
inline bool __hlt(__half a, __half b) { return porter_emu::f(a) < porter_emu::f(b); }
inline bool __hle(__half a, __half b) { return porter_emu::f(a) <= porter_emu::f(b); }
inline bool __hgt(__half a, __half b) { return porter_emu::f(a) > porter_emu::f(b); }
inline bool __hge(__half a, __half b) { return porter_emu::f(a) >= porter_emu::f(b); }
inline bool __hisnan(__half a) { return std::isnan(porter_emu::f(a)); }
inline int __hisinf(__half a) { float x = porter_emu::f(a); return std::isinf(x) ? (x < 0 ? -1 : 1) : 0; }
#define PORTER_HF(name, fn) inline __half name(__half a) { return porter_emu::h(fn(porter_emu::f(a))); } \
  inline __half2 name##2(__half2 a) { return __half2(name(a.x), name(a.y)); }
PORTER_HF(hexp, std::exp)
PORTER_HF(hlog, std::log)
PORTER_HF(hsqrt, std::sqrt)
PORTER_HF(hrcp, 1.0f /)
PORTER_HF(htanh, std::tanh)
inline __half hrsqrt(__half a) { return porter_emu::h(1.0f / std::sqrt(porter_emu::f(a))); }
inline __half2 h2rsqrt(__half2 a) { return __half2(hrsqrt(a.x), hrsqrt(a.y)); }
#undef PORTER_HF
inline __half2 h2exp(__half2 a) { return hexp2(a); }
inline __half2 h2log(__half2 a) { return hlog2(a); }
inline __half2 h2sqrt(__half2 a) { return hsqrt2(a); }
inline __half2 h2rcp(__half2 a) { return hrcp2(a); }

#if !defined(__HIP_NO_HALF_OPERATORS__)
inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline __half& operator+=(__half& a, __half b) { return a = __hadd(a, b); }
inline __half& operator-=(__half& a, __half b) { return a = __hsub(a, b); }
inline __half& operator*=(__half& a, __half b) { return a = __hmul(a, b); }
inline __half& operator/=(__half& a, __half b) { return a = __hdiv(a, b); }
inline bool operator==(__half a, __half b) { return __heq(a, b); }
inline bool operator!=(__half a, __half b) { return __hne(a, b); }
inline bool operator<(__half a, __half b) { return __hlt(a, b); }
inline bool operator<=(__half a, __half b) { return __hle(a, b); }
inline bool operator>(__half a, __half b) { return __hgt(a, b); }
inline bool operator>=(__half a, __half b) { return __hge(a, b); }
inline __half2 operator+(__half2 a, __half2 b) { return __hadd2(a, b); }
inline __half2 operator-(__half2 a, __half2 b) { return __hsub2(a, b); }
inline __half2 operator*(__half2 a, __half2 b) { return __hmul2(a, b); }
inline __half2 operator/(__half2 a, __half2 b) { return __h2div(a, b); }
inline __half2& operator+=(__half2& a, __half2 b) { return a = __hadd2(a, b); }
inline __half2& operator*=(__half2& a, __half2 b) { return a = __hmul2(a, b); }
#endif

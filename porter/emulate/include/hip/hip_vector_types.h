// porter's emulated HIP target: HIP's vector types (members x, y, z, w; the alignment HIP gives them).
// Written for porter (no vendor code).
#pragma once

#define PORTER_VEC2(T, N, A) struct alignas(A) N { T x, y; }; \
  inline N make_##N(T x, T y) { return N{x, y}; }
#define PORTER_VEC3(T, N) struct N { T x, y, z; }; \
  inline N make_##N(T x, T y, T z) { return N{x, y, z}; }
#define PORTER_VEC4(T, N, A) struct alignas(A) N { T x, y, z, w; }; \
  inline N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }

PORTER_VEC2(float, float2, 8)
PORTER_VEC3(float, float3)
PORTER_VEC4(float, float4, 16)
PORTER_VEC2(double, double2, 16)
PORTER_VEC4(double, double4, 32)
PORTER_VEC2(int, int2, 8)
PORTER_VEC3(int, int3)
PORTER_VEC4(int, int4, 16)
PORTER_VEC2(unsigned int, uint2, 8)
PORTER_VEC4(unsigned int, uint4, 16)
PORTER_VEC2(char, char2, 2)
PORTER_VEC4(char, char4, 4)
PORTER_VEC2(signed char, schar2, 2)
PORTER_VEC2(unsigned char, uchar2, 2)
PORTER_VEC4(unsigned char, uchar4, 4)
PORTER_VEC2(short, short2, 4)
PORTER_VEC4(short, short4, 8)
PORTER_VEC2(long long, longlong2, 16)
PORTER_VEC2(unsigned long long, ulonglong2, 16)

#undef PORTER_VEC2
#undef PORTER_VEC3
#undef PORTER_VEC4

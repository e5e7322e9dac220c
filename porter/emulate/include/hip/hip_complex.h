// porter's emulated HIP target: hipFloatComplex as a float2. Written for porter (no vendor code).
#pragma once
#include <hip/hip_vector_types.h>
typedef float2 hipFloatComplex;
typedef double2 hipDoubleComplex;

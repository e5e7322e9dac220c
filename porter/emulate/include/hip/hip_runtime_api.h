// porter's emulated HIP target: the HIP runtime API as torch extensions call it, on the CPU ("device" memory is
// host memory; streams and events are names only, since every launch completes before it returns).
// Written for porter (no vendor code).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#ifndef PORTER_EMU_WAVE
#error "porter emulated HIP target: PORTER_EMU_WAVE (32 or 64) must be defined (porter's emulate-wave32/64 profiles do)"
#endif

typedef enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorNotSupported = 801,
} hipError_t;
typedef enum hipMemcpyKind {
  hipMemcpyHostToHost = 0,
  hipMemcpyHostToDevice = 1,
  hipMemcpyDeviceToHost = 2,
  hipMemcpyDeviceToDevice = 3,
  hipMemcpyDefault = 4,
} hipMemcpyKind;
typedef enum hipFuncAttribute {
  hipFuncAttributeMaxDynamicSharedMemorySize = 8,
  hipFuncAttributePreferredSharedMemoryCarveout = 9,
} hipFuncAttribute;
typedef enum hipDeviceAttribute_t {
  hipDeviceAttributeMultiprocessorCount = 63,
  hipDeviceAttributeMaxThreadsPerBlock = 56,
  hipDeviceAttributeWarpSize = 87,
  hipDeviceAttributeMaxSharedMemoryPerBlock = 74,
} hipDeviceAttribute_t;

struct ihipStream_t;
typedef struct ihipStream_t* hipStream_t;
struct ihipEvent_t;
typedef struct ihipEvent_t* hipEvent_t;
typedef int hipDevice_t;

typedef struct hipDeviceProp_t {
  char name[256];
  char gcnArchName[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int clockRate;
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  std::size_t sharedMemPerMultiprocessor;
  int l2CacheSize;
} hipDeviceProp_t;

namespace porter_emu {
inline hipDeviceProp_t* device_properties() {
  static hipDeviceProp_t p = [] {
    hipDeviceProp_t d{};
    std::strcpy(d.name, PORTER_EMU_WAVE == 64 ? "porter emulated HIP device (wave 64)"
                                              : "porter emulated HIP device (wave 32)");
    std::strcpy(d.gcnArchName, PORTER_EMU_WAVE == 64 ? "porter-emulated-wave64" : "porter-emulated-wave32");
    d.totalGlobalMem = std::size_t(1) << 34;
    d.sharedMemPerBlock = 64 * 1024;
    d.regsPerBlock = 65536;
    d.warpSize = PORTER_EMU_WAVE;
    d.maxThreadsPerBlock = 1024;
    d.maxThreadsDim[0] = d.maxThreadsDim[1] = d.maxThreadsDim[2] = 1024;
    d.maxGridSize[0] = 2147483647;
    d.maxGridSize[1] = d.maxGridSize[2] = 65535;
    d.clockRate = 1000000;
    d.major = 9;
    d.minor = 0;
    d.multiProcessorCount = 4;  // small, so grids that size themselves by it stay small
    d.maxThreadsPerMultiProcessor = 2048;
    d.sharedMemPerMultiprocessor = 64 * 1024;
    d.l2CacheSize = 8 << 20;
    return d;
  }();
  return &p;
}
inline hipError_t& last_error() {
  static thread_local hipError_t e = hipSuccess;
  return e;
}
}  // namespace porter_emu

inline hipError_t hipGetLastError() { hipError_t e = porter_emu::last_error(); porter_emu::last_error() = hipSuccess; return e; }
inline hipError_t hipPeekAtLastError() { return porter_emu::last_error(); }
inline const char* hipGetErrorString(hipError_t e) { return e == hipSuccess ? "hipSuccess" : "porter emulated HIP error"; }
inline const char* hipGetErrorName(hipError_t e) { return hipGetErrorString(e); }
inline hipError_t hipGetDevice(int* d) { *d = 0; return hipSuccess; }
inline hipError_t hipSetDevice(int) { return hipSuccess; }
inline hipError_t hipGetDeviceCount(int* n) { *n = 1; return hipSuccess; }
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* p, int) { *p = *porter_emu::device_properties(); return hipSuccess; }
inline hipError_t hipDeviceGetAttribute(int* v, hipDeviceAttribute_t a, int) {
  const hipDeviceProp_t* p = porter_emu::device_properties();
  switch (a) {
    case hipDeviceAttributeMultiprocessorCount: *v = p->multiProcessorCount; break;
    case hipDeviceAttributeMaxThreadsPerBlock: *v = p->maxThreadsPerBlock; break;
    case hipDeviceAttributeWarpSize: *v = p->warpSize; break;
    case hipDeviceAttributeMaxSharedMemoryPerBlock: *v = static_cast<int>(p->sharedMemPerBlock); break;
    default: return hipErrorNotSupported;
  }
  return hipSuccess;
}
inline hipError_t hipDeviceSynchronize() { return hipSuccess; }
inline hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
inline hipError_t hipMalloc(void** p, std::size_t n) { *p = std::malloc(n ? n : 1); return *p ? hipSuccess : hipErrorOutOfMemory; }
template <typename T> inline hipError_t hipMalloc(T** p, std::size_t n) { return hipMalloc(reinterpret_cast<void**>(p), n); }
inline hipError_t hipFree(void* p) { std::free(p); return hipSuccess; }
inline hipError_t hipMemcpy(void* d, const void* s, std::size_t n, hipMemcpyKind) { std::memmove(d, s, n); return hipSuccess; }
inline hipError_t hipMemcpyAsync(void* d, const void* s, std::size_t n, hipMemcpyKind, hipStream_t = nullptr) { std::memmove(d, s, n); return hipSuccess; }
inline hipError_t hipMemset(void* d, int v, std::size_t n) { std::memset(d, v, n); return hipSuccess; }
inline hipError_t hipMemsetAsync(void* d, int v, std::size_t n, hipStream_t = nullptr) { std::memset(d, v, n); return hipSuccess; }
template <typename F> inline hipError_t hipFuncSetAttribute(F, hipFuncAttribute, int) { return hipSuccess; }
template <typename F> inline hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int threads, std::size_t) {
  *n = threads > 0 ? 2048 / threads : 1;
  return hipSuccess;
}
inline hipError_t hipEventCreate(hipEvent_t* e) { *e = nullptr; return hipSuccess; }
inline hipError_t hipEventRecord(hipEvent_t, hipStream_t = nullptr) { return hipSuccess; }
inline hipError_t hipEventSynchronize(hipEvent_t) { return hipSuccess; }
inline hipError_t hipEventDestroy(hipEvent_t) { return hipSuccess; }
inline hipError_t hipStreamWaitEvent(hipStream_t, hipEvent_t, unsigned) { return hipSuccess; }

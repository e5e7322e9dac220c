// porter's emulated HIP target: what a hipified torch extension asks of torch's HIP side, for the one emulated
// device (the host): streams and events are names only (every launch completes before it returns), guards guard
// nothing, and the device's properties say its wavefront size. ROCm torch keeps CUDA's names (c10::cuda::CUDAStream,
// at::cuda::getCurrentCUDAStream) beside the ...MasqueradingAsCUDA ones hipify writes: both are here.
// Written for porter (no vendor code).
#pragma once

#include <ATen/Context.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>
#include <hip/hip_runtime.h>

namespace c10::cuda {

class CUDAStream {
 public:
  CUDAStream() = default;
  explicit CUDAStream(c10::Stream) {}
  hipStream_t stream() const { return nullptr; }
  operator hipStream_t() const { return nullptr; }
  c10::DeviceIndex device_index() const { return 0; }
  c10::Device device() const { return c10::Device(c10::DeviceType::CPU); }
  c10::Stream unwrap() const { return c10::Stream(c10::Stream::DEFAULT, device()); }
  operator c10::Stream() const { return unwrap(); }
  c10::StreamId id() const { return 0; }
  bool query() const { return true; }
  void synchronize() const {}
  int priority() const { return 0; }
  bool operator==(const CUDAStream&) const { return true; }
  bool operator!=(const CUDAStream&) const { return false; }
};

inline CUDAStream getCurrentCUDAStream(c10::DeviceIndex = -1) { return CUDAStream(); }
inline CUDAStream getDefaultCUDAStream(c10::DeviceIndex = -1) { return CUDAStream(); }
inline CUDAStream getStreamFromPool(bool = false, c10::DeviceIndex = -1) { return CUDAStream(); }
inline CUDAStream getStreamFromPool(int, c10::DeviceIndex = -1) { return CUDAStream(); }
inline CUDAStream getStreamFromExternal(hipStream_t, c10::DeviceIndex) { return CUDAStream(); }
inline void setCurrentCUDAStream(CUDAStream) {}
inline c10::DeviceIndex device_count() noexcept { return 1; }
inline c10::DeviceIndex current_device() { return 0; }
inline void set_device(c10::DeviceIndex) {}
inline void device_synchronize() {}

struct CUDAGuard {
  template <typename... A>
  explicit CUDAGuard(A&&...) {}
  void set_device(c10::Device) {}
  void reset_device(c10::Device) {}
  void set_index(c10::DeviceIndex) {}
  c10::Device current_device() const { return c10::Device(c10::DeviceType::CPU); }
  c10::Device original_device() const { return current_device(); }
};
using OptionalCUDAGuard = CUDAGuard;
using CUDAStreamGuard = CUDAGuard;
using OptionalCUDAStreamGuard = CUDAGuard;
using CUDAMultiStreamGuard = CUDAGuard;

}  // namespace c10::cuda

namespace c10::hip {
using namespace c10::cuda;
using HIPStream = c10::cuda::CUDAStream;
using HIPStreamMasqueradingAsCUDA = c10::cuda::CUDAStream;
using HIPGuard = c10::cuda::CUDAGuard;
using OptionalHIPGuard = HIPGuard;
using HIPStreamGuard = HIPGuard;
using OptionalHIPStreamGuard = HIPGuard;
using HIPGuardMasqueradingAsCUDA = HIPGuard;
using OptionalHIPGuardMasqueradingAsCUDA = HIPGuard;
using HIPStreamGuardMasqueradingAsCUDA = HIPGuard;
using OptionalHIPStreamGuardMasqueradingAsCUDA = HIPGuard;
using HIPMultiStreamGuardMasqueradingAsCUDA = HIPGuard;
inline HIPStream getCurrentHIPStream(c10::DeviceIndex = -1) { return HIPStream(); }
inline HIPStream getDefaultHIPStream(c10::DeviceIndex = -1) { return HIPStream(); }
inline void setCurrentHIPStream(HIPStream) {}
inline HIPStream getCurrentHIPStreamMasqueradingAsCUDA(c10::DeviceIndex = -1) { return HIPStream(); }
inline HIPStream getDefaultHIPStreamMasqueradingAsCUDA(c10::DeviceIndex = -1) { return HIPStream(); }
inline HIPStream getStreamFromPoolMasqueradingAsCUDA(bool = false, c10::DeviceIndex = -1) { return HIPStream(); }
inline HIPStream getStreamFromExternalMasqueradingAsCUDA(hipStream_t, c10::DeviceIndex) { return HIPStream(); }
inline void setCurrentHIPStreamMasqueradingAsCUDA(HIPStream) {}
}  // namespace c10::hip

namespace at::cuda {
using namespace c10::cuda;
// declared by c10's Macros.h (ROCm builds): the wavefront size of the current device
__attribute__((weak)) int warp_size() { return PORTER_EMU_WAVE; }
inline hipDeviceProp_t* getCurrentDeviceProperties() { return ::porter_emu::device_properties(); }
inline hipDeviceProp_t* getDeviceProperties(c10::DeviceIndex) { return ::porter_emu::device_properties(); }
inline int64_t getNumGPUs() { return 1; }
inline bool is_available() { return true; }
}  // namespace at::cuda

namespace at::hip {
using namespace c10::hip;
using at::cuda::getCurrentDeviceProperties;
using at::cuda::getDeviceProperties;
using at::cuda::getNumGPUs;
using at::cuda::warp_size;
}  // namespace at::hip

#define C10_HIP_CHECK(EXPR)                                                               \
  do {                                                                                    \
    const hipError_t porter_err = (EXPR);                                                 \
    TORCH_CHECK(porter_err == hipSuccess, "HIP error: ", hipGetErrorString(porter_err)); \
  } while (0)
#define C10_HIP_CHECK_WARN(EXPR) ((void)(EXPR))
#define C10_HIP_KERNEL_LAUNCH_CHECK() C10_HIP_CHECK(hipGetLastError())
#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_HIP_KERNEL_LAUNCH_CHECK()
#define C10_CUDA_CHECK(EXPR) C10_HIP_CHECK(EXPR)
#define AT_CUDA_CHECK(EXPR) C10_HIP_CHECK(EXPR)
#define AT_HIP_CHECK(EXPR) C10_HIP_CHECK(EXPR)

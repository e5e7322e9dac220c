// porter's emulated HIP target: taken in before every unit of an emulated build (-include), so the unit's own
// text is compiled as it is. Written for porter (no vendor code).
//
// torch's Macros.h is read first, as a host compile reads it; then C10_WARP_SIZE is the wavefront size as a
// constant (what the device compile for a gfx9 arch sees), and __HIPCC__ is defined for everything after, so
// headers take their HIP branches. The emulated device is the host: a tensor is on the device when it is on the
// CPU, so an extension's "is it a CUDA tensor" checks ask is_cpu(), and kCUDA names kCPU (a tensor made "on the
// device" is made in host memory).
#pragma once

#if __has_include(<c10/macros/Macros.h>)
#include <c10/macros/Macros.h>
#undef C10_WARP_SIZE
#undef C10_WARP_SIZE_LOWER_BOUND
#undef C10_WARP_SIZE_UPPER_BOUND
#define C10_WARP_SIZE PORTER_EMU_WAVE
#define C10_WARP_SIZE_LOWER_BOUND PORTER_EMU_WAVE
#define C10_WARP_SIZE_UPPER_BOUND PORTER_EMU_WAVE
#endif

#ifndef __HIPCC__
#define __HIPCC__ 1
#endif
#include <hip/hip_runtime.h>

#if defined(TORCH_API_INCLUDE_EXTENSION_H) && __has_include(<torch/extension.h>)
#include <torch/extension.h>
#define is_cuda is_cpu
#define kCUDA kCPU
#endif

// porter's emulated HIP target: the thrust::complex that torch's complex type converts to and from in HIP
// compiles, as std::complex (no thrust here). Written for porter (no vendor code).
#pragma once

#include <complex>

namespace thrust {
template <typename T>
struct complex : std::complex<T> {
  using std::complex<T>::complex;
  complex(const std::complex<T>& c) : std::complex<T>(c) {}
};
using std::abs, std::arg, std::norm, std::conj, std::proj, std::polar, std::exp, std::log, std::log10, std::sqrt,
    std::pow, std::sin, std::cos, std::tan, std::asin, std::acos, std::atan, std::sinh, std::cosh, std::tanh,
    std::asinh, std::acosh, std::atanh;
}  // namespace thrust

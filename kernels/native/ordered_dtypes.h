// The dtypes the order-based kernels take (ArgMax/ArgMin in reduce.cc; TopK and CumSum in select.cc): their data
// pointer as the C type of the dtype, float16 as its uint16_t bits (the kernels widen it).
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace npu_ep::kern {

// Calls run(const T*) on `src` for float32, float16, int32, int64 and, with `bytes`, int8 and uint8; throws naming
// `op` and the dtype for any other.
template <typename F>
void ForOrderedDtype(const pybind11::dtype& dt, const void* src, bool bytes, const char* op, const F& run) {
  if (dt.equal(pybind11::dtype::of<float>()))
    run(static_cast<const float*>(src));
  else if (dt.kind() == 'f' && dt.itemsize() == 2)
    run(static_cast<const uint16_t*>(src));
  else if (dt.equal(pybind11::dtype::of<int32_t>()))
    run(static_cast<const int32_t*>(src));
  else if (dt.equal(pybind11::dtype::of<int64_t>()))
    run(static_cast<const int64_t*>(src));
  else if (bytes && dt.equal(pybind11::dtype::of<int8_t>()))
    run(static_cast<const int8_t*>(src));
  else if (bytes && dt.equal(pybind11::dtype::of<uint8_t>()))
    run(static_cast<const uint8_t*>(src));
  else
    throw std::invalid_argument(
        std::string(op) + ": x must be " +
        (bytes ? "float32, float16, int32, int64, int8 or uint8" : "float32, float16, int32 or int64") + ", got " +
        std::string(pybind11::str(dt)));
}

}  // namespace npu_ep::kern

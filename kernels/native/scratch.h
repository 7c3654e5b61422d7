// A thread's scratch buffer for the kernels (thread_local vectors): grown to the largest call, never shrunk or
// cleared, so a call pays neither an allocation nor a zero fill. A kernel using one writes every element it reads.
#pragma once

#include <cstdint>
#include <vector>

namespace npu_ep::kern {

// v's data with room for n elements.
template <typename T>
T* Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace npu_ep::kern

// Dims, strides and index lists of the data-movement kernels held inline, so a call allocates nothing for them (a
// std::vector per list was most of a small call's cost: malloc and free twenty times for a Transpose).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace npu_ep::kern {

// Up to N int64s in place (numpy's arrays have at most 64 axes; Tile's view of x has twice as many); more throws.
template <size_t N>
class InlineInts {
 public:
  InlineInts() = default;
  explicit InlineInts(size_t n, int64_t v = 0) { assign(n, v); }
  template <typename It>
  InlineInts(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  InlineInts(std::initializer_list<int64_t> l) : InlineInts(l.begin(), l.end()) {}
  InlineInts(const InlineInts& o) : n_(o.n_) { std::copy(o.v_, o.v_ + n_, v_); }
  InlineInts& operator=(const InlineInts& o) {
    n_ = o.n_;
    std::copy(o.v_, o.v_ + n_, v_);
    return *this;
  }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t* data() { return v_; }
  const int64_t* data() const { return v_; }
  int64_t* begin() { return v_; }
  int64_t* end() { return v_ + n_; }
  const int64_t* begin() const { return v_; }
  const int64_t* end() const { return v_ + n_; }
  int64_t& operator[](size_t i) { return v_[i]; }
  int64_t operator[](size_t i) const { return v_[i]; }
  int64_t& back() { return v_[n_ - 1]; }
  int64_t back() const { return v_[n_ - 1]; }

  void push_back(int64_t x) {
    Fits(n_ + 1);
    v_[n_++] = x;
  }
  void resize(size_t n, int64_t v = 0) {
    Fits(n);
    for (size_t i = n_; i < n; ++i) v_[i] = v;
    n_ = n;
  }
  template <typename It>
  void append(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  void assign(size_t n, int64_t v) {
    Fits(n);
    std::fill(v_, v_ + n, v);
    n_ = n;
  }
  bool operator==(const InlineInts& o) const { return n_ == o.n_ && std::equal(v_, v_ + n_, o.v_); }
  bool operator!=(const InlineInts& o) const { return !(*this == o); }

 private:
  static void Fits(size_t n) {
    if (n > N) throw std::invalid_argument("rank " + std::to_string(n) + " above " + std::to_string(N) + " axes");
  }

  int64_t v_[N];
  size_t n_ = 0;
};

constexpr size_t kMaxAxes = 64;  // numpy's NPY_MAXDIMS
using SmallDims = InlineInts<kMaxAxes>;

}  // namespace npu_ep::kern

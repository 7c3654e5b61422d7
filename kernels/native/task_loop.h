// The movement kernels' task loop (movement.cc, transpose.cc, pad.cc, indexing.cc).
#pragma once

#include <cstdint>

#include "thread_pool.h"

namespace npu_ep::kern {

// fn(t) for t in [0, n): on one thread the tasks in turn, called directly; else through ParallelFor, whose
// std::function holds a pointer to fn in place (a lambda capturing more than two references would be allocated per
// call). The same tasks either way, so the bytes never depend on the thread count.
template <typename F>
void ForTasks(int threads, int64_t n, const F& fn) {
  if (threads <= 1 || n <= 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  const F* f = &fn;
  ParallelFor(threads, n, [f](int64_t t) { (*f)(t); });
}

}  // namespace npu_ep::kern

// A small sleeping thread pool for the native kernels (no spinning: idle workers wait on a condition variable,
// so they never compete with ORT's own threads for the cores).
//
// Determinism is the caller's job and is easy: ParallelFor hands out task indices, and a task's work and
// summation order depend only on its index, never on which thread runs it or how many threads there are.
#pragma once

#include <cstdint>
#include <functional>

namespace npu_ep::kern {

// Runs fn(i) for every i in [0, n_tasks) on up to `threads` threads (the caller is one of them) and returns when
// all are done. If another call is already using the pool, this one runs on the caller's thread alone.
void ParallelFor(int threads, int64_t n_tasks, const std::function<void(int64_t)>& fn);

}  // namespace npu_ep::kern

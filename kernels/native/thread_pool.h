// A small sleeping thread pool for the native kernels (no spinning: idle workers wait on a condition variable,
// so they never compete with ORT's own threads for the cores).
//
// Determinism is the caller's job and is easy: ParallelFor hands out task indices, and a task's work and
// summation order depend only on its index, never on which thread runs it or how many threads there are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace npu_ep::kern {

// Work (element operations, or multiply-adds) below which a kernel runs on the calling thread alone: handing
// tasks to other threads costs more than it saves there (a small decoder's decode step ran 0.95 ms on two threads
// and 0.52 ms on one, PERF.md), and on a loaded host a helper descheduled mid-task stalls the whole op. Only the
// thread count changes, never the task split, so the bits stay the same.
constexpr int64_t kMinParallelWork = int64_t{1} << 20;
inline int ThreadsFor(int threads, int64_t work) { return work < kMinParallelWork ? 1 : threads; }

// A task body borrowed for one ParallelFor call: any callable taking the task index, by reference, so passing a
// lambda never allocates (std::function did for one capturing more than two references, on every call).
class TaskRef {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TaskRef>>>
  TaskRef(const F& f)  // NOLINT(google-explicit-constructor): lambdas pass as they are
      : obj_(&f), call_([](const void* o, int64_t i) { (*static_cast<const F*>(o))(i); }) {}
  void operator()(int64_t i) const { call_(obj_, i); }

 private:
  const void* obj_;
  void (*call_)(const void*, int64_t);
};

// Runs fn(i) for every i in [0, n_tasks) on up to `threads` threads (the caller is one of them) and returns when
// all are done. Inside a partition call (a CallContextScope on this thread) the tasks run on ORT's own intra-op
// pool, so no second pool competes with ORT's for the cores; elsewhere (kernel tests, benchmarks) on our helpers.
// If another call is already using our pool, this one runs on the caller's thread alone; so do all loops for a while
// after one whose helpers did not get a core, or after a run of loops whose helpers ran little of the work (a loaded
// host).
void ParallelFor(int threads, int64_t n_tasks, TaskRef fn);

// fn(begin, end) over [0, n) in even chunks of whole 16-element vectors, a multiple of `threads` of them with at most
// about task_elems each, so no thread waits on a last short one (element-wise kernels, whose results do not depend
// on the chunk an element lands in).
template <typename F>
void ForEvenChunks(int threads, int64_t n, int64_t task_elems, const F& fn) {
  if (n <= 0) return;
  const int64_t team = threads > 1 ? threads : 1;
  const int64_t tasks = ((n + task_elems - 1) / task_elems + team - 1) / team * team;
  const int64_t chunk = ((n + tasks - 1) / tasks + 15) / 16 * 16;
  ParallelFor(static_cast<int>(team), (n + chunk - 1) / chunk, [&](int64_t t) {
    const int64_t begin = t * chunk;
    fn(begin, begin + chunk < n ? begin + chunk : n);
  });
}

// A host's parallel loop (the EP passes ORT's intra-op pool): runs task(arg, i) for every i in [0, n) on its
// threads and the caller's, or returns false having run none (then our own helpers run them). The kernels know
// only this signature, not the host's API.
struct HostLoop {
  bool (*run)(const void* host, void (*task)(void*, size_t), size_t n, void* arg) = nullptr;
  const void* host = nullptr;
};

// While alive, ParallelFor on this thread runs through `loop`. Nests (restores the previous loop), so a
// partition called from inside another one keeps working.
class CallContextScope {
 public:
  explicit CallContextScope(HostLoop loop);
  ~CallContextScope();
  CallContextScope(const CallContextScope&) = delete;
  CallContextScope& operator=(const CallContextScope&) = delete;

 private:
  HostLoop previous_;
};

}  // namespace npu_ep::kern

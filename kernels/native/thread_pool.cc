#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace npu_ep::kern {
namespace {

constexpr int kMaxHelpers = 63;

class Pool {
 public:
  void Run(int threads, int64_t n, TaskRef fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    int helpers = static_cast<int>(std::min<int64_t>({threads - 1, n - 1, kMaxHelpers}));
    if (!busy.owns_lock() || helpers <= 0) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      while (static_cast<int>(workers_.size()) < helpers) {
        workers_.emplace_back([this] { WorkerLoop(); });
        workers_.back().detach();  // the pool lives for the whole process (never destroyed)
      }
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      want_ = helpers;
    }
    cv_.notify_all();
    Work();
    std::unique_lock<std::mutex> lk(mu_);
    want_ = 0;  // helpers that did not wake up yet are not needed any more
    done_cv_.wait(lk, [this] { return running_ == 0; });
    fn_ = nullptr;
  }

 private:
  void Work() {
    for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*fn_)(i);
  }

  void WorkerLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return want_ > 0; });
      --want_;
      ++running_;
      lk.unlock();
      Work();
      lk.lock();
      if (--running_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex run_mu_;  // one ParallelFor at a time uses the helpers
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const TaskRef* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int want_ = 0, running_ = 0;
};

}  // namespace

namespace {
thread_local HostLoop t_host_loop;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Until this time (steady clock, ns) parallel loops run on the calling thread alone: a recent loop found the host
// oversubscribed. Then the helpers do not get a core in time (the caller ends up running every task) or one is
// descheduled mid-task (the caller waits for it), while waking them costs the caller its core share; one thread is
// faster. Only the thread count changes, never the tasks, so the bits stay the same.
std::atomic<int64_t> g_serial_until{0};
constexpr int64_t kSerialSpanNs = 50'000'000;  // then one loop tries the helpers again
// A span that ends in another one within kSerialSpanNs doubles, up to kMaxSerialSpanNs: a host loaded for long would
// otherwise pay for a window of loops on absent helpers every 50 ms.
constexpr int64_t kMaxSerialSpanNs = 800'000'000;
std::atomic<int64_t> g_serial_span{kSerialSpanNs};
constexpr int64_t kStallFloorNs = 1'000'000;
constexpr int64_t kAbsentNs = 250'000;  // an idle helper joins a loop well within this time on a quiet host
// Over this many loops, helpers that ran under a ninth of the tasks' time did not get a core in time either: loops
// shorter than kAbsentNs never show it one by one, yet each pays for waking a helper that then only competes for
// the caller's core. On a quiet host the helpers run about half of it.
constexpr int64_t kWindowLoops = 32;
std::atomic<int64_t> g_window_loops{0}, g_window_caller_ns{0}, g_window_helper_ns{0};

// One loop's tasks, timed: how long the calling thread waited for the others after its own last task, and how
// long each side ran tasks.
struct TimedLoop {
  const TaskRef* fn;
  std::thread::id caller;
  int64_t caller_tasks = 0, caller_ns = 0, caller_end = 0;
  std::atomic<int64_t> helper_ns{0};

  void Run(int64_t i) {
    if (std::this_thread::get_id() != caller) {
      const int64_t t0 = NowNs();
      (*fn)(i);
      helper_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
      return;
    }
    const int64_t t0 = NowNs();
    (*fn)(i);
    caller_end = NowNs();
    caller_ns += caller_end - t0;
    ++caller_tasks;
  }
};

void RunTask(void* loop, size_t i) { static_cast<TimedLoop*>(loop)->Run(static_cast<int64_t>(i)); }

// Adds a loop's task times to the window; at its end, whether the helpers ran under a ninth of them (then a new
// window starts). Concurrent callers may blur a window's sums a little, which only shifts one decision.
bool WindowSaysSerial(int64_t caller_ns, int64_t helper_ns) {
  g_window_caller_ns.fetch_add(caller_ns, std::memory_order_relaxed);
  g_window_helper_ns.fetch_add(helper_ns, std::memory_order_relaxed);
  if (g_window_loops.fetch_add(1, std::memory_order_relaxed) + 1 < kWindowLoops) return false;
  g_window_loops.store(0, std::memory_order_relaxed);
  const int64_t caller = g_window_caller_ns.exchange(0, std::memory_order_relaxed);
  const int64_t helpers = g_window_helper_ns.exchange(0, std::memory_order_relaxed);
  return helpers * 8 < caller;
}
}  // namespace

CallContextScope::CallContextScope(HostLoop loop) : previous_(t_host_loop) { t_host_loop = loop; }
CallContextScope::~CallContextScope() { t_host_loop = previous_; }

void ParallelFor(int threads, int64_t n_tasks, TaskRef fn) {
  static Pool* pool = new Pool();  // intentionally leaked: detached workers may outlive static destructors
  if (n_tasks <= 0) return;
  if (threads <= 1 || n_tasks <= 1 || NowNs() < g_serial_until.load(std::memory_order_relaxed)) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  TimedLoop loop{&fn, std::this_thread::get_id()};
  if (t_host_loop.run == nullptr || !t_host_loop.run(t_host_loop.host, RunTask, static_cast<size_t>(n_tasks), &loop))
    pool->Run(threads, n_tasks, [&loop](int64_t i) { loop.Run(i); });
  // a caller that ran no task learns nothing; one that ran them all for long, or waited past several of its own
  // tasks' time, found the helpers off the cores; so did the last kWindowLoops loops when helpers ran little of them
  bool serial = WindowSaysSerial(loop.caller_ns, loop.helper_ns.load(std::memory_order_relaxed));
  if (loop.caller_tasks == 0 && !serial) return;
  const int64_t now = NowNs();
  if (loop.caller_tasks > 0) {
    const bool absent = loop.caller_tasks == n_tasks && loop.caller_ns > kAbsentNs;
    const int64_t waited = now - loop.caller_end;
    serial = serial || absent || waited > std::max(kStallFloorNs, 4 * loop.caller_ns / loop.caller_tasks);
  }
  if (!serial) return;
  int64_t span = kSerialSpanNs;
  if (now - g_serial_until.load(std::memory_order_relaxed) < kSerialSpanNs)
    span = std::min(2 * g_serial_span.load(std::memory_order_relaxed), kMaxSerialSpanNs);
  g_serial_span.store(span, std::memory_order_relaxed);
  g_serial_until.store(now + span, std::memory_order_relaxed);
}

}  // namespace npu_ep::kern

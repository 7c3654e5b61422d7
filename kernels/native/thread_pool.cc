#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace npu_ep::kern {
namespace {

constexpr int kMaxHelpers = 63;

class Pool {
 public:
  void Run(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
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
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int want_ = 0, running_ = 0;
};

}  // namespace

namespace {
thread_local HostLoop t_host_loop;

void RunTask(void* fn, size_t i) { (*static_cast<const std::function<void(int64_t)>*>(fn))(static_cast<int64_t>(i)); }
}  // namespace

CallContextScope::CallContextScope(HostLoop loop) : previous_(t_host_loop) { t_host_loop = loop; }
CallContextScope::~CallContextScope() { t_host_loop = previous_; }

void ParallelFor(int threads, int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  static Pool* pool = new Pool();  // intentionally leaked: detached workers may outlive static destructors
  if (n_tasks <= 0) return;
  threads = std::max(threads, 1);
  if (threads > 1 && n_tasks > 1 && t_host_loop.run != nullptr &&
      t_host_loop.run(t_host_loop.host, RunTask, static_cast<size_t>(n_tasks),
                      const_cast<std::function<void(int64_t)>*>(&fn)))
    return;
  pool->Run(threads, n_tasks, fn);
}

}  // namespace npu_ep::kern

// See embedded_python.h. The loader calls NpuEpMarkEmbeddedHost (exported, C linkage) before anything imports
// npu_ep in the interpreter it started.
#include "embedded_python.h"

#include <Python.h>

#include <atomic>

namespace npu_ep {
namespace {

std::atomic<bool> g_embedded_host{false};

// A thread state made by PyGILState_Ensure and kept (GIL released) until the thread ends.
struct HostThreadState {
  PyThreadState* saved = nullptr;
  HostThreadState() {
    PyGILState_Ensure();
    saved = PyEval_SaveThread();
  }
  ~HostThreadState() {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // interpreter gone: nothing left to release
    PyEval_RestoreThread(saved);
    PyGILState_Release(PyGILState_UNLOCKED);
  }
};

}  // namespace

bool EmbeddedHost() { return g_embedded_host.load(); }

void AdoptHostThread() {
  if (!g_embedded_host.load(std::memory_order_relaxed)) return;  // a Python host's threads are Python's own
  if (PyGILState_GetThisThreadState() != nullptr) return;
  thread_local HostThreadState state;
}

}  // namespace npu_ep

extern "C" __attribute__((visibility("default"))) void NpuEpMarkEmbeddedHost() { npu_ep::g_embedded_host = true; }

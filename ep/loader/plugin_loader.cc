// libnpu_ep_plugin.so: the NpuEP library for any ONNX Runtime host (C, C++, C#, Java, Node, Python).
//
// The real plugin (`npu_ep.ep._native`) is a Python extension: its Py* symbols come from the process, so a host
// without a Python interpreter cannot even dlopen it. This loader links no libpython. On CreateEpFactories it
//   1. finds a running interpreter (Py_IsInitialized in the process, e.g. a Python host): nothing to start;
//   2. otherwise finds the Python environment NpuEP is installed in (NPU_EP_PYTHON, else the environment around
//      this file's site-packages, else the python that built it), dlopens its libpython RTLD_GLOBAL (so numpy and
//      the other extensions resolve against it), starts the interpreter with that python as its executable (which
//      selects the environment's site-packages), releases the GIL for the host's threads, and checks that
//      `npu_ep.ep.entry_points` imports there from this very install;
//   3. dlopens `_native` beside this file and forwards CreateEpFactories/ReleaseEpFactory to it.
// Every failure becomes one OrtStatus naming what is missing. An interpreter we started is never finalized
// (numpy cannot be initialized twice in one process): unregistering releases the factory and its sessions' Python
// objects, and registering again reuses the interpreter. See README.md, "Any host".
#include <Python.h>  // declarations and PyConfig's layout only: every Py* call goes through dlsym
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "onnxruntime_c_api.h"

#define NPU_EP_EXPORT __attribute__((visibility("default")))

namespace {

// Recorded when the package was built (setup.py): the python that ran the build (an editable install's
// environment), its libpython's file name and folder, and the file name of the real plugin beside this loader.
constexpr const char* kBuildPython = NPU_EP_BUILD_PYTHON;
constexpr const char* kLibpythonName = NPU_EP_LIBPYTHON;
constexpr const char* kBuildLibdir = NPU_EP_BUILD_LIBDIR;
constexpr const char* kNativeFile = NPU_EP_NATIVE_FILE;
constexpr const char* kPythonVersion = NPU_EP_PYTHON_VERSION;  // "3.11": PyConfig's layout is this version's

using CreateFn = OrtStatus* (*)(const char*, const OrtApiBase*, const OrtLogger*, OrtEpFactory**, size_t, size_t*);
using ReleaseFn = OrtStatus* (*)(OrtEpFactory*);

struct Native {
  CreateFn create = nullptr;
  ReleaseFn release = nullptr;
};

std::mutex g_mutex;
Native g_native;

struct LoadError {
  std::string message;
};

bool IsFile(const std::string& path) { return !path.empty() && access(path.c_str(), R_OK) == 0; }

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::string ThisLibraryPath() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&ThisLibraryPath), &info) || !info.dli_fname) return {};
  char* real = realpath(info.dli_fname, nullptr);
  std::string path = real ? real : info.dli_fname;
  std::free(real);
  return path;
}

// The python executable of the environment NpuEP lives in, and how it was found (for error messages).
std::string FindPython(std::string* how) {
  if (const char* env = std::getenv("NPU_EP_PYTHON"); env && *env) {
    *how = "NPU_EP_PYTHON";
    return env;
  }
  // <prefix>/lib/pythonX.Y/{site,dist}-packages/npu_ep/ep/libnpu_ep_plugin.so: a wheel installed into <prefix>.
  const std::string self = ThisLibraryPath();
  size_t lib = self.rfind("/lib/python");
  if (lib != std::string::npos && (self.find("/site-packages/", lib) != std::string::npos ||
                                   self.find("/dist-packages/", lib) != std::string::npos)) {
    const std::string prefix = self.substr(0, lib);
    for (const char* name : {"/bin/python3", "/bin/python"}) {
      if (IsFile(prefix + name)) {
        *how = "the environment this library is installed in (" + prefix + ")";
        return prefix + name;
      }
    }
  }
  *how = "the python that built this library (an editable install)";
  return kBuildPython;
}

// pyvenv.cfg's `home` (the base interpreter's bin folder) for a virtual environment, else "".
std::string VenvHome(const std::string& env_dir) {
  std::ifstream cfg(env_dir + "/pyvenv.cfg");
  std::string line;
  while (std::getline(cfg, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", eq - 1) + 1);
    if (key != "home") continue;
    size_t start = line.find_first_not_of(" \t", eq + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return {};
}

// libpython candidates for `python`, most specific first; the last one is the bare soname (the loader's search).
std::vector<std::string> LibpythonCandidates(const std::string& python) {
  std::vector<std::string> out;
  if (const char* env = std::getenv("NPU_EP_LIBPYTHON"); env && *env) out.push_back(env);
  const std::string env_dir = Dirname(Dirname(python));
  const std::string home = VenvHome(env_dir);
  const std::string base = home.empty() ? env_dir : Dirname(home);
  for (const std::string& dir :
       {base + "/lib", base + "/lib/x86_64-linux-gnu", base + "/lib/aarch64-linux-gnu", std::string(kBuildLibdir)}) {
    out.push_back(dir + "/" + kLibpythonName);
  }
  out.push_back(kLibpythonName);
  return out;
}

template <typename T>
T Symbol(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) throw LoadError{std::string("libpython lacks ") + name};
  return reinterpret_cast<T>(p);
}

void CheckStatus(PyStatus status, int (*exception)(PyStatus), const std::string& what) {
  if (!exception(status)) return;
  throw LoadError{what + " failed: " + (status.func ? std::string(status.func) + ": " : "") +
                  (status.err_msg ? status.err_msg : "unknown error")};
}

// "" when `lib` is the Python version NpuEP was built for, else what it is.
std::string WrongVersion(void* lib) {
  auto version = Symbol<decltype(&Py_GetVersion)>(lib, "Py_GetVersion");
  const std::string have = version();
  if (have.rfind(std::string(kPythonVersion) + ".", 0) == 0) return {};
  return "NpuEP was built for Python " + std::string(kPythonVersion) + " but the libpython found is " +
         have.substr(0, have.find(' '));
}

// Start the interpreter of `python`'s environment with `lib` (already loaded RTLD_GLOBAL), then release the GIL.
void StartInterpreter(void* lib, const std::string& python) {
  auto init_config = Symbol<decltype(&PyConfig_InitPythonConfig)>(lib, "PyConfig_InitPythonConfig");
  auto set_string = Symbol<decltype(&PyConfig_SetBytesString)>(lib, "PyConfig_SetBytesString");
  auto initialize = Symbol<decltype(&Py_InitializeFromConfig)>(lib, "Py_InitializeFromConfig");
  auto clear = Symbol<decltype(&PyConfig_Clear)>(lib, "PyConfig_Clear");
  auto exception = Symbol<decltype(&PyStatus_Exception)>(lib, "PyStatus_Exception");
  auto save_thread = Symbol<decltype(&PyEval_SaveThread)>(lib, "PyEval_SaveThread");

  PyConfig config;
  init_config(&config);
  config.install_signal_handlers = 0;  // the host owns SIGINT
  config.parse_argv = 0;
  try {
    // The executable decides sys.prefix: a venv's python selects the venv's site-packages (pyvenv.cfg).
    CheckStatus(set_string(&config, &config.program_name, python.c_str()), exception, "PyConfig program_name");
    CheckStatus(set_string(&config, &config.executable, python.c_str()), exception, "PyConfig executable");
    CheckStatus(initialize(&config), exception, "starting Python (" + python + ")");
  } catch (...) {
    clear(&config);
    throw;
  }
  clear(&config);
  save_thread();  // the GIL is taken per callback by whichever host thread calls
}

// The environment's npu_ep must import (with its dependencies) and be the install this library belongs to: another
// copy of _native would not share the plugin's state. Runs under the GIL; problems become a LoadError.
void CheckEnvironment(void* lib, const std::string& python, const std::string& native_path) {
  auto ensure = Symbol<decltype(&PyGILState_Ensure)>(lib, "PyGILState_Ensure");
  auto release = Symbol<decltype(&PyGILState_Release)>(lib, "PyGILState_Release");
  auto import = Symbol<decltype(&PyImport_ImportModule)>(lib, "PyImport_ImportModule");
  auto getattr = Symbol<decltype(&PyObject_GetAttrString)>(lib, "PyObject_GetAttrString");
  auto fetch = Symbol<decltype(&PyErr_Fetch)>(lib, "PyErr_Fetch");
  auto str = Symbol<decltype(&PyObject_Str)>(lib, "PyObject_Str");
  auto utf8 = Symbol<decltype(&PyUnicode_AsUTF8)>(lib, "PyUnicode_AsUTF8");
  auto decref = Symbol<decltype(&Py_DecRef)>(lib, "Py_DecRef");
  auto type_name = Symbol<decltype(&_PyType_Name)>(lib, "_PyType_Name");
  auto pending_error = [&]() {
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    fetch(&type, &value, &tb);
    PyObject* text = value ? str(value) : nullptr;
    const char* msg = text ? utf8(text) : nullptr;
    std::string error = std::string(type ? type_name(reinterpret_cast<PyTypeObject*>(type)) : "ImportError") + ": " +
                        (msg ? msg : "(no message)");
    for (PyObject* o : {text, type, value, tb}) {
      if (o) decref(o);
    }
    return error;
  };

  PyGILState_STATE gil = ensure();
  std::string error, imported_native;
  PyObject* entry_points = import("npu_ep.ep.entry_points");
  if (!entry_points) {
    error = "cannot import npu_ep.ep.entry_points (" + pending_error() +
            "): install npu-ep into it, or point "
            "NPU_EP_PYTHON at the python of an environment that has it";
  } else {
    decref(entry_points);
    PyObject* native = import("npu_ep.ep._native");
    PyObject* file = native ? getattr(native, "__file__") : nullptr;
    const char* text = file ? utf8(file) : nullptr;
    if (!text) {
      error = "cannot locate npu_ep.ep._native (" + pending_error() + ")";
    } else if (char* real = realpath(text, nullptr)) {
      imported_native = real;
      std::free(real);
    } else {
      imported_native = text;
    }
    for (PyObject* o : {file, native}) {
      if (o) decref(o);
    }
  }
  release(gil);
  if (error.empty() && imported_native != native_path) {
    error = "imports npu_ep from another install (" + imported_native + ", this library needs " + native_path +
            "): set NPU_EP_PYTHON to the python of the environment this library is installed in";
  }
  if (!error.empty()) throw LoadError{"the Python environment of " + python + " " + error};
}

// Start Python unless the process already runs it; returns the libpython we started, else nullptr.
void* EnsurePython(std::string* python_out) {
  using IsInitialized = int (*)();
  if (auto running = reinterpret_cast<IsInitialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized")); running && running())
    return nullptr;
  std::string how;
  const std::string python = FindPython(&how);
  if (!IsFile(python))
    throw LoadError{"no Python found: " + python + " (from " + how +
                    ") does not exist; set "
                    "NPU_EP_PYTHON to the python of the environment npu-ep is installed in"};
  std::string tried;
  for (const std::string& candidate : LibpythonCandidates(python)) {
    if (void* lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      if (std::string wrong = WrongVersion(lib); !wrong.empty()) {
        dlclose(lib);  // not left in the process's global scope
        throw LoadError{wrong + " (" + candidate + ")"};
      }
      StartInterpreter(lib, python);
      *python_out = python;
      return lib;
    }
    tried += "\n  " + candidate + ": " + dlerror();
  }
  throw LoadError{"no libpython" + std::string(kPythonVersion) + " found for " + python + " (from " + how +
                  "; NPU_EP_LIBPYTHON overrides); tried:" + tried};
}

std::string NativePath() { return Dirname(ThisLibraryPath()) + "/" + kNativeFile; }

void LoadNative(bool started_python) {
  if (g_native.create) return;
  const std::string path = NativePath();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // the same object Python's import of _native maps
  if (!lib) throw LoadError{std::string("cannot load the NpuEP plugin: ") + dlerror()};
  if (started_python) {
    // The interpreter serves this host's ONNX Runtime: `import npu_ep` must not register with the onnxruntime
    // Python package's own (separate) runtime.
    if (auto mark = reinterpret_cast<void (*)()>(dlsym(lib, "NpuEpMarkEmbeddedHost"))) mark();
  }
  g_native.create = reinterpret_cast<CreateFn>(dlsym(lib, "CreateEpFactories"));
  g_native.release = reinterpret_cast<ReleaseFn>(dlsym(lib, "ReleaseEpFactory"));
  if (!g_native.create || !g_native.release) throw LoadError{path + " does not export the plugin EP entry points"};
}

}  // namespace

extern "C" {

NPU_EP_EXPORT OrtStatus* CreateEpFactories(const char* registered_name, const OrtApiBase* api_base,
                                           const OrtLogger* logger, OrtEpFactory** factories, size_t max_factories,
                                           size_t* num_factories) {
  *num_factories = 0;
  const OrtApi* api = api_base->GetApi(23);
  if (!api) return nullptr;  // runtime older than 1.23: no OrtApi to even build an error status with
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    // A libpython left running by a previous registration counts as running: it is reused.
    std::string python;
    void* started = EnsurePython(&python);
    LoadNative(started != nullptr);  // marks the embedded host before anything imports npu_ep
    if (started) CheckEnvironment(started, python, NativePath());
  } catch (const LoadError& e) {
    return api->CreateStatus(ORT_FAIL, ("NpuEP: " + e.message).c_str());
  }
  return g_native.create(registered_name, api_base, logger, factories, max_factories, num_factories);
}

NPU_EP_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  return g_native.release ? g_native.release(factory) : nullptr;
}

}  // extern "C"

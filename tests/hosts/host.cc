// A plain C++ ONNX Runtime host (no Python of its own): the C API sequence any host (C, C++, C#, Java, Node) uses to
// run a model on NpuEP. tests/hosts/test_cpp_host.py builds it with the system compiler against ORT's C headers and
// the libonnxruntime inside the onnxruntime wheel.
//
//   npu_host LIB MODEL IODIR [--ep-option k=v]... [--threads N] [--repeat R] [--reregister] [--profile PREFIX]
//            [--bench N] [--cpu-only]
//
// IODIR/step<k>/inputs.txt lists one input per line: `name elem_type rank dims...`, its bytes in in<i>.bin. Every
// step runs in order; outputs go to IODIR/out/r<round>_t<thread>/step<k>/ (outputs.txt + out<i>.bin). --threads N
// runs N host threads, each with its own session, concurrently; --repeat R runs the steps R times per thread (each
// repeat's outputs must equal the first: the host checks and fails otherwise). --reregister releases everything,
// unregisters the library, registers it again and runs a second round. --bench N times N runs of step 0 and prints
// "bench <ep> <us per run>". Exit status: 0 ok, 1 usage or I/O, 2 outputs differ between repeats, 3 ORT error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "onnxruntime_c_api.h"

namespace {

const OrtApi* g_api = nullptr;

struct OrtFailure {
  std::string message;
};

void Check(OrtStatus* status, const char* what) {
  if (!status) return;
  std::string msg = std::string(what) + ": " + g_api->GetErrorMessage(status);
  g_api->ReleaseStatus(status);
  throw OrtFailure{msg};
}

struct Tensor {
  std::string name;
  ONNXTensorElementDataType type;
  std::vector<int64_t> dims;
  std::vector<char> bytes;
};

size_t ElementSize(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    default: return 1;  // int8, uint8, bool
  }
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw OrtFailure{"cannot read " + path};
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  }
}

std::vector<std::vector<Tensor>> ReadSteps(const std::string& iodir) {
  std::vector<std::vector<Tensor>> steps;
  for (int k = 0;; ++k) {
    std::string dir = iodir + "/step" + std::to_string(k);
    std::ifstream list(dir + "/inputs.txt");
    if (!list) break;
    std::vector<Tensor> inputs;
    std::string line;
    while (std::getline(list, line)) {
      if (line.empty()) continue;
      std::istringstream in(line);
      Tensor t;
      int type = 0;
      size_t rank = 0;
      in >> t.name >> type >> rank;
      t.type = static_cast<ONNXTensorElementDataType>(type);
      t.dims.resize(rank);
      for (auto& d : t.dims) in >> d;
      t.bytes = ReadFile(dir + "/in" + std::to_string(inputs.size()) + ".bin");
      inputs.push_back(std::move(t));
    }
    steps.push_back(std::move(inputs));
  }
  if (steps.empty()) throw OrtFailure{"no " + iodir + "/step0/inputs.txt"};
  return steps;
}

struct Options {
  std::string lib, model, iodir, profile;
  std::vector<std::string> ep_keys, ep_values;
  int threads = 1, repeat = 1, bench = 0;
  bool reregister = false, cpu_only = false;
};

const OrtEpDevice* FindNpuDevice(OrtEnv* env) {
  const OrtEpDevice* const* devices = nullptr;
  size_t count = 0;
  Check(g_api->GetEpDevices(env, &devices, &count), "GetEpDevices");
  for (size_t i = 0; i < count; ++i) {
    if (std::strcmp(g_api->EpDevice_EpName(devices[i]), "NpuEP") == 0) return devices[i];
  }
  throw OrtFailure{"GetEpDevices lists no NpuEP device"};
}

OrtSession* CreateSession(OrtEnv* env, const Options& o, bool profile) {
  OrtSessionOptions* so = nullptr;
  Check(g_api->CreateSessionOptions(&so), "CreateSessionOptions");
  if (!o.cpu_only) {
    const OrtEpDevice* device = FindNpuDevice(env);
    std::vector<const char*> keys, values;
    for (size_t i = 0; i < o.ep_keys.size(); ++i) {
      keys.push_back(o.ep_keys[i].c_str());
      values.push_back(o.ep_values[i].c_str());
    }
    Check(g_api->SessionOptionsAppendExecutionProvider_V2(so, env, &device, 1, keys.data(), values.data(),
                                                           keys.size()),
          "SessionOptionsAppendExecutionProvider_V2");
  }
  if (profile) Check(g_api->EnableProfiling(so, o.profile.c_str()), "EnableProfiling");
  OrtSession* session = nullptr;
  OrtStatus* s = g_api->CreateSession(env, o.model.c_str(), so, &session);
  g_api->ReleaseSessionOptions(so);
  Check(s, "CreateSession");
  return session;
}

// Runs one step; returns the outputs in the session's output order.
std::vector<Tensor> Run(OrtSession* session, const std::vector<Tensor>& inputs) {
  OrtMemoryInfo* memory = nullptr;
  Check(g_api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &memory), "CreateCpuMemoryInfo");
  std::vector<OrtValue*> values;
  std::vector<const char*> in_names;
  for (const Tensor& t : inputs) {
    OrtValue* v = nullptr;
    Check(g_api->CreateTensorWithDataAsOrtValue(memory, const_cast<char*>(t.bytes.data()), t.bytes.size(),
                                                t.dims.data(), t.dims.size(), t.type, &v),
          "CreateTensorWithDataAsOrtValue");
    values.push_back(v);
    in_names.push_back(t.name.c_str());
  }
  OrtAllocator* allocator = nullptr;
  Check(g_api->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");
  size_t n_out = 0;
  Check(g_api->SessionGetOutputCount(session, &n_out), "SessionGetOutputCount");
  std::vector<std::string> out_names(n_out);
  std::vector<const char*> out_ptrs(n_out);
  for (size_t i = 0; i < n_out; ++i) {
    char* name = nullptr;
    Check(g_api->SessionGetOutputName(session, i, allocator, &name), "SessionGetOutputName");
    out_names[i] = name;
    out_ptrs[i] = out_names[i].c_str();
    allocator->Free(allocator, name);
  }
  std::vector<OrtValue*> outs(n_out, nullptr);
  OrtStatus* s = g_api->Run(session, nullptr, in_names.data(), values.data(), values.size(), out_ptrs.data(), n_out,
                            outs.data());
  for (OrtValue* v : values) g_api->ReleaseValue(v);
  g_api->ReleaseMemoryInfo(memory);
  Check(s, "Run");
  std::vector<Tensor> result;
  for (size_t i = 0; i < n_out; ++i) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    Check(g_api->GetTensorTypeAndShape(outs[i], &info), "GetTensorTypeAndShape");
    Tensor t;
    t.name = out_names[i];
    size_t rank = 0, count = 0;
    Check(g_api->GetTensorElementType(info, &t.type), "GetTensorElementType");
    Check(g_api->GetDimensionsCount(info, &rank), "GetDimensionsCount");
    t.dims.resize(rank);
    Check(g_api->GetDimensions(info, t.dims.data(), rank), "GetDimensions");
    Check(g_api->GetTensorShapeElementCount(info, &count), "GetTensorShapeElementCount");
    g_api->ReleaseTensorTypeAndShapeInfo(info);
    void* data = nullptr;
    Check(g_api->GetTensorMutableData(outs[i], &data), "GetTensorMutableData");
    const char* bytes = static_cast<const char*>(data);
    t.bytes.assign(bytes, bytes + count * ElementSize(t.type));
    g_api->ReleaseValue(outs[i]);
    result.push_back(std::move(t));
  }
  return result;
}

void WriteOutputs(const std::string& dir, const std::vector<Tensor>& outs) {
  MakeDirs(dir);
  std::ofstream list(dir + "/outputs.txt");
  for (size_t i = 0; i < outs.size(); ++i) {
    list << outs[i].name << ' ' << static_cast<int>(outs[i].type) << ' ' << outs[i].dims.size();
    for (int64_t d : outs[i].dims) list << ' ' << d;
    list << '\n';
    std::ofstream(dir + "/out" + std::to_string(i) + ".bin", std::ios::binary)
        .write(outs[i].bytes.data(), static_cast<std::streamsize>(outs[i].bytes.size()));
  }
}

bool SameOutputs(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dims != b[i].dims || a[i].bytes != b[i].bytes) return false;
  }
  return true;
}

// One host thread: its own session, every step `repeat` times; returns "" or what went wrong.
std::string RunThread(OrtEnv* env, const Options& o, const std::vector<std::vector<Tensor>>& steps, int round,
                      int thread) {
  try {
    OrtSession* session = CreateSession(env, o, !o.profile.empty() && thread == 0);
    std::string failure;
    for (size_t k = 0; k < steps.size() && failure.empty(); ++k) {
      std::vector<Tensor> first = Run(session, steps[k]);
      for (int r = 1; r < o.repeat && failure.empty(); ++r) {
        if (!SameOutputs(first, Run(session, steps[k]))) failure = "DIFFERENT outputs at repeat " + std::to_string(r);
      }
      WriteOutputs(o.iodir + "/out/r" + std::to_string(round) + "_t" + std::to_string(thread) + "/step" +
                       std::to_string(k), first);
    }
    if (!o.profile.empty() && thread == 0) {
      OrtAllocator* allocator = nullptr;
      Check(g_api->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");
      char* file = nullptr;
      Check(g_api->SessionEndProfiling(session, allocator, &file), "SessionEndProfiling");
      std::printf("profile %s\n", file);
      allocator->Free(allocator, file);
    }
    g_api->ReleaseSession(session);
    return failure;
  } catch (const OrtFailure& e) {
    return "ORT: " + e.message;
  }
}

void Bench(OrtEnv* env, const Options& o, const std::vector<Tensor>& inputs) {
  OrtSession* session = CreateSession(env, o, false);
  for (int i = 0; i < 200; ++i) Run(session, inputs);  // warm up
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.bench; ++i) Run(session, inputs);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / o.bench;
  std::printf("bench %s %.3f\n", o.cpu_only ? "cpu" : "npu", us);
  g_api->ReleaseSession(session);
}

int Main(const Options& o) {
  g_api = OrtGetApiBase()->GetApi(23);
  if (!g_api) throw OrtFailure{"this libonnxruntime does not serve API 23"};
  std::printf("onnxruntime %s\n", OrtGetApiBase()->GetVersionString());
  const auto steps = ReadSteps(o.iodir);
  OrtEnv* env = nullptr;
  Check(g_api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "npu_host", &env), "CreateEnv");
  const int rounds = o.reregister ? 2 : 1;
  int status = 0;
  for (int round = 0; round < rounds && status == 0; ++round) {
    if (!o.cpu_only) Check(g_api->RegisterExecutionProviderLibrary(env, "NpuEP", o.lib.c_str()), "Register");
    if (o.bench) {
      Bench(env, o, steps[0]);
    } else {
      std::vector<std::string> failures(o.threads);
      std::vector<std::thread> threads;
      for (int t = 0; t < o.threads; ++t) {
        threads.emplace_back([&, t] { failures[t] = RunThread(env, o, steps, round, t); });
      }
      for (auto& th : threads) th.join();
      for (int t = 0; t < o.threads; ++t) {
        if (failures[t].empty()) continue;
        std::fprintf(stderr, "round %d thread %d: %s\n", round, t, failures[t].c_str());
        status = failures[t].rfind("ORT: ", 0) == 0 ? 3 : 2;
      }
    }
    if (!o.cpu_only) Check(g_api->UnregisterExecutionProviderLibrary(env, "NpuEP"), "Unregister");
    std::printf("round %d done\n", round);
  }
  g_api->ReleaseEnv(env);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LIB MODEL IODIR [options] (see host.cc)\n", argv[0]);
    return 1;
  }
  Options o;
  o.lib = argv[1];
  o.model = argv[2];
  o.iodir = argv[3];
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--ep-option") {
      std::string kv = next();
      size_t eq = kv.find('=');
      o.ep_keys.push_back(kv.substr(0, eq));
      o.ep_values.push_back(eq == std::string::npos ? "" : kv.substr(eq + 1));
    } else if (a == "--threads") {
      o.threads = std::atoi(next().c_str());
    } else if (a == "--repeat") {
      o.repeat = std::atoi(next().c_str());
    } else if (a == "--reregister") {
      o.reregister = true;
    } else if (a == "--profile") {
      o.profile = next();
    } else if (a == "--bench") {
      o.bench = std::atoi(next().c_str());
    } else if (a == "--cpu-only") {
      o.cpu_only = true;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 1;
    }
  }
  try {
    return Main(o);
  } catch (const OrtFailure& e) {
    std::fprintf(stderr, "error: %s\n", e.message.c_str());
    std::fflush(stdout);
    return 3;
  }
}

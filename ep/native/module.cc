// The same shared library is also a Python extension module (`npu_ep.ep._native`): importing it locates the
// plugin for registration and exposes the bridge's per-partition timing counters to reports and benchmarks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "control_flow_steps.h"
#include "device_memory.h"
#include "embedded_python.h"
#include "gqa_step.h"
#include "kernels/native/bindings.h"
#include "native_steps.h"
#include "ort_api.h"
#include "output_buffers.h"
#include "partition_kernel.h"
#include "program_call.h"
#include "python_interop.h"
#include "step_loop.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "NpuEP plugin library (ORT plugin-EP ABI) and its bridge counters";
  m.attr("ORT_API_VERSION") = npu_ep::kOrtApiVersion;
  m.attr("VERSION") = NPU_EP_VERSION;
  // The base object of every view of an ORT-owned initializer (weights the program reads in place).
  m.attr("ORT_INITIALIZER") = npu_ep::InitializerBase();
  m.def("partition_stats", &npu_ep::AllStats,
        "{partition: {calls, total_ns, program_ns, bytes_in, bytes_out, bytes_in_npu, bytes_out_npu}} measured "
        "inside the Compute callback (the _npu bytes: partition inputs/outputs found in NPU memory)");
  m.def("reset_stats", &npu_ep::ResetStats);
  m.def(
      "device_stats",
      [](uint64_t key) {
        const npu_ep::DeviceStats* s = npu_ep::DeviceStatsFor(key);
        pybind11::dict d;
        d["live_bytes"] = s->live_bytes.load();
        d["peak_bytes"] = s->peak_bytes.load();
        d["allocations"] = s->allocations.load();
        d["frees"] = s->frees.load();
        d["copies_to_npu"] = s->copies_to_npu.load();
        d["copies_to_host"] = s->copies_to_host.load();
        d["copies_on_npu"] = s->copies_on_npu.load();
        d["bytes_to_npu"] = s->bytes_to_npu.load();
        d["bytes_to_host"] = s->bytes_to_host.load();
        d["bytes_on_npu"] = s->bytes_on_npu.load();
        return d;
      },
      pybind11::arg("key"),
      "NPU-memory counters of one session (EpSession.device_stats_key) or, key 0, of the environment's shared "
      "allocator: live/peak bytes, allocations, and copies and bytes by direction (device_memory.h)");
  m.attr("NPU_VENDOR_ID") = npu_ep::kNpuVendorId;
  m.def("embedded_host", &npu_ep::EmbeddedHost,
        "Whether this interpreter was started by the plugin loader for a non-Python ONNX Runtime host");
  m.def("partition_output", &npu_ep::PartitionOutput, pybind11::arg("index"), pybind11::arg("dims"),
        "Inside a partition call: a writeable view of ORT's buffer for that output (index, dims), which the bridge "
        "then does not copy; None outside a call or for an output of unknown rank. Never keep it past the call");
  m.def(
      "prepare_shutdown",
      [](double timeout_s) {
        pybind11::gil_scoped_release release;  // let in-flight partition calls finish their Python part
        return npu_ep::PrepareShutdown(timeout_s);
      },
      pybind11::arg("timeout_s") = 2.0,
      "Refuse new partition calls and wait for running ones; returns whether all finished in time");
  npu_ep::RegisterNativeSteps(m);
  npu_ep::RegisterGqaStep(m);
  npu_ep::RegisterControlFlowSteps(m);
  npu_ep::RegisterStepLoop(m);
  npu_ep::RegisterProgramCall(m);
  npu_ep::kern::RegisterKernels(m);
}

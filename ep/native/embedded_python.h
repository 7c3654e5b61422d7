// The plugin inside a host without Python of its own (ep/loader/plugin_loader.cc starts the interpreter there).
#pragma once

namespace npu_ep {

// Whether the interpreter was started by the loader for a non-Python host (then `import npu_ep` must not register
// the plugin with the onnxruntime Python package's runtime, a second ORT in the process).
bool EmbeddedHost();

// Give the calling host thread a Python thread state that lives as long as the thread, so each callback only
// takes the GIL instead of creating and destroying a thread state. No-op for threads Python already knows.
void AdoptHostThread();

}  // namespace npu_ep

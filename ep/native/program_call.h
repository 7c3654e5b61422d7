// A compiled program's call (ep/program.py, Program.__call__) in C++, so a partition call runs no Python frame
// before its first Python kernel: the partition's inputs in the program's order, the input-shape signature looked
// up, and a known signature's loop run under numpy's "ignore all" error state (from the first step that needs it:
// a context of the program's own is entered), its calls and time counted. A
// signature's first call and recording calls go to Program._observe, which runs them on the StepLoop with its
// observer (binding native steps, recording). At most `capacity` signatures are kept: tracking one more evicts
// the least recently used, whose later calls are observed again.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace npu_ep {

class ProgramCall;

// The call behind a `_native.ProgramCall` object; nullptr when `obj` is not one.
ProgramCall* AsProgramCall(pybind11::handle obj);
// The program's outputs for `inputs` (a tuple, the partition's order) as a new reference, or nullptr with a
// Python error set. GIL held. elapsed_ns (optional) receives the call's wall time.
PyObject* CallProgram(ProgramCall& call, PyObject* inputs, uint64_t* elapsed_ns = nullptr);

void RegisterProgramCall(pybind11::module_& m);

}  // namespace npu_ep

// Native steps: what a compiled program's step becomes once a signature's first call has shown its inputs
// (ep/step_binding.py binds them), run by the program's C++ loop (step_loop.cc) without the step's Python kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace npu_ep {

class NativeStep {
 public:
  virtual ~NativeStep() = default;
  // The step's outputs (a new reference to a tuple) for `args` (the step's input tuple); nullptr with no Python
  // error set when these inputs are not the ones the step was bound for (the loop then runs the Python kernel);
  // nullptr with an error set when the step failed.
  virtual PyObject* Run(PyObject* args) = 0;
};

// Whether a's shape is dims.
bool SameShape(const pybind11::array& a, const std::vector<pybind11::ssize_t>& dims);

// What keeps a bound step to the setting it was bound under: (dict, key, expected object) triples; the step
// declines once dict[key] is not that very object (an absent key is expected as None), e.g. another kernel choice
// or DMA counting switched on.
class Guards {
 public:
  explicit Guards(const pybind11::list& guards);
  // true while every guard holds; false (the step declines) otherwise, with a Python error set if reading failed
  bool Hold() const;

 private:
  struct Guard {
    pybind11::dict dict;
    pybind11::object key, expected;
  };
  std::vector<Guard> guards_;
};

void RegisterNativeSteps(pybind11::module_& m);

}  // namespace npu_ep

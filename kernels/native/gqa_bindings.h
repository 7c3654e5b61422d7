// The native GroupQueryAttention's checked entry from Python arrays, shared by its binding (`kernels.gqa`) and
// the program's bound GQA step (ep/native/gqa_step.cc).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "gqa.h"

namespace npu_ep::kern {

template <typename T>
using Arr = pybind11::array_t<T, pybind11::array::c_style>;

// The kernel's arguments for these arrays (all but out and threads); throws std::invalid_argument ("gqa: ...")
// naming what is wrong: a dtype, rank, contiguity or shape that does not fit. The result points into the arrays
// and length vectors passed: they must outlive the run.
GqaArgs GqaArgsFor(const pybind11::array& query, const std::optional<pybind11::array>& key,
                   const std::optional<pybind11::array>& value, const std::optional<pybind11::array>& past_key,
                   const std::optional<pybind11::array>& past_value, const pybind11::array& present_key,
                   const pybind11::array& present_value, int64_t dirty, const std::vector<int32_t>& past_len,
                   const std::vector<int32_t>& total_len, int64_t num_heads, int64_t kv_num_heads, float scale,
                   float softcap, int64_t local_window_size, const std::optional<pybind11::array>& cos,
                   const std::optional<pybind11::array>& sin, bool interleaved,
                   const std::optional<Arr<int64_t>>& position_ids);

// Runs the kernel without the GIL; returns the output [B, S, N*H] in query's dtype.
pybind11::array RunGqa(GqaArgs a, const pybind11::array& query, int threads);

}  // namespace npu_ep::kern

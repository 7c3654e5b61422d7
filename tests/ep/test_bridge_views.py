"""The bridge hands the program ORT's input tensors as read-only, C-contiguous numpy views (no copy), for every
rank including 0-d scalars and empty tensors, and the results equal the CPU EP's."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npu_ep.ep.program import Program
from tests.npu_testing import assignment, cpu_run, make_model, npu_session


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3), (1, 2, 513, 32)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_inputs_reach_the_program_as_read_only_views(monkeypatch, shape, dtype):
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    dims = [f"d{i}" for i in range(len(shape))]
    model = make_model([helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                       [helper.make_tensor_value_info("x", onnx_type, dims)],
                       [helper.make_tensor_value_info("y", onnx_type, dims)])
    sess = npu_session(model)
    seen = []
    real_observe = Program._observe

    def spy(self, inputs):
        seen.extend(inputs)
        return real_observe(self, inputs)

    monkeypatch.setattr(Program, "_observe", spy)
    x = np.asarray(np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) - 2).astype(dtype)
    for _ in range(2):  # first call of the signature, then the hot path
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, cpu_run(model, {"x": x})[0])
        assert got.dtype == dtype and got.shape == shape
    assert assignment(sess) == {"add": "NpuEP"}
    assert len(seen) == 1  # the first call reaches Python; the second runs in C++ on views made the same way
    for view in seen:
        assert view.shape == shape and view.dtype == dtype and view.flags.c_contiguous
        assert not view.flags.writeable and not view.flags.owndata
        with pytest.raises(ValueError, match="read-only"):
            view[...] = 0

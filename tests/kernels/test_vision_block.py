"""A small CNN block made of this issue's ops (Conv -> BatchNormalization -> Clip -> HardSwish -> Resize -> Pad ->
ConvTranspose -> InstanceNormalization -> LeakyRelu -> Flatten -> TopK / ArgMax) runs entirely on NpuEP as ONE
partition and matches the CPU EP (rtol/atol 1e-4), with ORT's graph optimizations on (ORT folds the BN into the
Conv first) and off (our conv_bn fusion folds it)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_testing import assignment, cpu_run, npu_partitions, npu_session, session_options

RNG = np.random.default_rng(13)


def _block():
    f = lambda *s: RNG.standard_normal(s).astype(np.float32)
    inits = {"w": f(8, 3, 3, 3), "b": f(8), "s": f(8), "bb": f(8), "m": f(8), "v": RNG.uniform(0.5, 2, 8)
             .astype(np.float32), "lo": np.array(0, np.float32), "hi": np.array(6, np.float32),
             "scales": np.array([1, 1, 2, 2], np.float32), "pads": np.array([0, 0, 1, 2, 0, 0, 1, 0], np.int64),
             "wt": f(8, 4, 2, 2), "is": f(4), "ib": f(4), "k": np.array([5], np.int64)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w", "b"], ["c"], "conv", pads=[1, 1, 1, 1]),
             n("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"], "bn"),
             n("Clip", ["bn", "lo", "hi"], ["clip"], "clip"),
             n("HardSwish", ["clip"], ["hs"], "hswish"),
             n("Resize", ["hs", "", "scales"], ["up"], "resize", mode="nearest"),
             n("Pad", ["up", "pads"], ["pad"], "pad", mode="reflect"),
             n("ConvTranspose", ["pad", "wt"], ["ct"], "convT", strides=[2, 2]),
             n("InstanceNormalization", ["ct", "is", "ib"], ["inorm"], "inorm"),
             n("LeakyRelu", ["inorm"], ["lr"], "lrelu", alpha=0.1),
             n("Flatten", ["lr"], ["flat"], "flatten", axis=1),
             n("TopK", ["flat", "k"], ["vals", "idx"], "topk"),
             n("ArgMax", ["flat"], ["am"], "argmax", axis=1, keepdims=0)]
    outs = [helper.make_tensor_value_info("vals", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("idx", TensorProto.INT64, None),
            helper.make_tensor_value_info("am", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "vision_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     [2, 3, 10, 12])],
                              outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("optimize", [True, False])
def test_vision_block_is_one_npu_partition_matching_cpu(optimize):
    model = _block()
    so = session_options()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = npu_session(model, so=so, cpu=False)
    assert set(assignment(sess).values()) == {"NpuEP"}
    assert len(npu_partitions(sess)) == 1
    feeds = {"x": RNG.standard_normal((2, 3, 10, 12)).astype(np.float32)}
    got, want = sess.run(None, feeds), cpu_run(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])

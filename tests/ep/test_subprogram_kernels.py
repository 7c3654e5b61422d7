"""A sub-program (an If branch, a Loop/Scan body) runs with its owner's kernel setting: the session's
``kernels=native|reference`` and ``host_threads`` reach the steps of branch and body programs, nested ones included,
whether the sub-program is loaded after the session stamped its owner or before (kernels/subprograms.py,
kernels/ops/runtime.configure)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_ep.ep.entry_points import LIVE_SESSIONS
from npu_ep.kernels import subprograms
from npu_ep.kernels import runtime
from npu_ep.quantization import quantize_matmul_nbits
from tests.npu_testing import F32, assignment, cpu_run, make_model, npu_session

RNG = np.random.default_rng(5)
K = 32


def _nbits(name: str, a: str):
    """A MatMulNBits node (K = N = 32, accuracy level 0) with its weights as graph-local initializers."""
    q = quantize_matmul_nbits((RNG.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32), 16, False)
    inits = [numpy_helper.from_array(np.asarray(v), f"{name}_{s}")
             for s, v in (("B", q.B), ("S", q.scales), ("Z", q.zero_points))]
    node = helper.make_node("MatMulNBits", [a, f"{name}_B", f"{name}_S", f"{name}_Z"], [name], name,
                            domain="com.microsoft", K=K, N=K, bits=4, block_size=16, accuracy_level=0)
    return node, inits


def loop_with_if_model():
    """acc = Loop(M): h = MatMulNBits(acc); acc = If(flag, then: Relu(MatMulNBits(h)), else: Sigmoid(h)): native
    kernels in the body and in a branch of the If nested in it."""
    then_mm, then_inits = _nbits("then_mm", "h")
    then_b = helper.make_graph([then_mm, helper.make_node("Relu", ["then_mm"], ["t_out"], name="then_relu")], "then",
                               [], [helper.make_tensor_value_info("t_out", F32, None)], then_inits)
    else_b = helper.make_graph([helper.make_node("Sigmoid", ["h"], ["e_out"], name="else_sig")], "else", [],
                               [helper.make_tensor_value_info("e_out", F32, None)])
    body_mm, body_inits = _nbits("body_mm", "acc_in")
    body = helper.make_graph(
        [body_mm, helper.make_node("Identity", ["body_mm"], ["h"], name="b_h"),
         helper.make_node("If", ["flag"], ["acc_out"], name="b_if", then_branch=then_b, else_branch=else_b),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_cond")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", F32, [2, K])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, [2, K])], body_inits)
    loop = helper.make_node("Loop", ["M", "", "acc0"], ["acc"], name="loop", body=body)
    return make_model([loop], [helper.make_tensor_value_info("M", TensorProto.INT64, []),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("acc0", F32, [2, K])],
                      [helper.make_tensor_value_info("acc", F32, [2, K])], opset=21,
                      extra_opsets=[("com.microsoft", 1)])


def _feeds(flag: bool):
    return {"M": np.array(3, np.int64), "flag": np.array(flag), "acc0": RNG.standard_normal((2, K)).astype(np.float32)}


def _sub_steps(steps):
    """Every step of every loaded sub-program under ``steps``, nested ones included."""
    out = []
    for st in steps:
        for program in subprograms.loaded_programs(st.prepared):
            out += [*program.steps, *_sub_steps(program.steps)]
    return out


class _NoNativeKernels:
    """Stands in for the extension's kernels module: any native kernel call fails the run. ``isa`` is no kernel but
    the host's instruction set, which compilation asks (``layout.host_mode``): the real module's answer."""

    def __init__(self):
        self.isa = runtime.native_module().isa

    def __getattr__(self, name):
        raise AssertionError(f"native kernel '{name}' called")


def _session(model, options):
    before = set(LIVE_SESSIONS)
    sess = npu_session(model, options)
    (ep,) = set(LIVE_SESSIONS) - before
    assert assignment(sess) == {"loop": "NpuEP"}
    (program,) = ep.programs.values()
    return sess, program


def test_reference_session_runs_branch_and_body_steps_on_the_reference_model(monkeypatch):
    """kernels=reference with the native kernels made unusable: the Loop body's and the nested If branch's
    MatMulNBits run the reference model (the run succeeds and matches the CPU EP); the same model in a
    kernels=native session reaches the (unusable) native kernels, so the setting is what decides."""
    monkeypatch.setattr(runtime, "_module", [_NoNativeKernels(), runtime.extension()])
    model = loop_with_if_model()
    sess, program = _session(model, {"kernels": "reference", "host_threads": "1"})
    for flag in (True, False):
        feeds = _feeds(flag)
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu_run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    nested = _sub_steps(program.steps)
    assert {st.op for st in nested} >= {"com.microsoft::MatMulNBits", "If", "Sigmoid"}
    assert sum("MatMul" in st.op for st in nested) == 2  # the body's, and the branch's (Relu fused into it)
    assert all(runtime.native(st.prepared) is None and runtime.threads(st.prepared) == 1 for st in nested)
    native_sess, _ = _session(model, {"kernels": "native"})
    with pytest.raises(Exception, match="native kernel 'matmul_nbits' called"):
        native_sess.run(None, _feeds(True))


def test_configure_reaches_sub_programs_loaded_before_it():
    """Sub-programs already loaded when the owner is stamped again take the new setting, nested ones too."""
    sess, program = _session(loop_with_if_model(), {"kernels": "native", "host_threads": "2"})
    for flag in (True, False):  # loads the body and both branch programs
        sess.run(None, _feeds(flag))
    nested = _sub_steps(program.steps)
    assert len({st.node_name for st in nested}) >= 5
    assert all(runtime.threads(st.prepared) == 2 and runtime.native(st.prepared) is runtime.native_module()
               for st in nested)
    runtime.configure((st.prepared for st in program.steps), "reference", 1)
    assert all(runtime.native(st.prepared) is None and runtime.threads(st.prepared) == 1 for st in nested)

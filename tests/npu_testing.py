"""Test helpers: build small ONNX models, run them on NpuEP and on the CPU EP, read ORT's graph assignment."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import npu_ep

F32 = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers: Mapping[str, np.ndarray] | None = None, *, opset: int = 17,
               extra_opsets: Sequence[tuple[str, int]] = ()) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, folder, name: str = "model.onnx") -> str:
    path = os.path.join(str(folder), name)
    onnx.save(model, path)
    return path


def session_options(**config: str) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    return so


def npu_session(model, provider_options: Mapping[str, str] | None = None, *, cpu: bool = True,
                so: ort.SessionOptions | None = None, **config: str) -> ort.InferenceSession:
    """A session with NpuEP first; Python's silent CPU fallback (at creation and at run) disabled so EP failures
    raise instead of quietly running everything on the CPU."""
    opts = {"cache_dir": ""}
    opts.update(provider_options or {})
    providers: list = [(npu_ep.get_ep_name(), opts)] + (["CPUExecutionProvider"] if cpu else [])
    model = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(model, sess_options=so or session_options(**config), providers=providers,
                                enable_fallback=0)


def cpu_run(model, feeds, output_names=None) -> list[np.ndarray]:
    model = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(output_names, feeds)


def assignment(sess: ort.InferenceSession) -> dict[str, str]:
    """node name -> EP that ran it, from ORT's own record (proves NpuEP ran, not a silent CPU fallback)."""
    out = {}
    for subgraph in sess.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            out[node.name] = subgraph.ep_name
    return out


def npu_partitions(sess: ort.InferenceSession) -> list[list[str]]:
    return [[n.name for n in sg.get_nodes()] for sg in sess.get_provider_graph_assignment_info()
            if sg.ep_name == npu_ep.get_ep_name()]


def count_kernel_runs(program) -> collections.Counter:
    """From now on, count each step's Python kernel runs by op (a program's step that ran natively is not counted):
    the kernels are wrapped and the program's loops rebuilt over them (a rebind to the same I/O order)."""
    runs: collections.Counter = collections.Counter()

    def counted(run, op):
        def counting(prepared, args):
            runs[op] += 1
            return run(prepared, args)
        return counting

    for st in program.steps:
        st.kernel = dataclasses.replace(st.kernel, run=counted(st.kernel.run, st.op))
    ort_order = [io.name for io in program.inputs]
    for j, i in enumerate(program._input_perm or ()):
        ort_order[i] = program.inputs[j].name
    program.rebind(ort_order, [io.name for io in program.outputs])
    return runs

"""What a person reads in npu-report's HTML and terminal output (issue 38, items 23 and 18): partitions named by
what they hold, every series labelled by what it measures, the crossings' measured column filled or saying
"not measured", and model-supplied names that cannot drive the terminal or inject HTML."""

from __future__ import annotations

import html as html_lib
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from rich.console import Console

import npu_ep
from npu_ep.tools.report.html import partition_map_figure, render_html, timeline_figure
from npu_ep.tools.report.render import render
from tests.ep.test_policy import target_without
from tests.npu_testing import make_model
from tests.tools.test_report import _session, erf_layers_model

HOSTILE = "/model/layers.0/mlp/MatMul\x1b]0;pwned\x07\n<script>alert(1)</script>"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return target_without(tmp_path_factory.mktemp("target"))


def _table(page: str, title: str) -> list[list[str]]:
    """The cells of the HTML table under heading ``title``, header row first."""
    block = page.split(f"<h2>{title}</h2>", 1)[1].split("</table>", 1)[0]
    return [[html_lib.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", block)]


def _column(rows: list[list[str]], name: str) -> list[str]:
    i = rows[0].index(name)
    return [r[i] for r in rows[1:]]


def test_a_sessions_partitions_are_named_by_what_they_hold_not_by_orts_hash(target):
    model = erf_layers_model()
    doc = npu_ep.report(_session(model, target), model=model, target=target, dims={"batch": 2})
    assert doc["source"] == "session"
    assert [p["label"] for p in doc["partitions"]] == ["p0: layer 0, 1 node", "p1: layer 1, 1 node",
                                                       "p2: layer 2, 1 node"]
    page = render_html(doc)
    parts = _table(page, "NpuEP partitions")
    assert _column(parts, "partition") == [p["label"] for p in doc["partitions"]]
    crossings = _table(page, "CPU &lt;-&gt; NPU crossings (per run)")
    assert set(_column(crossings, "partition")) == {p["label"] for p in doc["partitions"]}
    assert all(not name.startswith("NpuEP_") for name in _column(crossings, "partition"))
    assert {peer for c in doc["crossings"] for peer in c["peer"] if peer.startswith("partition:")} <= {
        "partition:p0", "partition:p1", "partition:p2"}


def test_without_a_run_the_measured_column_says_not_measured_and_the_timeline_says_estimated(target):
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 2})
    crossings = _table(render_html(doc), "CPU &lt;-&gt; NPU crossings (per run)")
    assert _column(crossings, "measured us") == ["not measured"] * len(doc["crossings"])
    fig = timeline_figure(doc)
    title, legend = fig.layout.title.text, [t.name for t in fig.data]
    assert "measured" not in title.replace("not measured", "") and "estimated" in title, title
    assert not any("measured" in name for name in legend), legend
    assert any("estimated" in name for name in legend), legend


def test_with_a_run_the_measured_column_holds_numbers_and_every_host_series_is_measured(target):
    doc = npu_ep.report(erf_layers_model(), target=target, dims={"batch": 2}, run=True, runs=2)
    crossings = _table(render_html(doc), "CPU &lt;-&gt; NPU crossings (per run)")
    measured = _column(crossings, "measured us")
    assert measured and all(float(v.replace(",", "")) >= 0 for v in measured), measured
    fig = timeline_figure(doc)
    assert "measured host" in fig.layout.title.text
    host = [t.name for t in fig.data if t.offsetgroup == "host"]
    assert host and all("(measured)" in name for name in host), host


def _hostile_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name=HOSTILE),
             helper.make_node("Erf", ["m"], ["y"], name="erf\x1b[2J")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                      {"w": rng.standard_normal((8, 8)).astype(np.float32)})


def test_hostile_node_names_are_escaped_in_html_and_on_the_terminal(target):
    doc = npu_ep.report(_hostile_model(), target=target)
    page = render_html(doc).split("<details>")[0]  # the JSON dump below is escaped by json itself
    assert "\x1b" not in page and "\x07" not in page and "<script>alert" not in page
    assert _column(_table(page, "nodes left to the CPU, and why"), "node") == ["erf\\x1b[2J"]  # shown as escapes
    hover = [text for trace in partition_map_figure(doc).data for text in trace.text]
    assert any(t.startswith("/model/layers.0/mlp/MatMul\\x1b]0;pwned\\x07\\n&lt;script&gt;") for t in hover), hover
    console = Console(record=True, width=200, force_terminal=False)
    render(doc, console)
    out = console.export_text()
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out

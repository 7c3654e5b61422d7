"""``python -m npu_ep.models.qnn_llm FOLDER`` writes only new files: an existing model (or its data file) in the
folder is refused before anything is exported, and left as it was. Needs no torch (the check comes first)."""

from __future__ import annotations

import pytest

from npu_ep.models import qnn_llm


@pytest.mark.parametrize("existing", ["llama_torchscript_float.onnx", "llama_torchscript_a16w8.onnx",
                                      "llama_torchscript_float.onnx.data"])
def test_an_existing_output_is_refused_and_untouched(tmp_path, existing, capsys):
    (tmp_path / existing).write_bytes(b"user's file")
    with pytest.raises(FileExistsError, match=existing.removesuffix(".data").replace(".", r"\.")):
        qnn_llm.build(tmp_path)
    assert qnn_llm.main([str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / existing).read_bytes() == b"user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]

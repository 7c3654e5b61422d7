"""npu_ep.models: generators of the models the tests, the demo and the benchmarks run; no downloads.

The tiny Llama decoders (``tiny_llama``, its weights and float32 numpy forward in ``weights`` and ``reference``),
QNN-style quantized LLMs (``qnn_llm``), the real models shipped in pip packages (``corpus``), and, with torch
installed, exported decoders (``torch_export``), encoders (``encoders``) and onnxruntime-genai folders
(``genai_llama``).

May import: numpy, onnx and the standard library (torch and transformers inside the functions that need them); no
other npu_ep package.
"""

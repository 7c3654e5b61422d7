"""npu_ep.quantization"""

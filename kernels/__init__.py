"""npu_ep.kernels"""

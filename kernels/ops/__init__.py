"""npu_ep.kernels.ops"""

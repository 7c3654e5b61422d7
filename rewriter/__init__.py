"""npu_ep.rewriter"""

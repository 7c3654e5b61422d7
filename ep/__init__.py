"""npu_ep.ep"""

"""npu_ep.models"""

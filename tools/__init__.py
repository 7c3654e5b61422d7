"""npu_ep.tools"""

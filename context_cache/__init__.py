"""npu_ep.context_cache"""

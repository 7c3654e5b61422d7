import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/npu_testing.py, shared helpers

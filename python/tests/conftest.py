import os
import sys

# The Megatron-style reference enumeration lives with the benchmark (python/bench).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))

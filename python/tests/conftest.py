import os
import sys

# The Megatron-style reference enumeration lives with the benchmark (python/bench).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))

# test_bindings_state.py runs a pytest of its own (the failure rendering of issue 23).
pytest_plugins = ["pytester"]

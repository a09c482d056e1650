import os
import sys

# Tests import the in-tree package (python/c10d with the built extension).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

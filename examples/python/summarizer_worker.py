"""Compatibility shim: the summarizer worker is now ``redis_mem.summarizer``
of the redis-mem package (python/; console script ``redis-mem-summarizer``).
Kept because benches/agent_sim.py imports ``summarizer_worker`` from this
folder; new code imports ``redis_mem.summarizer``."""

import os
import sys

# The package's source, for callers that have not pip-installed it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))

from redis_mem.summarizer import *  # noqa: E402,F401,F403
from redis_mem.summarizer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

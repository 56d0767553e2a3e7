"""`python -m benchmarks STEP ARGS...` (the steps: benchmarks/__init__.py, benchmarks/README.md)."""

import sys

from . import main

sys.exit(main())

"""`python -m testbed STEP ...`: the testbed's steps (run.py)."""

import sys

from .run import main

sys.exit(main())

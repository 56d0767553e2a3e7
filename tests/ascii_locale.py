"""run_in_ascii_locale: a Python child whose locale encoding is ASCII (LC_ALL=C without Python's UTF-8 mode), to
check that a file is read and written as UTF-8 whatever the locale says."""

import os
import subprocess
import sys


def run_in_ascii_locale(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args...` under the ASCII locale; its output captured as text."""
    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)

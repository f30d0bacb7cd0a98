"""Runs the package's Python tests for ctest, or skips them naming what is missing.

Usage: run_python_tests.py REQUIRES PATTERN
REQUIRES: modules the tests import, comma-separated ("numpy,torch"; "-" for none). When this
interpreter lacks one, prints what is missing and exits with 77, which ctest reports as
skipped (SKIP_RETURN_CODE). Otherwise runs the tests in this directory whose file names
match PATTERN (unittest discovery) and exits with their status.
"""

import importlib.util
import os
import sys
import unittest


def main():
    requires, pattern = sys.argv[1:3]
    needed = [] if requires == "-" else requires.split(",")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        print(f"SKIPPED: {sys.executable} has no {', '.join(missing)}; install Debian's python3-numpy and "
              f"python3-torch, or configure with -DPython3_EXECUTABLE=/usr/bin/python3 (an interpreter that has them)")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    suite = unittest.defaultTestLoader.discover(here, pattern=pattern, top_level_dir=here)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())

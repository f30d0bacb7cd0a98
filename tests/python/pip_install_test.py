"""`pip install .` into a fresh virtual environment (with the system's site packages, for
torch), offline (--no-index: nothing may be downloaded), then ferry imported from outside the
source tree: installed in the venv, with its metadata, sending and receiving.

FERRY_PIP_BUILD_DIR (set by ctest to the build tree the tests run in) makes the build
backend package that tree's build instead of configuring one of its own, so that this test
costs seconds.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cmake_version():
    with open(os.path.join(SOURCE, "CMakeLists.txt"), encoding="utf-8") as cmake:
        return re.search(r"project\(\s*ferry\s+VERSION\s+([0-9][0-9.]*)", cmake.read()).group(1)


CHECK = """
import importlib.metadata, os, sys
import ferry
assert os.path.realpath(ferry.__file__).startswith(os.path.realpath(sys.prefix)), ferry.__file__
version = importlib.metadata.version("ferry")
assert getattr(ferry, "__version__", version) == version, (ferry.__version__, version)
tx, rx = ferry._channel("shm_ring")
tx.send({"from": "venv", "n": 7})
assert rx.recv() == {"from": "venv", "n": 7}
print(version)
"""


class PipInstallTest(unittest.TestCase):
    def test_pip_install_into_a_fresh_venv_offline(self):
        with tempfile.TemporaryDirectory(prefix="ferry-pip-") as scratch:
            venv = os.path.join(scratch, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            install = subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-cache-dir", SOURCE],
                                     cwd=scratch, capture_output=True, text=True)
            self.assertEqual(install.returncode, 0, install.stdout + install.stderr)
            checked = subprocess.run([python, "-c", CHECK], cwd=scratch, capture_output=True, text=True,
                                     env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
            self.assertEqual(checked.stdout.strip(), cmake_version())
            # The wheel's RECORD lists every file: uninstalling leaves no ferry behind.
            subprocess.run([python, "-m", "pip", "uninstall", "-y", "ferry"], check=True, capture_output=True)
            gone = subprocess.run([python, "-c", "import ferry"], cwd=scratch, capture_output=True,
                                  env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
            self.assertNotEqual(gone.returncode, 0)
            self.assertFalse(os.path.exists(os.path.join(venv, "lib", f"python{sys.version_info.major}."
                                                         f"{sys.version_info.minor}", "site-packages", "ferry")))


if __name__ == "__main__":
    unittest.main()

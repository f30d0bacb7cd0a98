"""ferry's PEP 517 build backend: `pip install .` builds the Python package with CMake and
installs it with its metadata, needing nothing but the standard library, CMake, a C++20
compiler and Debian's development packages (no package index: nothing is downloaded).

pyproject.toml names it with `backend-path`, so pip loads it from the source tree with
`requires = []`. build_wheel configures the source tree into build/pip-<interpreter> (kept,
so a second install rebuilds only what changed; CMAKE_CXX_COMPILER_LAUNCHER=ccache in the
environment is honoured), builds the target ferry_python for the interpreter running pip,
and zips the package directory CMake made (<build>/python/ferry) into a wheel.
FERRY_PIP_BUILD_DIR names an already configured build tree to build and package instead
(ferry's own test of `pip install .` reuses the tree it runs in).
The version is the one in CMakeLists.txt's project() line: ferry has no other.
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "ferry"
SUMMARY = "Typed messages between processes; tensors travel without copies (C++ runtime, Python package)"


def version():
    """The project version of CMakeLists.txt (project(ferry VERSION x.y.z ...))."""
    with open(os.path.join(SOURCE, "CMakeLists.txt"), encoding="utf-8") as cmake:
        found = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9][0-9.]*)", cmake.read())
    if not found:
        raise RuntimeError("CMakeLists.txt has no project(ferry VERSION x.y.z) line")
    return found.group(1)


def wheel_tag():
    """This interpreter's tag: cp311-cp311-linux_x86_64 and the like."""
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = interpreter + getattr(sys, "abiflags", "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interpreter}-{abi}-{platform}"


def metadata_text():
    readme = os.path.join(SOURCE, "README.md")
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version()}",
        f"Summary: {SUMMARY}",
        "Requires-Python: >=3.9",
        "Classifier: Programming Language :: C++",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Operating System :: POSIX :: Linux",
    ]
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as text:
            return "\n".join(lines) + "\n\n" + text.read()
    return "\n".join(lines) + "\n"


def wheel_text():
    return "\n".join(["Wheel-Version: 1.0", "Generator: ferry_build_backend", "Root-Is-Purelib: false",
                      f"Tag: {wheel_tag()}", ""])


def run(command):
    print("ferry_build_backend:", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def build_package():
    """Configures (unless FERRY_PIP_BUILD_DIR is given) and builds ferry_python; the built
    package directory."""
    build = os.environ.get("FERRY_PIP_BUILD_DIR")
    if not build:
        build = os.path.join(SOURCE, "build", f"pip-{wheel_tag()}")
        configure = ["cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DFERRY_BUILD_PYTHON=ON",
                     "-DFERRY_BUILD_TESTS=OFF", "-DFERRY_BUILD_BENCH=OFF", "-DFERRY_BUILD_SAMPLES=OFF",
                     "-DFERRY_WITH_UCX=OFF", "-DFERRY_UNITY_BUILD=ON"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        run(configure)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    run(["cmake", "--build", build, "--target", "ferry_python", "--parallel", jobs])
    package = os.path.join(build, "python", NAME)
    if not os.path.isdir(package):
        raise RuntimeError(f"the build made no package directory {package}")
    return package


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(wheel_directory, package):
    dist_info = f"{NAME}-{version()}.dist-info"
    wheel_name = f"{NAME}-{version()}-{wheel_tag()}.whl"
    files = []
    for root, directories, names in os.walk(package):
        directories[:] = sorted(d for d in directories if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(root, name)
            with open(full, "rb") as data:
                files.append((os.path.join(NAME, os.path.relpath(full, package)), data.read()))
    files.append((f"{dist_info}/METADATA", metadata_text().encode("utf-8")))
    files.append((f"{dist_info}/WHEEL", wheel_text().encode("utf-8")))
    files.append((f"{dist_info}/top_level.txt", f"{NAME}\n".encode("utf-8")))
    record = [record_line(path, data) for path, data in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    target = os.path.join(wheel_directory, wheel_name)
    with tempfile.NamedTemporaryFile(dir=wheel_directory, delete=False) as partial:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
            for path, data in files:
                info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                wheel.writestr(info, data)
    os.replace(partial.name, target)
    return wheel_name


# ---- PEP 517 hooks ---------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"{NAME}-{version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, text in (("METADATA", metadata_text()), ("WHEEL", wheel_text()), ("top_level.txt", f"{NAME}\n")):
        with open(os.path.join(metadata_directory, dist_info, name), "w", encoding="utf-8") as out:
            out.write(text)
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return write_wheel(wheel_directory, build_package())

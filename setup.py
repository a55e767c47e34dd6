"""Build the Cython extensions in ``pyx/`` into the ``pal_bench`` package.

Flags are portable by default (``-O3``). Set ``PAL_BENCH_NATIVE=1`` to add ``-march=native``
for a build tuned to the machine it runs on (not portable to other CPUs).
"""

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["_sumtree", "_segment", "_rows", "_replay", "_measure", "_dropin"]

compile_args = [] if sys.platform == "win32" else ["-O3"]
if os.environ.get("PAL_BENCH_NATIVE") == "1":
    compile_args.append("-march=native")

# glibc's vector math library: the buffer's pow over arrays uses its AVX2 pow where the CPU has AVX2 and FMA
# (checked at run time; pyx/_vmath.pxd), libm's pow otherwise
def links_libmvec() -> bool:
    """Whether the C compiler links against libmvec here (glibc >= 2.22 with its development files)."""
    if platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux":
        return False
    cc = os.environ.get("CC", "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "t.c")
        src.write_text("int main(void) { return 0; }\n")
        try:
            done = subprocess.run([*cc, str(src), "-o", str(Path(tmp, "t")), "-lmvec", "-lm"], capture_output=True)
        except OSError:
            return False
    return done.returncode == 0


mvec = links_libmvec()
vmath = dict(libraries=["mvec", "m"], define_macros=[("PAL_HAVE_LIBMVEC", "1")]) if mvec else {}

extensions = [
    Extension(
        f"pal_bench.{name}",
        [f"pyx/{name}.pyx"],
        include_dirs=[np.get_include(), "pyx", "."],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + vmath.get("define_macros", []),
        libraries=vmath.get("libraries", []),
        extra_compile_args=compile_args,
    )
    for name in MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["pyx", "."],
        compiler_directives={"language_level": "3"},
    ),
)

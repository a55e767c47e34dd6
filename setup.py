"""Build the Cython extensions in ``pyx/`` into the ``pal_bench`` package.

Flags are portable by default (``-O3``). Set ``PAL_BENCH_NATIVE=1`` to add ``-march=native``
for a build tuned to the machine it runs on (not portable to other CPUs).
"""

import ctypes.util
import os
import platform
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["_sumtree", "_replay", "_measure"]

compile_args = [] if sys.platform == "win32" else ["-O3"]
if os.environ.get("PAL_BENCH_NATIVE") == "1":
    compile_args.append("-march=native")

# glibc's vector math library: the buffer's pow over arrays uses its AVX2 pow where the CPU has AVX2 and FMA
# (checked at run time; pyx/_vmath.pxd), libm's pow otherwise
mvec = platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None
vmath = dict(libraries=["mvec", "m"], define_macros=[("PAL_HAVE_LIBMVEC", "1")]) if mvec else {}

extensions = [
    Extension(
        f"pal_bench.{name}",
        [f"pyx/{name}.pyx"],
        include_dirs=[np.get_include(), "pyx"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")] + vmath.get("define_macros", []),
        libraries=vmath.get("libraries", []),
        extra_compile_args=compile_args,
    )
    for name in MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["pyx"],
        compiler_directives={"language_level": "3"},
    ),
)

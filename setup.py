"""Build the Cython extensions in ``pyx/`` into the ``pal_bench`` package.

Flags are portable by default (``-O3``). Set ``PAL_BENCH_NATIVE=1`` to add ``-march=native``
for a build tuned to the machine it runs on (not portable to other CPUs).
"""

import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["_sumtree", "_replay", "_measure"]

compile_args = [] if sys.platform == "win32" else ["-O3"]
if os.environ.get("PAL_BENCH_NATIVE") == "1":
    compile_args.append("-march=native")

extensions = [
    Extension(
        f"pal_bench.{name}",
        [f"pyx/{name}.pyx"],
        include_dirs=[np.get_include(), "pyx"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
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

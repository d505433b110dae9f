"""The one compiled part: the CPU mask kernel (everything else is in pyproject.toml).

`optional=True`: without a C compiler the install still succeeds and apply_bitmask runs
its tensor-op path on CPU too (slower; grammarmask.device.kernels logs a warning once).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "grammarmask.device._maskkernel",
            sources=["grammarmask/device/_maskkernel.c"],
            extra_compile_args=["-O3", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)

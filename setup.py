"""The one compiled helper; everything else about the package is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds, and readers copy rows
with numpy instead (``rangestream.layout.chunked``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rangestream.layout._chunked",
            ["src/rangestream/layout/_chunked.c"],
            optional=True,
        )
    ]
)

"""Package list for the two source roots.

The repository keeps ``core/`` and ``plugins/`` at the top level (the product's
layout) and installs them as ``cdcflow.core`` and ``cdcflow.plugins``.  The
package-dir mapping lives in pyproject.toml; this file enumerates the
sub-packages under each root so that new ones are picked up automatically,
and declares the two C extensions: the TiDB row decoder of the mounter's fast
path (``_rowfast``) and the Open Protocol codec's row image writer
(``_opfast``). Both are optional: where they do not compile (no C compiler,
no Python headers) the install goes on, and the mounter and the codec do
their work in Python.
"""

from setuptools import Extension, find_packages, setup


def _packages(root: str, prefix: str) -> list[str]:
    return [prefix, *(f"{prefix}.{name}" for name in find_packages(root))]


ROWFAST = Extension(
    "cdcflow.plugins.sources.tikv.tidb._rowfast",
    ["plugins/sources/tikv/tidb/_rowfast.c"],
    extra_compile_args=["-O2", "-std=c11"],
    optional=True,
)

OPFAST = Extension(
    "cdcflow.plugins.codecs._opfast",
    ["plugins/codecs/_opfast.c"],
    extra_compile_args=["-O2", "-std=c11"],
    optional=True,
)

setup(
    packages=_packages("core", "cdcflow.core") + _packages("plugins", "cdcflow.plugins"),
    ext_modules=[ROWFAST, OPFAST],
)

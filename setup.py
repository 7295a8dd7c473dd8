"""Package list for the two source roots.

The repository keeps ``core/`` and ``plugins/`` at the top level (the product's
layout) and installs them as ``cdcflow.core`` and ``cdcflow.plugins``.  The
package-dir mapping lives in pyproject.toml; this file only enumerates the
sub-packages under each root so that new ones are picked up automatically.
"""

from setuptools import find_packages, setup


def _packages(root: str, prefix: str) -> list[str]:
    return [prefix, *(f"{prefix}.{name}" for name in find_packages(root))]


setup(packages=_packages("core", "cdcflow.core") + _packages("plugins", "cdcflow.plugins"))

"""A built (non-editable) wheel carries the status page's files, where the server reads them."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from cdcflow.core.api.status_page import ASSETS
from tests import REPO

# Builds the distribution with pip (setuptools, no network: --no-build-isolation).
pytestmark = pytest.mark.integration


def test_the_wheel_carries_the_page(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    build.append(str(REPO))
    result = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [wheel] = tmp_path.glob("cdcflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ASSETS:
        assert f"cdcflow/core/api/status/{name}" in names, sorted(n for n in names if "/api/" in n)
    assert "cdcflow/core/api/status_page.py" in names

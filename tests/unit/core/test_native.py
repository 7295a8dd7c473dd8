import pytest

from cdcflow.core.native import PURE_PYTHON_ENV, native_module

BUILT = ["cdcflow.plugins.sources.tikv.tidb._rowfast", "cdcflow.plugins.codecs._opfast"]


@pytest.mark.parametrize("name", BUILT)
def test_a_built_extension_is_loaded_unless_turned_off(name, monkeypatch):
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)
    assert native_module(name).__name__ == name
    monkeypatch.setenv(PURE_PYTHON_ENV, "0")
    assert native_module(name) is not None
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert native_module(name) is None


def test_an_extension_that_is_not_built_is_none(monkeypatch):
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)
    assert native_module("cdcflow.plugins.codecs._not_built") is None

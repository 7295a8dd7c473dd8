import pytest

from cdcflow.core.config.units import parse_bytes, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"), [(5, 5.0), ("500ms", 0.5), ("30s", 30), ("5m", 300), ("24h", 86400), ("1d", 86400), ("2", 2)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["-1", "1y", "", True, -3, "m"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "size"),
    [(10, 10), ("1GiB", 1024**3), ("64MiB", 64 * 1024**2), ("10MB", 10_000_000), ("512kib", 512 * 1024)],
)
def test_sizes(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("bad", ["12XB", "-1", True, -1, "GiB"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)

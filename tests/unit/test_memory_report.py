"""The memory guard's closing report: what holds the memory, in lines a log's tail keeps."""

import tracemalloc

from tests import memory_report
from tests.memory_watch import rss_bytes

SMAPS = """\
55d0c8a00000-55d0c8c00000 r-xp 00000000 08:01 1234                       /usr/bin/python3.11
Size:               2048 kB
Rss:                1900 kB
VmFlags: rd ex mr mw me
55d0ca000000-55d10a000000 rw-p 00000000 00:00 0                          [heap]
Size:            1048576 kB
Rss:             1000000 kB
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               60000 kB
"""


def test_mappings_are_read_with_their_names_and_resident_sizes(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert memory_report.largest_mappings(top=2, smaps_path=str(smaps)) == [
        (1_000_000 * 1024, "[heap]"),
        (60_000 * 1024, "[anon]"),
    ]


def test_a_missing_smaps_file_gives_no_mappings(tmp_path):
    assert memory_report.largest_mappings(smaps_path=str(tmp_path / "absent")) == []


def test_the_summary_names_the_site_that_holds_what_grew():
    tracing = tracemalloc.is_tracing()  # the memory guard may be tracing already
    if not tracing:
        tracemalloc.start(8)
    try:
        held = [bytearray(1 << 20) for _ in range(40)]  # the site the report must name
        lines = memory_report.summary(rss_bytes(), tracemalloc.take_snapshot(), top=1)
    finally:
        if not tracing:
            tracemalloc.stop()
    assert len(held) == 40
    assert lines[0].startswith("memory: resident ")
    assert "malloc in use" in lines[0]
    assert lines[1].startswith("largest mappings: ")
    site = lines[-1]
    assert site.split(" MiB", 1)[0].strip().isdigit() and int(site.split(" MiB", 1)[0]) >= 40
    assert site.split(" at ", 1)[1].startswith("tests/unit/test_memory_report.py:")


def test_without_tracing_the_summary_still_says_what_is_resident():
    lines = memory_report.summary(rss_bytes(), None)
    assert lines[0].startswith("memory: resident ") and not any("Python allocations" in line for line in lines)

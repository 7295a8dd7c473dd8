"""The memory guard's closing report: what holds the memory, in lines a log's tail keeps."""

import threading
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
    assert ("malloc in use" in lines[0]) == (memory_report.malloc_in_use() is not None)  # glibc only
    assert lines[1].startswith("largest mappings: ")
    site = lines[-1]
    assert site.split(" MiB", 1)[0].strip().isdigit() and int(site.split(" MiB", 1)[0]) >= 40
    assert site.split(" at ", 1)[1].startswith("tests/unit/test_memory_report.py:")


def test_without_tracing_the_summary_still_says_what_is_resident():
    lines = memory_report.summary(rss_bytes(), None)
    assert lines[0].startswith("memory: resident ") and not any("Python allocations" in line for line in lines)


def test_the_watch_tells_a_burst_from_a_steady_growth():
    watch = memory_report.Watch(window=60)
    for second in range(50, 100):  # 50 s of samples
        watch.size(float(second), 1 * memory_report.GIB if second < 97 else 5 * memory_report.GIB)
    [line] = watch.lines(99.0)
    assert "1.00 GiB 3 s ago" in line and "5.00 GiB 1 s ago" in line
    assert "30 s ago" in line and "60 s ago" not in line  # no sample that old


def test_the_watch_counts_the_frames_of_this_checkout_that_threads_run():
    started, release = threading.Event(), threading.Event()

    def runaway_loop():
        started.set()
        release.wait(10)

    thread = threading.Thread(target=runaway_loop, name="runaway")
    thread.start()
    try:
        started.wait(10)
        watch = memory_report.Watch()
        for _ in range(3):
            watch.sample(skip=threading.get_ident())
    finally:
        release.set()
        thread.join()
    [line] = watch.lines(0.0)
    assert line.startswith("frames in 3 samples since tracing began: ")
    assert "runaway tests/unit/test_memory_report.py:" in line and "runaway_loop (3)" in line

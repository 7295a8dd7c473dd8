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
        lines = memory_report.summary(rss_bytes(), tracemalloc.take_snapshot().statistics("traceback"), top=1)
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


def test_the_watch_names_the_frames_threads_ran_and_left_not_where_they_stopped():
    in_first, leave_first, in_last, release = (threading.Event() for _ in range(4))

    def allocating_step():
        in_first.set()
        leave_first.wait(10)

    def idle_at_the_stop():
        in_last.set()
        release.wait(10)

    def runaway_loop():
        allocating_step()
        idle_at_the_stop()

    idle = threading.Thread(target=release.wait, args=(10,), name="idle")  # waits all along
    thread = threading.Thread(target=runaway_loop, name="runaway")
    idle.start()
    thread.start()
    watch = memory_report.Watch()
    try:
        in_first.wait(10)
        for _ in range(3):
            watch.sample(skip=threading.get_ident())
        leave_first.set()
        in_last.wait(10)
        watch.sample(skip=threading.get_ident())
    finally:
        leave_first.set()
        release.set()
        thread.join()
        idle.join()
    [line] = watch.lines(0.0)
    assert line.startswith("frames left in 4 samples since tracing began: ")
    assert "runaway tests/unit/test_memory_report.py:" in line and "allocating_step (3)" in line
    assert "idle_at_the_stop" not in line  # where the thread is at the stop: the stack dump shows it
    assert "idle " not in line  # a thread in the standard library alone has no frame of this checkout


def test_a_watch_whose_threads_never_moved_says_so():
    release = threading.Event()
    thread = threading.Thread(target=lambda: release.wait(10), name="waiter")
    thread.start()
    try:
        watch = memory_report.Watch()
        for _ in range(2):
            watch.sample(skip=threading.get_ident())
    finally:
        release.set()
        thread.join()
    [line] = watch.lines(0.0)
    # Other threads of the session may be anywhere; this one waited where it stopped.
    assert line.startswith("frames left in 2 samples since tracing began: ") and "waiter" not in line


def test_the_libraries_of_the_virtualenv_inside_the_checkout_are_not_its_own_code():
    root = memory_report._ROOT
    assert memory_report._own(f"{root}core/data/pipeline/tasks.py")
    assert not memory_report._own(f"{root}.venv/lib/python3.11/site-packages/grpc/aio/_call.py")
    assert not memory_report._own("/usr/lib/python3.11/selectors.py")

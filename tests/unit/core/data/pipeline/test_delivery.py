from cdcflow.core.data.events import DDLEvent
from cdcflow.core.data.pipeline.delivery import BatchDelivery
from cdcflow.core.testing import ListSink, insert


class PartSink(ListSink):
    accepts_partial_batches = True

    def __init__(self):
        super().__init__()
        self.parts = []

    def write_batch(self, batch):
        self.parts.append(batch)


def test_parts_for_sinks_that_accept_them_whole_batches_for_the_others():
    rows = [insert("s", "t", {"id": i}, commit_ts=10 + i) for i in range(10)]
    ddl = [DDLEvent(30, "alter table s.t add c int")]
    whole, parts = ListSink(), PartSink()
    delivery = BatchDelivery("cf", 7, 5, 30, ddl, [whole, parts], part_rows=4)
    delivery.add(rows[:3])
    delivery.add(rows[3:])
    assert [len(p.rows) for p in parts.parts] == [4, 4]  # written as soon as they fill
    assert whole.batches == {}
    delivery.finish()
    assert [(p.part, p.last_part, len(p.rows), list(p.ddl)) for p in parts.parts] == [
        (0, False, 4, []),
        (1, False, 4, []),
        (2, True, 2, ddl),
    ]
    assert {(p.batch_id, p.start_ts, p.end_ts) for p in parts.parts} == {(7, 5, 30)}
    assert list(whole.batches[7].rows) == rows and list(whole.batches[7].ddl) == ddl
    assert whole.batches[7].part == 0 and whole.batches[7].last_part
    assert delivery.row_count == 10

import dataclasses
import pickle

import pytest

from cdcflow.core.data.codec import EncodedMessage
from cdcflow.core.data.events import OpType, RawKVEvent, RowChange, Span, TableName
from cdcflow.core.data.frozen import frozen_maker

SPAN = Span(7, b"t_1", b"t_2")


@pytest.mark.parametrize(
    ("cls", "args", "kwargs"),
    [
        (RawKVEvent, (SPAN, b"k", b"v", b"o", 5, 6), {}),
        (RawKVEvent, (SPAN, b"k", b"", b"o", 5, 6), {"delete": True}),
        (RowChange, (TableName("s", "t"), OpType.INSERT, 9, 8, {"id": 1}), {}),
        (RowChange, (TableName("s", "t"), OpType.UPDATE, 9, 8, {"id": 1}, {"id": 0}), {"key": b"k"}),
        (EncodedMessage, (b"k", b"v"), {"ts": 3}),
        (EncodedMessage, (None, b"v", TableName("s", "t"), 1, 3), {}),
    ],
)
def test_the_maker_makes_what_the_class_makes(cls, args, kwargs):
    """Equal, hashed alike (where the fields hash), of the class, frozen, pickled alike,
    defaults included."""
    made, expected = frozen_maker(cls)(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls
    assert made == expected
    if not any(isinstance(a, dict) for a in args):
        assert hash(made) == hash(expected)
    assert dataclasses.astuple(made) == dataclasses.astuple(expected)
    assert pickle.loads(pickle.dumps(made)) == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.key = b"other"  # type: ignore[misc]


def test_the_maker_takes_names_and_refuses_what_the_class_refuses():
    make = frozen_maker(EncodedMessage)
    assert make(value=b"v", key=None) == EncodedMessage(None, b"v")
    with pytest.raises(TypeError):
        make(b"k")  # value is required
    with pytest.raises(TypeError):
        make(b"k", b"v", unknown=1)


def test_classes_a_maker_would_get_wrong_are_refused():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Shadowing:
        self: int
        _cls: int

    for cls in (NoSlots, NotFrozen, Checked, Factory, Shadowing, int):
        with pytest.raises(TypeError):
            frozen_maker(cls)

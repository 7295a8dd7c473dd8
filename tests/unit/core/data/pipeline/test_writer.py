"""The pipeline's writer identity, kept in its Spark checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.core.data.pipeline.writer import WRITER_FILE, WriterIdentity, writer_identity
from cdcflow.core.errors import CdcflowError


def test_a_new_directory_gets_an_identity_that_a_restart_keeps(tmp_path: Path) -> None:
    directory = tmp_path / "cf" / "spark-checkpoint"
    first = writer_identity(directory)
    assert first.id and not first.inherits
    assert writer_identity(directory) == first
    assert json.loads((directory / WRITER_FILE).read_text()) == {"writer": first.id, "inherits": False}


def test_a_lost_directory_or_another_capture_gets_another_identity(tmp_path: Path) -> None:
    first = writer_identity(tmp_path / "a")
    assert writer_identity(tmp_path / "b").id != first.id
    (tmp_path / "a" / WRITER_FILE).unlink()
    (tmp_path / "a").rmdir()
    assert writer_identity(tmp_path / "a").id != first.id


def test_a_directory_spark_wrote_before_identities_inherits_and_keeps_saying_so(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "7").write_text("v1\n")
    identity = writer_identity(tmp_path)
    assert identity.inherits
    assert writer_identity(tmp_path) == WriterIdentity(identity.id, True)


@pytest.mark.parametrize("content", ["{not json", '{"writer": ""}', "[1]"])
def test_an_unreadable_identity_names_the_file_and_what_to_do(tmp_path: Path, content: str) -> None:
    (tmp_path / WRITER_FILE).write_text(content)
    with pytest.raises(CdcflowError) as err:
        writer_identity(tmp_path)
    assert str(tmp_path / WRITER_FILE) in err.value.message
    assert f"delete the directory {tmp_path}" in err.value.message

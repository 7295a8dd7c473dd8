"""cdcflow's tests (a package, so that helpers are imported as ``tests.…``)."""

from pathlib import Path

#: The repository's root: where ``python -m tests.…`` runs and ``connectors.yaml`` lives.
#: Taken from here so that moving a test module does not change what it points at.
REPO = Path(__file__).resolve().parent.parent

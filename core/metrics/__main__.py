"""``python -m cdcflow.core.metrics``: write docs/reference/metrics.md from the metric definitions."""

from __future__ import annotations

import sys
from pathlib import Path

from cdcflow.core.metrics import reference_markdown

if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/reference/metrics.md")
    target.write_text(reference_markdown())
    print(f"wrote {target}")

"""``python -m pipeline`` (also installed as the ``pipeline`` console script)."""

from __future__ import annotations

from pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m colibri``: the command line (see colibri.cli)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())

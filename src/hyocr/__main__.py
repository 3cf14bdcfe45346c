"""``python -m hyocr`` runs the CLI."""

from .cli import main

raise SystemExit(main())

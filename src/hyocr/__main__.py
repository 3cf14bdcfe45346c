"""``python -m hyocr`` runs the CLI."""

from .cli import main

# Guarded: worker processes started with "spawn" re-import the parent's main module (as __mp_main__).
if __name__ == "__main__":
    raise SystemExit(main())

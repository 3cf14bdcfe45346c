"""Logs (and, later, metrics): set up by the CLI only, never at import."""

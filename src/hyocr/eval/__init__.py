"""``hyocr eval SET --output report.json``: accuracy measured on labelled documents, through the same
service, client and engines that serve production, and ``hyocr eval compare`` of reports side by side.

``sets`` turns a SET (a JSONL manifest, an OmniDocBench folder, or PDFs whose own text layer is the
reference) into samples: a batch ``Document`` to read and the truth of its pages. ``run`` reads them with
hyocr batch's machinery (its state file, resume rules and readers: in-process or, with ``--url``, as jobs on
a server), ``score`` compares each page with its truth using the field's metrics (``metrics/``), and
``report`` writes the JSON and markdown report, headed like a bench result. ``command`` is the CLI.
"""

from __future__ import annotations


class EvalError(Exception):
    """A SET, an option or a report that cannot be used (the message says why): nothing is scored."""

"""errors.py's documented tree names every exception class it defines, under its parent, with its status."""

from __future__ import annotations

import inspect
import re

from hyocr import errors


def test_docstring_tree_matches_the_classes():
    documented = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        m = re.match(r"^(\s*(?:\|\s*)*(?:\+-- )?)(\w+) \((\d+)", line)
        if not m:
            continue
        depth = m.group(1).count("+--") + m.group(1).count("|")
        parents[depth:] = [m.group(2)]
        documented[m.group(2)] = (int(m.group(3)), parents[depth - 1] if depth else None)
    defined = {
        name: (cls.status, cls.__base__.__name__ if cls is not errors.HyocrError else None)
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.HyocrError) and cls.__module__ == errors.__name__
    }
    assert documented == defined

"""Text against a reference: CER, WER, normalised edit distance (NED) and a bag-of-words F1.

Both sides are normalised first (``normalize``): Unicode NFKC (OmniDocBench's full-width to half-width
mapping, and PDF ligatures such as "ﬁ" to "fi"), a dot leader (four or more dots or middle dots, spaced or
not: a table of contents' "Introduction . . . . 1") one space, every run of whitespace one space, and
optionally case folded. Leaders are typeset fill whose length no reader reproduces: a PDF text layer has one
dot per step of the fill, an OCR model a few; counted, they made a well-read contents page score CER 0.74.
Then:

- CER: character edits (Levenshtein, rapidfuzz) over the reference's characters; it can pass 1.
- WER: the same over words (split at spaces; CJK text has no spaces, read its CER).
- NED: OmniDocBench's text metric: edits over the longer string's length, in [0, 1], computed after its
  ``clean_string`` step, which keeps only word characters (letters, digits, CJK), so spacing and
  punctuation do not count.
- word precision/recall/F1: the words both sides share, in any order (olmOCR-style presence, insensitive
  to reading order: the metric for references whose order is not the page's, like a PDF's text layer).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass

_SPACE = re.compile(r"\s+")
_LEADER = re.compile(r"(?:[.\u00b7\u2219\u22c5]\s*){4,}")  # after NFKC, which makes "…" three dots
_NOT_WORD = re.compile(r"[^\w]")  # Python's \w: Unicode letters, digits (CJK included) and "_"


def normalize(text: str, *, fold_case: bool = False) -> str:
    text = _SPACE.sub(" ", _LEADER.sub(" ", unicodedata.normalize("NFKC", text))).strip()
    return text.casefold() if fold_case else text


def squeeze(normalized: str) -> str:
    """OmniDocBench's ``clean_string``: word characters only."""
    return _NOT_WORD.sub("", normalized)


def distance(a: str | list[str], b: str | list[str]) -> int:
    """Levenshtein distance of two strings or two word lists."""
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.distance(a, b)


def similarity(a: str, b: str) -> float:
    """1 - NED of two already normalised strings (1.0 when both are empty)."""
    longest = max(len(a), len(b))
    return 1.0 - distance(a, b) / longest if longest else 1.0


@dataclass(frozen=True, slots=True)
class TextScore:
    """The counts behind one page's text scores; sums of them give the micro averages."""

    chars: int  # reference characters, normalised
    char_edits: int
    words: int  # reference words
    word_edits: int
    ned_edits: int  # on the squeezed strings
    ned_length: int  # the longer squeezed string
    shared_words: int  # bag of words: min(count in reference, count in output), summed
    output_words: int

    # A page whose reference is empty (a blank page, a figure) scores 0 when the output is empty too and 1 when
    # anything was read into it: left out of the page mean, an engine inventing 1,800 characters there scored 0.
    @property
    def cer(self) -> float:
        return self.char_edits / self.chars if self.chars else float(self.char_edits > 0)

    @property
    def wer(self) -> float:
        return self.word_edits / self.words if self.words else float(self.word_edits > 0)

    @property
    def ned(self) -> float:
        return self.ned_edits / self.ned_length if self.ned_length else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "cer": self.cer, "wer": self.wer, "ned": self.ned}


def score_text(reference: str, output: str, *, fold_case: bool = False) -> TextScore:
    ref, out = normalize(reference, fold_case=fold_case), normalize(output, fold_case=fold_case)
    ref_words, out_words = ref.split(), out.split()
    tight_ref, tight_out = squeeze(ref), squeeze(out)
    shared = Counter(ref_words) & Counter(out_words)
    return TextScore(len(ref), distance(ref, out), len(ref_words), distance(ref_words, out_words),
                     distance(tight_ref, tight_out), max(len(tight_ref), len(tight_out)),
                     sum(shared.values()), len(out_words))

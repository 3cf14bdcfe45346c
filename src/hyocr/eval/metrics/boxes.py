"""Spotting: predicted lines against reference lines, matched one to one at IoU >= 0.5, then their text.

The matcher is greedy: all pairs at or above the threshold, highest IoU first, each box used once. At a
threshold of 0.5 that is the optimal assignment whenever the reference boxes do not overlap one another
(a box can then pass 0.5 with at most one of them), which is what lines of text are; so scipy's
``linear_sum_assignment`` (a 30 MB dependency) would give the same pairs. This is the ICDAR / COCO way of
counting detections: precision = matched / predicted, recall = matched / reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .text import distance, normalize

IOU_THRESHOLD = 0.5
Box = Sequence[float]  # [x1, y1, x2, y2]


def iou(a: Box, b: Box) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(reference: Sequence[Box], predicted: Sequence[Box],
          threshold: float = IOU_THRESHOLD) -> list[tuple[int, int, float]]:
    """(reference index, predicted index, IoU) of each matched pair, highest IoU first."""
    pairs = sorted(((v, i, j) for i, r in enumerate(reference) for j, p in enumerate(predicted)
                    if (v := iou(r, p)) >= threshold), key=lambda t: (-t[0], t[1], t[2]))
    used_ref: set[int] = set()
    used_pred: set[int] = set()
    matched = []
    for value, i, j in pairs:
        if i not in used_ref and j not in used_pred:
            used_ref.add(i)
            used_pred.add(j)
            matched.append((i, j, value))
    return matched


@dataclass(frozen=True, slots=True)
class BoxScore:
    """One page's counts; sums of them give the micro averages."""

    reference: int  # reference boxes
    predicted: int
    matched: int
    iou_sum: float  # over matched pairs
    text_exact: int  # matched pairs whose normalised texts are equal
    text_chars: int  # reference characters of matched pairs
    text_edits: int  # character edits between matched pairs' texts

    @property
    def precision(self) -> float | None:
        return self.matched / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.matched / self.reference if self.reference else None

    @property
    def f1(self) -> float:
        return f1(self.matched, self.predicted, self.reference)

    def as_dict(self) -> dict:
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1}


def f1(matched: int, predicted: int, reference: int) -> float:
    """2PR / (P + R) from counts; 1.0 when there was nothing to find and nothing was found."""
    return 2 * matched / (predicted + reference) if predicted + reference else 1.0


def score_boxes(reference: Sequence[tuple[str, Box]], predicted: Sequence[tuple[str, Box]], *,
                fold_case: bool = False) -> BoxScore:
    """``reference`` and ``predicted``: (text, box) per line, boxes in the same pixels."""
    pairs = match([box for _, box in reference], [box for _, box in predicted])
    exact = chars = edits = 0
    for i, j, _ in pairs:
        want, got = normalize(reference[i][0], fold_case=fold_case), normalize(predicted[j][0], fold_case=fold_case)
        exact += want == got
        chars += len(want)
        edits += distance(want, got)
    return BoxScore(len(reference), len(predicted), len(pairs), sum(v for _, _, v in pairs), exact, chars, edits)

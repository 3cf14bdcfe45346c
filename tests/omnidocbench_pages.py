"""A page of OmniDocBench.json as the benchmark writes it (its README's dataset format), for tests that build
a small OmniDocBench folder: a title, a paragraph cut in two by a ``truncated`` relation, a display formula,
a table, a page number, an ``abandon`` block and an ignored one, out of reading order."""

from __future__ import annotations


def block(category: str, anno_id: int, order: int | None, **extra) -> dict:
    return {"category_type": category, "poly": [10.0, 10.0, 200.0, 10.0, 200.0, 40.0, 10.0, 40.0],
            "ignore": False, "order": order, "anno_id": anno_id, "line_with_spans": [], **extra}


def page(image: str, language: str = "english") -> dict:
    return {
        "layout_dets": [
            block("page_number", 5, 6, text="7"),
            block("title", 0, 1, text="Annual Report"),
            block("text_block", 1, 2, text="Revenue grew in the "),
            block("text_block", 2, 3, text="third quarter."),
            block("equation_isolated", 3, 4, latex="$$E=mc^2$$"),
            block("table", 4, 5, html="<table><tr><td>Q3</td><td>12</td></tr></table>", latex="\\begin{tabular}"),
            block("abandon", 6, None, text="DRAFT"),
            {**block("text_block", 7, 7, text="ignored"), "ignore": True},
        ],
        "page_info": {"page_no": 0, "height": 400, "width": 800, "image_path": image,
                      "page_attribute": {"language": language, "data_source": "research_report"}},
        "extra": {"relation": [{"source_anno_id": 1, "target_anno_id": 2, "relation_type": "truncated"}]},
    }

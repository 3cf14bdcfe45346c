"""What hyocr knows about HunyuanOCR itself, one module per domain: prompts (the official prompts and
recognising them), chat (message format, image placeholder, sampling defaults), geometry (pixel bounds,
smart resize, visual tokens), spotting (the box output format, the 0..1000 grid), markdown (the document
fence), extraction (lenient JSON). Imported by engines/ and pipeline/; imports neither."""

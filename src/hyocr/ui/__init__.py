"""The web UI: a Gradio app on the same ``OcrService`` as the API, mounted at /ui by ``build_app``.

    app.py        mounting at /ui, the UI's auth hook, clean-up at shutdown; builds the Blocks
    page.py       the layout: input and result columns, examples; ``Widgets``, the live components
    handlers.py   the quick events: task selector, upload check, page selector
    reading.py    Run and Stop: a reading streamed into the outputs, then the finished result
    runner.py     one run: prepare, stream each page, build the /v1/ocr result; Stop
    display.py    pure helpers: boxes drawn on pages, results formatted for display
    examples.py   example images drawn at start-up with the system's fonts
    uploads.py    the upload route's ASGI guard and the upload space (cache) it keeps under its cap
    multipart.py  the upload rules (size, format, shape) checked on the multipart body as it streams
    style.py      CSS and the page head's additions
    _gradio.py    Gradio, imported with its telemetry off (every module above that uses Gradio takes it here)
"""

"""The web UI: a Gradio app on the same ``OcrService`` as the API, mounted at /ui by ``build_app``.

    app.py       the Blocks: layout, events, mounting (the only module that imports Gradio)
    runner.py    one run: prepare, stream each page, build the /v1/ocr result; Stop
    render.py    pure helpers: boxes drawn on pages, results formatted for display
    examples.py  example images drawn at start-up with the system's fonts
"""

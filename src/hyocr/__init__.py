"""hyocr: a production OCR service for HunyuanOCR.

Public API (imports are lazy inside each name's module; importing hyocr does no work):

    from hyocr.config import Settings, load_settings
    from hyocr.api.app import build_app
    from hyocr.pipeline.service import OcrService, result_of   # service.read(call) -> events
    from hyocr.types import OcrCall, MediaInput, OcrResult
    from hyocr.engines.registry import create_engine
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

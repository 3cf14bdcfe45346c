"""Gradio as the UI loads it: no telemetry and no version check, set before Gradio is first imported (the
Blocks get ``analytics_enabled=False`` as well). UI modules take ``gr`` from here, never import it
themselves, so whichever of them loads first, Gradio starts quiet."""

import os

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import gradio as gr

__all__ = ["gr"]

"""Request pipeline: task prompts, output post-processing and the steps between API and engine."""

"""Durable OCR jobs: submitted, stored, read in the background, delivered."""

"""Rendering result rows: aggregation, Markdown, CSV/JSON, figures, the static page."""

"""Evaluation: probe, sanity checks, benchmark, result rows, and evaluate (evaluate.py, the entry;
config.py, source.py, recipe.py, settings.py and runner.py, its parts)."""

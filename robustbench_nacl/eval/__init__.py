"""Evaluation: probe, sanity checks, benchmark, evaluate, result rows."""

"""Training: config, step, resumable loop, manifest."""

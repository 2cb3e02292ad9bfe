"""What an evaluation leaves behind, readable without torch: result rows, their per-example bits,
epsilon labels and the finetuning protocols' settings (the renderers in ``report`` need nothing else)."""

"""robustbench-nacl: adversarial-robustness benchmark and model zoo for contrastive encoders."""

__version__ = "0.1.0"

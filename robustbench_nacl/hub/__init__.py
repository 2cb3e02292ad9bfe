"""The model hub: published reference models, their cards, and the paths in and out of the package.

catalog.py (what a published set holds: models, cards, rows; no torch), load.py (``load_model``:
weights and linear heads, each checked against its pinned sha256), download.py (the user's cache
and http(s) downloads that never leave it), cards.py (model cards), release.py (``zoo publish``:
a trained zoo into the package) and submission.py (``zoo verify-submission``: an outsider's model).
Nothing is re-exported here: import from the module that defines a name.
"""

"""Bring the hand-written fixture rows in rows/ to the current row format (idempotent).

The fixture's numbers and provenance are hand-written; what a format change adds (recipe,
recipe_id, protocol_id, the kNN fields of probe_config, attack_versions, ...) is filled in here
with the library's own functions, and every row is renamed to its new content address. See
README.md beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from robustbench_nacl.data import canonical_spec
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.eval.recipe import recipe_of
from robustbench_nacl.eval.source import CheckpointInfo
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.results.rows import ROW_FORMAT, ResultRow, row_path, stamp_ids, write_row
from robustbench_nacl.training import TrainConfig

ROWS = Path(__file__).parent / "rows"


def recipe(row: dict) -> dict:
    """The recipe a row's hand-written checkpoint would have: a digits convnet_small run."""
    encoder = create_encoder(row["encoder"], in_channels=1, mean=[0.5], std=[0.5], input_shape=(1, 8, 8))
    config = TrainConfig(
        loss=row["loss"] if not row["control"] else "simclr",
        dataset=row["pretrain_dataset"],
        encoder=row["encoder"],
        epochs=row["train_epochs"],
        seed=row["train_seed"],
    ).to_dict()
    info = {"encoder": row["encoder"], "dataset": row["pretrain_dataset"], "format": "ours"}
    info |= {"config": config, "loss_params": row["loss_params"], "sha256": row["checkpoint_sha256"]}
    return recipe_of(CheckpointInfo.from_info(info), encoder=encoder, control=row["control"])


def upgrade(row: dict) -> dict:
    row = dict(row)
    row["row_format"] = ROW_FORMAT
    row["dataset"] = canonical_spec(row["dataset"])
    row["pretrain_dataset"] = canonical_spec(row["pretrain_dataset"])
    row["probe_config"] = ProbeConfig(**row["probe_config"]).as_dict()  # new fields: defaults
    row.setdefault("attack_versions", {"robustbench_nacl": row["versions"]["robustbench_nacl"]})
    row.setdefault("n_examples_evaluated", row["n_examples"])
    row.setdefault("recipe", recipe(row))
    return stamp_ids(row)


def main() -> int:
    for path in sorted(ROWS.glob("*.json")):
        row = ResultRow.from_json(upgrade(json.loads(path.read_text())), source=path)
        write_row(ROWS.parent, row)
        if row_path(ROWS.parent, row.row_id) != path:
            path.unlink()
    print(f"{len(list(ROWS.glob('*.json')))} rows in {ROWS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``robustbench-nacl post CKPT --recipe dynacl++ --out DIR``: the "++" post-processing of a
pretrained checkpoint into a new one (robustbench_nacl/post/)."""

from __future__ import annotations

import argparse
import json

from .common import DEFAULT_OUT, deterministic_flag, writable_out


def post_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``post``."""
    from ..post import POST_RECIPES

    p.add_argument(
        "checkpoint", help="a checkpoint directory written by `train` (dual BatchNorm: acl, dynacl, ...)"
    )
    p.add_argument(
        "--recipe",
        default="dynacl++",
        help=f"the post-processing recipe: {', '.join(POST_RECIPES.names())} (default dynacl++)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT / "post"), help="the new checkpoint's directory")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one recipe setting (repeatable), e.g. --set trades_start=randn --set aft_epochs=5",
    )
    p.add_argument("--dataset", default=None, help="pseudo-label training data (default: the parent's)")
    p.add_argument("--data-root", default=None, help="where the datasets live")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--show", action="store_true", help="print the resolved recipe as JSON and stop")
    deterministic_flag(p)


def run_post(args: argparse.Namespace) -> int:
    """Run ``post``: print what was written."""
    from ..errors import UserError
    from ..post import post_process, resolve_recipe

    overrides = {}
    for item in args.overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    recipe = resolve_recipe(args.recipe, overrides)
    if args.show:
        print(json.dumps({"recipe": recipe.name, "source": recipe.source, **recipe.identity()}, indent=2))
        return 0
    writable_out(args.out)
    out = post_process(
        args.checkpoint,
        args.recipe,
        args.out,
        overrides=overrides,
        dataset=args.dataset,
        device=args.device,
        data_root=args.data_root,
        progress=not args.no_progress,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    print(
        f"wrote {out / manifest['weights']} and {out / 'manifest.json'} ({manifest['id']}: "
        f"{manifest['post']['recipe']} of {manifest['parent']['id']}, "
        f"test kNN accuracy {manifest['knn_acc']:.4f})"
    )
    return 0

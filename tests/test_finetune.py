"""ALF and AFF finetuning protocols (eval/finetune.py): independent readings, resume, identities, CLI."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from _models import Normalize, one_thread, randomize_bn
from _reliability import cli, one_line_error
from torch import nn

from robustbench_nacl.attack.rng import derive_seed
from robustbench_nacl.data import ImageData, load_dataset
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval import finetune as ft
from robustbench_nacl.eval.evaluate import evaluate
from robustbench_nacl.eval.probe import ProbeConfig
from robustbench_nacl.report import protocols
from robustbench_nacl.report.compare import compare, format_compare
from robustbench_nacl.report.leaderboard import build_context, render_leaderboard
from robustbench_nacl.results.finetune import AffConfig, AlfConfig
from robustbench_nacl.results.rows import protocol_name

SUITE = {
    "name": "ft-test",
    "attack": [{"name": "pgd", "norm": "Linf", "eps": [0.1], "steps": 3, "step_size": 0.03, "restarts": 1}],
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _train(n: int) -> ImageData:
    d = load_dataset("digits:0-4", "train")
    return dataclasses.replace(d, x=d.x[:n], y=d.y[:n])


def _encoder(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    enc = nn.Sequential(
        Normalize(0.3, 0.4),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
    )
    randomize_bn(enc, seed)
    return enc.eval()


def _pgd_at(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, a: float, steps: int, gen):
    """Madry's PGD, written out: uniform start, signed steps, clip to the ball and to [0,1]."""
    x_adv = torch.clamp(x + (torch.rand(x.shape, generator=gen) * 2 - 1) * eps, 0, 1)
    for _ in range(steps):
        x_adv = x_adv.detach().requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, x_adv)
        x_adv = torch.min(torch.max(x_adv.detach() + a * g.sign(), x - eps), x + eps).clamp(0, 1)
    return x_adv.detach()


def _head(dim: int, classes: int, seed: int) -> nn.Linear:
    """The SLF probe's initialisation: U(-1/sqrt(d), 1/sqrt(d)), weight then bias, from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    head = nn.Linear(dim, classes)
    b = dim**-0.5
    with torch.no_grad():
        head.weight.copy_(torch.empty(classes, dim).uniform_(-b, b, generator=gen))
        head.bias.copy_(torch.empty(classes).uniform_(-b, b, generator=gen))
    return head


def test_alf_head_equals_a_hand_written_pgd_at_loop() -> None:
    train, seed = _train(48), 3
    # the recipe as configured (fit off: raw features, its epochs); tests/test_alf_fit.py: the fit
    cfg = AlfConfig(epochs=2, batch_size=16, steps=3, eps=0.1, milestones="1", lr=0.05, fit="off")
    enc = _encoder()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    got = ft.train_alf_head(enc, train, cfg, seed=seed)
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())  # frozen, BN untouched

    head = _head(32, 5, seed)
    opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9, weight_decay=2e-4)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1], gamma=0.1)
    x_all = train.x.float() / 255
    for epoch in range(2):
        gen = torch.Generator().manual_seed(derive_seed(seed, "alf", epoch))
        perm = torch.randperm(len(x_all), generator=gen)
        for i in range(0, len(x_all), 16):
            x, y = x_all[perm[i : i + 16]], train.y[perm[i : i + 16]]
            x_adv = _pgd_at(lambda v: head(enc(v)), x, y, 0.1, 0.025, 3, gen)
            opt.zero_grad()
            F.cross_entropy(head(enc(x_adv).detach()), y).backward()
            opt.step()
        sched.step()
    assert torch.allclose(got.weight, head.weight, atol=1e-6, rtol=0)
    assert torch.allclose(got.bias, head.bias, atol=1e-6, rtol=0)
    assert not torch.allclose(got.weight, _head(32, 5, seed).weight, atol=1e-3)  # it did train


def test_aff_trades_step_equals_a_hand_written_one() -> None:
    train, seed = _train(16), 1
    cfg = AffConfig(epochs=1, batch_size=16, steps=2, eps=0.1, beta=6.0)
    enc, head0 = _encoder(), _head(32, 5, seed)
    got_enc, got_head = ft.train_aff(enc, head0, train, cfg, seed=seed)

    model = nn.Sequential(_encoder(), _head(32, 5, seed))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=2e-4)
    gen = torch.Generator().manual_seed(derive_seed(seed, "aff", 0))
    perm = torch.randperm(16, generator=gen)
    x, y = train.x[perm].float() / 255, train.y[perm]
    kl = nn.KLDivLoss(reduction="sum")
    model.eval()  # the authors' trades_loss: inner maximisation in eval mode
    x_adv = x + 0.001 * torch.randn(x.shape, generator=gen)
    for _ in range(2):
        x_adv.requires_grad_()
        loss_kl = kl(F.log_softmax(model(x_adv), dim=1), F.softmax(model(x), dim=1).detach())
        (g,) = torch.autograd.grad(loss_kl, [x_adv])
        x_adv = torch.min(torch.max(x_adv.detach() + 0.025 * g.sign(), x - 0.1), x + 0.1).clamp(0, 1)
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, y) + 6.0 * kl(F.log_softmax(model(x_adv), 1), F.softmax(logits, 1)) / 16
    opt.zero_grad()
    loss.backward()
    opt.step()
    want = model.state_dict()
    got = {
        **{f"0.{k}": v for k, v in got_enc.state_dict().items()},
        **{f"1.{k}": v for k, v in got_head.state_dict().items()},
    }
    for k, v in want.items():  # BatchNorm running statistics included
        assert torch.allclose(got[k].float(), v.float(), atol=1e-6, rtol=0), k
    assert not got_enc.training and not torch.equal(got["1.weight"], head0.weight)


def test_aff_resumes_bit_identically_after_a_kill_mid_epoch(tmp_path, monkeypatch) -> None:
    train, seed = _train(48), 0
    cfg = AffConfig(epochs=3, batch_size=16, steps=1, eps=0.1, milestones="2")
    head0 = _head(32, 5, seed)
    enc_a, head_a = ft.train_aff(_encoder(), head0, train, cfg, seed=seed)
    want = ft.save_weights(tmp_path / "a", ft.ProbedClassifier(enc_a, head_a))

    calls, real = {"n": 0}, ft.trades_loss

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:  # the 2nd batch of epoch 2 (3 batches an epoch)
            raise KeyboardInterrupt
        return real(*a, **k)

    state = tmp_path / "state.pt"
    monkeypatch.setattr(ft, "trades_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        ft.train_aff(_encoder(), head0, train, cfg, seed=seed, state_path=state)
    assert torch.load(state, weights_only=True)["epoch"] == 1  # epoch 1 finished and saved
    monkeypatch.setattr(ft, "trades_loss", real)
    enc_b, head_b = ft.train_aff(_encoder(), head0, train, cfg, seed=seed, state_path=state)
    assert ft.save_weights(tmp_path / "b", ft.ProbedClassifier(enc_b, head_b)) == want
    assert (tmp_path / "b" / ft.WEIGHTS_DIR / f"{want}.safetensors").is_file()


def test_an_unreadable_state_is_said_and_the_run_starts_over_to_the_same_weights(tmp_path, capsys) -> None:
    # a truncated state file (a disk that filled up mid-write outside atomic_open, a foreign file)
    # must not be trusted: the run starts from epoch 0 and ends where an unbroken run ends
    train, seed = _train(32), 0
    cfg = AffConfig(epochs=2, batch_size=16, steps=1, eps=0.1)
    head0 = _head(32, 5, seed)
    want = ft.save_weights(
        tmp_path / "a", ft.ProbedClassifier(*ft.train_aff(_encoder(), head0, train, cfg, seed=seed))
    )
    state = tmp_path / "state.pt"
    state.write_bytes(b"PK\x03\x04 not a torch file")
    got = ft.train_aff(_encoder(), head0, train, cfg, seed=seed, state_path=state)
    assert f"ignoring unreadable finetuning state {state}" in capsys.readouterr().out
    assert ft.save_weights(tmp_path / "b", ft.ProbedClassifier(*got)) == want
    assert torch.load(state, weights_only=True)["epoch"] == 2  # replaced by the run's own state


def test_three_protocols_give_distinct_protocol_ids_and_slf_rows_do_not_change(tmp_path) -> None:
    probe = ProbeConfig(epochs=3, max_train=40)
    kw = dict(dataset="digits:0-4", suite=SUITE, n_examples=12, probe=probe, progress=False)
    small = dict(epochs=1, batch_size=20, steps=1)
    # ALF fitted (the default) keeps the recipe's steps: at batch 4000, 13 (one-batch epochs here)
    alf_small = dict(small, batch_size=4000)
    rows = evaluate(
        _encoder(),
        out=tmp_path / "all",
        protocol="slf,alf,aff",
        alf=AlfConfig(**alf_small),
        aff=AffConfig(**small),
        **kw,
    )
    slf_only = evaluate(_encoder(), out=tmp_path / "slf", **kw)
    by = {p: [r for r in rows if protocol_name(r) == p] for p in ("slf", "alf", "aff")}
    assert all(len(v) == 2 for v in by.values())  # pgd + worst case each
    assert len({r["protocol_id"] for r in rows}) == 3
    assert [r.row_id for r in by["slf"]] == [r.row_id for r in slf_only]  # SLF: no finetune field, same ids
    assert "finetune" not in by["slf"][0] and by["alf"][0]["finetune"]["steps"] == 1
    aff_sha = by["aff"][0]["finetuned_sha256"]
    assert (tmp_path / "all" / ft.WEIGHTS_DIR / f"{aff_sha}.safetensors").is_file()
    # another ALF setting is another protocol
    other = evaluate(
        _encoder(), out=tmp_path / "all", protocol="alf", alf=AlfConfig(**alf_small, eps=0.05), **kw
    )
    assert other[0]["protocol_id"] != by["alf"][0]["protocol_id"]
    # the leaderboard: one table per protocol, plus SLF / ALF / AFF side by side and their figure
    files = render_leaderboard(list(rows), tmp_path / "board")
    page = files["LEADERBOARD.md"].read_text()
    side = page.split("## Finetuning protocols side by side", 1)[1].split("## Figures", 1)[0]
    assert (
        "| SLF clean | SLF worst case@0.1" in side
        and "| AFF (epochs 1, batch_size 20, steps 1) clean" in side
    )
    line = next(x for x in side.splitlines() if x.startswith("| Sequential"))
    want = [f"{100 * by[p][i]['clean_acc' if i == 0 else 'robust_acc']:.1f}" for p in by for i in (0, 1)]
    assert [c.split()[0] for c in line.strip("| ").split(" | ")[1:]] == want
    assert page.count("ranked by") >= 3 and protocols.FIGURE in files
    # an ALF run more than 10 points below SLF's clean accuracy is marked and named under the table;
    # exactly 10 points is not
    slf_clean = by["slf"][0]["clean_acc"]
    for drop, marked in ((protocols.ALF_CLEAN_GAP, False), (protocols.ALF_CLEAN_GAP + 0.02, True)):
        moved = [
            {**r, "clean_acc": slf_clean - drop, "robust_acc": min(r["robust_acc"], slf_clean - drop)}
            if protocol_name(r) == "alf"
            else dict(r)
            for r in rows
        ]
        ctx, _ = build_context(moved)
        text = "\n".join(protocols.markdown_section(ctx))
        alf_cell = next(x for x in text.splitlines() if x.startswith("| Sequential")).split(" | ")[3]
        assert (protocols.GAP_MARK in alf_cell) is marked, (drop, alf_cell)
        seed = by["alf"][0]["seed"]
        note = f"- Sequential (seed {seed}: {100 * slf_clean:.1f} → {100 * (slf_clean - drop):.1f})"
        assert (f"{protocols.GAP_MARK} ALF clean accuracy" in text and note in text) is marked, text
    slf_page = render_leaderboard(list(slf_only), tmp_path / "board-slf")["LEADERBOARD.md"].read_text()
    assert "side by side" not in slf_page and not (tmp_path / "board-slf" / protocols.FIGURE).exists()
    # compare: per protocol (the other family's SLF and ALF rows each against Sequential's, never across)
    kw2 = dict(protocol="slf,alf", alf=AlfConfig(**alf_small), name="other", **kw)
    more = [*rows, *evaluate(_encoder(1), out=tmp_path / "all", **kw2)]
    result = compare(more, "Sequential")
    assert {c.protocol_id for c in result.comparisons} == {
        by["slf"][0]["protocol_id"],
        by["alf"][0]["protocol_id"],
    }
    text = format_compare(result)
    assert "| protocol" in text and "| ALF " in text and "| SLF " in text
    again = evaluate(
        _encoder(),
        out=tmp_path / "all",
        protocol="aff,alf,slf",
        alf=AlfConfig(**alf_small),
        aff=AffConfig(**small),
        **kw,
    )
    assert again.computed == 0 and sorted(r.row_id for r in again) == sorted(r.row_id for r in rows)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--protocol", "slf,xlf"], "protocol 'xlf'"),
        (["--protocol", ""], "choose one or more of slf, alf, aff"),
        (["--protocol", "aff", "--aff-milestones", "20,15"], "aff milestones '20,15'"),
        (["--protocol", "alf", "--alf-steps", "0"], "alf steps 0"),
    ],
)
def test_cli_protocol_errors_are_one_line_exit_2(args, fragment, capsys, tmp_path) -> None:
    rc, _, err = cli(["eval", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), *args], capsys)
    one_line_error(rc, err, fragment, command="eval")


def test_zoo_entries_carry_the_protocol_and_expect_its_rows() -> None:
    from robustbench_nacl.pipeline import expected_rows, with_protocol
    from robustbench_nacl.zoo import demo_zoo

    entries = demo_zoo()[:2]
    assert with_protocol(entries, "slf") == entries  # SLF: the manifests as they are
    three = with_protocol(entries, "aff,slf,alf")
    assert [e.eval["protocol"] for e in three] == ["aff,slf,alf"] * 2
    assert [expected_rows(e) for e in three] == [3 * expected_rows(e) for e in entries]


@pytest.mark.parametrize("command", [["demo"], ["zoo", "run"], ["zoo", "eval"]])
def test_protocol_flag_of_demo_and_zoo_rejects_unknown_names(command, capsys) -> None:
    rc, _, err = cli([*command, "--protocol", "alf,xyz"], capsys)
    one_line_error(rc, err, "protocol 'xyz'", command=command[0])


def test_evaluate_resumes_a_killed_aff_run_to_the_same_weights(tmp_path, monkeypatch) -> None:
    kw = dict(dataset="digits:0-4", suite=SUITE, n_examples=8, probe=ProbeConfig(epochs=1, max_train=40))
    kw.update(protocol="aff", aff=AffConfig(epochs=2, batch_size=20, steps=1), progress=False)
    want = evaluate(_encoder(), out=tmp_path / "a", **kw)[0]["finetuned_sha256"]
    calls, real = {"n": 0}, ft.trades_loss

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the first batch of epoch 2
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ft, "trades_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_encoder(), out=tmp_path / "b", **kw)
    assert not list((tmp_path / "b").glob("rows/*.json"))  # no half-finished rows
    monkeypatch.setattr(ft, "trades_loss", real)
    calls["n"] = 0
    monkeypatch.setattr(
        ft, "trades_loss", lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1]
    )
    rows = evaluate(_encoder(), out=tmp_path / "b", **kw)
    assert calls["n"] == 2  # only epoch 2 was trained again
    assert rows[0]["finetuned_sha256"] == want


def test_setting_kinds_run_their_own_suites_and_finetuning_only_where_asked(tmp_path) -> None:
    from robustbench_nacl.eval.evaluate import planned_identities

    fgsm = {"name": "fgsm-only", "attack": [{"name": "fgsm", "norm": "Linf", "eps": [0.05]}]}
    kw = dict(
        dataset="digits:0-4",
        transfer="digits:5-9",
        corruptions="contrast",
        severities="2",
        suite=SUITE,
        setting_suites={"corruption": fgsm},
        n_examples=10,
        probe=ProbeConfig(epochs=2, max_train=40),
        protocol="slf,alf",
        alf=AlfConfig(epochs=1, batch_size=4000, steps=1, max_train=32),  # fitted: 13 steps
        finetune_settings="in-domain,corruption",
    )
    rows = evaluate(_encoder(), out=tmp_path, progress=False, **kw)
    # planned without the checkpoint = written, row for row
    planned = planned_identities(**kw)
    assert len(rows) == len(planned) == 2 * 3 + 2 * 2  # SLF: 3 settings; ALF: in-domain + corruption
    got = {(protocol_name(r), r["setting"], r["attack"]) for r in rows}
    assert ("alf", "transfer", "pgd") not in got and ("alf", "corruption", "fgsm") in got
    assert {r["attack"] for r in rows if r["setting"] == "corruption"} == {"fgsm", "worst_case"}
    suites = {r["setting"]: r["suite"] for r in rows}
    assert suites == {"in-domain": "ft-test", "transfer": "ft-test", "corruption": "fgsm-only"}
    alf = [r for r in rows if protocol_name(r) == "alf"]
    assert {r["finetune"]["max_train"] for r in alf} == {32}
    # an ALF row without max_train keeps the identity it had before the field existed
    assert "max_train" not in AlfConfig().identity() and AlfConfig(max_train=32).identity()["max_train"] == 32
    with pytest.raises(UserError, match="finetune settings 'indomain'"):
        planned_identities(**{**kw, "finetune_settings": "indomain"})
    with pytest.raises(UserError, match="setting suite for 'shifts'"):
        planned_identities(**{**kw, "setting_suites": {"shifts": fgsm}})
    with pytest.raises(UserError, match="alf max-train 0"):
        AlfConfig(max_train=0).check()

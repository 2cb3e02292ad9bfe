"""Linear probe: frozen encoder stays bit-identical, the hand-written Adam equals torch's, kNN works,
every probe and kNN setting is validated and used."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from robustbench_nacl.data import load_dataset
from robustbench_nacl.errors import UserError
from robustbench_nacl.eval.probe import (
    ProbeConfig,
    ProbedClassifier,
    _train_head,
    fit_knn_probe,
    fit_linear_probe,
)
from robustbench_nacl.models.factory import create_encoder
from robustbench_nacl.models.features import knn_predict


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    return create_encoder("convnet_small", in_channels=1, input_shape=(1, 8, 8), width=8)


def test_probing_leaves_the_encoder_bit_identical_and_returns_a_frozen_classifier() -> None:
    enc = _encoder()
    enc.train()  # even a caller that left it in train mode must not see BatchNorm statistics move
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    clf, res = fit_linear_probe(enc, train, test, ProbeConfig(epochs=20, lr=1e-2))
    after = enc.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert isinstance(clf, ProbedClassifier) and not clf.training
    clf.train()  # frozen by contract: stays in eval mode
    assert not any(m.training for m in clf.modules())
    assert not any(p.requires_grad for p in clf.parameters())
    x = (test.x[:8].float() / 255).requires_grad_(True)
    logits = clf(x)
    assert logits.shape == (8, 5)
    (g,) = torch.autograd.grad(logits.sum(), x)  # input gradients flow end to end
    assert g.abs().sum() > 0
    assert 0.5 < res.test_acc <= 1.0 and res.n_train == len(train) and res.n_test == len(test)
    assert res.best_test_acc >= res.test_acc and 1 <= res.best_epoch <= 20


def test_cached_feature_accuracy_equals_end_to_end_accuracy() -> None:
    enc = _encoder()
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    clf, res = fit_linear_probe(enc, train, test, ProbeConfig(epochs=30))
    with torch.no_grad():
        e2e = (clf(test.x.float() / 255).argmax(1) == test.y).float().mean().item()
    assert abs(e2e - res.test_acc) <= 1 / len(test)  # the cache only trains; attacks use the pipeline


def test_hand_written_adam_equals_torch_adam() -> None:
    g = torch.Generator().manual_seed(1)
    f_train, y_train = (
        torch.randn(100, 7, generator=g, dtype=torch.float64),
        torch.randint(0, 3, (100,), generator=g),
    )
    f_test, y_test = (
        torch.randn(20, 7, generator=g, dtype=torch.float64),
        torch.randint(0, 3, (20,), generator=g),
    )
    cfg = ProbeConfig(epochs=5, lr=1e-2, batch_size=32, weight_decay=1e-3)
    ours = nn.Linear(7, 3).double()
    ref = nn.Linear(7, 3).double()
    ref.load_state_dict(ours.state_dict())
    _train_head(ours, f_train, y_train, f_test, y_test, cfg, torch.Generator().manual_seed(5))
    opt = torch.optim.Adam(ref.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(5)
    for _ in range(cfg.epochs):
        perm = torch.randperm(100, generator=gen)
        for i in range(0, 100, 32):
            idx = perm[i : i + 32]
            loss = nn.functional.cross_entropy(ref(f_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.testing.assert_close(ours.weight, ref.weight, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours.bias, ref.bias, rtol=1e-9, atol=1e-12)


def test_probe_is_deterministic_given_its_seed() -> None:
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    _, a = fit_linear_probe(_encoder(), train, test, ProbeConfig(epochs=10, seed=3))
    _, b = fit_linear_probe(_encoder(), train, test, ProbeConfig(epochs=10, seed=3))
    assert dataclasses.asdict(a) == dataclasses.asdict(b)


def test_knn_probe_is_a_valid_accuracy_above_chance() -> None:
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    acc = fit_knn_probe(_encoder(), train, test)
    assert 0.2 < acc <= 1.0  # a random conv encoder already separates digits far above 10%


def test_knn_votes_do_not_overflow_at_a_small_temperature() -> None:
    # e^{sim/t} overflows float32 for sim/t > 88.7: with t = 0.01 every vote was inf and the argmax
    # fell to class 0 whatever the neighbours said; votes e^{(sim - max)/t} rank the same and stay finite
    q = torch.tensor([[1.0, 0.0]])
    bank = torch.tensor([[1.0, 0.0]] * 3 + [[0.95, (1 - 0.95**2) ** 0.5]] * 2)
    bank_y = torch.tensor([1, 1, 1, 0, 0])
    assert knn_predict(bank, bank_y, q, num_classes=2, k=5, t=0.01).tolist() == [1]
    assert knn_predict(bank, bank_y, q, num_classes=2, k=5, t=0.1).tolist() == [1]


def test_probe_config_records_and_uses_the_knn_parameters() -> None:
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    for k, t in ((1, 0.1), (50, 0.5)):
        _, res = fit_linear_probe(_encoder(), train, test, ProbeConfig(epochs=2, knn_k=k, knn_t=t))
        assert res.knn_acc == fit_knn_probe(_encoder(), train, test, k=k, t=t)
        assert (res.config["knn_k"], res.config["knn_t"]) == (k, t)


def test_probe_seed_none_is_seed_zero_outside_evaluate() -> None:
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    _, a = fit_linear_probe(_encoder(), train, test, ProbeConfig(epochs=5))
    _, b = fit_linear_probe(_encoder(), train, test, ProbeConfig(epochs=5, seed=0))
    assert (a.test_acc, a.best_epoch, a.train_acc) == (b.test_acc, b.best_epoch, b.train_acc)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epochs", 0, "probe epochs 0: must be an integer >= 1"),
        ("batch_size", 1.5, "probe batch_size 1.5: must be an integer >= 1"),
        ("knn_k", 0, "probe knn_k 0: must be an integer >= 1"),
        ("max_train", 0, "probe max_train 0: must be an integer >= 1"),
        ("lr", 0.0, r"probe lr 0.0: must be a finite number > 0"),
        ("knn_t", float("inf"), r"probe knn_t inf: must be a finite number > 0"),
        ("weight_decay", -1e-3, r"probe weight_decay -0.001: must be a finite number >= 0"),
    ],
)
def test_bad_probe_settings_are_one_line_user_errors(field: str, value: object, message: str) -> None:
    cfg = dataclasses.replace(ProbeConfig(), **{field: value})
    with pytest.raises(UserError, match=message):
        cfg.check()
    train, test = load_dataset("digits:0-4", "train"), load_dataset("digits:0-4", "test")
    with pytest.raises(UserError, match=message):  # checked before anything is computed
        fit_linear_probe(_encoder(), train, test, cfg)

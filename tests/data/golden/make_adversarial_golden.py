"""Regenerate adversarial_losses_b8.json: the ACL, DynACL, RoCL and DeACL losses as their authors wrote them.

Transcriptions (float64, plain torch, nothing from robustbench_nacl) of:
- ACL, https://github.com/VITA-Group/Adversarial-Contrastive-Learning: ``utils.py`` ``nt_xent`` and
  ``pair_cosine_similarity`` (views interleaved [x1_0, x2_0, x1_1, ...]), ``train_simCLR.py``
  ``loss = (nt_xent(features) + nt_xent(features_adv)) / 2`` (ACL_DS);
- DynACL, https://github.com/PKU-ML/DynACL: ``train_DynACL.py``
  ``(nt_xent(features) * (2 - weight_adv) + nt_xent(features_adv) * weight_adv) / 2``;
- RoCL, https://github.com/Kim-Minseon/RoCL: ``src/loss.py`` ``pairwise_similarity`` and
  ``NT_xent(adv_type='Rep')`` (layout [x1; x2; x_adv], the 1e-8 terms kept), ``src/attack_lib.py``
  ``RepresentationAdv.get_loss`` (``(1 / lamda) NT_xent`` of [x_adv; x2], ``regularize_to='other'``)
  and ``src/rocl_train.py`` (``loss = simloss + adv_loss``);
- DeACL, https://github.com/pantheon5100/DeACL: ``solo/methods/mocov2_distillation_AT.py``
  ``training_step`` (``adv_loss = -cos(student_clean, away_target).mean()
  - trades_k * cos(student_AE, student_clean).mean()``, trades_k = 2).

Run from the repository root: ``python tests/data/golden/make_adversarial_golden.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

B, D = 8, 16


def acl_nt_xent(x: torch.Tensor, t: float = 0.5) -> torch.Tensor:
    n = x.norm(p=2, dim=1, keepdim=True)
    x = (x @ x.t()) / (n * n.t()).clamp(min=1e-8)
    x = torch.exp(x / t)
    idx = torch.arange(x.size()[0])
    idx[::2] += 1
    idx[1::2] -= 1
    x = x[idx]
    x = x.diag() / (x.sum(0) - torch.exp(torch.tensor(1 / t, dtype=x.dtype)))
    return -torch.log(x).mean()


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([a, b], dim=1).reshape(2 * a.shape[0], a.shape[1])


def rocl_similarity(outputs: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    b = outputs.shape[0]
    norm = outputs / (outputs.norm(dim=1).view(b, 1) + 1e-8)
    return (1.0 / temperature) * torch.mm(norm, norm.transpose(0, 1).detach())


def rocl_nt_xent(sim: torch.Tensor, rep: bool) -> torch.Tensor:
    n2 = len(sim)
    n = n2 // 3 if rep else n2 // 2
    e = torch.exp(sim) * (1 - torch.eye(n2, n2, dtype=sim.dtype))
    loss = -torch.log(e / (torch.sum(e, dim=1).view(n2, 1) + 1e-8) + 1e-8)
    if not rep:
        return (1.0 / n2) * torch.sum(torch.diag(loss[0:n, n:]) + torch.diag(loss[n:, 0:n]))
    return (1.0 / n2) * torch.sum(
        torch.diag(loss[0:n, n : 2 * n])
        + torch.diag(loss[n : 2 * n, 0:n])
        + torch.diag(loss[0:n, 2 * n :])
        + torch.diag(loss[2 * n :, 0:n])
        + torch.diag(loss[n : 2 * n, 2 * n :])
        + torch.diag(loss[2 * n :, n : 2 * n])
    )


def main() -> None:
    cases, inputs = [], []
    for seed in range(3):
        g = torch.Generator().manual_seed(1000 + seed)
        z1, z2, a1, a2 = (torch.randn(B, D, generator=g, dtype=torch.float64) for _ in range(4))
        clean, adv = acl_nt_xent(interleave(z1, z2)), acl_nt_xent(interleave(a1, a2))
        inputs.append({"z1": z1.tolist(), "z2": z2.tolist(), "z1_adv": a1.tolist(), "z2_adv": a2.tolist()})
        arrays = {"input": seed}
        cases.append({"loss": "acl", "acl_mode": "ds", "t": 0.5, **arrays, "value": float((clean + adv) / 2)})
        cases.append({"loss": "acl", "acl_mode": "a2a", "t": 0.5, **arrays, "value": float(adv)})
        a2s = acl_nt_xent(interleave(z1, a2))
        cases.append({"loss": "acl", "acl_mode": "a2s", "t": 0.5, **arrays, "value": float(a2s)})
        for w in (1.0, 4 / 3, 5 / 3):
            value = (clean * (2 - w) + adv * w) / 2
            cases.append({"loss": "dynacl", "adv_weight": w, "t": 0.5, **arrays, "value": float(value)})
        lamda = 256.0
        simloss = rocl_nt_xent(rocl_similarity(torch.cat([z1, z2, a1])), rep=True)
        reg = (1.0 / lamda) * rocl_nt_xent(rocl_similarity(torch.cat([a1, z2])), rep=False)
        cases.append({"loss": "rocl", "rocl_lamda": lamda, "t": 0.5, **arrays, "value": float(simloss + reg)})
        # DeACL on unnormalised features: z1 = student(clean), z1_adv = student(AE), z2 = teacher(clean)
        cos = torch.nn.functional.cosine_similarity
        deacl = -cos(z1, z2).mean() + -2.0 * cos(a1, z1).mean()
        cases.append({"loss": "deacl", "trades_k": 2.0, **arrays, "value": float(deacl)})
    out = Path(__file__).with_name("adversarial_losses_b8.json")
    lines = [json.dumps(x) for x in inputs], [json.dumps(c) for c in cases]
    text = '{"inputs": [\n' + ",\n".join(lines[0]) + '\n],\n"cases": [\n' + ",\n".join(lines[1]) + "\n]}\n"
    out.write_text(text)


if __name__ == "__main__":
    main()

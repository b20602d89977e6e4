#!/usr/bin/env python3
"""Reference numbers for tests/parity_step1.rs: step 1's loss and gradients
of the PyTorch twins of `zoo::resnet18_cifar` and `zoo::airbench94_net`
(benches/pytorch_models.py), in float64, on weights and data given by a
formula both sides compute, so the test needs neither torch nor a large file.

    python3 benches/parity_step1_reference.py > tests/data/parity_step1.json

The formula (the test computes the same, in Rust): parameter number t (in
`named_parameters` order, airbench's frozen BatchNorm scales left out; the
running statistics are 0 and 1) of PyTorch shape S holds, at flat index k,
  kernels and linear weights: sin(1.7 k + 0.9 t + 0.3) / sqrt(fan_in)
  biases:                     0.1 sin(1.3 k + 0.9 t)
  BatchNorm weight:           1 + 0.2 sin(1.1 k + 0.9 t)
  BatchNorm bias:             0.1 cos(0.7 k + 0.9 t)
each rounded to f32; the batch, 2 NHWC images of 32x32x3, holds
sin(0.37 i + 0.11) at flat index i (rounded to f32), labels [3, 7].
For each gradient tensor it stores the L2 norm, the largest magnitude and the
values at 8 flat indices (PyTorch layout) spread over it.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from parity_models import SMOOTHING, frozen, twin  # noqa: E402

BATCH, SIDE, LABELS = 2, 32, [3, 7]


def kind(name, module):
    if isinstance(module, nn.BatchNorm2d):
        return "bn_weight" if name.endswith("weight") else "bn_bias"
    return "bias" if name.endswith("bias") else "kernel"


def formula(kind, shape, t):
    k = np.arange(int(np.prod(shape)), dtype=np.float64)
    v = {
        "kernel": lambda: np.sin(1.7 * k + 0.9 * t + 0.3) / math.sqrt(int(np.prod(shape[1:]))),
        "bias": lambda: 0.1 * np.sin(1.3 * k + 0.9 * t),
        "bn_weight": lambda: 1 + 0.2 * np.sin(1.1 * k + 0.9 * t),
        "bn_bias": lambda: 0.1 * np.cos(0.7 * k + 0.9 * t),
    }[kind]()
    return v.astype(np.float32).astype(np.float64).reshape(shape)


def sample_indices(n):
    return sorted({int(round(j * (n - 1) / 7)) for j in range(8)})


def reference(name):
    torch.manual_seed(0)
    model = twin(name).double().train()
    skip = frozen(model, name)
    modules = dict(model.named_modules())
    kinds = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname in skip:
                continue
            kinds[pname] = kind(pname, modules[pname.rsplit(".", 1)[0]])
            p.copy_(torch.from_numpy(formula(kinds[pname], tuple(p.shape), len(kinds) - 1)))
    i = np.arange(BATCH * SIDE * SIDE * 3, dtype=np.float64)
    x = np.sin(0.37 * i + 0.11).astype(np.float32).astype(np.float64).reshape(BATCH, SIDE, SIDE, 3)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    loss = nn.CrossEntropyLoss(label_smoothing=SMOOTHING[name])(model(x), torch.tensor(LABELS))
    loss.backward()
    grads = []
    for pname, p in model.named_parameters():
        if pname in skip:
            continue
        g = p.grad.detach().numpy().reshape(-1)
        idx = sample_indices(g.size)
        grads.append({"name": pname, "kind": kinds[pname], "shape": list(p.shape),
                      "norm": float(np.linalg.norm(g)), "max_abs": float(np.abs(g).max()),
                      "at": idx, "values": [float(g[j]) for j in idx]})
    return {"loss": loss.item(), "label_smoothing": SMOOTHING[name], "tensors": grads}


def main():
    torch.set_default_dtype(torch.float64)
    out = {"torch": torch.__version__, "batch": BATCH, "side": SIDE, "labels": LABELS,
           "models": {name: reference(name) for name in ("airbench94", "resnet18")}}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference numbers for tests/parity_step1.rs: step 1's loss and gradients
of the PyTorch twins of `zoo::resnet18_cifar` and `zoo::airbench94_net`
(benches/pytorch_models.py), in float64, on weights and data given by a
formula both sides compute, so the test needs neither torch nor a large file.

    python3 benches/parity_step1_reference.py > tests/data/parity_step1.json

The formula (the test computes the same, in Rust): `uniform(n, s)` is n
values in [-1, 1) from an integer hash of (index, s), exact in both
languages; parameter number t (in `named_parameters` order, airbench's
frozen BatchNorm scales left out; the running statistics are 0 and 1) of
PyTorch shape S holds `uniform(|S|, t + 1)` scaled as
  kernels and linear weights: u sqrt(3 / fan_in) (variance 1 / fan_in)
  biases and BatchNorm biases: 0.1 u
  BatchNorm weights:           1 + 0.2 u
each rounded to f32 (a multiple of 2^-23 times the scale); the batch, 2 NHWC
images of 32x32x3, is `uniform(2 * 32 * 32 * 3, 0)`, labels [3, 7].
(Smooth formulas such as sin(a k + b) make the filters nearly collinear:
ResNet-18's BatchNorms then amplify rounding until PyTorch's own float32
loss is 2e-4 off its float64 one, which no tolerance can tell from a defect.)
For each gradient tensor it stores the L2 norm, the largest magnitude, the
values at 8 flat indices (PyTorch layout) spread over it, and how far
PyTorch's own float32 gradient is from them by the test's measure: with a
batch of 2, ReLU kinks and BatchNorm's backward make ResNet-18's float32
gradients differ from float64 by up to a few percent of a tensor's largest
entry, the floor any float32 implementation is held to.
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


def uniform(n, stream):
    """n values uniform in [-1, 1) from an integer hash of (index, stream): exact
    integer arithmetic, so Rust computes the same bits."""
    m = np.uint64(0xFFFFFFFF)
    h = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(stream) * np.uint64(40503)
         + np.uint64(12345)) & m
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(3266489917)) & m
    h ^= h >> np.uint64(16)
    return (h >> np.uint64(8)).astype(np.float64) / 2.0 ** 23 - 1.0


def formula(kind, shape, t):
    n = int(np.prod(shape))
    u = uniform(n, t + 1)
    v = {
        "kernel": lambda: u * math.sqrt(3.0 / int(np.prod(shape[1:]))),
        "bias": lambda: 0.1 * u,
        "bn_weight": lambda: 1 + 0.2 * u,
        "bn_bias": lambda: 0.1 * u,
    }[kind]()
    return v.astype(np.float32).astype(np.float64).reshape(shape)


def sample_indices(n):
    return sorted({int(round(j * (n - 1) / 7)) for j in range(8)})


def step1(name, dtype):
    """The twin of `name` in `dtype` on the formula's weights and batch: the
    loss, each parameter's gradient (flat, float64) and its kind, by name."""
    torch.manual_seed(0)
    model = twin(name).to(dtype).train()
    skip = frozen(model, name)
    modules = dict(model.named_modules())
    kinds = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname in skip:
                continue
            kinds[pname] = kind(pname, modules[pname.rsplit(".", 1)[0]])
            p.copy_(torch.from_numpy(formula(kinds[pname], tuple(p.shape), len(kinds) - 1)))
    x = uniform(BATCH * SIDE * SIDE * 3, 0).reshape(BATCH, SIDE, SIDE, 3)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(dtype)
    loss = nn.CrossEntropyLoss(label_smoothing=SMOOTHING[name])(model(x), torch.tensor(LABELS))
    loss.backward()
    grads = {pname: (p.grad.detach().double().numpy().reshape(-1), tuple(p.shape))
             for pname, p in model.named_parameters() if pname in kinds}
    return loss.item(), grads, kinds


def error(g, ref, idx):
    """The test's measure: the norm's relative error, or the largest error at
    the sampled entries over the largest |reference|, whichever is larger."""
    norm = abs(np.linalg.norm(g) - np.linalg.norm(ref)) / max(np.linalg.norm(ref), 1e-30)
    return max(norm, float(np.abs(g[idx] - ref[idx]).max() / max(np.abs(ref).max(), 1e-30)))


def reference(name):
    loss, grads, kinds = step1(name, torch.float64)
    _, grads32, _ = step1(name, torch.float32)
    out = []
    for pname, (g, shape) in grads.items():
        idx = sample_indices(g.size)
        out.append({"name": pname, "kind": kinds[pname], "shape": list(shape),
                    "norm": float(np.linalg.norm(g)), "max_abs": float(np.abs(g).max()),
                    "at": idx, "values": [float(g[j]) for j in idx],
                    "torch_f32_error": error(grads32[pname][0], g, idx)})
    return {"loss": loss, "label_smoothing": SMOOTHING[name], "tensors": out}


def main():
    out = {"torch": torch.__version__, "batch": BATCH, "side": SIDE, "labels": LABELS,
           "models": {name: reference(name) for name in ("airbench94", "resnet18")}}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Which of aether's v1 recipe choices move test accuracy (issue 35's 2-point
gap), measured in PyTorch where each can be switched alone: v1 trained with
PyTorch's defaults (the twin), with aether's He-normal initialisation, with
aether's AdamW details too (epsilon 1e-7 in the Keras form, BatchNorm not
decayed), and with the GPU path's f16 roundings (conv and dense inputs and
kernels, and their output gradients rounded to f16 with no loss scaling,
clipped to +-65504; `parity_pytorch.gpu_f16_roundings`, which reproduces
aether's GPU step-1 gradients to 3 digits), split into operand and gradient
rounding, and with the gradients scaled by 2^16 before their rounding (loss
scaling). Trains on a harder variant of `aether::data::synthetic_images`
(more pixel noise, so accuracy is not saturated; CIFAR-10 cannot be
downloaded where this was written), several seeds each.

    python3 benches/v1_recipe_study.py [--epochs 10] [--train 25000] [--seeds 3] [--noise 3 5]
        [--configs NAME ...]

Needs torch (a CUDA GPU makes it take minutes) and numpy.
"""

import argparse
import math
import statistics
import time

import numpy as np
import torch
from torch import nn

from parity_pytorch import AdamW, gpu_f16_roundings, he_normal_, split_params, v1_model


def synthetic(n, side, seed, noise):
    """`aether::data::synthetic_images`' classes (a tint shared by two classes
    and a stripe orientation shared by two), with uniform pixel noise of
    width `noise` (aether's: 0.8). NCHW float32, labels int64."""
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, 10, n)
    tint_id = (cls // 2).astype(np.float32)
    angle = (cls % 5) * math.pi / 5 + (rng.random(n) - 0.5) * 0.4
    freq = 0.25 + 0.2 * rng.random(n)
    tint = np.stack([0.5 + 0.3 * np.sin(tint_id * a + b) + (rng.random(n) - 0.5) * 0.3
                     for a, b in [(1.3, 0.0), (2.1, 1.0), (2.9, 2.0)]], 1)
    phase = rng.random(n) * 2 * math.pi
    contrast = 0.1 + 0.25 * rng.random(n)
    bright = rng.random(n) * 0.4 - 0.2
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    stripe = np.sin((xx[None] * np.cos(angle)[:, None, None] + yy[None] * np.sin(angle)[:, None, None])
                    * freq[:, None, None] + phase[:, None, None])
    img = (tint[:, :, None, None] * 0.5 + (contrast[:, None, None] * stripe)[:, None]
           + bright[:, None, None, None] + (rng.random((n, 3, side, side)) - 0.5) * noise)
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(cls.astype(np.int64))


def build(init, f16):
    """f16: False, or the gradient scale of `gpu_f16_roundings`."""
    model = v1_model(own_rng=True)
    if f16 is not False:
        gpu_f16_roundings(model, f16)
    if init == "he":
        he_normal_(model)
    return model


# name -> (init, optimizer, f16: False, or the output-gradient scale before
# its f16 rounding: 1 as aether today, None for f16 operands with f32 gradients).
CONFIGS = {
    "PyTorch twin (torch init, torch AdamW)": ("torch", "torch", False),
    "twin + f16 GPU roundings": ("torch", "torch", 1.0),
    "twin + f16 operands, f32 gradients": ("torch", "torch", None),
    "twin + f16, gradients scaled 2^16": ("torch", "torch", 65536.0),
    "He-normal init, torch AdamW": ("he", "torch", False),
    "He init + aether AdamW (CPU aether)": ("he", "aether", False),
    "He + aether AdamW + f16 (GPU aether)": ("he", "aether", 1.0),
    "GPU aether + gradients scaled 2^16": ("he", "aether", 65536.0),
}


def train(config, seed, data, epochs, batch, device):
    init, opt_name, f16 = CONFIGS[config]
    torch.manual_seed(seed)
    model = build(init, f16).to(device)
    if opt_name == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    else:
        decayed, kept = split_params(model)
        opt = AdamW(decayed, kept)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    (x, y), (tx, ty) = data
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(y), generator=g).split(batch):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[idx.to(device)]), y[idx.to(device)]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum().item()
                      for i in range(0, len(ty), 1000))
    return correct / len(ty)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--train", type=int, default=25000)
    p.add_argument("--test", type=int, default=10000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--noise", type=float, nargs="+", default=[3.0, 5.0])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                   metavar="NAME", help="which of the configurations to train (default all)")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, "
          f"v1 32x32, {args.train} train / {args.test} test images, batch {args.batch}, "
          f"{args.epochs} epochs, AdamW 1e-3 / wd 0.01, label smoothing 0.05, dropout on")
    for noise in args.noise:
        data = tuple((a.to(device), b.to(device)) for a, b in
                     (synthetic(args.train, 32, 1, noise), synthetic(args.test, 32, 2, noise)))
        print(f"pixel noise width {noise}:")
        for config in args.configs:
            start = time.time()
            accs = [train(config, s, data, args.epochs, args.batch, device) for s in range(args.seeds)]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            print(f"  {config:<40} test accuracy {statistics.mean(accs):.4f} +- {sd:.4f} "
                  f"({', '.join(f'{a:.4f}' for a in accs)}) [{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()

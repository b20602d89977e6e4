#!/usr/bin/env python3
"""airbench94's training recipe in PyTorch, on the data `examples/airbench.rs`
trains on, printing the same per-epoch lines: the twin whose loss curve the
aether example's is set beside (docs/lab/airbench.md).

    cargo run --release --example airbench -- --export-data /tmp/airbench-data.safetensors
    python3 benches/airbench_recipe.py --data /tmp/airbench-data.safetensors [--epochs 9.9] [--json PATH]

The recipe, after the public airbench94 (KellerJordan/cifar10-airbench), in
the same hyperparameters aether's example uses:
- the network of `benches/pytorch_models.py::airbench94` (aether's
  `zoo::airbench94_net`), its first 2x2 conv set to whiten 2x2 patches of the
  first 5000 training images (eigenvectors over sqrt(eigenvalues + 5e-4), and
  their negatives) and frozen, its bias trained for 3 epochs;
- batch 1024, label smoothing 0.2 on a loss summed over the batch;
- Nesterov SGD, momentum 0.85, lr 11.5 and decoupled-from-batch weight decay
  0.0153 per 1024 examples scaled by 1024 (1 + 1 / (1 - momentum)), the
  BatchNorm biases at 64x the lr and 1/64 the decay;
- a triangular schedule (0.2 -> 1 at 23% of the steps -> 0.07);
- lookahead every 5 steps toward an average with decay 0.95^5 * (step/total)^3,
  the average copied in at the end;
- alternating flip and random reflect-padded translation by up to 2 pixels;
- test-time augmentation: the mean over the mirror of the image, and of it
  shifted one pixel up-left and down-right (weights 1/2, 1/4, 1/4).

The data file holds `train_x [N, 32, 32, 3]`, `train_y [N]`, `test_x`, `test_y`
(f32 NHWC, already normalised; labels as f32).
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from pytorch_models import airbench94

BATCH = 1024
LR, MOMENTUM, WEIGHT_DECAY, BIAS_SCALER = 11.5, 0.85, 0.0153, 64.0
LABEL_SMOOTHING, WHITEN_BIAS_EPOCHS, TRANSLATE = 0.2, 3, 2


def load_file(path):
    """A safetensors file of f32 tensors as numpy arrays (read here, so the
    device machine needs no `safetensors` package)."""
    with open(path, "rb") as f:
        raw = f.read()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    body = raw[8 + size:]
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{name}: {info['dtype']}"
        start, end = info["data_offsets"]
        arrays[name] = np.frombuffer(body[start:end], dtype=np.float32).reshape(info["shape"]).copy()
    return arrays


def whiten(conv, images, eps=5e-4):
    """Sets the 2x2 conv to whiten 2x2 patches of `images` (NCHW)."""
    c, (h, w) = images.shape[1], conv.weight.shape[2:]
    patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
    flat = patches.reshape(len(patches), -1)
    eigenvalues, eigenvectors = torch.linalg.eigh(flat.T @ flat / len(flat))
    eigenvectors = eigenvectors.T.reshape(-1, c, h, w).flip(0)
    filters = eigenvectors / torch.sqrt(eigenvalues.flip(0) + eps).view(-1, 1, 1, 1)
    conv.weight.data[:] = torch.cat((filters, -filters))


def triangle(steps, start, end, peak):
    return np.interp(np.arange(steps + 1), [0, int(peak * steps), steps], [start, 1.0, end])


def translate(images, pad, generator):
    """Each image shifted by up to `pad` pixels either way, reflect-padded."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad,) * 4, mode="reflect")
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy.view(n, 1) + torch.arange(h)).to(images.device)
    cols = (dx.view(n, 1) + torch.arange(w)).to(images.device)
    idx = torch.arange(n, device=images.device).view(n, 1, 1, 1)
    ch = torch.arange(images.shape[1], device=images.device).view(1, -1, 1, 1)
    return padded[idx, ch, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


def tta_logits(model, x):
    mirror = lambda v: 0.5 * (model(v) + model(v.flip(-1)))
    padded = F.pad(x, (1,) * 4, mode="reflect")
    up_left, down_right = padded[:, :, :-2, :-2], padded[:, :, 2:, 2:]
    return 0.5 * mirror(x) + 0.25 * mirror(up_left) + 0.25 * mirror(down_right)


def evaluate(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 2000):
            correct += (tta_logits(model, x[i:i + 2000]).argmax(1) == y[i:i + 2000]).sum().item()
    model.train()
    return correct / len(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=float, default=9.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    data = load_file(args.data)
    to = lambda k: torch.from_numpy(data[k]).permute(0, 3, 1, 2).contiguous().to(device)
    train_x, test_x = to("train_x"), to("test_x")
    train_y = torch.from_numpy(data["train_y"]).long().to(device)
    test_y = torch.from_numpy(data["test_y"]).long().to(device)
    n = len(train_x)
    steps_per_epoch = math.ceil(n / BATCH)
    total_steps = math.ceil(args.epochs * steps_per_epoch)

    model = airbench94().to(device)
    whiten(model[0], train_x[:5000])
    model[0].weight.requires_grad = False
    for conv in [m for m in model if isinstance(m, torch.nn.Conv2d)][1:]:
        torch.nn.init.dirac_(conv.weight.data[:conv.in_channels])
    kilostep_scale = 1024 * (1 + 1 / (1 - MOMENTUM))
    lr, wd = LR / kilostep_scale, WEIGHT_DECAY * BATCH / kilostep_scale
    norm_biases = [p for m in model if isinstance(m, torch.nn.BatchNorm2d) for p in [m.bias]]
    others = [p for p in model.parameters() if p.requires_grad and all(p is not b for b in norm_biases)]
    optimizer = torch.optim.SGD(
        [dict(params=norm_biases, lr=lr * BIAS_SCALER, weight_decay=wd / BIAS_SCALER),
         dict(params=others, lr=lr, weight_decay=wd)],
        momentum=MOMENTUM, nesterov=True)
    schedule = triangle(total_steps, start=0.2, end=0.07, peak=0.23)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    ema_decay = 0.95 ** 5 * (np.arange(total_steps + 1) / total_steps) ** 3
    average = {k: v.clone() for k, v in model.state_dict().items() if v.dtype.is_floating_point}

    def lookahead(decay):
        state = model.state_dict()
        for k, v in average.items():
            v.lerp_(state[k], 1 - decay)
            state[k].copy_(v)

    flip = torch.rand(n, generator=generator) < 0.5
    losses, epochs, step, start = [], [], 0, time.time()
    epoch = 0
    while step < total_steps:
        model[0].bias.requires_grad = epoch < WHITEN_BIAS_EPOCHS
        flipped = flip if epoch % 2 == 0 else ~flip
        order = torch.randperm(n, generator=generator)
        epoch_loss, seen = 0.0, 0
        for i in range(0, n, BATCH):
            if step >= total_steps:
                break
            rows = order[i:i + BATCH]
            x = train_x[rows.to(device)]
            x = torch.where(flipped[rows].to(device).view(-1, 1, 1, 1), x.flip(-1), x)
            x = translate(x, TRANSLATE, generator)
            loss = F.cross_entropy(model(x), train_y[rows.to(device)], label_smoothing=LABEL_SMOOTHING,
                                   reduction="sum")
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * schedule[step]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 5 == 0:
                lookahead(ema_decay[step])
            mean = loss.item() / len(rows)
            losses.append(mean)
            epoch_loss, seen = epoch_loss + loss.item(), seen + len(rows)
        if step >= total_steps:
            lookahead(1.0)
        accuracy = evaluate(model, test_x, test_y)
        epochs.append(dict(epoch=epoch + 1, loss=epoch_loss / seen, test_accuracy=accuracy))
        print(f"pytorch airbench94 epoch {epoch + 1}: train loss {epoch_loss / seen:.4f}, "
              f"test accuracy (TTA) {accuracy:.4f}, {time.time() - start:.1f} s")
        epoch += 1
    print(f"pytorch airbench94 on {device}: {total_steps} steps, test accuracy (TTA) "
          f"{epochs[-1]['test_accuracy']:.4f}, {time.time() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, steps=total_steps, losses=losses, epochs=epochs), f)


if __name__ == "__main__":
    main()

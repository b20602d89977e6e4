#!/usr/bin/env python3
"""PyTorch side of the v1 step-by-step parity check (issue 35): replays what
`cargo run --release --example parity_dump -- DIR` wrote (aether's initial v1
weights, the batches, the dropout masks each step drew) in a PyTorch twin of
v1 with the same recipe, and prints both loss curves side by side, the first
step where they part by more than --tolerance, step 1's per-parameter
gradients against `Model::gradients`, and the weights and BatchNorm running
statistics after the last step.

    python3 benches/parity_pytorch.py DIR [--tolerance 3e-3] [--device cpu|cuda] [--variants] [--f16-sim]

The reference is the same replay in float64: aether's losses are held to it
(--tolerance, relative), beside torch's own f32 replay, whose distance from
float64 is the f32 noise floor (Adam's sign-like early steps amplify rounding,
so both drift to about 1e-3 by step 50).

--variants then replays the same steps with one recipe detail at a time
switched from aether's choice to PyTorch's default (AdamW's epsilon and its
form, which parameters decay, the initialisation, dropout masks from torch's
RNG), and the full PyTorch twin (torch init + torch.optim.AdamW), each
against the aether mirror, to show which of them move the loss curve.
--f16-sim replays it once more with aether's GPU f16 roundings simulated,
for a dump made with `--device gpu`.

Needs torch and numpy; nothing in `cargo test` imports this file.
"""

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

STAGES = [((32, 32), 0.1), ((64, 64), 0.15), ((128,), 0.2)]


def read_safetensors(path):
    """{name: np.ndarray} of an f32 safetensors file (no safetensors package needed)."""
    raw = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    data = raw[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype="<f4").reshape(info["shape"]).copy()
    return out


class Masked(nn.Module):
    """Spatial dropout whose per-(sample, channel) multipliers are set from
    outside before each step (aether's masks), or nn.Dropout2d's own."""

    def __init__(self, rate, own_rng):
        super().__init__()
        self.rate, self.own_rng, self.mask = rate, own_rng, None
        self.torch_dropout = nn.Dropout2d(rate)

    def forward(self, x):
        if not self.training:
            return x
        if self.own_rng:
            return self.torch_dropout(x)
        return x * self.mask[:, :, None, None]


def v1_model(own_rng=False):
    """v1 in the layer order of `zoo::cifar10_v1` (Flatten added before Linear)."""
    layers, c_in = [], 3
    for filters, rate in STAGES:
        for f in filters:
            layers += [nn.Conv2d(c_in, f, 3, padding=1), nn.BatchNorm2d(f, eps=1e-5, momentum=0.1), nn.ReLU()]
            c_in = f
        layers += [nn.MaxPool2d(2), Masked(rate, own_rng)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)]
    return nn.Sequential(*layers)


def _round_f16(t):
    """t rounded to f16 in the forward, its gradient passed through unchanged."""
    return t + (t.half().float() - t).detach()


def _f16_output_grad(y, scale):
    """The gradient arriving at y rounded to f16 after clipping to +-65504, as
    aether's conv backward casts it: with `scale` 1 (aether today, no loss
    scaling), or times `scale` before the rounding and divided after (loss
    scaling, what PyTorch's GradScaler does); None leaves it f32."""
    if y.requires_grad and scale is not None:
        y.register_hook(lambda g: (g * scale).clamp(-65504, 65504).half().to(g.dtype) / scale)
    return y


class F16Conv2d(nn.Conv2d):
    """A conv as aether's GPU path runs it (`f16_operands` variants): input and
    kernel rounded to f16, f32 accumulation, output gradient rounded to f16."""

    grad_scale = 1.0

    def forward(self, x):
        y = F.conv2d(_round_f16(x), _round_f16(self.weight), self.bias, padding=self.padding)
        return _f16_output_grad(y, self.grad_scale)


class F16Linear(nn.Linear):
    """aether's Dense, a 1x1 conv on the same kernels: the same roundings."""

    grad_scale = 1.0

    def forward(self, x):
        y = F.linear(_round_f16(x), _round_f16(self.weight), self.bias)
        return _f16_output_grad(y, self.grad_scale)


def gpu_f16_roundings(model, grad_scale=1.0):
    """Swaps model's Conv2d and Linear layers for the F16 ones, weights kept;
    `grad_scale` as in `_f16_output_grad`."""
    for i, m in enumerate(model):
        if isinstance(m, nn.Conv2d):
            new = F16Conv2d(m.in_channels, m.out_channels, m.kernel_size, padding=m.padding)
        elif isinstance(m, nn.Linear):
            new = F16Linear(m.in_features, m.out_features)
        else:
            continue
        new.load_state_dict(m.state_dict())
        new.grad_scale = grad_scale
        model[i] = new


def he_normal_(model):
    """aether's initialisation (src/nn/init.rs) drawn from torch's RNG:
    N(0, 2 / fan_in) kernels, zero biases."""
    for m in model:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / m.weight[0].numel()))
            nn.init.zeros_(m.bias)


def aether_layer_indices(tensors, suffix):
    return sorted({int(k.split(".")[1]) for k in tensors if k.endswith("." + suffix)})


def mapping(model, tensors):
    """[(aether tensor name, torch parameter or buffer, aether -> torch transform)]."""
    weighted = [m for m in model if isinstance(m, (nn.Conv2d, nn.Linear))]
    norms = [m for m in model if isinstance(m, nn.BatchNorm2d)]
    pairs = []
    for i, m in zip(aether_layer_indices(tensors, "kernel"), weighted, strict=True):
        if isinstance(m, nn.Conv2d):  # [R, S, Cin, Cout] -> [Cout, Cin, R, S]
            pairs.append((f"layers.{i}.kernel", m.weight, lambda a: a.transpose(3, 2, 0, 1)))
        else:  # [1, 1, in, out] -> [out, in]
            pairs.append((f"layers.{i}.kernel", m.weight, lambda a: a.reshape(a.shape[-2:]).T))
        pairs.append((f"layers.{i}.bias", m.bias, lambda a: a))
    for i, m in zip(aether_layer_indices(tensors, "gamma"), norms, strict=True):
        for name, t in [("gamma", m.weight), ("beta", m.bias),
                        ("running_mean", m.running_mean), ("running_var", m.running_var)]:
            pairs.append((f"layers.{i}.{name}", t, lambda a: a))
    return pairs


def load_aether(model, tensors):
    with torch.no_grad():
        for name, t, to_torch in mapping(model, tensors):
            t.copy_(torch.from_numpy(np.ascontiguousarray(to_torch(tensors[name]))))


class AdamW:
    """AdamW as aether's src/optim.rs computes it: bias correction folded into
    the step size (Keras form, `lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)`,
    `p -= lr_t m / (sqrt(v) + eps)`), decoupled decay `p -= lr wd p` before the
    Adam step, BatchNorm's gamma/beta not decayed. `eps_form='torch'` uses
    PyTorch's `p -= lr/(1 - b1^t) m / (sqrt(v / (1 - b2^t)) + eps)`."""

    def __init__(self, decayed, kept, lr=1e-3, wd=0.01, eps=1e-7, eps_form="keras", b1=0.9, b2=0.999):
        self.groups = [(p, True) for p in decayed] + [(p, False) for p in kept]
        self.lr, self.wd, self.eps, self.eps_form, self.b1, self.b2 = lr, wd, eps, eps_form, b1, b2
        self.state = [(torch.zeros_like(p), torch.zeros_like(p)) for p, _ in self.groups]
        self.t = 0

    def zero_grad(self, set_to_none=True):
        for p, _ in self.groups:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2, t = self.b1, self.b2, self.t
        for (p, decays), (m, v) in zip(self.groups, self.state):
            g = p.grad
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            if decays:
                p.mul_(1 - self.lr * self.wd)
            if self.eps_form == "keras":
                lr_t = self.lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p.addcdiv_(m, v.sqrt().add_(self.eps), value=-lr_t)
            else:
                denom = (v / (1 - b2 ** t)).sqrt().add_(self.eps)
                p.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** t))


def split_params(model):
    bn = {id(p) for m in model if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
    decayed = [p for p in model.parameters() if id(p) not in bn]
    kept = [p for p in model.parameters() if id(p) in bn]
    return decayed, kept


# name -> (init, optimizer, dropout masks): one recipe detail at a time.
VARIANTS = {
    "mirror (aether's recipe)": ("aether", dict(eps=1e-7, eps_form="keras", decay_bn=False), "aether"),
    "eps 1e-8 torch form": ("aether", dict(eps=1e-8, eps_form="torch", decay_bn=False), "aether"),
    "BN gamma/beta decayed": ("aether", dict(eps=1e-7, eps_form="keras", decay_bn=True), "aether"),
    "torch.optim.AdamW": ("aether", "torch", "aether"),
    "He-normal, torch's draws": ("he", dict(eps=1e-7, eps_form="keras", decay_bn=False), "aether"),
    "torch default init": ("torch", dict(eps=1e-7, eps_form="keras", decay_bn=False), "aether"),
    "torch's dropout RNG": ("aether", dict(eps=1e-7, eps_form="keras", decay_bn=False), "torch"),
    "PyTorch twin (init+AdamW)": ("torch", "torch", "aether"),
}


def make_optimizer(model, spec):
    if spec == "torch":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    decayed, kept = split_params(model)
    if spec["decay_bn"]:
        decayed, kept = decayed + kept, []
    return AdamW(decayed, kept, eps=spec["eps"], eps_form=spec["eps_form"])


def replay(run, data, init, opt_spec, masks_from, device, want_grads=False, dtype=torch.float32,
           f16=False):
    torch.manual_seed(run["seed"])
    model = v1_model(own_rng=masks_from == "torch")
    if init == "aether":
        load_aether(model, data["initial"])
    elif init == "he":
        he_normal_(model)
    if f16:
        gpu_f16_roundings(model)
    model = model.to(device, dtype).train()
    opt = make_optimizer(model, opt_spec)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=run["label_smoothing"])
    b, side, batches = run["batch"], run["side"], run["batches"]
    x = torch.from_numpy(data["x"]).reshape(batches, b, side, side, 3).permute(0, 1, 4, 2, 3).to(dtype).contiguous()
    y = torch.from_numpy(data["y"].astype(np.int64)).reshape(batches, b)
    droppers = [m for m in model if isinstance(m, Masked)]
    losses, grads = [], None
    for step in range(run["steps"]):
        for k, m in enumerate(droppers):
            m.mask = torch.from_numpy(data["masks"][step][k]).to(device, dtype)
        xb, yb = x[step % batches].to(device), y[step % batches].to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if step == 0 and want_grads:
            grads = {id(p): p.grad.detach().cpu().float().clone() for p in model.parameters()}
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        xs, ys = x.reshape(-1, 3, side, side).to(device), y.reshape(-1).to(device)
        logits = torch.cat([model(xs[i:i + b]) for i in range(0, len(ys), b)])
        eval_loss = loss_fn(logits, ys).item()
        eval_acc = (logits.argmax(1) == ys).float().mean().item()
    return model.cpu().float(), losses, grads, (eval_loss, eval_acc)


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def rel_norm(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def split_masks(run, raw):
    """masks.f32 -> per step, per dropout layer, [batch, channels] arrays."""
    chans = [filters[-1] for filters, _ in STAGES]
    per_step = run["batch"] * sum(chans)
    raw = raw.reshape(run["steps"], per_step)
    out = []
    for s in range(run["steps"]):
        at, layers = 0, []
        for c in chans:
            layers.append(raw[s, at:at + run["batch"] * c].reshape(run["batch"], c))
            at += run["batch"] * c
        out.append(layers)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--tolerance", type=float, default=3e-3,
                        help="largest |loss_aether - loss_f64| / loss_f64 counted as the same "
                             "(f32's own drift from float64 over 50 Adam steps is about 1e-3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--f16-sim", action="store_true",
                        help="also replay with aether's GPU f16 roundings simulated (for a GPU dump)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    d = Path(args.dir)
    run = json.loads((d / "run.json").read_text())
    n = run["batches"] * run["batch"]
    data = {
        "initial": read_safetensors(d / "initial.safetensors"),
        "x": np.fromfile(d / "x.f32", dtype="<f4").reshape(n, run["side"], run["side"], 3),
        "y": np.fromfile(d / "y.u32", dtype="<u4"),
        "masks": split_masks(run, np.fromfile(d / "masks.f32", dtype="<f4")),
    }
    print(f"torch {torch.__version__} on {args.device}; aether on {run['device']}; v1 at "
          f"{run['side']}x{run['side']}, batch {run['batch']}, {run['batches']} batches cycled, "
          f"{run['steps']} steps, dropout {'on (aether masks)' if run['dropout'] else 'rates 0'}")

    model, losses, grads, (eval_loss, eval_acc) = replay(
        run, data, *VARIANTS["mirror (aether's recipe)"], args.device, want_grads=True)
    # The same steps in float64: the reference both f32 runs are held to.
    _, l64, _, _ = replay(run, data, *VARIANTS["mirror (aether's recipe)"], args.device,
                          dtype=torch.float64)
    ours = run["losses"]
    print(f"\n{'step':>4} {'aether':>11} {'torch f32':>11} {'torch f64':>11} "
          f"{'aether/f64':>10} {'torch/f64':>10} {'aether/torch':>12}")
    first_bad = None
    for s, (a, t, r64) in enumerate(zip(ours, losses, l64), 1):
        if first_bad is None and abs(a - r64) / r64 > args.tolerance:
            first_bad = s
        if s in (1, 2, 3, 5, 10, 20, 30, 40, 50) or s == len(ours):
            print(f"{s:>4} {a:>11.6f} {t:>11.6f} {r64:>11.6f} {abs(a - r64) / r64:>10.2e} "
                  f"{abs(t - r64) / r64:>10.2e} {abs(a - t) / t:>12.2e}")
    worst = max(abs(a - r) / r for a, r in zip(ours, l64))
    floor = max(abs(t - r) / r for t, r in zip(losses, l64))
    verdict = f"first step beyond it: {first_bad}" if first_bad else "no step beyond it"
    print(f"tolerance {args.tolerance:g} on |aether - torch f64| / torch f64: worst {worst:.2e}, "
          f"{verdict} (torch f32's own worst: {floor:.2e})")
    print(f"eval-mode loss on all batches after the last step (running statistics): "
          f"aether {run['eval_loss']:.6f}  torch {eval_loss:.6f}; accuracy "
          f"{run['eval_accuracy']:.4f} / {eval_acc:.4f}")

    # Step 1's gradients: aether's Model::gradients against autograd.
    # A conv bias before BatchNorm has gradient 0 in exact arithmetic (BN
    # subtracts the batch mean): both sides hold rounding residue there.
    absorbed = {f"layers.{i}.bias" for i in aether_layer_indices(data["initial"], "kernel")
                if i + 1 in aether_layer_indices(data["initial"], "gamma")}
    agrads = read_safetensors(d / "grads.safetensors")
    print(f"\nstep 1 loss: aether Model::gradients {run['grad_loss']:.6f}, torch {losses[0]:.6f}")
    print(f"{'parameter':<22} {'max|diff|/max|g|':>16} {'max|g| torch':>12}")
    by_param = {id(p): k for k, p in model.named_parameters()}
    for name, t, to_torch in mapping(model, data["initial"]):
        if name not in agrads:
            continue
        g_torch = grads[id(t)].numpy()
        g_aether = to_torch(agrads[name].reshape(data["initial"][name].shape))
        note = "  BN-absorbed: exact gradient 0, both rounding residue" if name in absorbed else ""
        print(f"{name:<22} {rel(g_aether, g_torch):>16.2e} {np.abs(g_torch).max():>12.2e}{note}"
              f"  ({by_param[id(t)]})")

    final = read_safetensors(d / "final.safetensors")
    worst_w = max((rel_norm(to_torch(final[name]), t.detach().numpy()), name)
                  for name, t, to_torch in mapping(model, final) if name not in absorbed)
    print(f"after step {run['steps']}: largest ||aether - torch|| / ||torch|| of a saved tensor "
          f"(weights, BN running statistics; BN-absorbed biases left out) "
          f"{worst_w[0]:.2e} ({worst_w[1]})")

    if args.f16_sim:
        _, l16, _, _ = replay(run, data, *VARIANTS["mirror (aether's recipe)"], args.device, f16=True)
        print("torch with aether's GPU f16 roundings simulated (conv/dense inputs, kernels and "
              "output gradients; no loss scaling):")
        for s in (1, 10, run["steps"]):
            if s <= len(l16):
                print(f"  step {s:>3}: {l16[s - 1]:.6f}  |aether - sim| / sim "
                      f"{abs(ours[s - 1] - l16[s - 1]) / l16[s - 1]:.2e}  "
                      f"|sim - f64| / f64 {abs(l16[s - 1] - l64[s - 1]) / l64[s - 1]:.2e}")
    if not args.variants:
        return 0 if first_bad is None else 1
    print(f"\nOne recipe detail at a time (same batches; loss at steps 1/10/{run['steps']}, "
          f"eval loss/accuracy after; rel = |variant - mirror| / mirror at step {run['steps']}):")
    base = None
    for name, spec in VARIANTS.items():
        if spec[2] == "torch" and not run["dropout"]:
            continue
        _, l, _, (el, ea) = replay(run, data, *spec, args.device)
        base = base or l
        at = [l[i - 1] for i in (1, 10, run["steps"]) if i <= len(l)]
        print(f"  {name:<28} " + " ".join(f"{v:.4f}" for v in at)
              + f"   eval {el:.4f}/{ea:.3f}   rel {abs(l[-1] - base[-1]) / base[-1]:.2e}")
    return 0 if first_bad is None else 1


if __name__ == "__main__":
    sys.exit(main())

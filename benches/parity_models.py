#!/usr/bin/env python3
"""Step-by-step parity of aether's ResNet-18 and airbench94 with their PyTorch
twins (issue 35): the same initial weights (PyTorch's, imported into aether
through `aether::import::load_pytorch_state_dict`), the same batches, the
same recipe (AdamW as aether computes it), on the CPU.

    python3 benches/parity_models.py make DIR --model resnet18|airbench94 [--batch 8] [--batches 4] [--steps 50] [--lr 1e-3]
    cargo run --release --example parity_models -- DIR [--device cpu|gpu]
    python3 benches/parity_models.py compare DIR [--tolerance 3e-3]

`make` builds the twin (benches/pytorch_models.py; airbench94's convs
dirac-initialised as airbench does, its BatchNorm scales frozen at 1 and left
out of the state_dict as aether has none), writes its state_dict
(`initial.safetensors`), fixed N(0, 1) batches (`x.f32`, NHWC, and `y.u32`)
and `run.json`, then replays the steps in float64 and float32 and stores the
losses and step 1's gradients of both (`reference.json`,
`grads64.safetensors`, PyTorch names and layouts). `parity_models` trains
aether on the same files and writes `aether.json` and `aether_grads.safetensors`.
`compare` prints the losses at steps 1, 10 and 50 beside the float64 replay,
the first step past --tolerance, and step 1's per-tensor gradient error.

The optimizer is the mirror of aether's AdamW (benches/parity_pytorch.py's
`AdamW`: Keras-form epsilon 1e-7, BatchNorm parameters not decayed), so a
difference is the network's, not a recipe choice. Needs torch and numpy;
nothing in `cargo test` imports this file.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from parity_pytorch import AdamW, read_safetensors  # noqa: E402
from pytorch_models import ResNet18, airbench94  # noqa: E402

# model -> label smoothing (the zoo's / airbench's).
SMOOTHING = {"resnet18": 0.05, "airbench94": 0.2}


def twin(name):
    if name == "resnet18":
        return ResNet18(10)
    model = airbench94()
    # airbench's Conv: PyTorch's default init, then the leading filters as the identity.
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Conv2d) and m.bias is None:
                w = m.weight
                nn.init.dirac_(w[:w.size(1)])
    return model


def frozen(model, name):
    """state_dict entries aether has no tensor for (airbench94's BatchNorm scales, fixed at 1)."""
    if name != "airbench94":
        return set()
    return {f"{k}.weight" for k, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}


def write_safetensors(path, tensors):
    """{name: np.ndarray} as an f32 (or f64) safetensors file."""
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dtype = {np.float32: "F32", np.float64: "F64"}[a.dtype.type]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_any(path):
    """Like parity_pytorch.read_safetensors, F64 too."""
    raw = Path(path).read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    data, out = raw[8 + size:], {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": "<f4", "F64": "<f8"}[info["dtype"]]
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=dt).reshape(info["shape"]).copy()
    return out


def batches(run, d, dtype):
    n, side = run["batch"] * run["batches"], run["side"]
    x = np.fromfile(d / "x.f32", dtype="<f4").reshape(n, side, side, 3)
    y = np.fromfile(d / "y.u32", dtype="<u4").astype(np.int64)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).to(dtype).contiguous()
    b = run["batch"]
    return [(x[i * b:(i + 1) * b], torch.from_numpy(y[i * b:(i + 1) * b])) for i in range(run["batches"])]


def replay(run, d, dtype, steps=None):
    """The run's steps (or the first `steps`) in `dtype` from initial.safetensors:
    losses, step 1's gradients by name."""
    model = twin(run["model"])
    state = {k: torch.from_numpy(v) for k, v in read_safetensors(d / "initial.safetensors").items()}
    missing = model.load_state_dict(state, strict=False).missing_keys
    assert set(missing) <= frozen(model, run["model"]) | {k for k in missing if k.endswith("num_batches_tracked")}, missing
    model = model.to(dtype).train()
    bn = {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = AdamW([p for p in trainable if id(p) not in bn], [p for p in trainable if id(p) in bn],
                lr=run["lr"], wd=run["weight_decay"])
    loss_fn = nn.CrossEntropyLoss(label_smoothing=run["label_smoothing"])
    data = batches(run, d, dtype)
    losses, grads = [], {}
    for step in range(steps or run["steps"]):
        xb, yb = data[step % len(data)]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if step == 0:
            grads = {k: p.grad.detach().double().numpy().copy() for k, p in model.named_parameters()
                     if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def make(args):
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = twin(args.model)
    skip = frozen(model, args.model)
    write_safetensors(d / "initial.safetensors",
                      {k: v.numpy() for k, v in model.state_dict().items()
                       if k not in skip and not k.endswith("num_batches_tracked")})
    g = torch.Generator().manual_seed(args.seed + 1)
    n = args.batch * args.batches
    x = torch.randn(n, 32, 32, 3, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x.numpy().astype("<f4").tofile(d / "x.f32")
    y.numpy().astype("<u4").tofile(d / "y.u32")
    run = {"model": args.model, "seed": args.seed, "batch": args.batch, "batches": args.batches,
           "steps": args.steps, "side": 32, "lr": args.lr, "weight_decay": 0.01,
           "label_smoothing": SMOOTHING[args.model]}
    (d / "run.json").write_text(json.dumps(run, indent=1))
    l64, g64 = replay(run, d, torch.float64)
    l32, _ = replay(run, d, torch.float32)
    write_safetensors(d / "grads64.safetensors", g64)
    (d / "reference.json").write_text(json.dumps({"torch_f64": l64, "torch_f32": l32,
                                                  "torch": torch.__version__}, indent=1))
    print(f"{args.model}: torch f64 loss after steps 1/10/{args.steps}: "
          f"{l64[0]:.6f} {l64[min(9, len(l64) - 1)]:.6f} {l64[-1]:.6f}; wrote {d}")


def to_torch_layout(a, shape):
    """aether [R, S, I, O] -> [O, I, R, S]; [1, 1, I, O] -> [O, I]; else as is."""
    if len(shape) == 4:
        return a.reshape(shape[2], shape[3], shape[1], shape[0]).transpose(3, 2, 0, 1)
    if len(shape) == 2:
        return a.reshape(shape[1], shape[0]).T
    return a.reshape(shape)


def compare(args):
    d = Path(args.dir)
    run = json.loads((d / "run.json").read_text())
    ref = json.loads((d / "reference.json").read_text())
    ours = json.loads((d / "aether.json").read_text())
    l64, l32, la = ref["torch_f64"], ref["torch_f32"], ours["losses"]
    print(f"{run['model']}, batch {run['batch']}, {run['batches']} batches cycled, {run['steps']} steps, "
          f"AdamW lr {run['lr']} wd {run['weight_decay']}, label smoothing {run['label_smoothing']}; "
          f"aether on {ours['device']}, torch {ref['torch']} (CPU)")
    print(f"{'step':>4} {'aether':>11} {'torch f32':>11} {'torch f64':>11} {'aether/f64':>10} {'torch/f64':>10}")
    first_bad = None
    for s, (a, t, r) in enumerate(zip(la, l32, l64), 1):
        if first_bad is None and abs(a - r) / r > args.tolerance:
            first_bad = s
        if s in (1, 2, 5, 10, 20, 30, 40, 50) or s == len(la):
            print(f"{s:>4} {a:>11.6f} {t:>11.6f} {r:>11.6f} {abs(a - r) / r:>10.2e} {abs(t - r) / r:>10.2e}")
    worst = max(abs(a - r) / r for a, r in zip(la, l64))
    floor = max(abs(t - r) / r for t, r in zip(l32, l64))
    print(f"tolerance {args.tolerance:g} on |aether - torch f64| / torch f64: worst {worst:.2e}, "
          + (f"first step beyond it: {first_bad}" if first_bad else "no step beyond it")
          + f" (torch f32's own worst: {floor:.2e})")
    g64 = read_any(d / "grads64.safetensors")
    ga = read_any(d / "aether_grads.safetensors")
    print(f"step 1 loss: aether Model::gradients {ours['grad_loss']:.6f}, torch f64 {l64[0]:.6f}")
    # PyTorch's own float32 gradient beside aether's: the float32 floor.
    _, g32 = replay(run, d, torch.float32, steps=1)
    rows = []
    for aether_name, torch_name in ours["names"]:
        if torch_name not in g64:
            continue
        ref_g = g64[torch_name]
        got = to_torch_layout(ga[aether_name], ref_g.shape)
        scale = max(np.abs(ref_g).max(), 1e-30)
        rows.append((float(np.abs(got - ref_g).max() / scale), aether_name, torch_name,
                     float(np.abs(g32[torch_name] - ref_g).max() / scale), float(np.abs(ref_g).max())))
    rows.sort(reverse=True)
    print(f"step 1 gradients, {len(rows)} tensors: max|g - torch f64| / max|torch f64| per tensor, "
          f"aether and torch f32; worst 5 of aether's:")
    for err, a, t, e32, m in rows[:5]:
        print(f"  {t:<28} ({a:<18}) aether {err:.2e}  torch f32 {e32:.2e}   max|g| {m:.2e}")
    print(f"  worst over all tensors: aether {max(r[0] for r in rows):.2e}, "
          f"torch f32 {max(r[3] for r in rows):.2e}")
    return 0 if first_bad is None else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--model", choices=sorted(SMOOTHING), required=True)
    m.add_argument("--batch", type=int, default=8)
    m.add_argument("--batches", type=int, default=4)
    m.add_argument("--steps", type=int, default=50)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--lr", type=float, default=1e-3)
    c = sub.add_parser("compare")
    c.add_argument("dir")
    c.add_argument("--tolerance", type=float, default=3e-3)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    return make(args) or 0 if args.command == "make" else compare(args)


if __name__ == "__main__":
    sys.exit(main())

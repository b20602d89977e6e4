"""Reference trajectories of torch.optim.SGD for tests/sgd.rs.

Prints the Rust constants the test embeds: three parameters (sizes 5, 3 and
4) with fixed f32 initial values and four steps of fixed f32 gradients, run
through torch.optim.SGD in float64 with parameter groups: parameter 0 at the
base learning rate with weight decay, parameter 1 at 4x the learning rate with
weight decay, parameter 2 (a BatchNorm-like one) at the base rate without
decay. Three configurations: Nesterov, heavy-ball momentum, plain SGD.

    python3 benches/sgd_reference.py > /tmp/sgd_ref.rs

The test must not need torch, so it embeds what this prints.
"""

import torch

torch.manual_seed(35)
SIZES = [5, 3, 4]
STEPS = 4
LR = 0.1
CONFIGS = [
    ("NESTEROV", dict(momentum=0.9, nesterov=True, weight_decay=5e-3)),
    ("MOMENTUM", dict(momentum=0.8, nesterov=False, weight_decay=1e-2)),
    ("PLAIN", dict(momentum=0.0, nesterov=False, weight_decay=1e-2)),
]


def f32(t):
    return t.to(torch.float32).to(torch.float64)


init = [f32(torch.randn(n)) for n in SIZES]
grads = [[f32(torch.randn(n)) for n in SIZES] for _ in range(STEPS)]


def rust(name, rows):
    body = ",\n".join(
        "    &[" + ", ".join(f"{float(v)!r}" for v in row) + "]" for row in rows
    )
    return f"const {name}: [&[f64]; {len(rows)}] = [\n{body},\n];"


print(rust("INIT", init))
for s, g in enumerate(grads):
    print(rust(f"GRADS_{s}", g))
for name, cfg in CONFIGS:
    params = [p.clone().requires_grad_(True) for p in init]
    wd = cfg.pop("weight_decay")
    opt = torch.optim.SGD(
        [
            dict(params=[params[0]], weight_decay=wd),
            dict(params=[params[1]], weight_decay=wd, lr=4 * LR),
            dict(params=[params[2]], weight_decay=0.0),
        ],
        lr=LR,
        **cfg,
    )
    for g in grads:
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        opt.step()
    print(f"// {name}: lr {LR}, weight_decay {wd}, {cfg}")
    print(rust(f"WANT_{name}", [p.detach() for p in params]))

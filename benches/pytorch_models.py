#!/usr/bin/env python3
"""PyTorch's training-step time for the networks `cifar10_breakdown --model`
times in aether (v1, resnet18, airbench94), with the same optimizer (AdamW
lr 1e-3, weight decay 0.01, BatchNorm included as PyTorch does) and loss, so
one device run prints both sides.

    python3 benches/pytorch_models.py --model resnet18 [--batch-size 256] [--repeats 30] [--no-compile]

Variants, each ms/step as the median of --repeats synchronised steps and
pipelined (--repeats back to back, one synchronise):
- AMP fp16 channels_last eager, batch copied from the host each step;
- the whole AMP step in one CUDA graph, batch copied from pageable host memory
  into the static input each step, and with the batch already resident;
- torch.compile (default inductor mode) of the model, the whole compiled step
  (forward, backward, fused AdamW) captured in one CUDA graph, batch resident;
  its first step's compile time is printed.
"""

import argparse
import time

import torch
from torch import nn

# The v1 twin and the step timer are pytorch_reference.py's (same folder).
from pytorch_reference import timed_steps, v1_model


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """The CIFAR ResNet-18 of `aether::zoo::resnet18_cifar` (same module names)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, c_in = [], 64
        for i, width in enumerate([64, 128, 256, 512]):
            blocks = []
            for b in range(2):
                blocks.append(BasicBlock(c_in, width, 2 if i > 0 and b == 0 else 1))
                c_in = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(512, classes)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.linear(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


class Mul(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def airbench94():
    """`aether::zoo::airbench94_net`: airbench94's network (BatchNorm weights frozen)."""

    def norm(c):
        bn = nn.BatchNorm2d(c, eps=1e-12, momentum=0.4)
        bn.weight.requires_grad = False
        return bn

    def group(c_in, c_out):
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.MaxPool2d(2), norm(c_out), nn.GELU(),
                nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), norm(c_out), nn.GELU()]

    return nn.Sequential(nn.Conv2d(3, 24, 2, padding=0, bias=True), nn.GELU(), *group(24, 64), *group(64, 256),
                         *group(256, 256), nn.MaxPool2d(3), nn.Flatten(), nn.Linear(256, 10, bias=False), Mul(1 / 9))


MODELS = {"v1": (v1_model, 0.05), "resnet18": (ResNet18, 0.05), "airbench94": (airbench94, 0.2)}


def optimizer(model, capturable=False):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, capturable=capturable, foreach=True)


def captured(step):
    """`step` warmed up on a side stream, then captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    make, smoothing = MODELS[args.model]
    n = args.batch_size
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}")
    g = torch.Generator().manual_seed(1)
    x_host = torch.rand(n, 3, 32, 32, generator=g)
    y_host = torch.randint(0, 10, (n,), generator=g)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=smoothing)
    cl = torch.channels_last
    results = {}

    model = make().cuda().to(memory_format=cl)
    opt = optimizer(model)
    scaler = torch.amp.GradScaler()

    def eager():
        x, y = x_host.cuda().to(memory_format=cl), y_host.cuda()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    results["AMP eager (host batch)"] = timed_steps(eager, args.repeats)

    def graph_variant(net):
        opt = optimizer(net, capturable=True)
        static_x = torch.empty(n, 3, 32, 32, device="cuda").to(memory_format=cl)
        static_y = torch.empty(n, dtype=torch.long, device="cuda")
        static_x.copy_(x_host)
        static_y.copy_(y_host)

        def step():
            opt.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(net(static_x), static_y)
            loss.backward()
            opt.step()

        return captured(step), static_x, static_y

    graph, sx, sy = graph_variant(make().cuda().to(memory_format=cl))

    def pageable():
        sx.copy_(x_host.cuda(non_blocking=True))
        sy.copy_(y_host.cuda(non_blocking=True))
        graph.replay()

    results["AMP CUDA graph (host batch)"] = timed_steps(pageable, args.repeats)
    results["AMP CUDA graph (resident batch)"] = timed_steps(graph.replay, args.repeats)
    if not args.no_compile:
        start = time.perf_counter()
        compiled = torch.compile(make().cuda().to(memory_format=cl))
        graph, _, _ = graph_variant(compiled)
        torch.cuda.synchronize()
        print(f"torch.compile + capture took {time.perf_counter() - start:.1f} s")
        results["torch.compile + CUDA graph (resident batch)"] = timed_steps(graph.replay, args.repeats)
    for name, (ms, pipelined) in results.items():
        print(f"pytorch {args.model} batch {n} {name}: {ms:.3f} ms/step synchronised, {pipelined:.3f} pipelined")


if __name__ == "__main__":
    main()

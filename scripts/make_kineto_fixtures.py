#!/usr/bin/env python3
"""Makes the PyTorch profiler (Kineto) traces that torchpilot-analyze's tests read.

Run on the GPU machine (scripts/gpu_run.sh kineto), with the PyTorch wheel:
    python3 scripts/make_kineto_fixtures.py --out tests/fixtures/kineto

Each case is a small trainer with one planted bottleneck (or none), profiled for a few steps
with torch.profiler (CPU and CUDA activities, shapes and FLOPs recorded, one ProfilerStep per
step) and written gzip-compressed as <case>.json.gz. The same cases are the planted pairs of
bench/planted_pairs.cpp, at smaller sizes: the traces stay small enough to commit.
    healthy          a conv net on data already on the GPU, nothing to fix
    data_wait        a DataLoader whose single worker sleeps per sample: the step waits for data
    host_sync        host work and GPU work per step, then loss.item() every step
    pageable_copies  a large batch copied non_blocking from pageable memory every step
    launch_bound     a deep narrow MLP at batch 8: short kernels, gaps between launches
    fp32_matmul      large fp32 matmuls with TF32 off (FLOPs recorded: MFU)
    nccl_allreduce   gradients all-reduced by hand after backward with NCCL, world size 1
A manifest (manifest.json) records the machine, torch and CUDA versions and each case's step
time measured without the profiler.

--measure-fixes FILE: no traces; for each case with a fix (host_sync: no loss.item();
pageable_copies: the batch pinned; data_wait: 8 workers; fp32_matmul: bf16 autocast), the step
time of the case and of its fix without the profiler, interleaved rounds, medians, to FILE (JSON):
what the analyzer's estimates on the traces are checked against.
"""
import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

DEV = "cuda"


def cpu_work(us):
    end = time.perf_counter() + us / 1e6
    x = 0.0
    while time.perf_counter() < end:
        x += 1.0
    return x


class ConvNet(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.c1 = nn.Conv2d(3, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width, 3, padding=1)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(x.mean(dim=(2, 3)))


class SleepyDataset(torch.utils.data.Dataset):
    def __init__(self, n, sleep_s):
        self.n, self.sleep_s = n, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return torch.randn(3, 32, 32), i % 10


def make_case(name, fixed=False):
    """Returns step_fn: step_fn(i) runs training step i (fixed: the case's fix applied)."""
    torch.manual_seed(0)
    if name in ("healthy", "host_sync", "data_wait"):
        model = ConvNet().to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 3, 32, 32, device=DEV)
        y = torch.randint(0, 10, (64,), device=DEV)

        def train(xb, yb, item):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            return loss.item() if item else loss

        if name == "healthy":
            return lambda i: train(x, y, False)
        if name == "host_sync":
            def step(i):
                cpu_work(2000)  # batch preparation on the host
                train(x, y, not fixed)
            return step
        loader = torch.utils.data.DataLoader(SleepyDataset(1_000_000, 0.0005), batch_size=64,
                                             num_workers=8 if fixed else 1, prefetch_factor=2)
        it = iter(loader)

        def step(i):
            xb, yb = next(it)
            train(xb.to(DEV, non_blocking=True), yb.to(DEV, non_blocking=True), False)
        return step
    if name == "pageable_copies":
        model = ConvNet(32).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        host = torch.randn(256, 3, 64, 64)  # pageable
        if fixed:
            host = host.pin_memory()
        y = torch.randint(0, 10, (256,), device=DEV)

        def step(i):
            xb = host.to(DEV, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), y).backward()
            opt.step()
        return step
    if name == "launch_bound":
        layers = []
        for _ in range(12):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(64, 10)).to(DEV)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        x = torch.randn(8, 64, device=DEV)
        y = torch.randint(0, 10, (8,), device=DEV)

        def step(i):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step
    if name == "fp32_matmul":
        torch.backends.cuda.matmul.allow_tf32 = False
        model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(2048, 4096, device=DEV)

        def step(i):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fixed):
                y = model(x)
            y.float().pow(2).mean().backward()
            opt.step()
        return step
    if name == "nccl_allreduce":
        import torch.distributed as dist
        store_dir = tempfile.mkdtemp()
        if not dist.is_initialized():
            dist.init_process_group("nccl", init_method="file://" + os.path.join(store_dir, "store"),
                                    rank=0, world_size=1)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(512, 1024, device=DEV)

        def step(i):
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            for p in model.parameters():  # by hand, after backward: no overlap
                dist.all_reduce(p.grad)
            opt.step()
        return step
    raise ValueError(name)


CASES = ["healthy", "data_wait", "host_sync", "pageable_copies", "launch_bound", "fp32_matmul",
         "nccl_allreduce"]


def step_time_ms(step, n=20):
    for i in range(5):
        step(i)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / n


FIXES = ["host_sync", "pageable_copies", "data_wait", "fp32_matmul"]


def measure_fixes(path, rounds=5, n=100):
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "date": time.strftime("%Y-%m-%d"), "rounds": rounds, "steps": n, "cases": {}}
    for name in FIXES:
        steps = {False: make_case(name, False), True: make_case(name, True)}
        times = {False: [], True: []}
        for r in range(rounds):
            for fixed in ((False, True) if r % 2 == 0 else (True, False)):
                times[fixed].append(step_time_ms(steps[fixed], n))
        bad, fix = sorted(times[False])[rounds // 2], sorted(times[True])[rounds // 2]
        out["cases"][name] = {"step_ms": round(bad, 4), "fixed_step_ms": round(fix, 4),
                              "measured_gain": round(bad / fix - 1, 4),
                              "runs_ms": [times[False], times[True]]}
        print(f"{name}: {bad:.3f} ms -> {fix:.3f} ms fixed, measured {bad / fix - 1:+.1%}",
              flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/kineto")
    ap.add_argument("--cases", nargs="*", default=CASES)
    ap.add_argument("--active", type=int, default=5, help="profiled steps per trace")
    ap.add_argument("--measure-fixes", metavar="FILE", help="measure each case against its fix")
    args = ap.parse_args()
    if args.measure_fixes:
        measure_fixes(args.measure_fixes)
        return
    os.makedirs(args.out, exist_ok=True)
    manifest = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
                "script": "scripts/make_kineto_fixtures.py", "cases": {}}
    for name in args.cases:
        step = make_case(name)
        plain_ms = step_time_ms(step)
        tmp = os.path.join(tempfile.mkdtemp(), name + ".json")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=1, warmup=2, active=args.active),
                     record_shapes=True, with_flops=True,
                     on_trace_ready=lambda p: p.export_chrome_trace(tmp)) as prof:
            for i in range(1 + 2 + args.active):
                step(i)
                prof.step()
        torch.cuda.synchronize()
        dst = os.path.join(args.out, name + ".json.gz")
        with open(tmp, "rb") as f, gzip.open(dst, "wb", compresslevel=9) as g:
            shutil.copyfileobj(f, g)
        manifest["cases"][name] = {"file": name + ".json.gz", "steps": args.active,
                                   "step_ms_unprofiled": round(plain_ms, 4),
                                   "bytes": os.path.getsize(dst)}
        print(f"{name}: {plain_ms:.3f} ms/step unprofiled, {os.path.getsize(dst)} bytes", flush=True)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


if __name__ == "__main__":
    main()

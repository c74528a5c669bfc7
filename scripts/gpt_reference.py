#!/usr/bin/env python3
"""The GPT example's model in Python PyTorch, for the MFU comparison on the same GPU.

Same architecture as examples/gpt (pre-LayerNorm blocks, fused QKV, GELU MLP 4x, learned
positions, untied LM head, vocab 256, no dropout), bf16 autocast, scaled_dot_product_attention,
AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1). MFU uses the same analytic FLOPs as
examples/gpt/gpt_flops.h: 6*N*B*T + 12*B*L*T^2*d with N = 12*L*d^2 + V*d.
Runs AdamW per-parameter (foreach=False, what LibTorch's C++ AdamW does) and multi-tensor
(foreach=True, PyTorch's default on CUDA); --optimizers picks among these and fused (fused=True,
the kernel the C++ example runs by default). Prints one JSON object.
"""
import argparse, json, statistics, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, d, layers, heads, seq, vocab=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


OPTIMIZERS = {"per_parameter": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}


def run(args, optimizer):
    torch.manual_seed(0)
    model = GPT(args.d_model, args.layers, args.heads, args.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **OPTIMIZERS[optimizer])
    data = torch.randint(0, 256, (args.batch, args.seq + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.view(-1, 256), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    # The same steps back to back, the host running ahead as a trainer does: wall time per step.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / args.steps
    if args.profile_dir:
        profile(args, optimizer, step)
    return statistics.median(times), wall


def profile(args, optimizer, step, steps=10):
    """CUDA kernels of `steps` back-to-back steps (torch.profiler, CUDA activities only): a
    Chrome trace and a table of kernel time by name, to set beside a torchpilot window's."""
    import os
    from torch.profiler import ProfilerActivity, profile as torch_profile
    os.makedirs(args.profile_dir, exist_ok=True)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(args.profile_dir, f"python-{optimizer}.trace.json"))
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, {"count": 0, "us": 0.0})
            k["count"] += 1
            k["us"] += e.time_range.elapsed_us()
    with open(os.path.join(args.profile_dir, f"python-{optimizer}.kernels.json"), "w") as f:
        json.dump({"steps": steps, "kernels": kernels}, f, indent=0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=989.0)  # H100/H200 SXM bf16 dense
    p.add_argument("--optimizers", default="per_parameter,foreach",
                   help="comma-separated: " + ", ".join(OPTIMIZERS))
    p.add_argument("--profile-dir", help="also profile 10 steps per optimizer (torch.profiler)")
    p.add_argument("--out")
    a = p.parse_args()
    chosen = a.optimizers.split(",")
    for o in chosen:
        if o not in OPTIMIZERS:
            p.error(f"--optimizers: unknown {o!r} (known: {', '.join(OPTIMIZERS)})")
    d, L, B, T, V = a.d_model, a.layers, a.batch, a.seq, 256
    flops = 6 * (12 * L * d * d + V * d) * B * T + 12 * B * L * T * T * d
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "config": {"d_model": d, "layers": L, "heads": a.heads, "seq": T, "batch": B,
                      "precision": "bf16 autocast", "attention": "sdpa"},
           "analytic_flops_per_step": flops, "peak_tflops": a.peak_tflops}
    for o in chosen:
        s, wall = run(a, o)
        res["adamw_" + o] = {"median_step_ms": s * 1e3, "mfu": flops / s / (a.peak_tflops * 1e12),
                             "wall_step_ms": wall * 1e3,
                             "wall_mfu": flops / wall / (a.peak_tflops * 1e12)}
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

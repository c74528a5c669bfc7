#!/usr/bin/env python3
"""Writes a synthetic PyTorch profiler (Kineto) trace of many steps, for torchpilot-analyze's
speed on long traces (tests/analyze_test.sh, docs/analyze.md "Limits").

    python3 scripts/make_long_kineto_trace.py --steps 20000 --out long.json [--kernels 16]

Each 1 ms step on one training thread: a loader wait, an optimizer phase, a linear layer's
aten ops with recorded shapes, --kernels kernel launches on stream 7, and an aten::item (a
device-to-host copy and a stream synchronize), as torch.profiler writes them. About 11 kB of
JSON per step at 16 kernels.
"""
import argparse
import json


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--kernels", type=int, default=16, help="kernels per step")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    base = 4675962146048.0  # µs, like Kineto's steady-clock timestamps
    corr = 1
    with open(a.out, "w") as f:
        f.write('{"schemaVersion": 1, "record_shapes": 1, "deviceProperties": '
                '[{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],\n'
                '"traceEvents": [\n')
        first = True

        def ev(cat, name, ts, dur, tid=100, args=None):
            nonlocal first
            e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,
                 "ts": round(ts, 3), "dur": round(dur, 3)}
            if args is not None:
                e["args"] = args
            f.write(("" if first else ",\n") + json.dumps(e))
            first = False

        for s in range(a.steps):
            t = base + s * 1000.0
            ev("user_annotation", f"ProfilerStep#{s}", t, 1000)
            ev("user_annotation",
               "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 1, 40)
            ev("cpu_op", "aten::linear", t + 50, 400)
            ev("cpu_op", "aten::mm", t + 60, 380,
               args={"Input Dims": [[64, 512], [512, 512]], "Input type": ["float", "float"]})
            for k in range(a.kernels):
                launch = t + 70 + k * 20
                ev("cuda_runtime", "cudaLaunchKernel", launch, 8, args={"correlation": corr})
                ev("kernel", "void at::native::vectorized_elementwise_kernel<4>", launch + 10,
                   15, tid=7, args={"correlation": corr, "stream": 7, "grid": [132, 1, 1],
                                    "block": [128, 1, 1]})
                corr += 1
            ev("user_annotation", "Optimizer.step#SGD.step", t + 500, 150)
            ev("cpu_op", "aten::item", t + 700, 100)
            ev("cuda_runtime", "cudaMemcpyAsync", t + 710, 60, args={"correlation": corr})
            ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 760, 5, tid=7,
               args={"correlation": corr, "stream": 7, "bytes": 4})
            corr += 1
            ev("cuda_runtime", "cudaStreamSynchronize", t + 775, 10,
               args={"correlation": corr})
            corr += 1
        f.write("\n]}\n")


if __name__ == "__main__":
    main()

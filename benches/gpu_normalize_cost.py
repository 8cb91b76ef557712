"""What a batch that crosses the bus as uint8 costs the training stream on the GPU: stoker's
`Normalizer` (an exact table gather: int32 index, add, index_select) on a uint8 batch, against
the training step it feeds. A step's ceiling (`gpu_train_step.py --model`) reuses one float
batch, so this is the difference between the ceiling and a fed run with GPU idle near zero.

    python3 benches/gpu_normalize_cost.py --batch-size 256      # needs a GPU and PyTorch
"""
import argparse
import json

import torch
from stoker._gpu import Normalizer

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cuda_ms(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    n = args.batch_size
    out = {"gpu": torch.cuda.get_device_name(0), "batch_size": n}
    for layout, shape in (("NCHW", (n, 3, 224, 224)), ("NHWC", (n, 224, 224, 3))):
        x = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")
        for dtype in ("float32", "bfloat16"):
            norm = Normalizer(IMAGENET_MEAN, IMAGENET_STD, dtype, layout == "NHWC")
            out[f"normalize_{layout}_{dtype}_ms"] = cuda_ms(lambda norm=norm, x=x: norm(x))
    f = torch.randn(n, 3, 224, 224, device="cuda")
    out["float_to_channels_last_ms"] = cuda_ms(lambda: f.contiguous(memory_format=torch.channels_last))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

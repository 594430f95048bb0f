"""GPU load for the measurement: bf16 8192^3 matmuls for N seconds (torch from the image)."""
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, n = time.time() + seconds, 0
t0 = time.time()
while time.time() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    n += 10
dt = time.time() - t0
print(f"load: {n} matmuls in {dt:.1f}s = {n * 2 * 8192**3 / dt / 1e12:.0f} TFLOP/s")

"""Fault the GPU on purpose: a kernel writes to an unmapped device address (expect XID 31, MMU fault)."""
import cupy as cp

kernel = cp.RawKernel(r'''
extern "C" __global__ void poke(int *p) { *(volatile int *)(0x7f0000000000ULL) = 1; }
''', "poke")
try:
    kernel((1,), (1,), (cp.zeros(1, dtype=cp.int32),))
    cp.cuda.runtime.deviceSynchronize()
    print("xid: kernel finished without a fault")
except Exception as exc:  # cudaErrorIllegalAddress is what we want
    print(f"xid: kernel fault as intended: {type(exc).__name__}: {exc}")

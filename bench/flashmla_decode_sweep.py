#!/usr/bin/env python3
"""FlashMLA's fp8 sparse decode at the batch sizes of `sparse_mla_kernel_bench --decode-sweep`, with
anchors_bench.py's own workload definition (imported from .anchors/, so the work is the same as the anchors'):

  PYTHONPATH=<anchor wheels> python3 bench/flashmla_decode_sweep.py

One line per shape: `flashmla decode H128 B80 <us> us`. The batches below must match the harness's list."""
import importlib.util

spec = importlib.util.spec_from_file_location("ab", ".anchors/anchors_bench.py")
ab = importlib.util.module_from_spec(spec); spec.loader.exec_module(ab)
SWEEP = {128: [1, 16, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160, 192],
         64: [1, 4, 8, 16, 20, 24, 32, 40, 48, 64, 96, 112, 128, 144, 160, 192, 256]}
for H, batches in SWEEP.items():
    for B in batches:
        us, tflops = ab.flashmla_decode(B, H)
        print(f"flashmla decode H{H} B{B} {us:.1f} us {tflops:.0f} TFLOP/s", flush=True)

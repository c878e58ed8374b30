#!/usr/bin/env python3
"""Where a CPU training step's time goes, layer by layer, from a perf profile with call chains:
each sample goes to the first function of its chain, from the leaf up, that names a layer
(the layers' OpenMP regions, `*._omp_fn.N`, carry their function's name, so samples on the
worker threads are counted too); model setup (allocation, initialisation) and page faults
(the first touch of fresh memory, in the warm-up step) are left out.

  perf record -F 999 --call-graph dwarf -o perf.data build/bench_sizes --size d,L,T --mode M \
      --no-rates
  perf script -i perf.data | dev/bench/perf_layers.py          (docs/sizes.md)
"""
import re
import sys

# (what, the pattern of a function name), the first that matches a frame wins
LAYERS = [
    ("setup (not the step)", r"^(model_init_params|model_build|model_free|rng_|bench_batch)"),
    # the first touch of fresh memory (the warm-up step's, of AdamW's moments and the
    # gradients above all): later steps reuse every buffer and take no page faults
    ("setup (not the step)", r"^(asm_exc_page_fault|exc_page_fault)$"),
    ("matmuls (linear)", r"^(linear_|matmul\b|matmul_|pack_panels)"),
    ("causal attention", r"^attention_"),
    ("depth attention (AttnRes)", r"^(depth_|attnres_)"),
    ("AdamW", r"^(adamw_|model_update)"),
    ("zeroing the gradients", r"^(host_zero|model_zero_grad)"),
    ("RMSNorm", r"^rmsnorm_"),
    ("SwiGLU", r"^swiglu_"),
    ("RoPE", r"^rope_"),
    ("embedding, loss", r"^(embedding_|crossentropy_)"),
]
PATTERNS = [(name, re.compile(p)) for name, p in LAYERS]


def classify(frames):
    for frame in frames:  # leaf first
        for name, pattern in PATTERNS:
            if pattern.search(frame):
                return name
    return "other (residual adds, copies, the model's glue)"


def main():
    counts, frames = {}, []
    for line in list(sys.stdin) + [""]:
        if line.strip() == "":  # a sample ends
            if frames:
                what = classify(frames)
                counts[what] = counts.get(what, 0) + 1
            frames = []
        elif line.startswith((" ", "\t")):  # a frame: address, symbol+offset, (dso)
            parts = line.split()
            if len(parts) >= 2:
                frames.append(parts[1].split("+")[0])
    step = {k: v for k, v in counts.items() if not k.startswith("setup")}
    total = sum(step.values())
    if total == 0:
        sys.exit("error: no samples of a training step in the input (perf script output with "
                 "call chains)")
    print(f"{total} samples of the step ({counts.get('setup (not the step)', 0)} of setup left out)")
    for what, n in sorted(step.items(), key=lambda kv: -kv[1]):
        print(f"  {100.0 * n / total:5.1f}%  {what}")


if __name__ == "__main__":
    main()

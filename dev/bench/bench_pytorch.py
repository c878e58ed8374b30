#!/usr/bin/python3
"""PyTorch eager (float32, CPU or --device cuda) counterpart of dev/bench/bench.c: ms/step and tokens/s of one full
training step (forward, backward, AdamW) per residual mode, on the same fixed config
(d=256 L=8 H=8 G=4 F=704 V=256, B=8 T=128), median of --steps steps after 2 warm-up steps.

  /usr/bin/python3 dev/bench/bench_pytorch.py [--steps N] [--threads N] [--device cpu|cuda]

Note: Debian's python3-torch does its matmuls in whatever libblas.so.3 the system resolves;
with only libblas3 installed that is netlib's unoptimised reference BLAS (~2 GFLOP/s here),
which dominates the time. To time torch with OpenBLAS without installing it system-wide:
  apt-get download libopenblas0-pthread && dpkg-deb -x libopenblas0-pthread_*.deb /tmp/obl
  LD_LIBRARY_PATH=/tmp/obl/usr/lib/x86_64-linux-gnu/openblas-pthread /usr/bin/python3 ...
The BLAS in use is printed in the header.

The model is dev/check/reference.py's forward (RMSNorm, GQA attention with interleaved RoPE, SwiGLU,
depth attention via stack + softmax over sources), run in float32. Two deliberate differences
from reference.py, neither changing the math:
  * rope: reference.py builds its cos/sin tables in float64 on every call (which would promote
    the whole model to float64); here they are computed once per (T, hs) in float64 and rounded
    to float32, as src/rope.c does.
  * parameters: per-layer weights are separate leaf tensors (a Python list indexed by layer, as
    an nn.Module would hold them) rather than one stacked (L, ...) tensor, so backward does not
    scatter each layer's gradient into a full-size zero tensor. reference.forward only ever
    indexes p[name][layer], so it runs unchanged on this layout.
Optimiser: torch.optim.AdamW(lr=1e-4, betas=(0.9, 0.95), eps=1e-8), weight decay 0.1 on the
matrices (SPEC's decayed set) and 0 on gains and pseudo-queries, as model_update does.
"""
import argparse, math, os, sys, time

if __name__ == "__main__":  # OpenBLAS reads its thread count when torch loads it
    _t = next((sys.argv[i + 1] for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--threads"),
              "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", _t)
try:
    import torch  # noqa: E402
except ImportError:  # --device cuda: a skip (exit 3), as for a torch without CUDA
    if "--device=cuda" in sys.argv or any(a == "--device" and b == "cuda"
                                          for a, b in zip(sys.argv, sys.argv[1:])):
        print(f"bench_pytorch: skipped: {sys.executable} cannot import torch")
        sys.exit(3)
    sys.exit(f"error: {sys.executable} cannot import torch (Debian: apt-get install "
             "python3-torch, then run it with /usr/bin/python3)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "check"))
import reference  # noqa: E402

_rope_cache = {}


def rope_f32(x, base):
    """reference.rope with cos/sin cached and in x's dtype (angles in float64, rounded once)."""
    T, hs = x.shape[1], x.shape[3]
    key = (T, hs, base, x.dtype)
    if key not in _rope_cache:
        t = torch.arange(T, dtype=torch.float64)
        j = torch.arange(hs // 2, dtype=torch.float64)
        theta = t[:, None] * base ** (-2 * j / hs)
        _rope_cache[key] = (torch.cos(theta)[None, :, None, :].to(x.dtype),
                            torch.sin(theta)[None, :, None, :].to(x.dtype))
    cos, sin = _rope_cache[key]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).reshape(x.shape)


reference.rope = rope_f32  # reference.attention looks rope up as a module global

STACKED = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "wg", "wu", "wd",
           "res_query", "res_norm"}


def time_mode(S, steps, B, T, device):
    c = reference.cfg(B=B, T=T, V=256, d=256, L=8, H=8, G=4, F=704, S=S)
    hp = dict(reference.DEFAULT_HP)
    p, decay, no_decay = {}, [], []
    if device == "cuda":
        torch.set_default_device("cpu")  # init_params draws from a CPU generator
    for name, t in reference.init_params(c, "spec", 1).items():
        t = t.float().to(device)
        ts = [r.clone().requires_grad_(True) for r in t] if name in STACKED \
            else t.clone().requires_grad_(True)
        p[name] = ts
        (decay if name in reference.DECAYED else no_decay).extend(
            ts if isinstance(ts, list) else [ts])
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.1),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (B, T), generator=g).to(device)
    y = torch.randint(0, 256, (B, T), generator=g).to(device)
    if device == "cuda":  # the tensors reference.forward makes (causal mask, rope tables)
        torch.set_default_device(device)
    ms = []
    for s in range(-2, steps):
        t0 = time.perf_counter()
        _, loss = reference.forward(p, x, y, c, hp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if s >= 0:
            ms.append(1000.0 * (time.perf_counter() - t0))
    assert math.isfinite(loss.item())
    return sorted(ms)[steps // 2]  # same (upper) median as bench.c


# FLOPs of one training step, counted as 3x the forward matmuls (forward + 2 backward):
#   6 * (matmul parameters) * B*T  +  3 * L * 2 * (2*B*H*T*T*hs) / 2   (QK^T and AV, causal half)
# matmul parameters = L*(d*H*hs + 2*d*G*hs + H*hs*d + 3*d*F) + V*d (lm_head; wte is a lookup).
# Depth attention, norms, softmax, RoPE and AdamW are not counted (elementwise, small).
def step_flops(B, T, V=256, d=256, L=8, H=8, G=4, F=704):
    hs = d // H
    n_mm = L * (d * H * hs + 2 * d * G * hs + H * hs * d + 3 * d * F) + V * d
    return 6 * n_mm * B * T + 3 * L * 2 * (2 * B * H * T * T * hs) / 2


def blas_library():
    """The BLAS shared library torch's matmuls go to (torch 1.13 Debian: BLAS_INFO=generic, i.e.
    whatever libblas.so.3 resolves to; netlib's reference BLAS is ~30x slower than OpenBLAS)."""
    try:
        libs = {ln.split()[-1] for ln in open("/proc/self/maps") if ln.split()[-1:] and
                any(k in ln.split()[-1] for k in ("blas", "mkl", "blis"))}
    except OSError:
        return "unknown"
    return ", ".join(sorted(os.path.realpath(p) for p in libs)) or "none found"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: on the GPU, float32 without TF32 (exits 3 if torch has no CUDA)")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("error: --steps must be positive")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_pytorch: skipped: this torch has no CUDA device")
            sys.exit(3)
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, as ours
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(a.threads)
    B, T = 8, 128
    flops = step_flops(B, T)
    print(f"bench_pytorch: torch {torch.__version__} eager float32 on {a.device}, d=256 L=8 H=8 G=4 F=704 "
          f"V=256 B={B} T={T}, {torch.get_num_threads()} threads, median of {a.steps} steps "
          f"({flops / 1e9:.2f} GFLOP/step counted)")
    if a.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, TF32 off")
    else:
        print(f"BLAS: {blas_library()}")
    base = 0.0
    for i, (name, S) in enumerate([("none", 0), ("full", 1), ("block S=4", 4)]):
        ms = time_mode(S, a.steps, B, T, a.device)
        if i == 0:
            base = ms
        line = f"{name:<10s} {ms:8.1f} ms/step {B * T / (ms / 1000.0):9.0f} tokens/s"
        line += f" {flops / (ms / 1000.0) / 1e9:6.1f} GFLOP/s"
        if i > 0:
            line += f"   overhead vs none {100.0 * (ms - base) / base:+6.1f}%"
        print(line, flush=True)


if __name__ == "__main__":
    main()

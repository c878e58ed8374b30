#!/usr/bin/python3
"""The strongest honest PyTorch baseline for attnres.c: the same model and training step
(forward, backward, AdamW), written as a PyTorch user would, timed in every way the installed
torch can run it; first checked against the reference state files that attnres.c passes.

  /usr/bin/python3 dev/bench/bench_pytorch.py [--device cpu|cuda] [--ways W,W,..]
      [--modes none,full,block] [--size d,L,T ...] [--steps N] [--rounds R] [--threads N]
      [--budget S] [--jobs N] [--logs DIR] [--check-only | --no-check]

The model (SPEC: RMSNorm pre-norm, GQA attention with interleaved RoPE, SwiGLU, and none /
full / block AttnRes) is an nn.Module: nn.Linear layers in an nn.ModuleList, RoPE's cos/sin
tables and the causal mask built once as buffers, F.scaled_dot_product_attention with
is_causal=True where torch has it (else the same product by hand), one depth-attention function
over the stacked sources (each source's inverse RMS computed once, the key norm's gain folded
into the query), and AdamW with lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay
0.1 on SPEC's decayed set (wte, the matrices, lm_head) and 0 on the gains and pseudo-queries,
as model_update does, in its fused form where torch has one (else foreach). float32, TF32 off.
On the GPU the step also clips the gradient norm to 1, as ./train_cuda's step does.

The ways (--ways, default every one this torch and device have): eager; torch.compile
default ("default"); mode="max-autotune-no-cudagraphs"; mode="reduce-overhead" (CUDA graphs,
GPU only); eager always runs: each compiled way's first-step loss must equal eager's on the
same parameters and batch (within 1e-5 relative) for its time to be printed. Each mode in
each way runs in its own process: --jobs of them (default: all on cuda, 1 on cpu) build,
compile and warm up (2 steps eager, 3 compiled: the compile, then CUDA graphs' record and
replay) at once, then time their --steps steps one at a time, nothing else running; each
process's output goes to a file in --logs.

The check first (every run, unless --no-check, for a caller that ran --check-only with the same
torch; --check-only: it alone): for each state file of tests/data whose
model is the default one in none, full or block mode (dev/check/reference.py wrote them in
float64 from SPEC; ./check_state proves the C code computes them), this model takes the file's
parameters and batch and must give, in float64, the file's loss, logits and every gradient and,
replaying the file's AdamW steps with the optimiser the bench uses, its losses after each step
(all within 1e-6 of each tensor's scale: the file stores float32 roundings), and in float32
the file's loss within 1e-5 (check_state's floor). Failing, it exits 1 before timing anything.

Sizes: --size d,L,T (default 256,8,128, the bench model: d=256 L=8 H=8 G=4 F=704 V=256); H=8,
G=4, F = 8d/3 rounded up to a multiple of 64, V=256 and B = 1024 / T (1024 tokens a step) at
every size up to T = 1024; past it (2048, 4096) B = 1. Each mode's line ends with its process's
peak resident memory (on the CPU: the model, its activations, AdamW, torch itself). Per size, mode and way: median ms/step of --steps steps (after warm-up steps; with
--rounds R > 1 the best of R such medians, the processes taking turns round after round),
tokens/s and GFLOP/s (the matmuls and attention products, as dev/bench/bench_sizes.c counts
them), then the best way per mode; and the matmul rate at that size, torch.mm (B*T x d)(d x F),
and each step's share of it (on the CPU also of its rate with its operands out of cache,
matmul_rate_cold). --budget S: a process not ready S seconds after the start is
stopped, and none starts after; one skip line each.

BLAS (CPU): Debian's python3-torch does its matmuls in whatever libblas.so.3 the system
resolves; with only libblas3 installed that is netlib's unoptimised reference BLAS (~2
GFLOP/s), about 30 times slower than OpenBLAS. Time torch with OpenBLAS's OpenMP build,
which runs in torch's own OpenMP threads; the pthread build (libopenblas0-pthread) keeps a
second pool of threads that spin against torch's, and on 2 cores made the step 2.6 times
slower (docs/speed.md). dev/bench/bench_sizes.sh runs it so (TORCH_BLAS=DIR for another).
By hand, without installing it system-wide:
  apt-get download libopenblas0-openmp && dpkg-deb -x libopenblas0-openmp_*.deb /tmp/oblomp
  LD_LIBRARY_PATH=/tmp/oblomp/usr/lib/x86_64-linux-gnu/openblas-openmp /usr/bin/python3 ...
The BLAS in use, and which build, is printed in the header; for OpenBLAS, then the core whose
kernels it runs ("BLAS core: SkylakeX"): Debian's 0.3.21 takes a CPU it does not know (Sapphire
Rapids) for a generic Prescott, without AVX2, unless OPENBLAS_CORETYPE names one
(dev/bench/bench_sizes.sh sets it so on such a CPU).
"""
import argparse, ctypes, glob, math, multiprocessing, multiprocessing.connection, os, resource, signal, struct, sys, \
    tempfile, time

if __name__ == "__main__":  # OpenBLAS reads its thread count when torch loads it
    _t = next((sys.argv[i + 1] for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--threads"),
              "2")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", _t)
try:
    import torch  # noqa: E402
    import torch.nn as nn  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError:  # --device cuda: a skip (exit 3), as for a torch without CUDA
    if "--device=cuda" in sys.argv or any(a == "--device" and b == "cuda"
                                          for a, b in zip(sys.argv, sys.argv[1:])):
        print(f"bench_pytorch: skipped: {sys.executable} cannot import torch")
        sys.exit(3)
    sys.exit(f"error: {sys.executable} cannot import torch (Debian: apt-get install "
             "python3-torch, then run it with /usr/bin/python3)")

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_COMPILE = hasattr(torch, "compile")
ALL_WAYS = ["eager", "default", "max-autotune-no-cudagraphs", "reduce-overhead"]
MODES = {"none": 0, "full": 1, "block": 4}  # block size S in sub-layers (full: S = 1)
MODE_NAMES = {"none": "none", "full": "full", "block": "block S=4"}
EPS, ROPE_BASE = 1e-6, 10000.0
EPS_F32 = struct.unpack("<f", struct.pack("<f", EPS))[0]  # the eps a state file stores
# the check: float64 against the state files' float32 roundings, and check_state's floor
TOL64, TOL32 = 1e-6, 1e-5
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data")


def config(d, L, T, S):
    """The sweep's model at width d, depth L, context T; mode S (0 none, 1 full, >= 2 block)."""
    return dict(V=256, d=d, L=L, H=8, G=4, F=-(-(-(-8 * d // 3)) // 64) * 64, S=S, B=max(1, 1024 // T), T=T)


def rms_norm(x, gain):
    """SPEC's RMSNorm over the last axis: gain * x / sqrt(mean(x^2) + eps)."""
    return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, cos, sin):
    """x (B, T, heads, hs): rotate each interleaved pair (2j, 2j+1) by t * base^(-2j/hs);
    cos, sin (T, hs/2)."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def inv_rms(x):
    """1 / sqrt(mean(x^2) + eps) over the last axis: (B, T, d) -> (B, T)."""
    return torch.rsqrt(x.pow(2).mean(-1) + EPS)


def depth_attention(sources, inv_rms_of, query, gain):
    """SPEC's depth attention over n sources (B, T, d) per position: weights softmax over i of
    query . rmsnorm(V_i; gain), out sum_i weight_i V_i. The score is V_i . (gain*query) times
    V_i's inverse rms (inv_rms_of, each source's once, shared by every sub-layer that reads
    it), so the normalised keys are never built."""
    V = torch.stack(sources)  # (n, B, T, d)
    scores = (V @ (gain * query)) * torch.stack(inv_rms_of)  # (n, B, T)
    weights = scores.softmax(dim=0)
    return (weights.unsqueeze(-1) * V).sum(0)


class Attention(nn.Module):
    def __init__(self, d, H, G):
        super().__init__()
        self.H, self.G, self.hs = H, G, d // H
        self.wq = nn.Linear(d, H * self.hs, bias=False)
        self.wk = nn.Linear(d, G * self.hs, bias=False)
        self.wv = nn.Linear(d, G * self.hs, bias=False)
        self.wo = nn.Linear(H * self.hs, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = rope(self.wq(x).view(B, T, self.H, self.hs), cos, sin).transpose(1, 2)  # (B,H,T,hs)
        k = rope(self.wk(x).view(B, T, self.G, self.hs), cos, sin).transpose(1, 2)  # (B,G,T,hs)
        v = self.wv(x).view(B, T, self.G, self.hs).transpose(1, 2)
        # query head h reads kv head h // (H/G); float32 attention kernels take equal head counts
        k = k.repeat_interleave(self.H // self.G, dim=1)
        v = v.repeat_interleave(self.H // self.G, dim=1)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: the same product by hand
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hs))
            y = scores.masked_fill(mask[:T, :T], float("-inf")).softmax(-1) @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.hs))


class MLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.wg = nn.Linear(d, hidden, bias=False)
        self.wu = nn.Linear(d, hidden, bias=False)
        self.wd = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.wd(F.silu(self.wg(x)) * self.wu(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(c["d"]))
        self.attn = Attention(c["d"], c["H"], c["G"])
        self.mlp_norm = nn.Parameter(torch.ones(c["d"]))
        self.mlp = MLP(c["d"], c["F"])


class Model(nn.Module):
    """SPEC's model; S = 0 the PreNorm residual, S = 1 full AttnRes, S >= 2 block AttnRes."""

    def __init__(self, c, max_T, dtype=torch.float32):
        super().__init__()
        V, d, L, S = c["V"], c["d"], c["L"], c["S"]
        self.L, self.S, self.V = L, S, V
        self.wte = nn.Embedding(V, d)
        self.layers = nn.ModuleList(Layer(c) for _ in range(L))
        if S > 0:  # one pseudo-query and key gain per depth attention: 2L sub-layers + output
            self.res_query = nn.Parameter(torch.zeros(2 * L + 1, d))
            self.res_norm = nn.Parameter(torch.ones(2 * L + 1, d))
        self.final_norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, V, bias=False)
        self.to(dtype)
        hs = d // c["H"]  # RoPE's angles t * base^(-2j/hs) in float64, rounded once (src/rope.c)
        theta = torch.arange(max_T, dtype=torch.float64)[:, None] * \
            ROPE_BASE ** (-2 * torch.arange(hs // 2, dtype=torch.float64) / hs)
        self.register_buffer("cos", torch.cos(theta).to(dtype), persistent=False)
        self.register_buffer("sin", torch.sin(theta).to(dtype), persistent=False)
        self.register_buffer("mask", torch.ones(max_T, max_T, dtype=torch.bool).triu(1),
                             persistent=False)

    def sublayer(self, l, h):
        layer, T = self.layers[l // 2], h.shape[1]
        if l % 2 == 0:
            return layer.attn(rms_norm(h, layer.attn_norm), self.cos[:T], self.sin[:T], self.mask)
        return layer.mlp(rms_norm(h, layer.mlp_norm))

    def forward(self, x, y):
        h = self.wte(x)
        if self.S == 0:
            for l in range(2 * self.L):
                h = h + self.sublayer(l, h)
        else:  # block AttnRes: sources are x0, the completed blocks and the partial sum
            blocks, blocks_inv_rms, partial = [h], [inv_rms(h)], None
            for l in range(2 * self.L):
                sources, inv = blocks, blocks_inv_rms
                if partial is not None:
                    sources, inv = blocks + [partial], blocks_inv_rms + [inv_rms(partial)]
                f = self.sublayer(l, depth_attention(sources, inv, self.res_query[l],
                                                     self.res_norm[l]))
                partial = f if partial is None else partial + f
                if l % self.S == self.S - 1:
                    blocks.append(partial)
                    blocks_inv_rms.append(inv_rms(partial))
                    partial = None
            h = depth_attention(blocks, blocks_inv_rms, self.res_query[2 * self.L],
                                self.res_norm[2 * self.L])
        logits = self.lm_head(rms_norm(h, self.final_norm))
        return F.cross_entropy(logits.view(-1, self.V), y.view(-1), ignore_index=-1), logits

    def canonical(self):
        """(SPEC name, its tensors) in SPEC's parameter order: one per layer for PER_LAYER's
        kinds, else the one tensor (res_query and res_norm hold every row)."""
        per_layer = [("attn_norm", lambda b: b.attn_norm), ("wq", lambda b: b.attn.wq.weight),
                     ("wk", lambda b: b.attn.wk.weight), ("wv", lambda b: b.attn.wv.weight),
                     ("wo", lambda b: b.attn.wo.weight), ("mlp_norm", lambda b: b.mlp_norm),
                     ("wg", lambda b: b.mlp.wg.weight), ("wu", lambda b: b.mlp.wu.weight),
                     ("wd", lambda b: b.mlp.wd.weight)]
        out = [("wte", [self.wte.weight])]
        out += [(name, [get(b) for b in self.layers]) for name, get in per_layer]
        if self.S > 0:
            out += [("res_query", [self.res_query]), ("res_norm", [self.res_norm])]
        return out + [("final_norm", [self.final_norm]), ("lm_head", [self.lm_head.weight])]


DECAYED = {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd", "lm_head"}  # SPEC's decayed set
PER_LAYER = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "wg", "wu", "wd"}  # one per layer


def init_spec(model, seed):
    """SPEC's init: matrices N(0, 0.02) (wo, wd: 0.02 / sqrt(2L)), gains 1, pseudo-queries 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensors in model.canonical():
            for t in tensors:
                if name in DECAYED:
                    std = 0.02 / math.sqrt(2 * model.L) if name in ("wo", "wd") else 0.02
                    t.copy_(torch.randn(t.shape, generator=g) * std)


def make_optimizer(model, lr, device, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    """AdamW, weight decay on SPEC's decayed set only, fused where torch has it on this device."""
    decay, no_decay = [], []
    for name, tensors in model.canonical():
        (decay if name in DECAYED else no_decay).extend(tensors)
    groups = [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]
    for fast in ("fused", "foreach"):
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **{fast: True}), fast
        except (TypeError, RuntimeError, ValueError):  # no such option, or not on this device
            continue
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps), "plain"


def train_step(model, opt, x, y, clip):
    """One training step; the loss comes back to the host (one read-back, as ours)."""
    loss, _ = model(x, y)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


# ---- the check against the reference state files ------------------------------------------
def read_state(path):
    """A state file of dev/check/reference.py with the default model in none/full/block mode:
    (config, hp, params {name: float64 tensor}, x, y, loss, logits, grads, AdamW losses), or
    None for any other model (variants, mHC-lite) or optimiser (Muon)."""
    buf = open(path, "rb").read()
    hdr = struct.unpack_from("<256i", buf, 0)
    fl = struct.unpack_from("<64f", buf, 1024)
    if any(hdr[13:21]):  # a variant, mHC-lite's streams or Muon
        return None
    B, T, V, d, L, H, G, Fh, S = hdr[2:11]
    K = hdr[12]
    c = dict(B=B, T=T, V=V, d=d, L=L, H=H, G=G, F=Fh, S=S)
    hs, n = d // H, 2 * L + 1
    shapes = [("wte", (V, d)), ("attn_norm", (L, d)), ("wq", (L, H * hs, d)),
              ("wk", (L, G * hs, d)), ("wv", (L, G * hs, d)), ("wo", (L, d, H * hs)),
              ("mlp_norm", (L, d)), ("wg", (L, Fh, d)), ("wu", (L, Fh, d)), ("wd", (L, d, Fh))]
    shapes += [("res_query", (n, d)), ("res_norm", (n, d))] if S > 0 else []
    shapes += [("final_norm", (d,)), ("lm_head", (V, d))]
    off = 1280

    def take(dtype, shape):
        nonlocal off
        count = math.prod(shape)
        t = torch.frombuffer(bytearray(buf[off:off + 4 * count]), dtype=dtype).reshape(shape)
        off += 4 * count
        return t.double() if dtype == torch.float32 else t.long()

    p = {name: take(torch.float32, s) for name, s in shapes}
    x, y = take(torch.int32, (B, T)), take(torch.int32, (B, T))
    logits, loss = take(torch.float32, (B, T, V)), take(torch.float32, (1,))[0]
    grads = {name: take(torch.float32, s) for name, s in shapes}
    losses = take(torch.float32, (K,))
    assert off == len(buf), f"{path}: size {len(buf)}, expected {off}"
    hp = dict(eps=fl[0], base=fl[1], lr=fl[2], beta1=fl[3], beta2=fl[4], adam_eps=fl[5], wd=fl[6])
    return c, hp, p, x, y, loss, logits, grads, losses


def load_params(model, p):
    """The state file's parameters p {SPEC name: tensor} into the model."""
    with torch.no_grad():
        for name, tensors in model.canonical():
            for i, t in enumerate(tensors):
                t.copy_(p[name][i] if name in PER_LAYER else p[name])


def relative(a, b):
    """max|a - b| over max|b| (the error on the tensor's own scale, as dev/check's rule)."""
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check_file(path, device):
    """The file's numbers recomputed by this model; returns (worst float64 error of loss,
    logits, gradients and AdamW losses; float32 loss error; K) or None (not a default model)."""
    state = read_state(path)
    if state is None:
        return None
    c, hp, p, x, y, loss, logits, grads, losses = state
    assert hp["eps"] == EPS_F32 and hp["base"] == ROPE_BASE, f"{path}: other eps or RoPE base"
    x, y = x.to(device), y.to(device)
    model = Model(c, c["T"], torch.float64).to(device)
    load_params(model, p)
    got_loss, got_logits = model(x, y)
    got_loss.backward()
    got_grads = {name: torch.stack([t.grad for t in ts]) if name in PER_LAYER else ts[0].grad
                 for name, ts in model.canonical()}
    worst = max([relative(got_loss.reshape(1).cpu(), loss.reshape(1)),
                 relative(got_logits.cpu(), logits)] +
                [relative(got_grads[name].reshape(g.shape).cpu(), g) for name, g in grads.items()])
    # the file's AdamW steps (no clipping), replayed with the bench's optimiser
    model = Model(c, c["T"], torch.float64).to(device)
    load_params(model, p)
    opt, _ = make_optimizer(model, hp["lr"], device, (hp["beta1"], hp["beta2"]), hp["adam_eps"],
                            hp["wd"])
    replayed = torch.tensor([train_step(model, opt, x, y, False) for _ in range(len(losses))],
                            dtype=torch.float64)
    if len(losses):
        worst = max(worst, relative(replayed, losses))
    model32 = Model(c, c["T"]).to(device)
    load_params(model32, p)
    with torch.no_grad():
        loss32 = model32(x, y)[0].item()
    return worst, abs(loss32 - loss.item()) / abs(loss.item()), len(losses)


def check_parity(device):
    """Every default-model state file; prints one line each; True when all pass."""
    files = sorted(glob.glob(os.path.join(DATA, "*.bin")))
    ok, n = True, 0
    for path in files:
        r = check_file(path, device)
        if r is None:
            continue
        n += 1
        worst64, err32, K = r
        good = worst64 <= TOL64 and err32 <= TOL32
        ok &= good
        print(f"check {os.path.basename(path):24s} float64: loss, logits, gradients, {K} AdamW "
              f"losses within {worst64:.1e} (tol {TOL64:g}); float32 loss within {err32:.1e} "
              f"(tol {TOL32:g}){'' if good else '  <-- FAIL'}")
    if n == 0:
        print(f"check: no default-model state file in {DATA}")
        return False
    print(f"check: {n} state files, {'all equal' if ok else 'FAILED'}", flush=True)
    return ok


# ---- the timing ----------------------------------------------------------------------------
# FLOPs of one training step, counted as 3x the forward matmuls (forward + 2 backward):
#   6 * (matmul parameters) * B*T  +  3 * L * 2 * (2*B*H*T*T*hs) / 2   (QK^T and AV, causal half)
# matmul parameters = L*(d*H*hs + 2*d*G*hs + H*hs*d + 3*d*F) + V*d (lm_head; wte is a lookup).
# Depth attention, norms, softmax, RoPE and AdamW are not counted (elementwise, small);
# step_flops in dev/bench/bench_sizes.c counts the same.
def step_flops(c):
    B, T, V, d, L, H, G, Fh = (c[k] for k in "B T V d L H G F".split())
    hs = d // H
    n_mm = L * (d * H * hs + 2 * d * G * hs + H * hs * d + 3 * d * Fh) + V * d
    return 6 * n_mm * B * T + 3 * L * 2 * (2 * B * H * T * T * hs) / 2


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(c, device, repeats=5):
    """GFLOP/s of torch.mm (B*T x d)(d x F), the MLP's product (bench.c times linear_forward's)."""
    a = torch.randn(c["B"] * c["T"], c["d"], device=device)
    b = torch.randn(c["d"], c["F"], device=device)
    best = math.inf
    for _ in range(repeats + 1):  # the first warms up
        sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * a.shape[0] * c["d"] * c["F"] / best * 1e-9


def matmul_rate_cold(c, repeats=5, pool_bytes=256 << 20):
    """The same torch.mm with its operands out of cache, as bench_sizes.c's matmul_rate_cold
    measures ours (CPU): sets of (a, b, out) of 256 MB together, multiplied in turn into
    their own outputs, best of the passes over them. Returns (GFLOP/s, sets)."""
    N, d, F = c["B"] * c["T"], c["d"], c["F"]
    sets = pool_bytes // (4 * (N * d + d * F + N * F)) + 1
    ops = [(torch.randn(N, d), torch.randn(d, F), torch.empty(N, F)) for _ in range(sets)]
    best = math.inf
    for _ in range(repeats + 1):  # the first pass warms up
        t0 = time.perf_counter()
        for a, b, out in ops:
            torch.mm(a, b, out=out)
        best = min(best, (time.perf_counter() - t0) / sets)
    return 2.0 * N * d * F / best * 1e-9, sets


def setup(device, threads):
    """float32 products as ours: no TF32 anywhere; torch's CPU threads."""
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(threads)


def worker(c, way, steps, device, threads, log, conn):
    """One mode in one way, in its own process: builds, compiles and warms up, sends ("ready",
    first-step loss, seconds taken), then for each "go" (the timing takes turns, nothing else
    running) times `steps` steps and sends ("done", median ms), until "stop". Its output goes
    to `log`."""
    try:  # Linux: killed with its parent (a timeout that stops the benchmark stops its compiles)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    try:
        setup(device, threads)
        t0 = time.perf_counter()
        torch.manual_seed(0)
        model = Model(c, c["T"]).to(device)
        init_spec(model, 1)
        opt, _ = make_optimizer(model, 1e-4, device)
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g).to(device)
        y = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g).to(device)
        run = model if way == "eager" else torch.compile(model, fullgraph=True, mode=way)

        def step():
            if way == "reduce-overhead":  # the last step's outputs may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            return train_step(run, opt, x, y, device == "cuda")

        first = step()  # compiles the forward and the backward; AdamW's state
        for _ in range(1 if way == "eager" else 2):  # the rest of the warm-up (CUDA graphs:
            step()                                    # record, then replay)
        conn.send(("ready", first, time.perf_counter() - t0))
        while conn.recv() == "go":
            ms = []
            for _ in range(steps):
                sync(device)
                t0 = time.perf_counter()
                loss = step()
                ms.append(1000.0 * (time.perf_counter() - t0))
            if not math.isfinite(loss):
                raise RuntimeError(f"loss {loss} is not finite")
            # the same (upper) median as bench.c, and the peak resident MiB (Linux: KiB)
            conn.send(("done", (sorted(ms)[steps // 2], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)))
    except Exception as e:
        print(f"{type(e).__name__}: {e}", flush=True)
        conn.send(("error", f"{type(e).__name__}: {str(e).strip()[:200]}"))


def blas_library():
    """The BLAS torch's matmuls go to, as "WHAT: PATHS": every BLAS library mapped into this
    process, and what the one torch's sgemm_ binds to is (blas_kind). That is a libblas*:
    torch 1.13 Debian (BLAS_INFO=generic) links libblas.so.3 before liblapack.so.3, whose
    OpenBLAS may be another."""
    try:
        libs = sorted({os.path.realpath(ln.split()[-1]) for ln in open("/proc/self/maps")
                       if ln.split()[-1:] and any(k in ln.split()[-1] for k in ("blas", "mkl", "blis"))})
    except OSError:
        return "unknown: /proc/self/maps unreadable"
    if not libs:
        return "unknown: no BLAS library mapped (one inside torch?)"
    return f"{blas_kind(min(libs, key=lambda p: not os.path.basename(p).startswith('libblas')))}: " \
           f"{', '.join(libs)}"


def blas_kind(path):
    """What the BLAS library at path is: OpenBLAS with its version and build (OpenMP, pthread or
    single-threaded, as openblas_get_parallel says), the reference BLAS (a libblas without
    OpenBLAS in it: netlib's, ~30x slower than OpenBLAS), MKL, BLIS or unknown."""
    name = os.path.basename(path)
    try:
        lib = ctypes.CDLL(path)  # dlsym searches its dependencies too: libblas.so.3 -> libopenblas
    except OSError:
        return "unknown"
    if hasattr(lib, "openblas_get_parallel"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        version = " ".join(lib.openblas_get_config().decode().split()[:2])  # "OpenBLAS 0.3.21"
        build = {0: "single-threaded", 1: "pthread", 2: "OpenMP"}.get(lib.openblas_get_parallel(), "unknown")
        return f"{version}, {build} build"
    if "mkl" in name or "blis" in name:
        return "MKL" if "mkl" in name else "BLIS"
    return "reference BLAS" if name.startswith("libblas") else "unknown"


def blas_core():
    """The kernels OpenBLAS chose for this CPU (openblas_get_corename: "Haswell", "SkylakeX",
    "Prescott" for a CPU it does not know, ...; OPENBLAS_CORETYPE chooses instead where set), of
    the OpenBLAS torch's matmuls go to; None for another BLAS."""
    try:
        libs = [os.path.realpath(ln.split()[-1]) for ln in open("/proc/self/maps")
                if ln.split()[-1:] and "blas" in ln.split()[-1]]
    except OSError:
        return None
    for path in sorted(set(libs), key=lambda p: not os.path.basename(p).startswith("libblas")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "openblas_get_corename"):
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
    return None


def log_tail(path, lines=3):
    try:
        return " | ".join(open(path).read().strip().splitlines()[-lines:])[:400]
    except OSError:
        return ""


def of_cold(gflops, cold_rate):
    """', X% of it out of cache' where the out-of-cache rate was measured (the CPU)"""
    return "" if cold_rate is None else f", {100.0 * gflops / cold_rate:.1f}% of it out of cache"


def bench_size(d, L, T, a, ways, deadline):
    """Times every mode in every way at one size: a worker process per (mode, way), a.jobs of
    them compiling at once; once they are ready (or the budget is spent: the late ones are
    stopped, a skip line each) they time their steps one at a time. One line per mode and
    way, each compiled way's first-step loss checked against eager's, then each mode's best."""
    c0 = config(d, L, T, 0)
    flops = {m: step_flops(config(d, L, T, S)) for m, S in MODES.items()}
    rate = matmul_rate(c0, a.device)
    cold, cold_rate = "", None
    if a.device == "cpu":
        cold_rate, sets = matmul_rate_cold(c0)
        cold = f", {cold_rate:.1f} with its operands out of cache ({sets} sets in turn)"
    print(f"size d={d} L={L} T={T}: H={c0['H']} G={c0['G']} F={c0['F']} V={c0['V']} "
          f"B={c0['B']}, {flops['none'] / 1e9:.2f} GFLOP/step counted; torch.mm "
          f"({c0['B'] * c0['T']} x {d})({d} x {c0['F']}): {rate:.1f} GFLOP/s{cold}", flush=True)
    mp = multiprocessing.get_context("spawn")
    pairs = [(way, mode) for way in ways for mode in a.modes]
    best, eager_loss = {}, {}
    for i in range(0, len(pairs), a.jobs):
        batch, running = pairs[i:i + a.jobs], {}
        for way, mode in batch:
            if time.time() >= deadline:
                print(f"skip {MODE_NAMES[mode]:<10s} {way}: the budget ({a.budget:g} s) is spent")
                continue
            here, there = mp.Pipe()
            log = os.path.join(a.logs, f"{d}_{L}_{T}_{mode}_{way}.log")
            p = mp.Process(target=worker, args=(config(d, L, T, MODES[mode]), way, a.steps,
                                                a.device, a.threads, log, there))
            p.start()
            running[(way, mode)] = (p, here, log)
        ready = {}
        while len(ready) < len(running):  # wait for the compiles, up to the deadline
            waiting = [here for key, (_, here, _) in running.items() if key not in ready]
            left = deadline - time.time() if a.budget else None
            if left is not None and left <= 0:
                break
            for here in multiprocessing.connection.wait(waiting, left):
                key = next(k for k, (_, h, _) in running.items() if h is here)
                try:
                    ready[key] = here.recv()
                except EOFError:
                    ready[key] = ("error", f"the process died: {log_tail(running[key][2])}")
        # then the timing: a.rounds rounds, in each of which every ready process in turn
        # times its steps, nothing else running; a way's time is the best of its rounds'
        # medians (its spread across rounds printed beside it)
        live, medians, peak = [], {}, {}
        for key in pairs:
            if key not in running:
                continue
            (way, mode), (p, here, log) = key, running[key]
            if key not in ready:
                p.terminate()
                print(f"skip {MODE_NAMES[mode]:<10s} {way}: not compiled within the budget "
                      f"({a.budget:g} s)", flush=True)
            elif ready[key][0] == "ready":
                live.append(key)
                medians[key] = []
            else:
                print(f"FAIL {MODE_NAMES[mode]:<10s} {way}: {ready[key][1]} (log {log})", flush=True)
                a.failed = True
                p.join()
        for _ in range(a.rounds):
            for key in [k for k in live if k in medians]:
                p, here, log = running[key]
                here.send("go")
                try:
                    status, value = here.recv()
                except EOFError:
                    status, value = "error", f"the process died: {log_tail(log)}"
                if status == "error":
                    way, mode = key
                    print(f"FAIL {MODE_NAMES[mode]:<10s} {way}: {value} (log {log})", flush=True)
                    a.failed = True
                    del medians[key]
                    p.join()
                    continue
                medians[key].append(value[0])
                peak[key] = value[1]
        for key in live:
            if key not in medians:
                continue
            (way, mode), (p, here, log) = key, running[key]
            here.send("stop")
            p.join()
            first, took = ready[key][1], ready[key][2]
            ms = min(medians[key])
            if way == "eager":
                eager_loss[mode] = first
            elif mode in eager_loss and abs(first - eager_loss[mode]) > TOL32 * abs(eager_loss[mode]):
                print(f"FAIL {MODE_NAMES[mode]:<10s} {way}: first-step loss {first:.7f}, eager's "
                      f"{eager_loss[mode]:.7f}: not the same model", flush=True)
                a.failed = True
                continue
            gflops = flops[mode] / (ms / 1000.0) / 1e9
            spread = (f"   rounds {min(medians[key]):.2f} .. {max(medians[key]):.2f} ms"
                      if a.rounds > 1 else "")
            print(f"{MODE_NAMES[mode]:<10s} {way:<27s} {ms:9.2f} ms/step "
                  f"{c0['B'] * c0['T'] / (ms / 1000.0):9.0f} tokens/s {gflops:8.1f} GFLOP/s "
                  f"{100.0 * gflops / rate:5.1f}% of torch.mm{of_cold(gflops, cold_rate)}   "
                  f"first loss {first:.6f} "
                  f"({took:.0f} s to build, compile and warm up){spread} | memory "
                  f"{peak[key]:.1f} MiB", flush=True)
            if mode not in best or ms < best[mode][0]:
                best[mode] = (ms, way)
    for mode in a.modes:
        if mode in best:
            ms, way = best[mode]
            gflops = flops[mode] / (ms / 1000.0) / 1e9
            print(f"best {MODE_NAMES[mode]:<10s} d={d} L={L} T={T}: {ms:9.2f} ms/step "
                  f"{gflops:8.1f} GFLOP/s {100.0 * gflops / rate:5.1f}% of torch.mm"
                  f"{of_cold(gflops, cold_rate)} ({way})",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: on the GPU, float32 without TF32 (exits 3 if torch has no CUDA)")
    ap.add_argument("--ways", default=None, help="comma-separated, of " + ", ".join(ALL_WAYS))
    ap.add_argument("--modes", default="none,full,block")
    ap.add_argument("--size", action="append", default=None, metavar="d,L,T")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of --steps steps, the processes taking turns in each; a way's\n"
                         "time is the best of its rounds' medians")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds from the start: a way not compiled by then is stopped, and\n"
                         "none starts after (a skip line each; 0: no limit)")
    ap.add_argument("--jobs", type=int, default=0,
                    help="(mode, way) processes compiling at once (default: all on cuda, 1 on cpu)")
    ap.add_argument("--logs", default=None, help="folder for each process's output (default: a "
                    "new one under the system's temporary folder)")
    ap.add_argument("--check-only", action="store_true", help="the check against the state files alone")
    ap.add_argument("--no-check", action="store_true",
                    help="time without the check (for a caller that ran --check-only first with\n"
                         "the same torch, as make bench-sizes does)")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("error: --steps must be positive")
    if a.rounds < 1:
        sys.exit("error: --rounds must be positive")
    a.modes = a.modes.split(",")
    if not a.modes or any(m not in MODES for m in a.modes):
        sys.exit(f"error: --modes takes a comma-separated list of {', '.join(MODES)}")
    sizes = []
    for s in a.size or ["256,8,128"]:
        try:
            d, L, T = (int(v) for v in s.split(","))
        except ValueError:
            sys.exit(f"error: --size takes d,L,T (three integers), not '{s}'")
        if d % 64 or L < 2 or L % 2 or T not in (128, 256, 512, 1024, 2048, 4096):
            sys.exit(f"error: --size {s}: d must be a multiple of 64, L even (block S=4), T one of "
                     "128, 256, 512, 1024, 2048, 4096")
        sizes.append((d, L, T))
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_pytorch: skipped: this torch has no CUDA device")
        sys.exit(3)
    setup(a.device, a.threads)
    available = [w for w in ALL_WAYS if w == "eager" or
                 (HAS_COMPILE and (w != "reduce-overhead" or a.device == "cuda"))]
    ways = available if a.ways is None else a.ways.split(",")
    unknown = [w for w in ways if w not in ALL_WAYS]
    if unknown or not ways:
        sys.exit(f"error: --ways takes a comma-separated list of {', '.join(ALL_WAYS)}")
    if any(w not in available for w in ways):
        sys.exit(f"error: --ways {a.ways}: this torch and device run only {', '.join(available)}")
    ways = ["eager"] + [w for w in ways if w != "eager"]  # the compiled ways are checked against it
    if a.jobs < 0:
        sys.exit("error: --jobs must not be negative")
    a.jobs = a.jobs or (len(ways) * len(a.modes) if a.device == "cuda" else 1)
    a.logs = a.logs or tempfile.mkdtemp(prefix="bench_pytorch_")
    os.makedirs(a.logs, exist_ok=True)
    print(f"bench_pytorch: torch {torch.__version__} float32 on {a.device}, "
          f"{torch.get_num_threads()} threads, median of {a.steps} steps; ways: {', '.join(ways)}; "
          f"{a.jobs} compiling at once; logs in {a.logs}")
    if not HAS_SDPA or not HAS_COMPILE:
        print(f"torch {torch.__version__} has no "
              f"{' and no '.join(n for n, has in (('scaled_dot_product_attention', HAS_SDPA), ('torch.compile', HAS_COMPILE)) if not has)}"
              f": eager only, attention by hand (softmax(q k^T / sqrt(hs) + causal mask) v)")
    if a.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, TF32 off")
    else:
        print(f"BLAS: {blas_library()}")
        core = blas_core()
        if core:
            print(f"BLAS core: {core}")
    _, kind = make_optimizer(Model(config(64, 1, 128, 0), 128).to(a.device), 1e-4, a.device)
    print(f"AdamW: {kind}; attention: "
          f"{'F.scaled_dot_product_attention(is_causal=True), kv heads repeated' if HAS_SDPA else 'by hand'}"
          f"{'; gradient norm clipped to 1 (as ./train_cuda)' if a.device == 'cuda' else ''}",
          flush=True)
    if not a.no_check and not check_parity(a.device):
        sys.exit(1)
    if a.check_only:
        return
    deadline = time.time() + a.budget if a.budget else math.inf
    a.failed = False
    for d, L, T in sizes:
        bench_size(d, L, T, a, ways, deadline)
    sys.exit(1 if a.failed else 0)


if __name__ == "__main__":
    main()

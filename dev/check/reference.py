#!/usr/bin/python3
"""Independent PyTorch (autograd, float64) reference for attnres.c, written from SPEC.md.

Usage (needs /usr/bin/python3, which has torch):
  dev/check/reference.py --all tests/data            regenerate every committed state file
  dev/check/reference.py --out F --mode block --S 4 --B 2 --T 7 ...   write one custom file
      (SPEC's variants: --depth-score sigmoid, --key-norm off, --depth-query input,
       --depth-heads K, --depth-window W, --mixing static|dense; mHC-lite: --mode mhc
       --streams m; the replayed steps' optimiser: --optimizer muon [--muon-momentum 0.95])
  dev/check/reference.py --random DIR [--count 60] [--seed 0]   write COUNT files with random configs
  dev/check/reference.py --check F [--tol 1e-4]      recompute a state file, print differences
  dev/check/reference.py --selftest                  finite differences, sanity and round-trip

All arithmetic is float64. Parameters are drawn as float32 (what the file stores) and then
widened, so the file holds exactly the parameters that were used.

State file (little-endian), in this order:
  int32[256]   header: [0] magic 20261125, [1] version 1, [2] B, [3] T, [4] V, [5] d,
               [6] L, [7] H, [8] G, [9] F, [10] S (0 none, 1 full, >=2 block size in
               sub-layers), [11] 0, [12] K (optimiser steps replayed), [13..18] SPEC's
               depth-attention variants (all 0: the default model), [19] mHC-lite's
               streams m (0: not mhc; then [10] = 0), [20] the optimiser of the K steps
               (0 AdamW, 1 Muon); rest 0
  float32[64]  [0] RMSNorm eps, [1] RoPE base, [2] lr, [3] beta1, [4] beta2, [5] Adam eps,
               [6] weight decay, [7] Muon's momentum mu (0 with AdamW); rest 0
  float32      parameters, canonical SPEC order, each flattened row-major
  int32[B*T]   x (tokens), then int32[B*T] y (targets, -1 = ignored)
  float32      logits [B*T*V], then the loss (one value)
  float32      gradients of the loss, same layout as the parameters
  float32[K]   loss before each of K optimiser steps on the same batch (first = loss above)
Size: 1024 + 256 + 4*(n_params + 2*B*T + B*T*V + 1 + n_params + K) bytes, n_params = the
parameter count.
"""
import argparse, itertools, math, os, sys
import numpy as np
import torch
import torch.nn.functional as Fn

MAGIC, VERSION = 20261125, 1
DECAYED = {"wte", "wq", "wk", "wv", "wo", "wg", "wu", "wd", "lm_head"}
DEFAULT_HP = dict(eps=1e-6, base=10000.0, lr=1e-3, beta1=0.9, beta2=0.95, adam_eps=1e-8, wd=0.1)
# SPEC "Optimisers and schedules": Muon updates each layer's slice of these, AdamW the rest
MUON_MATRICES = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")
# Muon's state files take steps large enough to move the gradient between them: with
# lr = 1e-3, N's direction hardly depends on mu and another mu would pass unnoticed
MUON_HP = dict(DEFAULT_HP, lr=0.02, optimizer=1, mu=0.95)


# SPEC "Variants": the switches of the depth-attention operator, their header slots and
# values; every switch at its first value is the default model (header 0).
VARIANTS = dict(score=(13, ["softmax", "sigmoid"]), key_norm=(14, ["on", "off"]),
                query=(15, ["static", "input"]), heads=(16, None), window=(17, None),
                mixing=(18, ["attention", "static", "dense"]))
DEFAULT_VARIANT = dict(score="softmax", key_norm="on", query="static", heads=1, window=0,
                       mixing="attention")
STREAMS_SLOT = 19  # mHC-lite's m (0: not mhc)


def mhc_sizes(m):
    """R = m! permutations, E = 2m + R projected values a row."""
    R = math.factorial(m)
    return R, 2 * m + R


def shapes(c):
    """Canonical parameter order and shapes (SPEC 'Parameters' and 'Variants')."""
    B, T, V, d, L, H, G, F, S = (c[k] for k in "B T V d L H G F S".split())
    hs, n = d // H, 2 * L + 1
    out = [("wte", (V, d)), ("attn_norm", (L, d)), ("wq", (L, H * hs, d)), ("wk", (L, G * hs, d)),
           ("wv", (L, G * hs, d)), ("wo", (L, d, H * hs)), ("mlp_norm", (L, d)),
           ("wg", (L, F, d)), ("wu", (L, F, d)), ("wd", (L, d, F))]
    m = c["streams"]
    if m > 0:  # SPEC "mHC-lite"
        R, E = mhc_sizes(m)
        out += [("hc_norm", (2 * L, m * d)), ("hc_proj", (2 * L, E, m * d)),
                ("hc_bias", (2 * L, E)), ("hc_scale", (2 * L, 3))]
    if S > 0 and c["mixing"] == "static":
        out += [("res_logits", (n, n))]
    elif S > 0 and c["mixing"] == "dense":
        out += [("res_scalars", (n, n))]
    elif S > 0:
        out += [("res_query", (n, d))]
        out += [("res_norm", (n, d))] if c["key_norm"] == "on" else []
        out += [("res_qproj", (n, d, d))] if c["query"] == "input" else []
    return out + [("final_norm", (d,)), ("lm_head", (V, d))]


def hc_bias_spec(L, m):
    """SPEC's hc_bias: for sub-layer l, pre and post -1 except +1 at stream l mod m; res -8
    except 0 at the identity r = 0."""
    R, E = mhc_sizes(m)
    b = torch.empty(2 * L, E)
    for l in range(2 * L):
        side = torch.full((m,), -1.0)
        side[l % m] = 1.0
        res = torch.full((R,), -8.0)
        res[0] = 0.0
        b[l] = torch.cat([side, res, side])
    return b


def init_params(c, init, seed):
    """init='spec': exactly SPEC's init. init='rand': every path non-trivial (larger matrices,
    gains 1+0.3*N(0,1), pseudo-queries N(0,0.5); mHC-lite: Phi N(0,0.3), biases SPEC's plus
    N(0,0.5), scales 0.5+0.3*N(0,1), so the coefficients vary with the input)."""
    g = torch.Generator().manual_seed(seed)
    p = {}
    for name, shp in shapes(c):
        n = lambda std: torch.randn(shp, generator=g, dtype=torch.float32) * std
        if name == "hc_proj":
            t = torch.zeros(shp) if init == "spec" else n(0.3)
        elif name == "hc_bias":
            t = hc_bias_spec(c["L"], c["streams"]) + (0 if init == "spec" else n(0.5))
        elif name == "hc_scale":
            t = torch.full(shp, 0.01) if init == "spec" else 0.5 + n(0.3)
        elif name in ("attn_norm", "mlp_norm", "res_norm", "final_norm", "res_scalars", "hc_norm"):
            t = torch.ones(shp) if init == "spec" else 1 + n(0.3)
        elif name in ("res_query", "res_logits"):
            t = torch.zeros(shp) if init == "spec" else n(0.5)
        elif name == "res_qproj":
            t = torch.zeros(shp) if init == "spec" else n(0.3 / math.sqrt(c["d"]))
        elif init == "spec":
            t = n(0.02 / math.sqrt(2 * c["L"]) if name in ("wo", "wd") else 0.02)
        else:
            t = n(1.0 if name == "wte" else 0.2)
        p[name] = t.float().double()  # drawn as float32, computed in float64
    return p


def rmsnorm(x, g, eps):
    return g * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(x, base):
    """x: (B, T, heads, hs); rotate interleaved pairs (2j, 2j+1) by t * base^(-2j/hs)."""
    T, hs = x.shape[1], x.shape[3]
    t = torch.arange(T, dtype=torch.float64)
    j = torch.arange(hs // 2, dtype=torch.float64)
    theta = t[:, None] * base ** (-2 * j / hs)  # (T, hs/2)
    cos, sin = torch.cos(theta)[None, :, None, :], torch.sin(theta)[None, :, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).reshape(x.shape)


def attention(x, wq, wk, wv, wo, c, base):
    B, T, d = x.shape
    H, G = c["H"], c["G"]
    hs = d // H
    q = rope((x @ wq.T).view(B, T, H, hs), base).transpose(1, 2)  # (B, H, T, hs)
    k = rope((x @ wk.T).view(B, T, G, hs), base).transpose(1, 2)  # (B, G, T, hs)
    v = (x @ wv.T).view(B, T, G, hs).transpose(1, 2)
    k = k.repeat_interleave(H // G, dim=1)  # query head h reads kv head h // (H/G)
    v = v.repeat_interleave(H // G, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hs)
    return y.transpose(1, 2).reshape(B, T, H * hs) @ wo.T


def mlp(x, wg, wu, wd):
    return (Fn.silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def depth_attention(sources, p, l, c, eps, trace=None):
    """Depth attention of sub-layer l (l = 2L: the output aggregation) over its sources, per
    position. Default: h = sum_i softmax_i(w_l . rmsnorm(V_i; g_l)) V_i. With SPEC's variants:
    static mixing softmax(c_l[:n]) or DenseFormer scalars beta_l[:n] instead of scores;
    otherwise sigmoid for softmax, raw keys for rmsnorm(V_i; g), the query
    w_l + U_l rmsnorm(V_last) (no gain), and K heads, each a contiguous group of d/K channels
    with its own mean square, scores and weights."""
    V = torch.stack(sources)  # (n, B, T, d)
    n, d = V.shape[0], V.shape[-1]
    if c["mixing"] in ("static", "dense"):
        row = p["res_logits" if c["mixing"] == "static" else "res_scalars"][l][:n]
        alpha = torch.softmax(row, dim=0) if c["mixing"] == "static" else row
        alpha = alpha[:, None, None].expand(V.shape[:3])  # (n, B, T)
        h = (alpha[..., None] * V).sum(0)
        if trace is not None:
            trace.append((alpha.detach(), V.detach(), h.detach()))
        return h
    K = c["heads"]
    q = p["res_query"][l]  # (d) or, input-dependent, (B, T, d)
    if c["query"] == "input":
        q = q + rmsnorm(V[-1], torch.ones(d, dtype=V.dtype), eps) @ p["res_qproj"][l].T
    Vh = V.reshape(V.shape[:3] + (K, d // K))  # (n, B, T, K, d/K)
    keys = Vh
    if c["key_norm"] == "on":
        keys = rmsnorm(Vh, p["res_norm"][l].reshape(K, d // K), eps)
    s = (keys * q.reshape(q.shape[:-1] + (K, d // K))).sum(-1)  # (n, B, T, K)
    alpha = torch.softmax(s, dim=0) if c["score"] == "softmax" else torch.sigmoid(s)
    h = (alpha[..., None] * Vh).sum(0).reshape(V.shape[1:])
    if trace is not None:
        trace.append((alpha.detach(), V.detach(), h.detach()))
    return h


def mhc_lite(x0, p, c, eps, sublayer, trace=None):
    """SPEC 'mHC-lite': the streams X (B, T, m, d), all x0 at the start; per sub-layer l
    z = rmsnorm(concat X; c_l), e = z Phi_l^T split (pre m, res R, post m), a_pre =
    sigmoid(sigma0 e_pre + beta_pre), pi = softmax(sigma1 e_res + beta_res), a_post =
    2 sigmoid(sigma2 e_post + beta_post), H = sum_r pi_r P_r (P_r[i][j] = 1 iff perm_r[i] = j,
    permutations in lexicographic order), u = sum_s a_pre[s] X_s, f = f_l(u),
    X_t <- sum_s H[s][t] X_s + a_post[t] f. Returns rmsnorm(X_s; g_final) for every stream
    (B, T, m, d)."""
    m, d, L = c["streams"], x0.shape[-1], c["L"]
    R, E = mhc_sizes(m)
    perms = torch.tensor(list(itertools.permutations(range(m))))  # lexicographic, identity first
    P = torch.eye(m, dtype=torch.float64)[perms]  # (R, m, m): P[r][i][j] = [perm_r[i] == j]
    X = x0.unsqueeze(-2).expand(x0.shape[:-1] + (m, d))
    for l in range(2 * L):
        z = rmsnorm(X.reshape(X.shape[:-2] + (m * d,)), p["hc_norm"][l], eps)
        e = z @ p["hc_proj"][l].T  # (B, T, E)
        pre = e[..., :m] * p["hc_scale"][l][0] + p["hc_bias"][l][:m]
        res = e[..., m:m + R] * p["hc_scale"][l][1] + p["hc_bias"][l][m:m + R]
        post = e[..., m + R:] * p["hc_scale"][l][2] + p["hc_bias"][l][m + R:]
        a_pre, pi, a_post = torch.sigmoid(pre), torch.softmax(res, -1), 2 * torch.sigmoid(post)
        H = torch.einsum("...r,rst->...st", pi, P)
        u = torch.einsum("...s,...sd->...d", a_pre, X)
        f = sublayer(l, u)
        if trace is not None:
            trace.append((H.detach(), a_pre.detach(), a_post.detach()))
        X = torch.einsum("...st,...sd->...td", H, X) + a_post[..., None] * f[..., None, :]
    return rmsnorm(X, p["final_norm"], eps)


def forward(p, x, y, c, hp, trace=None):
    """Returns (logits (B,T,V), loss). SPEC 'Forward pass'."""
    L, S, eps, base = c["L"], c["S"], hp["eps"], hp["base"]

    def sublayer(l, h):
        n = l // 2
        if l % 2 == 0:
            return attention(rmsnorm(h, p["attn_norm"][n], eps), p["wq"][n], p["wk"][n],
                             p["wv"][n], p["wo"][n], c, base)
        return mlp(rmsnorm(h, p["mlp_norm"][n], eps), p["wg"][n], p["wu"][n], p["wd"][n])

    x0 = p["wte"][x]
    if c["streams"] > 0:  # mHC-lite: m streams mixed by a doubly stochastic H
        xf = mhc_lite(x0, p, c, eps, sublayer, trace).sum(-2)
        logits = xf @ p["lm_head"].T
        loss = Fn.cross_entropy(logits.reshape(-1, c["V"]), y.reshape(-1), ignore_index=-1)
        return logits, loss
    if S == 0:  # standard PreNorm residual
        out = x0
        for l in range(2 * L):
            out = out + sublayer(l, out)
    else:  # block AttnRes (full = block with S = 1)
        W = c["window"]  # full only: x0 and the W most recent outputs (0: all)
        window = lambda srcs: srcs if W == 0 else srcs[:1] + srcs[1:][-W:]
        blocks, partial = [x0], None
        for l in range(2 * L):
            i = l % S  # position inside block 1 + l // S
            srcs = blocks if i == 0 else blocks + [partial]
            f = sublayer(l, depth_attention(window(srcs), p, l, c, eps, trace))
            partial = f if i == 0 else partial + f
            if i == S - 1:  # block complete
                blocks.append(partial)
                partial = None
        out = depth_attention(window(blocks), p, 2 * L, c, eps, trace)
    logits = rmsnorm(out, p["final_norm"], eps) @ p["lm_head"].T
    loss = Fn.cross_entropy(logits.reshape(-1, c["V"]), y.reshape(-1), ignore_index=-1)
    return logits, loss


def loss_and_grads(p, x, y, c, hp):
    q = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    logits, loss = forward(q, x, y, c, hp)
    loss.backward()
    return logits.detach(), loss.detach(), {k: v.grad.detach() for k, v in q.items()}


def adamw_step(p, m, v2, g, k, t, hp):
    """SPEC's AdamW step t (from 1) on tensor k, in place in p, m, v2."""
    b1, b2, lr, eps = hp["beta1"], hp["beta2"], hp["lr"], hp["adam_eps"]
    m[k] = b1 * m[k] + (1 - b1) * g[k]
    v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
    mhat, vhat = m[k] / (1 - b1 ** t), v2[k] / (1 - b2 ** t)
    wd = hp["wd"] if k in DECAYED else 0.0
    p[k] = p[k] - lr * (mhat / (torch.sqrt(vhat) + eps) + wd * p[k])


def newton_schulz(X):
    """Five quintic Newton-Schulz steps on X (rows <= cols), float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        Y = X @ X.T
        X = a * X + (b * Y + c * Y @ Y) @ X
    return X


def muon_step(p, m, g, k, hp):
    """SPEC's Muon step on every layer's slice of tensor k, in place in p and m (momentum)."""
    mu, new = hp["mu"], p[k].clone()
    for l in range(p[k].shape[0]):
        m[k][l] = mu * m[k][l] + g[k][l]
        N = g[k][l] + mu * m[k][l]
        X = N / (N.norm() + 1e-7)
        A, B = X.shape
        X = newton_schulz(X.T).T if A > B else newton_schulz(X)
        new[l] = p[k][l] - hp["lr"] * (hp["wd"] * p[k][l] + 0.2 * math.sqrt(max(A, B)) * X)
    p[k] = new


def replay(p, x, y, c, hp, K):
    """K optimiser steps, float64: AdamW (SPEC 'Optimiser') on every tensor, or with
    hp["optimizer"] == 1 Muon on MUON_MATRICES and AdamW on the rest (SPEC 'Optimisers and
    schedules'); m is AdamW's first moment or Muon's momentum. Returns the loss before each."""
    muon = hp.get("optimizer", 0) == 1
    p = {k: v.clone() for k, v in p.items()}
    m = {k: torch.zeros_like(v) for k, v in p.items()}
    v2 = {k: torch.zeros_like(v) for k, v in p.items()}
    losses = []
    for t in range(1, K + 1):
        _, loss, g = loss_and_grads(p, x, y, c, hp)
        losses.append(loss.item())
        for k in p:
            if muon and k in MUON_MATRICES:
                muon_step(p, m, g, k, hp)
            else:
                adamw_step(p, m, v2, g, k, t, hp)
    return losses


def make_batch(c, seed, ignore):
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)
    y = torch.randint(0, c["V"], (c["B"], c["T"]), generator=g)
    n = min(round(ignore * y.numel()), y.numel() - 1)  # exactly n ignored, >= 1 kept
    y.view(-1)[torch.randperm(y.numel(), generator=g)[:n]] = -1
    return x, y


def compute(p, x, y, c, hp, K):
    logits, loss, grads = loss_and_grads(p, x, y, c, hp)
    return dict(logits=logits, loss=loss, grads=grads, losses=replay(p, x, y, c, hp, K))


def file_size(c, K):
    n_params = sum(math.prod(s) for _, s in shapes(c))
    BT = c["B"] * c["T"]
    return 1024 + 256 + 4 * (n_params + 2 * BT + BT * c["V"] + 1 + n_params + K)


def variant_slots(c):
    """The header slots [13..18] of c's variants: value index, or the number (heads: 0 for
    one head, window: 0 for all)."""
    slots = {}
    for key, (slot, values) in VARIANTS.items():
        v = c[key]
        slots[slot] = values.index(v) if values else (0 if key == "heads" and v == 1 else v)
    return slots


def write_state(path, c, hp, K, p, x, y, r):
    hdr = np.zeros(256, "<i4")
    hdr[:13] = [MAGIC, VERSION, c["B"], c["T"], c["V"], c["d"], c["L"], c["H"], c["G"],
                c["F"], c["S"], 0, K]
    for slot, v in variant_slots(c).items():
        hdr[slot] = v
    hdr[STREAMS_SLOT] = c["streams"]
    fl = np.zeros(64, "<f4")
    fl[:7] = [hp[k] for k in ("eps", "base", "lr", "beta1", "beta2", "adam_eps", "wd")]
    hdr[20], fl[7] = hp.get("optimizer", 0), hp.get("mu", 0.0)
    f32 = lambda t: np.asarray(t.detach().numpy() if torch.is_tensor(t) else t).astype("<f4")
    parts = [hdr, fl] + [f32(p[n]) for n, _ in shapes(c)]
    parts += [x.numpy().astype("<i4"), y.numpy().astype("<i4"), f32(r["logits"]),
              f32(r["loss"]).reshape(1)]
    parts += [f32(r["grads"][n]) for n, _ in shapes(c)] + [f32(r["losses"])]
    with open(path, "wb") as fh:
        for a in parts:
            fh.write(a.tobytes())
    # round-trip: exact size, and everything reads back as written
    assert os.path.getsize(path) == file_size(c, K), "bad file size"
    c2, hp2, K2, p2, x2, y2, r2 = read_state(path)
    assert c2 == c and K2 == K and torch.equal(x2, x) and torch.equal(y2, y)
    assert all(torch.equal(p2[n], p[n].float().double()) for n in p)
    assert torch.equal(r2["logits"], torch.from_numpy(f32(r["logits"]).astype(np.float64)))
    assert torch.equal(r2["losses"], torch.from_numpy(f32(r["losses"]).astype(np.float64)))


def read_state(path):
    buf = open(path, "rb").read()
    hdr = np.frombuffer(buf, "<i4", 256, 0)
    fl = np.frombuffer(buf, "<f4", 64, 1024)
    assert hdr[0] == MAGIC and hdr[1] == VERSION, f"{path}: bad magic/version"
    c = dict(zip("B T V d L H G F S".split(), (int(v) for v in hdr[2:11])))
    for key, (slot, values) in VARIANTS.items():
        v = int(hdr[slot])
        if (values and not 0 <= v < len(values)) or v < 0:
            sys.exit(f"{path}: header [{slot}] = {v} is not a {key} variant")
        c[key] = values[v] if values else (max(v, 1) if key == "heads" else v)
    c["streams"] = int(hdr[STREAMS_SLOT])
    check_variant(c, path)
    K = int(hdr[12])
    hp = dict(zip(("eps", "base", "lr", "beta1", "beta2", "adam_eps", "wd"),
                  (float(v) for v in fl[:7])))
    if int(hdr[20]) not in (0, 1) or not (0 <= fl[7] < 1 if hdr[20] == 1 else fl[7] == 0):
        sys.exit(f"{path}: header [20] = {hdr[20]} with float [7] = {fl[7]} is no optimiser")
    if hdr[20] == 1:
        hp.update(optimizer=1, mu=float(fl[7]))
    off = 1280
    if len(buf) != file_size(c, K):
        sys.exit(f"{path}: size {len(buf)} != expected {file_size(c, K)}")

    def take(dtype, shape):
        nonlocal off
        n = math.prod(shape)
        a = np.frombuffer(buf, dtype, n, off).reshape(shape)
        off += 4 * n
        return torch.from_numpy(a.astype(np.float64 if dtype == "<f4" else np.int64))

    BT = (c["B"], c["T"])
    p = {n: take("<f4", s) for n, s in shapes(c)}
    x, y = take("<i4", BT), take("<i4", BT)
    r = dict(logits=take("<f4", BT + (c["V"],)), loss=take("<f4", (1,))[0])
    r["grads"] = {n: take("<f4", s) for n, s in shapes(c)}
    r["losses"] = take("<f4", (K,))
    return c, hp, K, p, x, y, r


def check(path, tol):
    """Recompute a state file from its parameters and batch; print per-tensor differences.
    max_rel = max|a-b| / max(max|ref|, 1e-6), i.e. relative to the tensor's scale."""
    c, hp, K, p, x, y, got = read_state(path)
    assert x.min() >= 0 and x.max() < c["V"] and y.min() >= -1 and y.max() < c["V"], "bad batch"
    ref = compute(p, x, y, c, hp, K)
    print(f"{path}: {c} K={K} hp={hp}")
    rows = [("logits", got["logits"], ref["logits"]), ("loss", got["loss"], ref["loss"])]
    rows += [("d" + n, got["grads"][n], ref["grads"][n]) for n, _ in shapes(c)]
    replayed = "muon_losses" if hp.get("optimizer", 0) == 1 else "adamw_losses"
    rows += [(replayed, got["losses"], torch.tensor(ref["losses"]))]
    worst = 0.0
    for name, a, b in rows:
        a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
        if b.numel() == 0:
            continue
        dmax, scale = (a - b).abs().max().item(), b.abs().max().item()
        rel = dmax / max(scale, 1e-6)
        worst = max(worst, rel)
        print(f"  {name:14s} max_abs {dmax:.3e}  max_rel {rel:.3e}  (scale {scale:.3e})"
              + ("  <-- FAIL" if rel > tol else ""))
    print(f"  worst max_rel {worst:.3e}: {'OK' if worst <= tol else 'FAIL'} (tol {tol:g})")
    return worst <= tol


def generate(path, c, K, init, ignore, seed, hp=DEFAULT_HP):
    hp = {k: float(np.float32(v)) for k, v in hp.items()}  # the values the file stores
    p = init_params(c, init, seed)
    x, y = make_batch(c, seed, ignore)
    write_state(path, c, hp, K, p, x, y, compute(p, x, y, c, hp, K))
    print(f"{path}: {os.path.getsize(path)} bytes  S={c['S']}"
          + (f" m={c['streams']}" if c["streams"] else "") + f" B={c['B']} T={c['T']} V={c['V']}"
          f" d={c['d']} L={c['L']} H={c['H']} G={c['G']} F={c['F']} K={K} init={init}"
          f" ignored={int((y == -1).sum())}")


def check_variant(c, where="config"):
    """SPEC 'Variants': which switches apply to which mode, and which combine."""
    v = {k: c[k] for k in DEFAULT_VARIANT}
    changed = [k for k in DEFAULT_VARIANT if v[k] != DEFAULT_VARIANT[k]]
    problem = None
    if c["streams"] != 0 and not 2 <= c["streams"] <= 4:
        problem = f"--streams {c['streams']} must be 2 .. 4"
    elif c["streams"] != 0 and c["S"] != 0:
        problem = "--streams is for --mode mhc (block size 0)"
    elif c["heads"] < 1 or c["d"] % c["heads"] != 0:
        problem = f"--depth-heads {c['heads']} does not divide d = {c['d']}"
    elif c["window"] < 0:
        problem = "--depth-window must not be negative"
    elif c["S"] == 0 and changed:
        problem = f"{', '.join(changed)}: depth-attention variants need --mode full or block"
        problem += " (not mhc)" if c["streams"] else ""
    elif c["window"] > 0 and c["S"] != 1:
        problem = "--depth-window is for --mode full only"
    elif c["mixing"] != "attention" and (v["score"] != "softmax" or v["key_norm"] != "on" or
                                         v["query"] != "static" or v["heads"] != 1):
        problem = "--mixing replaces the attention: no score, key-norm, query or head switch with it"
    if problem:
        sys.exit(f"{where}: {problem}")


def cfg(B=2, T=7, V=13, d=16, L=2, H=4, G=2, F=32, S=0, streams=0, **variant):
    if not (d % H == 0 and (d // H) % 2 == 0 and H % G == 0 and (S <= 1 or (2 * L) % S == 0)):
        sys.exit(f"bad config: need d % H == 0, even d/H, H % G == 0, S | 2L (d={d} H={H} "
                 f"G={G} L={L} S={S})")
    unknown = set(variant) - set(DEFAULT_VARIANT)
    if unknown:
        sys.exit(f"bad config: unknown variant switches {sorted(unknown)}")
    c = dict(B=B, T=T, V=V, d=d, L=L, H=H, G=G, F=F, S=S, **{**DEFAULT_VARIANT, **variant},
             streams=streams)
    check_variant(c)
    return c


# name: (config, K, init, ignored-target fraction, seed)
ALL = {
    "none_mha_rand": (cfg(T=7, V=11, H=4, G=4, F=24, S=0), 3, "rand", 0.25, 1),
    "none_gqa_spec": (cfg(T=8, V=13, H=4, G=2, F=32, S=0), 4, "spec", 0.0, 2),
    "full_gqa_rand": (cfg(T=7, V=17, H=4, G=2, F=32, S=1), 4, "rand", 0.25, 3),
    "full_mqa_spec": (cfg(T=6, V=13, H=4, G=1, F=24, S=1), 3, "spec", 0.2, 4),
    "block_s2_mqa_rand": (cfg(T=9, V=13, L=3, H=4, G=1, F=40, S=2), 5, "rand", 0.2, 5),
    "block_s3_gqa_rand": (cfg(T=5, V=11, L=3, H=8, G=4, F=24, S=3), 4, "rand", 0.3, 6),
    "block_s4_gqa_rand": (cfg(T=7, V=13, L=4, H=4, G=2, F=24, S=4), 4, "rand", 0.25, 7),
    "block_s4_mha_spec": (cfg(T=8, V=11, L=2, H=2, G=2, F=32, S=4), 3, "spec", 0.0, 8),
    "block_s6_mha_rand": (cfg(B=3, T=6, V=11, L=3, H=2, G=2, F=24, S=6), 3, "rand", 0.0, 9),
    # SPEC's variants: each switch in full and block where it applies, and combinations
    "full_sigmoid_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, score="sigmoid"), 3, "rand", 0.2, 10),
    "block_s2_sigmoid_rand": (cfg(T=7, V=11, H=4, G=1, F=24, S=2, score="sigmoid"), 3, "rand", 0.2, 11),
    "full_keynorm_off_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, key_norm="off"), 3, "rand", 0.2, 12),
    "block_s4_keynorm_off_rand": (cfg(T=7, V=11, H=2, G=2, F=24, S=4, key_norm="off"), 3, "rand", 0.0, 13),
    "full_query_input_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, query="input"), 3, "rand", 0.2, 14),
    "block_s2_query_input_rand": (cfg(T=7, V=11, H=4, G=4, F=24, S=2, query="input"), 3, "rand", 0.2, 15),
    "full_query_input_spec": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, query="input"), 3, "spec", 0.0, 16),
    "full_heads4_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, heads=4), 3, "rand", 0.2, 17),
    "block_s2_heads2_rand": (cfg(T=7, V=11, H=2, G=1, F=24, S=2, heads=2), 3, "rand", 0.2, 18),
    "full_window2_rand": (cfg(T=6, V=13, L=3, H=4, G=2, F=24, S=1, window=2), 3, "rand", 0.2, 19),
    "full_static_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, mixing="static"), 3, "rand", 0.2, 20),
    "block_s2_static_rand": (cfg(T=7, V=11, L=3, H=4, G=2, F=24, S=2, mixing="static"), 3, "rand", 0.0, 21),
    "full_dense_rand": (cfg(T=6, V=13, H=4, G=2, F=24, S=1, mixing="dense"), 3, "rand", 0.2, 22),
    "block_s4_dense_spec": (cfg(T=7, V=11, H=4, G=2, F=24, S=4, mixing="dense"), 3, "spec", 0.2, 23),
    "full_window3_dense_rand": (cfg(T=6, V=13, L=3, H=4, G=2, F=24, S=1, window=3, mixing="dense"), 3, "rand", 0.2, 24),
    "block_s2_sigmoid_keynorm_off_heads2_query_input_rand": (
        cfg(T=7, V=11, H=4, G=2, F=24, S=2, score="sigmoid", key_norm="off", heads=2, query="input"),
        3, "rand", 0.2, 25),
    "full_window2_sigmoid_heads2_rand": (
        cfg(T=6, V=13, L=3, H=4, G=2, F=24, S=1, window=2, score="sigmoid", heads=2), 3, "rand", 0.2, 26),
    # mHC-lite: m = 2, 3, 4 streams
    "mhc_m2_gqa_rand": (cfg(T=7, V=13, H=4, G=2, F=24, streams=2), 3, "rand", 0.2, 27),
    "mhc_m3_mha_rand": (cfg(T=6, V=11, L=3, H=2, G=2, F=24, streams=3), 3, "rand", 0.2, 28),
    "mhc_m4_spec": (cfg(T=7, V=13, H=4, G=1, F=24, streams=4), 4, "spec", 0.2, 29),
}


# Muon's K steps (header [20] = 1, float [7] = mu), AdamW on every other tensor:
# name: (config, K, init, ignored-target fraction, seed)
MUON_CASES = {
    "none_muon_rand": (cfg(T=7, V=11, H=4, G=2, F=24, S=0), 4, "rand", 0.25, 31),
    "block_s2_muon_rand": (cfg(T=7, V=13, L=3, H=4, G=1, F=40, S=2), 4, "rand", 0.2, 32),
    "full_muon_spec": (cfg(T=6, V=13, H=4, G=2, F=24, S=1), 4, "spec", 0.2, 33),
    "mhc_m3_muon_rand": (cfg(T=7, V=13, H=4, G=2, F=24, streams=3), 4, "rand", 0.2, 34),
}


def random_case(seed):
    """One random case for --random: (config, K, init, ignored fraction), drawn from seed.
    Modes none/full/block equally often; block takes any divisor S >= 2 of 2L; d = H * hs
    up to 64 with G any divisor of H; 4 in 5 cases use init 'rand' (random gains and
    pseudo-queries), the rest SPEC's init."""
    r = np.random.default_rng(seed)
    pick = lambda xs: xs[int(r.integers(len(xs)))]
    L = int(r.integers(1, 5))
    mode = pick(["none", "full", "block"])
    S = {"none": 0, "full": 1, "block": pick([s for s in range(2, 2 * L + 1) if 2 * L % s == 0])}[mode]
    H = pick([1, 2, 4, 8])
    G = pick([g for g in range(1, H + 1) if H % g == 0])
    hs = pick([h for h in (2, 4, 6, 8, 12, 16) if H * h <= 64])
    c = cfg(B=int(r.integers(1, 4)), T=int(r.integers(1, 11)), V=int(r.integers(5, 33)),
            d=H * hs, L=L, H=H, G=G, F=int(r.integers(4, 65)), S=S)
    init = "rand" if r.random() < 0.8 else "spec"
    return c, int(r.integers(0, 6)), init, pick([0.0, 0.1, 0.2, 0.3, 0.4])


def fd_worst(c, p, x, y, hp, seed, e=1e-5):
    """The worst relative error of central finite differences (step e) against autograd, on
    a few elements of every tensor."""
    _, _, g = loss_and_grads(p, x, y, c, hp)
    worst, gen = 0.0, torch.Generator().manual_seed(seed)
    for n in p:
        floor = 1e-3 * g[n].abs().max().item()
        for idx in torch.randint(0, p[n].numel(), (4,), generator=gen).tolist():
            q = {k: v.clone() for k, v in p.items()}
            q[n].view(-1)[idx] += e
            lp = forward(q, x, y, c, hp)[1].item()
            q[n].view(-1)[idx] -= 2 * e
            lm = forward(q, x, y, c, hp)[1].item()
            fd, an = (lp - lm) / (2 * e), g[n].view(-1)[idx].item()
            worst = max(worst, abs(fd - an) / max(abs(an), floor, 1e-12))
    return worst, g


def selftest_variants(hp):
    """SPEC 'Variants': finite differences for every switch in full and block (and some
    combinations), then the facts SPEC states about them."""
    ok = True
    tiny = lambda S, **v: cfg(B=2, T=5, V=7, d=8, L=3, H=2, G=1, F=12, S=S, **v)
    cases = [dict(score="sigmoid"), dict(key_norm="off"), dict(query="input"), dict(heads=2),
             dict(heads=4, score="sigmoid"), dict(mixing="static"), dict(mixing="dense"),
             dict(score="sigmoid", key_norm="off", query="input", heads=2)]
    for i, v in enumerate(cases):
        for S in (1, 2):
            c = tiny(S, **v)
            p = init_params(c, "rand", 200 + i)
            x, y = make_batch(c, 200 + i, 0.3)
            worst, _ = fd_worst(c, p, x, y, hp, i)
            ok &= worst < 1e-6
            print(f"finite differences {v} S={S}: worst rel err {worst:.2e}")
    for v in (dict(window=2), dict(window=3, mixing="dense"), dict(window=2, score="sigmoid")):
        c = tiny(1, **v)
        p = init_params(c, "rand", 300)
        x, y = make_batch(c, 300, 0.3)
        worst, _ = fd_worst(c, p, x, y, hp, 3)
        ok &= worst < 1e-6
        print(f"finite differences {v} S=1: worst rel err {worst:.2e}")

    def loss_of(c, p, x, y, trace=None):
        return forward(p, x, y, c, hp, trace)[1].item()

    c = tiny(1)
    x, y = make_batch(c, 400, 0.3)
    base = init_params(c, "rand", 400)
    # sigmoid at a zero query: every weight exactly 1/2; row 0 gets gradient (h_0 = x0 / 2)
    cs = tiny(2, score="sigmoid")
    ps, trace = init_params(cs, "spec", 401), []
    forward(ps, x, y, cs, hp, trace)
    half = all(bool((a == 0.5).all()) for a, _, _ in trace)
    _, _, gs = loss_and_grads(init_params(cs, "rand", 402), x, y, cs, hp)
    row0 = gs["res_query"][0].abs().max().item() > 0
    print(f"sigmoid: zero query gives alpha = 1/2 everywhere: {half}; res_query[0] gets gradient: {row0}")
    ok &= half and row0
    # static mixing at init: the exact mean; row l's entries past its n_l sources get none
    cm = tiny(2, mixing="static")
    pm, trace = init_params(cm, "spec", 403), []
    forward(pm, x, y, cm, hp, trace)
    mean = all(bool((a == 1.0 / V.shape[0]).all()) for a, V, _ in trace)
    _, _, gm = loss_and_grads(init_params(cm, "rand", 404), x, y, cm, hp)
    n_l = [len(t[1]) for t in trace]
    unused = all(gm["res_logits"][l][n:].abs().max().item() == 0 if n < gm["res_logits"].shape[1]
                 else True for l, n in enumerate(n_l))
    first = gm["res_logits"][0][0].item() == 0.0  # one source: softmax is 1 whatever c_0
    print(f"static mixing: init gives exact means: {mean}; unused logits get zero gradient: "
          f"{unused}; row 0 zero gradient: {first}")
    ok &= mean and unused and first
    # DenseFormer at SPEC init is the PreNorm model (full: exactly, sources summed in order)
    cd, cn = tiny(1, mixing="dense"), tiny(0)
    pd = init_params(cd, "spec", 405)
    pn = {k: v for k, v in pd.items() if k != "res_scalars"}
    ld, ln = loss_of(cd, pd, x, y), loss_of(cn, pn, x, y)
    print(f"DenseFormer at init: loss {ld!r} against PreNorm {ln!r}")
    ok &= abs(ld - ln) <= 1e-12 * abs(ln)
    # a window covering every output is full; a zero input projection is the static query
    cw = tiny(1, window=6)
    same_window = loss_of(cw, base, x, y) == loss_of(c, base, x, y)
    cq = tiny(1, query="input")
    pq = dict(base, res_qproj=torch.zeros(shapes(cq)[-3][1], dtype=torch.float64))
    same_query = loss_of(cq, pq, x, y) == loss_of(c, base, x, y)
    ch = tiny(1, heads=1)
    same_heads = loss_of(ch, base, x, y) == loss_of(c, base, x, y)
    print(f"window W >= 2L = full: {same_window}; U = 0 = static query: {same_query}; "
          f"1 head = default: {same_heads}")
    ok &= same_window and same_query and same_heads
    # header round trip of a combination (asserted inside write_state)
    path = "/tmp/attnres_selftest_variant.bin"
    generate(path, tiny(2, score="sigmoid", key_norm="off", query="input", heads=4), 2, "rand",
             0.3, 12)
    ok &= check(path, 1e-6)
    return ok


def selftest_mhc(hp):
    """SPEC 'mHC-lite': finite differences for m = 2, 3, 4, then its facts: H doubly
    stochastic, H near the identity at SPEC's init with sub-layer l reading mostly stream
    l mod m, and a header round trip."""
    ok = True
    tiny = lambda m, G=1: cfg(B=2, T=5, V=7, d=8, L=2, H=2, G=G, F=12, streams=m)
    for m in (2, 3, 4):
        c = tiny(m, G=1 + (m == 3))
        p = init_params(c, "rand", 500 + m)
        x, y = make_batch(c, 500 + m, 0.3)
        # step 1e-4: the m streams' loss takes more float64 roundings (~1e-15 in all), which a
        # 1e-5 step turns into ~1e-6 of the smallest gradients checked (hc_proj's, hc_bias's);
        # at 1e-4 the curvature's error (step^2) stays below 1e-8
        worst, _ = fd_worst(c, p, x, y, hp, m, e=1e-4)
        ok &= worst < 1e-6
        print(f"finite differences mhc m={m}: worst rel err {worst:.2e}")
        trace = []
        forward(p, x, y, c, hp, trace)
        stochastic = all(torch.allclose(H.sum(-1), torch.ones(1, dtype=H.dtype), atol=1e-14) and
                         torch.allclose(H.sum(-2), torch.ones(1, dtype=H.dtype), atol=1e-14)
                         for H, _, _ in trace)
        trace = []
        forward(init_params(c, "spec", 510 + m), x, y, c, hp, trace)
        near = all((H - torch.eye(m, dtype=H.dtype)).abs().max().item() < math.factorial(m) * math.exp(-8)
                   for H, _, _ in trace)
        favoured = all(bool((a_pre.argmax(-1) == l % m).all() and (a_post.argmax(-1) == l % m).all())
                       for l, (_, a_pre, a_post) in enumerate(trace))
        print(f"  H doubly stochastic: {stochastic}; SPEC init: H near the identity: {near}, "
              f"sub-layer l reads and writes stream l mod m: {favoured}")
        ok &= stochastic and near and favoured
    path = "/tmp/attnres_selftest_mhc.bin"  # header round trip (asserted inside write_state)
    generate(path, tiny(3), 2, "rand", 0.3, 13)
    ok &= check(path, 1e-6)
    return ok


def selftest():
    hp, ok = DEFAULT_HP, True
    tiny = lambda S, L=2, H=2, G=1: cfg(B=2, T=5, V=7, d=8, L=L, H=H, G=G, F=12, S=S)
    for S, L, H, G in [(0, 2, 4, 2), (1, 2, 2, 2), (2, 2, 4, 2), (4, 2, 2, 1), (3, 3, 4, 1),
                       (6, 3, 2, 2)]:
        c = tiny(S, L, H, G)
        p = init_params(c, "rand", 100 + S)
        x, y = make_batch(c, 100 + S, 0.3)
        worst, g = fd_worst(c, p, x, y, hp, S)  # (1) central finite differences
        ok &= worst < 1e-6
        print(f"finite differences S={S} L={L} H={H} G={G}: worst rel err {worst:.2e}")
        if S > 0:  # (2) first sub-layer's pseudo-query/gain get exactly zero gradient
            z = g["res_query"][0].abs().max().item() + g["res_norm"][0].abs().max().item()
            ok &= z == 0.0
            print(f"  grad of res_query[0], res_norm[0]: {z}")
            ps = init_params(c, "spec", 7)
            _, _, gs = loss_and_grads(ps, x, y, c, hp)
            ok &= gs["res_query"][0].abs().max().item() == 0 and gs["res_norm"][0].abs().max() == 0
            trace, mean = [], True
            forward(ps, x, y, c, hp, trace)  # (2) SPEC init: every DA is the exact mean
            for alpha, V, h in trace:
                mean &= bool((alpha == 1.0 / V.shape[0]).all())
                mean &= torch.allclose(h, V.mean(0), rtol=1e-14, atol=1e-17)
            ok &= mean
            print(f"  SPEC init: {len(trace)} depth attentions all exact means: {mean}")
    ok &= selftest_variants(hp)
    ok &= selftest_mhc(hp)
    path = "/tmp/attnres_selftest.bin"  # (3) round-trip + size (asserted inside write_state)
    c, K = tiny(4), 3
    generate(path, c, K, "rand", 0.3, 11)
    ok &= os.path.getsize(path) == file_size(c, K) and check(path, 1e-6)
    print("SELFTEST", "PASSED" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--all", metavar="DIR")
    ap.add_argument("--out", metavar="FILE")
    ap.add_argument("--check", metavar="FILE")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--random", metavar="DIR", help="write --count files random_<seed>.bin, "
                    "seeds --seed, --seed+1, ... (random_case)")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--mode", choices=["none", "full", "block", "mhc"], default="block")
    ap.add_argument("--streams", type=int, default=4, help="--mode mhc: streams m (2 .. 4)")
    for k, v in dict(S=4, B=2, T=7, V=13, d=16, L=2, H=4, G=2, F=32, K=3, seed=0).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--init", choices=["spec", "rand"], default="rand")
    # SPEC's variants (the flags of ./train), for --out
    ap.add_argument("--depth-score", choices=VARIANTS["score"][1], default="softmax")
    ap.add_argument("--key-norm", choices=VARIANTS["key_norm"][1], default="on")
    ap.add_argument("--depth-query", choices=VARIANTS["query"][1], default="static")
    ap.add_argument("--depth-heads", type=int, default=1)
    ap.add_argument("--depth-window", type=int, default=0)
    ap.add_argument("--mixing", choices=VARIANTS["mixing"][1], default="attention")
    ap.add_argument("--ignore", type=float, default=0.2, help="fraction of targets set to -1")
    ap.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                    help="the optimiser of the K replayed steps")
    ap.add_argument("--muon-momentum", type=float, default=0.95)
    a = ap.parse_args()
    if a.selftest:
        sys.exit(0 if selftest() else 1)
    if a.check:
        sys.exit(0 if check(a.check, a.tol) else 1)
    if a.all:
        os.makedirs(a.all, exist_ok=True)
        for name, (c, K, init, ignore, seed) in ALL.items():
            generate(os.path.join(a.all, name + ".bin"), c, K, init, ignore, seed)
        for name, (c, K, init, ignore, seed) in MUON_CASES.items():
            generate(os.path.join(a.all, name + ".bin"), c, K, init, ignore, seed, MUON_HP)
        names = list(ALL) + list(MUON_CASES)
        print("total", sum(os.path.getsize(os.path.join(a.all, n + ".bin")) for n in names), "bytes")
    elif a.random:
        os.makedirs(a.random, exist_ok=True)
        for seed in range(a.seed, a.seed + a.count):
            c, K, init, ignore = random_case(seed)
            generate(os.path.join(a.random, f"random_{seed}.bin"), c, K, init, ignore, seed)
    elif a.out:
        S = {"none": 0, "full": 1, "mhc": 0}.get(a.mode, a.S)
        if a.mode == "block" and S < 2:
            sys.exit("--mode block needs --S >= 2")
        c = cfg(a.B, a.T, a.V, a.d, a.L, a.H, a.G, a.F, S, score=a.depth_score,
                key_norm=a.key_norm, query=a.depth_query, heads=a.depth_heads,
                window=a.depth_window, mixing=a.mixing, streams=a.streams if a.mode == "mhc" else 0)
        hp = DEFAULT_HP if a.optimizer == "adamw" else dict(MUON_HP, mu=a.muon_momentum)
        generate(a.out, c, a.K, a.init, a.ignore, a.seed, hp)
    else:
        ap.print_help()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""attnres.c's safetensors files in PyTorch: read one into dev/check/reference.py's model, run
it, and write one from PyTorch weights (with /usr/bin/python3: torch and numpy, no
safetensors package; the format is simple enough to read with json and numpy).

Usage:
  dev/load_safetensors.py info FILE                      the config and the tensors
  dev/load_safetensors.py forward FILE [--B 2 --T 16 --seed 0] [--state OUT.bin]
      the reference's logits on a random batch, checked against the C forward: writes a
      parity state file (docs/parity.md) from the file's weights and runs ./check_state on it
  dev/load_safetensors.py generate FILE (--prompt TEXT | --prompt-tokens 3,1,4 |
      [--task reverse --length 12 --symbols 16 --seed 1337 --eval-examples 500])
      [--tokens N] [--context T]
      greedy generation, printed as `./train --sample` prints it (the same tokens)
  dev/load_safetensors.py loss FILE --task reverse --length 4 --symbols 8 --batch 8 --seed 7
      [--eval-examples 500] [--text FILE --seq-len 64] [--step 0]
      the loss of the training batch that `./train --init-from FILE` (same data flags)
      trains on at step STEP + 1
  dev/load_safetensors.py write OUT (--from FILE | --init spec|rand --seed N [model flags])
      a safetensors file from PyTorch weights, byte for byte what ./train --export writes:
      --from a safetensors or parity state file, or a fresh reference init (model flags as
      ./train's: --mode --block-size --streams --V --d --L --H --G --F and the variants)
  dev/load_safetensors.py selftest                       the format against hand-made bytes
  dev/load_safetensors.py roundtrip [--quick] [--keep DIR]
      the whole round trip: train text and reversal models in every mode and variant, export,
      forward (check_state) and greedy generation (./train --sample) against PyTorch

The file (docs/safetensors.md): u64 little-endian header length N, N bytes of JSON padded
with spaces to 8 + N = 0 mod 8, then the flat float32 parameter buffer. The JSON holds
__metadata__ (the format, its version and every ModelConfig field as a decimal string),
then one entry per tensor in the parameter buffer's order: a layer's or depth-attention
row's slice of each stacked tensor, named as PyTorch users name them (layers.0.attn.wq.weight,
res.2.query, ...), shaped [out, in].
"""
import argparse, json, math, os, re, shutil, subprocess, sys, tempfile
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check"))
import reference as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT, FORMAT_VERSION = "attnres.c", "1"
# src/model.h's ModelConfig, field by field in struct order
CONFIG_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden",
                 "block_size", "depth_score", "key_norm_off", "depth_query", "depth_heads",
                 "depth_window", "mixing", "streams")
# the C build's constants (src/layers.h); the reference's other hyperparameters only matter
# for the optimiser steps, which a forward check does not replay
HP = {k: float(np.float32(v)) for k, v in ref.DEFAULT_HP.items()}


# ---- names ---------------------------------------------------------------------------------
# a tensor kind's name for row i: (kind, format with {i}); rows are layers for the layer
# tensors, depth-attention rows l for res_*, sub-layers l for hc_*
ROW_NAMES = {
    "attn_norm": "layers.{i}.attn_norm.weight", "wq": "layers.{i}.attn.wq.weight",
    "wk": "layers.{i}.attn.wk.weight", "wv": "layers.{i}.attn.wv.weight",
    "wo": "layers.{i}.attn.wo.weight", "mlp_norm": "layers.{i}.mlp_norm.weight",
    "wg": "layers.{i}.mlp.wg.weight", "wu": "layers.{i}.mlp.wu.weight",
    "wd": "layers.{i}.mlp.wd.weight", "hc_norm": "hc.{i}.norm.weight",
    "hc_proj": "hc.{i}.proj.weight", "hc_bias": "hc.{i}.bias", "hc_scale": "hc.{i}.scale",
    "res_logits": "res.{i}.logits", "res_scalars": "res.{i}.scalars",
    "res_query": "res.{i}.query", "res_norm": "res.{i}.norm.weight",
    "res_qproj": "res.{i}.qproj.weight"}
WHOLE_NAMES = {"wte": "wte.weight", "final_norm": "final_norm.weight",
               "lm_head": "lm_head.weight"}


def layout(c):
    """The file's tensors in order: (name, kind, row or None, shape), from the reference's
    canonical order (the flat parameter buffer's)."""
    out = []
    for kind, shape in ref.shapes(c):
        if kind in WHOLE_NAMES:
            out.append((WHOLE_NAMES[kind], kind, None, list(shape)))
        else:
            out += [(ROW_NAMES[kind].format(i=i), kind, i, list(shape[1:]))
                    for i in range(shape[0])]
    return out


# ---- config ----------------------------------------------------------------------------
def config_of(meta):
    """The reference's config dict from the metadata's ModelConfig fields (B and T: 1)."""
    f = {k: int(meta[k]) for k in CONFIG_FIELDS}
    c = dict(B=1, T=1, V=f["vocab_size"], d=f["d_model"], L=f["n_layers"], H=f["n_heads"],
             G=f["n_kv_heads"], F=f["ffn_hidden"], S=f["block_size"],
             score=ref.VARIANTS["score"][1][f["depth_score"]],
             key_norm=ref.VARIANTS["key_norm"][1][f["key_norm_off"]],
             query=ref.VARIANTS["query"][1][f["depth_query"]],
             heads=max(f["depth_heads"], 1), window=f["depth_window"],
             mixing=ref.VARIANTS["mixing"][1][f["mixing"]], streams=f["streams"])
    return c


def model_config(c):
    """ModelConfig's fields as ./train stores them: one head is 0, a window of W >= 2L is 0
    (full mode), as options.c normalises them."""
    window = 0 if c["S"] == 1 and c["window"] >= 2 * c["L"] else c["window"]
    values = [c["V"], c["d"], c["L"], c["H"], c["G"], c["F"], c["S"],
              ref.VARIANTS["score"][1].index(c["score"]),
              ref.VARIANTS["key_norm"][1].index(c["key_norm"]),
              ref.VARIANTS["query"][1].index(c["query"]),
              0 if c["heads"] == 1 else c["heads"], window,
              ref.VARIANTS["mixing"][1].index(c["mixing"]), c["streams"]]
    return dict(zip(CONFIG_FIELDS, values))


# ---- writing -----------------------------------------------------------------------------
def encode(c, p):
    """The file's bytes for config c and the reference-layout tensors p (name -> stacked
    tensor, as reference.init_params returns them), rounded to float32."""
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION}
    meta.update({k: str(v) for k, v in model_config(c).items()})
    header, data, offset = {"__metadata__": meta}, [], 0
    for name, kind, row, shape in layout(c):
        t = p[kind] if row is None else p[kind][row]
        a = np.ascontiguousarray(t.detach().cpu().numpy(), dtype="<f4")
        assert list(a.shape) == shape, f"{kind}: shape {list(a.shape)}, expected {shape}"
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + a.nbytes]}
        data.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(data)


def write(path, c, p):
    """Writes the file to a temporary name beside path, then renames it (as checkpoints)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(encode(c, p))
    os.replace(tmp, path)


# ---- reading -----------------------------------------------------------------------------
class BadFile(Exception):
    pass


def decode(buf, where="file"):
    """(metadata, config, tensors) of a file's bytes: tensors in the reference's layout
    (stacked per kind, float64 as the reference computes), whatever order the file has them
    in. Raises BadFile naming the problem: a short or unparsable header, another format, a
    missing, extra, misshapen or non-F32 tensor, offsets that overlap, run past the end or
    leave bytes unused, NaN or Inf."""
    if len(buf) < 8:
        raise BadFile(f"{where}: {len(buf)} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(buf[:8], "little")
    if n > len(buf) - 8:
        raise BadFile(f"{where}: header length {n} runs past the end ({len(buf)} bytes)")
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadFile(f"{where}: the header is not JSON ({e})")
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise BadFile(f"{where}: the header has no __metadata__ map")
    meta = header.pop("__metadata__")
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise BadFile(f"{where}: format {meta.get('format')!r} version "
                      f"{meta.get('format_version')!r}, this reads {FORMAT!r} {FORMAT_VERSION!r}")
    missing = [k for k in CONFIG_FIELDS if not re.fullmatch(r"-?[0-9]+", str(meta.get(k, "")))]
    if missing:
        raise BadFile(f"{where}: __metadata__ lacks a decimal {missing[0]}")
    try:
        c = config_of(meta)
    except IndexError:
        raise BadFile(f"{where}: a variant switch in __metadata__ is out of range")
    expected = layout(c)
    names = [name for name, _, _, _ in expected]
    extra = [k for k in header if k not in names]
    absent = [k for k in names if k not in header]
    if extra or absent:
        raise BadFile(f"{where}: " + (f"tensor {extra[0]} is not in this model" if extra
                                      else f"tensor {absent[0]} is missing"))
    data, rows, spans = buf[8 + n:], {}, []
    for name, kind, row, shape in expected:  # the tensors in any order, as the C reader
        e = header[name]
        if not isinstance(e, dict) or e.get("dtype") != "F32" or e.get("shape") != shape:
            e = e if isinstance(e, dict) else {}
            raise BadFile(f"{where}: {name} is {e.get('dtype')} {e.get('shape')}, expected F32 {shape}")
        span = e.get("data_offsets")
        size = 4 * math.prod(shape)
        if (not isinstance(span, list) or len(span) != 2 or not all(type(v) is int for v in span)
                or span[1] - span[0] != size or span[0] < 0):
            raise BadFile(f"{where}: {name}'s data_offsets {span} do not span its {size} bytes")
        if span[1] > len(data):
            raise BadFile(f"{where}: {name} runs past the end of the data ({len(data)} bytes)")
        a = np.frombuffer(data, "<f4", size // 4, span[0]).reshape(shape)
        if not np.isfinite(a).all():
            raise BadFile(f"{where}: {name} holds NaN or Inf")
        rows.setdefault(kind, []).append(torch.from_numpy(a.astype(np.float64)))
        spans.append((span[0], span[1], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise BadFile(f"{where}: {first} and {second} overlap in the data")
    if sum(e - b for b, e, _ in spans) != len(data):
        raise BadFile(f"{where}: the data holds {len(data)} bytes, the tensors "
                      f"{sum(e - b for b, e, _ in spans)}")
    p = {kind: (t[0] if len(t) == 1 and kind in WHOLE_NAMES else torch.stack(t))
         for kind, t in rows.items()}
    return meta, c, p


def load(path):
    """(config, tensors) of a file, in dev/check/reference.py's layout: reference.forward(p,
    x, y, c, HP) runs it."""
    with open(path, "rb") as fh:
        _, c, p = decode(fh.read(), path)
    return c, p


def logits(c, p, tokens):
    """The model's logits (B, T, V), float64, for tokens (B, T)."""
    x = torch.as_tensor(tokens, dtype=torch.long)
    return ref.forward(p, x, torch.full_like(x, -1), dict(c, B=x.shape[0], T=x.shape[1]), HP)[0]


# ---- the data of ./train (data/dataset.c), for the batch a run trains on -----------------
M64, GOLDEN, EVAL_STREAM = (1 << 64) - 1, 0x9E3779B97F4A7C15, 0xE7A1C0DE5EEDF00D


def mix64(z):  # src/rng.h
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Stream:
    """A splitmix64 stream (rng_next)."""
    def __init__(self, state):
        self.state = state & M64

    def next(self):
        self.state = (self.state + GOLDEN) & M64
        return mix64(self.state)


def prompt_hash(prompt):
    h = GOLDEN
    for v in prompt:
        h = mix64((h + v) & M64)
    return h or 1


def task_answer(task, prompt):
    return prompt[::-1] if task == "reverse" else sorted(prompt) if task == "sort" else list(prompt)


class TaskData:
    """dataset_init_task: the held-out prompts (their hashes, which training draws avoid)."""
    def __init__(self, task, length, symbols, n_eval, seed):
        self.task, self.length, self.symbols = task, length, symbols
        self.eval_hashes, self.eval_prompts = set(), []
        stream = Stream(mix64(seed ^ EVAL_STREAM))
        for _ in range(n_eval):
            prompt = self.fresh_prompt(stream)
            self.eval_hashes.add(prompt_hash(prompt))
            self.eval_prompts.append(prompt)
        self.seed = seed

    def fresh_prompt(self, stream):
        while True:
            prompt = [1 + stream.next() % self.symbols for _ in range(self.length)]
            if prompt_hash(prompt) not in self.eval_hashes:
                return prompt

    def train_sequence(self, step, sequence):
        """task_train_sequence: x = prompt, 0, answer[:-1]; y = -1 on the prompt, then the answer."""
        prompt = self.fresh_prompt(Stream(sequence_stream(self.seed, step, sequence)))
        answer = task_answer(self.task, prompt)
        return prompt + [0] + answer[:-1], [-1] * self.length + answer


class TextData:
    """dataset_init_text: the first 90% of the bytes train."""
    def __init__(self, path, T, seed):
        self.text, self.T, self.seed = open(path, "rb").read(), T, seed
        self.n_train = len(self.text) - len(self.text) // 10

    def train_sequence(self, step, sequence):
        start = Stream(sequence_stream(self.seed, step, sequence)).next() % (self.n_train - self.T)
        w = self.text[start:start + self.T + 1]
        return list(w[:-1]), list(w[1:])


def sequence_stream(seed, step, sequence):
    return mix64(mix64(mix64((seed + GOLDEN) & M64) ^ step) ^ sequence)


def train_batch(data, B, step):
    """dataset_train_batch: (x, y) as (B, T) tensors."""
    sequences = [data.train_sequence(step, b) for b in range(B)]
    return torch.tensor([s[0] for s in sequences]), torch.tensor([s[1] for s in sequences])


# ---- greedy generation, as ./train --sample (src/sample.c, src/inference.c) ----------------
def greedy(c, p, prompt, n_new, context):
    """decoder_generate at temperature 0: position q's logits pick token q + 1, the first
    largest; the model sees the last `context` tokens up to q (positions from 0 again once
    the window slides). Returns the tokens and the smallest gap between the two largest
    logits on the way (how near a tie the argmax came)."""
    seq, gap = list(prompt), math.inf
    for q in range(len(prompt) - 1, len(prompt) + n_new - 1):
        window = seq[max(0, q + 1 - context):q + 1]
        row = logits(c, p, [window])[0, -1]
        top2 = torch.topk(row, 2).values if row.numel() > 1 else row
        gap = min(gap, (top2[0] - top2[-1]).item())
        seq.append(int(torch.argmax(row)))  # the first of equal maxima, as sample_token
    return seq[len(prompt):], gap


def sample_text(c, p, a):
    """What `./train --sample` prints for the same flags, and the smallest logit gap."""
    V, is_text = c["V"], c["V"] == 256
    expected = None
    if a.prompt is not None:
        if not is_text:
            raise BadFile(f"--prompt needs a text model (V = 256), this one has V = {V}")
        prompt = list(a.prompt.encode())
    elif a.prompt_tokens is not None:
        prompt = [int(t) for t in a.prompt_tokens.split(",") if re.fullmatch("[0-9]+", t)]
        if len(prompt) != a.prompt_tokens.count(",") + 1 or max(prompt) >= V:
            raise BadFile(f"--prompt-tokens '{a.prompt_tokens}': expected token ids in [0, {V}) "
                          "separated by commas")
    else:  # sample.c task_prompt: the first held-out example's prompt and separator
        data = TaskData(a.task, a.length, a.symbols, a.eval_examples, a.seed)
        prompt = data.eval_prompts[0] + [0]
        expected = task_answer(a.task, data.eval_prompts[0])
        if a.symbols + 1 != V:
            raise BadFile(f"the file has V = {V}, --symbols {a.symbols} gives {a.symbols + 1}")
    n_new = a.tokens if a.tokens > 0 else (256 if is_text else a.length)
    context = a.context if a.context > 0 else (64 if is_text else 2 * a.length)
    out, gap = greedy(c, p, prompt, n_new, context)
    if is_text:
        return bytes(prompt + out) + b"\n", gap
    lines = [("prompt:   ", prompt), ("generated:", out)] + ([("expected: ", expected)]
                                                            if expected else [])
    return "".join(label + "".join(f" {t}" for t in row) + "\n" for label, row in lines).encode(), gap


# ---- the forward against C -----------------------------------------------------------------
def check_forward(c, p, B, T, seed, state, check_state="./check_state"):
    """Writes a parity state file (reference.write_state: the weights, a random batch, the
    reference's logits, loss and gradients, no optimiser step) and runs check_state on it.
    Returns (passed, logits line's max_rel, its tol, check_state's output)."""
    cb = dict(c, B=B, T=T)
    x, y = ref.make_batch(cb, seed, 0.0)
    ref.write_state(state, cb, HP, 0, p, x, y, ref.compute(p, x, y, cb, HP, 0))
    run = subprocess.run([check_state, state], capture_output=True, text=True)
    m = re.search(r"^\s*logits .*max_rel (\S+)\s+spread \S+\s+tol (\S+)", run.stdout, re.M)
    if m is None:
        return False, math.nan, math.nan, run.stdout + run.stderr
    return run.returncode == 0, float(m.group(1)), float(m.group(2)), run.stdout + run.stderr


# ---- selftest: the format against hand-made bytes ------------------------------------------
def selftest():
    """The writer against bytes written out by hand from the format's description, the reader
    on them, a round trip of every mode, and the refusals."""
    ok = True
    # the smallest model: V=2 d=2 L=1 H=G=1 F=2, none; every float its index
    c = ref.cfg(B=1, T=1, V=2, d=2, L=1, H=1, G=1, F=2, S=0)
    p, k = {}, 0
    for kind, shape in ref.shapes(c):
        p[kind] = torch.arange(k, k + math.prod(shape), dtype=torch.float64).reshape(shape)
        k += math.prod(shape)
    meta = ('{"__metadata__":{"format":"attnres.c","format_version":"1","vocab_size":"2",'
            '"d_model":"2","n_layers":"1","n_heads":"1","n_kv_heads":"1","ffn_hidden":"2",'
            '"block_size":"0","depth_score":"0","key_norm_off":"0","depth_query":"0",'
            '"depth_heads":"0","depth_window":"0","mixing":"0","streams":"0"}')
    tensors = [("wte.weight", [2, 2]), ("layers.0.attn_norm.weight", [2]),
               ("layers.0.attn.wq.weight", [2, 2]), ("layers.0.attn.wk.weight", [2, 2]),
               ("layers.0.attn.wv.weight", [2, 2]), ("layers.0.attn.wo.weight", [2, 2]),
               ("layers.0.mlp_norm.weight", [2]), ("layers.0.mlp.wg.weight", [2, 2]),
               ("layers.0.mlp.wu.weight", [2, 2]), ("layers.0.mlp.wd.weight", [2, 2]),
               ("final_norm.weight", [2]), ("lm_head.weight", [2, 2])]
    text, off = meta, 0
    for name, shape in tensors:
        n = 4 * math.prod(shape)
        text += (f',"{name}":{{"dtype":"F32","shape":[{",".join(map(str, shape))}],'
                 f'"data_offsets":[{off},{off + n}]}}')
        off += n
    text += "}"
    text += " " * (-(8 + len(text)) % 8)
    hand = len(text).to_bytes(8, "little") + text.encode() + np.arange(k, dtype="<f4").tobytes()
    same = encode(c, p) == hand
    print(f"writer gives the hand-made bytes ({len(hand)} bytes, header {len(text)}): {same}")
    ok &= same
    _, c2, p2 = decode(hand)
    read = c2 == dict(c, B=1, T=1) and all(torch.equal(p2[n], p[n]) for n in p)
    print(f"reader gives back the config and every tensor: {read}")
    ok &= read
    # every mode and variant: write, read, write again is byte-identical
    for name, (cc, _, init, _, seed) in list(ref.ALL.items()):
        pp = ref.init_params(cc, init, seed)
        b = encode(cc, pp)
        _, c3, p3 = decode(b)
        same = encode(c3, p3) == b and all(torch.equal(p3[n], pp[n]) for n in pp)
        same &= (8 + int.from_bytes(b[:8], "little")) % 8 == 0
        ok &= same
        if not same:
            print(f"round trip {name}: FAIL")
    print(f"round trip write -> read -> write of {len(ref.ALL)} configs byte-identical: {ok}")
    # the tensors in another order (as the safetensors library may write them) read the same
    n = int.from_bytes(hand[:8], "little")
    entries = re.findall(r',("[^"]+":\{[^}]*\})', hand[8:8 + n].decode())
    h = meta + "," + ",".join(entries[::-1]) + "}"
    h += " " * (-(8 + len(h)) % 8)
    _, c4, p4 = decode(len(h).to_bytes(8, "little") + h.encode() + hand[8 + n:])
    same = c4 == c2 and all(torch.equal(p4[k], p[k]) for k in p)
    print(f"reader takes the {len(entries)} tensors in reverse order: {same}")
    ok &= same
    # refusals: each a one-line BadFile

    def patched(old, new):
        h = hand[8:8 + n].decode().replace(old, new, 1)
        h += " " * (-(8 + len(h)) % 8)
        return len(h).to_bytes(8, "little") + h.encode() + hand[8 + n:]

    nan = bytearray(hand)
    nan[8 + n:8 + n + 4] = np.array([np.nan], "<f4").tobytes()
    bad = {"truncated data": hand[:-4], "no header": hand[:5], "length past the end":
           (10 ** 6).to_bytes(8, "little") + hand[8:], "not JSON": patched('{"__metadata__"', '["__metadata__"'),
           "a misnamed tensor": patched(',"lm_head.weight"', ',"lm_head.weightX"'),
           "a missing tensor": patched(',"lm_head.weight":{"dtype":"F32","shape":[2,2],'
                                       '"data_offsets":[152,168]}', ''),
           "wrong dtype": patched('"F32"', '"F16"'), "wrong shape": patched('[2,2]', '[4,1]'),
           "offsets not the tensor's size": patched('[0,16]', '[0,20]'),
           "overlapping offsets": patched('[16,24]', '[8,16]'),
           "bytes after the tensors": hand + bytes(4),
           "another format": patched('"attnres.c"', '"other"'),
           "no config field": patched('"mixing":"0",', ''), "NaN": bytes(nan)}
    for what, b in bad.items():
        try:
            decode(b)
            print(f"refuses {what}: FAIL (read)")
            ok = False
        except BadFile as e:
            print(f"refuses {what}: {e}")
    print("SELFTEST", "PASSED" if ok else "FAILED")
    return ok


# ---- the whole round trip ------------------------------------------------------------------
# name: ./train's model flags (every mode, every variant switch the reference knows)
ROUNDTRIP_CONFIGS = [
    ("none", "--mode none"),
    ("full", "--mode full"),
    ("block_s2", "--mode block --block-size 2"),
    ("block_s4", "--mode block --block-size 4"),
    ("sigmoid", "--mode block --block-size 2 --depth-score sigmoid"),
    ("keynorm_off", "--mode block --block-size 2 --key-norm off"),
    ("query_input", "--mode full --depth-query input"),
    ("heads2", "--mode block --block-size 2 --depth-heads 2"),
    ("window2", "--mode full --depth-window 2"),
    ("static", "--mode full --mixing static"),
    ("dense", "--mode block --block-size 2 --mixing dense"),
    ("all_switches", "--mode block --block-size 2 --depth-score sigmoid --key-norm off "
                     "--depth-query input --depth-heads 2"),
    ("mhc_m2", "--mode mhc --streams 2"),
    ("mhc_m3", "--mode mhc --streams 3"),
    ("mhc_m4", "--mode mhc --streams 4"),
]
TEXT_PROMPT = "The model "
# the round trip's models: small enough that each trains in about a second
ROUNDTRIP_MODEL = ["--d", "32", "--L", "2", "--H", "4", "--G", "2", "--F", "64"]
REVERSE = ["--task", "reverse", "--length", "6", "--symbols", "8", "--eval-examples", "64",
           "--seed", "5"]


def run(cmd):
    """cmd's stdout (bytes); an exception with its error line if it fails."""
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode().strip()}")
    return r.stdout


def csv_losses(diagnostics):
    """The train_loss column of ./train --diagnostics DIR's train.csv (printed %.6g)."""
    with open(os.path.join(diagnostics, "train.csv")) as fh:
        return [float(line.split(",")[1]) for line in fh.readlines()[1:]]


def export_check(train, check_state, work, task, task_flags, name, flags, common):
    """Trains one model, exports it, and compares it loaded in PyTorch with C: the forward
    (check_state), the bytes (the Python writer's against the C writer's) and the greedy
    generation (./train --sample). Returns (line, logits error / tolerance, tokens, gap, ok)."""
    tag = f"{task}_{name}"
    ckpt, st = os.path.join(work, tag + ".ckpt"), os.path.join(work, tag + ".safetensors")
    run([train] + flags.split() + task_flags + common + ["--checkpoint", ckpt])
    run([train, "--export", st, "--checkpoint", ckpt])
    raw = open(st, "rb").read()
    _, c, p = decode(raw, st)
    same_bytes = encode(c, p) == raw
    T = 12 if task == "reverse" else 32
    passed, rel, tol, _ = check_forward(c, p, 2, T, 1, os.path.join(work, tag + ".bin"),
                                        check_state)
    # the task's first held-out prompt and one of our own; text: 256 bytes after a prompt,
    # sliding past T = 32
    prompts = ([[], ["--prompt-tokens", "3,1,4,1,5,2,0"]] if task == "reverse"
               else [["--prompt", TEXT_PROMPT]])
    same, n_tok, gap = True, 0, math.inf
    for extra in prompts:
        c_out = run([train, "--sample", "--checkpoint", ckpt] + extra)
        ns = argparse.Namespace(prompt=None, prompt_tokens=None, task="reverse", length=6,
                                symbols=8, eval_examples=64, seed=5, tokens=0, context=T)
        if extra:
            setattr(ns, extra[0][2:].replace("-", "_"), extra[1])
        py_out, g = sample_text(c, p, ns)
        same &= py_out == c_out
        gap = min(gap, g)
        n_tok += 256 if task == "text" else 6
    line = (f"{tag:24s} {rel:9.2e} {tol:8.1e} {'ok' if passed else 'FAIL':>11s} "
            f"{'same' if same_bytes else 'DIFF':>6s} {n_tok:7d} {'yes' if same else 'NO':>5s} "
            f"{gap:8.2e}")
    return line, rel / tol, n_tok, gap, passed and same and same_bytes


def import_check(train, work, name, flags, threads):
    """Writes a random reference init of the model from PyTorch; ./train --init-from it
    --steps 0 then --export must give the same bytes; 20 steps from it on reversal must start
    at PyTorch's loss of that batch (to 1e-5, check_state's floor; the CSV's 6 digits round
    by at most 2e-6 of a loss above 1) and fall. Returns (line, loss error, ok)."""
    ap = argparse.ArgumentParser()
    model_flags(ap)
    a = ap.parse_args(flags.split() + ["--V", "9"] + ROUNDTRIP_MODEL)
    c = config_from_flags(a)
    p = ref.init_params(c, "rand", 17)
    st, diag = os.path.join(work, f"init_{name}.safetensors"), os.path.join(work, f"init_{name}")
    ckpt, again = os.path.join(work, f"init_{name}.ckpt"), os.path.join(work, f"again_{name}.safetensors")
    write(st, c, p)
    run([train, "--init-from", st, "--steps", "0", "--checkpoint", ckpt] + REVERSE)
    run([train, "--export", again, "--checkpoint", ckpt])
    same_bytes = open(st, "rb").read() == open(again, "rb").read()
    run([train, "--init-from", st] + REVERSE + ["--batch", "16", "--steps", "20",
        "--warmup", "2", "--lr", "0.01", "--log-every", "1", "--eval-every", "20",
        "--threads", str(threads), "--diagnostics", diag])
    losses = csv_losses(diag)
    x, y = train_batch(TaskData("reverse", 6, 8, 64, 5), 16, 0)
    py_loss = ref.forward(p, x, y, dict(c, B=16, T=12), HP)[1].item()
    err = abs(losses[0] - py_loss) / py_loss
    falls = all(map(math.isfinite, losses)) and sum(losses[-5:]) / 5 < losses[0]
    ok = err <= 1e-5 and falls and same_bytes
    line = (f"init_{name:19s} {'same' if same_bytes else 'DIFF':>6s} {py_loss:10.6f} "
            f"{losses[0]:10.6g} {err:9.2e} {sum(losses[-5:]) / 5:11.4f} {'yes' if ok else 'NO':>4s}")
    return line, err, ok


def roundtrip(a):
    """Train, export, load, compare, for every model; then write, import, train; a table and
    a summary line each."""
    text_file = "/usr/share/common-licenses/GPL-3"
    if not os.path.exists(text_file):
        text_file = os.path.join(ROOT, "docs", "walkthrough.md")
    tasks = {"reverse": REVERSE, "text": ["--task", "text", "--text", text_file, "--seq-len",
                                          "32", "--eval-examples", "64", "--seed", "5"]}
    steps = "100" if a.quick else "300"
    common = ROUNDTRIP_MODEL + ["--batch", "16", "--steps", steps, "--warmup", "20", "--lr",
                                "0.01", "--eval-every", steps, "--log-every", steps,
                                "--threads", str(a.threads)]
    work = a.keep or tempfile.mkdtemp(prefix="attnres_roundtrip_")
    os.makedirs(work, exist_ok=True)
    train, check_state = os.path.join(ROOT, "train"), os.path.join(ROOT, "check_state")
    configs = ROUNDTRIP_CONFIGS[:4] + ROUNDTRIP_CONFIGS[-1:] if a.quick else ROUNDTRIP_CONFIGS
    worst, tokens, all_ok, min_gap = 0.0, 0, True, math.inf
    print("export: ./train --export, loaded here; logits on a batch against ./check_state's "
          "C forward,\nthe Python writer's bytes against the C writer's, greedy tokens against "
          "./train --sample")
    print(f"{'model':24s} {'logits':>9s} {'tol':>8s} {'check_state':>11s} {'bytes':>6s} "
          f"{'tokens':>7s} {'same':>5s} {'min gap':>8s}")
    for task, task_flags in tasks.items():
        for name, flags in configs:
            line, ratio, n_tok, gap, ok = export_check(train, check_state, work, task,
                                                      task_flags, name, flags, common)
            print(line, flush=True)
            worst, tokens, all_ok = max(worst, ratio), tokens + n_tok, all_ok and ok
            min_gap = min(min_gap, gap)
    print(f"{2 * len(configs)} models: worst logits error / tolerance {worst:.3f}; {tokens} "
          f"greedy tokens compared, {'all equal' if all_ok else 'NOT ALL EQUAL'}; smallest "
          f"gap between the two largest logits on a greedy path {min_gap:.2e}")
    print("\nimport: a random init written here; ./train --init-from it --steps 0, exported: the "
          "same bytes?\n20 steps from it on reversal: the first loss against PyTorch's loss of "
          "that batch, the mean of the last 5")
    print(f"{'model':24s} {'bytes':>6s} {'PyTorch':>10s} {'./train':>10s} {'error':>9s} "
          f"{'steps 16-20':>10s} {'ok':>4s}")
    worst_loss, imports_ok = 0.0, True
    for name, flags in configs:
        line, err, ok = import_check(train, work, name, flags, a.threads)
        print(line, flush=True)
        worst_loss, imports_ok = max(worst_loss, err), imports_ok and ok
    print(f"{len(configs)} imports: worst first-loss error {worst_loss:.2e} (tolerance 1e-5), "
          f"{'every one trains' if imports_ok else 'NOT ALL OK'}")
    if not a.keep:
        shutil.rmtree(work)
    return all_ok and imports_ok


# ---- command line ------------------------------------------------------------------------
def model_flags(ap):
    ap.add_argument("--mode", choices=["none", "full", "block", "mhc"], default="block")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4)
    for k, v in dict(V=17, d=64, L=4, H=4, G=2, F=176).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--depth-score", choices=ref.VARIANTS["score"][1], default="softmax")
    ap.add_argument("--key-norm", choices=ref.VARIANTS["key_norm"][1], default="on")
    ap.add_argument("--depth-query", choices=ref.VARIANTS["query"][1], default="static")
    ap.add_argument("--depth-heads", type=int, default=1)
    ap.add_argument("--depth-window", type=int, default=0)
    ap.add_argument("--mixing", choices=ref.VARIANTS["mixing"][1], default="attention")


def config_from_flags(a):
    S = {"none": 0, "full": 1, "mhc": 0}.get(a.mode, a.block_size)
    return ref.cfg(B=1, T=1, V=a.V, d=a.d, L=a.L, H=a.H, G=a.G, F=a.F, S=S,
                   streams=a.streams if a.mode == "mhc" else 0, score=a.depth_score,
                   key_norm=a.key_norm, query=a.depth_query, heads=a.depth_heads,
                   window=a.depth_window, mixing=a.mixing)


def data_flags(ap):
    ap.add_argument("--task", choices=["reverse", "copy", "sort", "text"], default="reverse")
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--symbols", type=int, default=16)
    ap.add_argument("--eval-examples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1337)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("info")
    s.add_argument("file")
    s = sub.add_parser("forward")
    s.add_argument("file")
    for k, v in dict(B=2, T=16, seed=0).items():
        s.add_argument("--" + k, type=int, default=v)
    s.add_argument("--state", help="keep the state file here")
    s = sub.add_parser("generate")
    s.add_argument("file")
    s.add_argument("--prompt")
    s.add_argument("--prompt-tokens")
    s.add_argument("--tokens", type=int, default=0, help="0: the answer's length / 256 bytes")
    s.add_argument("--context", type=int, default=0, help="the T trained on (0: 2 * length, "
                   "text 64): ./train --sample reads it from the checkpoint")
    data_flags(s)
    s = sub.add_parser("loss")
    s.add_argument("file")
    data_flags(s)
    s.add_argument("--text")
    s.add_argument("--seq-len", type=int, default=64)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--step", type=int, default=0)
    s = sub.add_parser("write")
    s.add_argument("out")
    s.add_argument("--from", dest="source", help="a .safetensors file or a parity state file")
    s.add_argument("--init", choices=["spec", "rand"], default="spec")
    s.add_argument("--seed", type=int, default=0, help="torch's seed for --init")
    model_flags(s)
    sub.add_parser("selftest")
    s = sub.add_parser("roundtrip")
    s.add_argument("--quick", action="store_true", help="5 configs, 100 steps")
    s.add_argument("--keep", metavar="DIR", help="keep the checkpoints and files in DIR")
    s.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    try:
        if a.command == "selftest":
            sys.exit(0 if selftest() else 1)
        if a.command == "roundtrip":
            sys.exit(0 if roundtrip(a) else 1)
        if a.command == "write":
            if a.source is None:
                c = config_from_flags(a)
                p = ref.init_params(c, a.init, a.seed)
            elif a.source.endswith(".safetensors"):
                c, p = load(a.source)
            else:
                c, _, _, p, _, _, _ = ref.read_state(a.source)
            write(a.out, c, p)
            print(f"{a.out}: {os.path.getsize(a.out)} bytes, "
                  f"{sum(t.numel() for t in p.values())} parameters")
            return
        with open(a.file, "rb") as fh:
            meta, c, p = decode(fh.read(), a.file)
        if a.command == "info":
            print(" ".join(f"{k}={v}" for k, v in meta.items()))
            for name, kind, row, shape in layout(c):
                print(f"  {name:32s} {shape}")
        elif a.command == "forward":
            state = a.state or tempfile.mktemp(suffix=".bin")
            passed, rel, tol, out = check_forward(c, p, a.B, a.T, a.seed, state,
                                                  os.path.join(ROOT, "check_state"))
            print(out, end="")
            print(f"logits: max_rel {rel:.2e} against tol {tol:.1e}: {'ok' if passed else 'FAIL'}")
            if not a.state:
                os.remove(state)
            sys.exit(0 if passed else 1)
        elif a.command == "generate":
            out, gap = sample_text(c, p, a)
            sys.stdout.buffer.write(out)
            print(f"(smallest gap between the two largest logits: {gap:.3e})", file=sys.stderr)
        elif a.command == "loss":
            data = (TextData(a.text, a.seq_len, a.seed) if a.task == "text" else
                    TaskData(a.task, a.length, a.symbols, a.eval_examples, a.seed))
            x, y = train_batch(data, a.batch, a.step)
            loss = ref.forward(p, x, y, dict(c, B=x.shape[0], T=x.shape[1]), HP)[1]
            print(f"{loss.item():.9g}")
    except (BadFile, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()

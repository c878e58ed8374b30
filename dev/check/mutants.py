#!/usr/bin/env python3
"""mutants.py — a mutation study of the backward passes (`make mutants`).

Do the gradient tests notice when one piece of a backward is missing? For every backward
function in src/ (a name ending in _backward or _backward_naive, adamw_update, muon_update, muon_matrix and
newton_schulz) this script makes mutants, each
the source with one piece taken out:
  - one term dropped from an accumulation (`+=`, `-=`), or from an assignment or a float
    initialisation whose right-hand side is a sum of several terms (`m[i] = beta1 * m[i]
    + (1 - beta1) * g` gives two), or from a sum in parentheses inside one (`(1 - beta1)`
    gives two more); dropping the only term of a `+=` / `-=` deletes the statement;
  - one call statement deleted (a layer's backward called by model.c, a matmul of
    linear_backward, the zeroing of a gradient buffer, ...), except calls that only free
    memory or report an error (SKIPPED_CALLS).
Each mutant is compiled in a scratch copy of the repository and judged by the tests of its
file (TESTS): a failing, crashing or hanging test kills it; a mutant that passes every test
survives, and names a term the tests cannot see (or an equivalent mutant: one that computes the
same thing). Prints `file: killed K / total T` per file and names every survivor.

With --cuda the same is done to the CUDA kernels (cuda/*.cu): every function of a kernel
file (kernels, device helpers, launchers) gets those mutants, a deleted __syncthreads() or
__syncwarp() among them, and is judged by its agreement tests under the emulator
(./test_cuda_emu) in both thread orders (CUDA_TESTS).

With --shape RxTxK (--cuda) the kernels are built with the depth attention's block shape
DEPTH_ROWS x ROW_THREADS x DEPTH_COLS (DEPTH_SHAPES in dev/infra/gpu.mk) instead of the default:
the code of a thread's later column groups runs only with DEPTH_COLS > 1.

usage: python3 dev/check/mutants.py [--cuda [--shape 4x64x4]] [--files rmsnorm.c,model.c] [--list]
                              [--fail-on-survivor]
The working tree is never written: the mutants live in a temporary copy, removed at the end
(also on Ctrl-C).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is in dev/check/)

# ---------------------------------------------------------------------------------------
# Which tests judge which file. Doctest test-case filters (wildcards, case-insensitive) for
# ./test_attnres; model.c is also compared with the PyTorch state files by ./check_state.

ACCUMULATES = "every backward accumulates*"  # the += contract of every layer's backward
TESTS = {
    "adamw.c": ["*adamw*", "weight decay*"],
    "attention.c": ["attention *", ACCUMULATES],
    "crossentropy.c": ["crossentropy*", ACCUMULATES],
    "depth_attention.c": ["*depth attention*", ACCUMULATES],
    # attnres_input_backward, the model's one call for every AttnRes operator (the default's
    # branch too), is judged by the whole-model gradients in every mode and every variant
    "depth_variants.c": ["variant depth attention*", "static mixing and DenseFormer*",
                         "whole-model gradients*"],
    "embedding.c": ["embedding*", ACCUMULATES],
    "linear.c": ["linear*", ACCUMULATES],
    # the finite differences run one backward on a fresh model, where every buffer is still
    # zero; a second backward on the same model (the bit-identical test) sees a missing zeroing
    "mhc.c": ["*mHC-lite*", "the permutation table*"],
    "model.c": ["whole-model gradients*", "forward and backward are bit-identical*"],
    # Muon's step and its Newton-Schulz iteration, against SPEC's step in double
    "muon.c": ["*Newton-Schulz*", "*Muon*"],
    "rmsnorm.c": ["rmsnorm*", ACCUMULATES],
    "rope.c": ["rope*", ACCUMULATES],
    "swiglu.c": ["swiglu*", ACCUMULATES],
    # trainer_backward calls model_backward's parts: without them the loss stays where it
    # starts, or the step's gradients are not model_backward's
    "trainer.c": ["training lowers the loss*", "--microbatches: M parts*"],
    # the schedule, the bytes and the shares; then the pipelines themselves (SHELL_TESTS)
    "pipeline.c": ["pipeline_*", "the bytes that travel*", "a chunk holds its share*"],
}
# Beyond the backward functions (TARGET_FUNCTION), the functions of a file that are mutated:
# the pipeline's sends, receives and cache bookkeeping, what zeroes the model's carried
# gradients, and the attention's forward (its lse is what the backward recomputes from)
EXTRA_TARGETS = {
    "pipeline.c": {"first_travelling", "last_received", "pipeline_floats_into", "bind",
                   "travelling", "send_buffers", "receive", "chunk_forward", "place_in_whole",
                   "gather_whole", "pipeline_loss_and_norm", "pipeline_step"},
    "model.c": {"model_zero_carried", "model_zero_carried_buffers"},
    # the forward's online softmax: each key tile's part and its merge into the running one
    "attention.c": {"attention_forward", "attention_query_online", "tile_part"},
}
# Test commands (run in the scratch copy) beyond the doctest filters, and the binaries they
# need built: the pipeline under mpirun against one process (tests/mpi_tests.sh)
SHELL_TESTS = {
    "pipeline.c": [["bash", "-c", "source tests/mpi_tests.sh && export TEST_DIR=$(mktemp -d) && "
                                  "mpi_pipeline_judge; status=$?; rm -rf \"$TEST_DIR\"; exit $status"]],
}
SHELL_BUILDS = {"pipeline.c": ["build/train_mpi", "build/compare_checkpoints"]}
CHECK_STATE_FILES = {"model.c"}
# The CUDA files (--cuda: cuda/*.cu, and the .cuh headers that define functions): their
# agreement tests in ./test_cuda_emu (run in forward and in reverse thread order: a missing
# barrier may show in one order only). A new kernel file needs its line here;
# CUDA_NOT_MUTATED hold no layer arithmetic (the whole-model tests cover them; trainer.cu,
# the step's calls, tests/run_all.sh's emulated ./train_cuda against ./train).
CUDA_NOT_MUTATED = {"model.cu", "distributed.cu", "trainer.cu"}
CUDA_TESTS = {
    "adamw.cu": ["adamw update*", "global gradient norm*"],
    "attention.cu": ["attention forward and backward*"],
    # (add_column_sums_cuda: mHC-lite's dbeta and dsigma, the many-head variants' dq and dg;
    # the CUDA graphs' capture, walk and replay: the emulator's graph tests)
    "common.cu": ["rmsnorm*", "static mixing*", "mHC-lite's operators*", "stream capture*",
                  "a captured CUDA graph*", "the step as CUDA graphs*"],
    # the shared device helpers: warp sums and maxima (RMSNorm, attention, both depth
    # attentions), 16-byte loads and stores (the matmul)
    "common.cuh": ["rmsnorm*", "attention forward and backward*", "linear*",
                   "depth attention forward and backward*"],
    "crossentropy.cu": ["crossentropy*"],
    # (its naive kernels first; and the variants and the mixings, which add their parameters'
    # gradients with its sum of parts, alone and, in the whole model, fused with their norm)
    "depth_attention.cu": ["the naive one-thread-per-row depth attention*",
                           "depth attention forward and backward*", "depth attention with*",
                           "depth attention variants*", "static mixing*", "DenseFormer*",
                           "the whole model on the GPU matches the CPU*"],
    # the fast kernels' row steps, the default operator's and the one-head variants'
    "depth_rows.cuh": ["depth attention forward and backward*", "depth attention with*",
                       "depth attention variants*", "static mixing*", "DenseFormer*"],
    "depth_sources.cuh": ["depth attention forward and backward*", "depth attention variants*"],
    # (and attnres_input_forward_cuda / _backward_cuda, the model's one call for any operator)
    "depth_variants.cu": ["depth attention variants*", "static mixing*", "DenseFormer*",
                          "the whole model on the GPU matches the CPU*"],
    "embedding.cu": ["embedding*"],
    # (and matmul_add_cuda, Newton-Schulz's product with a right operand as it is)
    "linear.cu": ["linear*", "the Muon step on the GPU*"],
    "mhc.cu": ["mHC-lite's operators*", "mHC-lite on the GPU: with every stream equal*"],
    "muon.cu": ["the Muon step on the GPU*", "Muon steps of the whole model*"],
    "rmsnorm.cu": ["rmsnorm*"],
    "rope.cu": ["rope*", "the one-read-back training step*"],  # the latter: steps allocate nothing
    "swiglu.cu": ["swiglu*"],
}
# functions the emulator never runs: the cuBLAS path
CUDA_SKIPPED_FUNCTIONS = {"matmul_use_cublas", "linear_use_cublas_cuda"}
# statements that only wait for the GPU (cudaStreamSynchronize, ...: the emulator runs every
# launch and copy to completion when it is made, so a missing wait cannot show there; on a GPU
# the agreement tests and compute-sanitizer can), only free device memory (as `free` above),
# only report an error (check_source_count: too many sources for a launch's parameters, as
# `exit` above), or ask which device is current (cudaGetDevice into a `device = 0`: the same
# on one device, the only kind the tests have)
CUDA_SKIPPED_STATEMENT = re.compile(r"\bcuda\w*Synchronize\b|\bcudaFree(?:Host)?\b"
                                    r"|\bcheck_source_count\b|\bcudaGetDevice\b")
TEST_TIMEOUT_S = 120  # per test command: a mutant that hangs longer is killed

# ---------------------------------------------------------------------------------------
# Reading C: just enough to find statements and the terms of a sum.

TARGET_FUNCTION = re.compile(r"\w+_backward(?:_naive)?|adamw_update|muon_update|muon_matrix|newton_schulz")
# calls that are no part of the arithmetic: deleting one only leaks or skips an error report.
# (Zeroing calls such as K->zero(a->dxn, ...) are mutated: the gradient buffers are reused
# across sub-layers and steps, so a missing zeroing leaves stale gradient in them.)
SKIPPED_CALLS = {"free", "fprintf", "exit"}
# what may precede the name of a declared scalar we mutate (`const float x = a + b;`)
FLOAT_DECLARATION_WORDS = {"const", "static", "register", "volatile", "float", "double"}
# words that can open a cast, so that `(float)-x` reads as a cast of -x
CAST_WORDS = {"const", "float", "double", "int", "long", "short", "char", "unsigned",
              "signed", "size_t"}
# at the top level of a right-hand side these make it something other than a sum
NOT_A_SUM = {"?", ":", ",", "=", "<", ">", "<=", ">=", "==", "!=", "&&", "||"}
ASSIGNMENTS = {"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="}

# comments, string and character literals, and preprocessor lines (#pragma omp ...)
NON_CODE = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'"""
                      r"""|^[ \t]*\#(?:\\\n|[^\n])*""", re.S | re.M)
TOKEN = re.compile(r"""
    (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFlLuU]*)  # 1e-6f is one token
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<op>->|\+\+|--|<<=|>>=|<<|>>|&&|\|\||[-+*/%&|^!=<>]=|[^\s\w])
""", re.X)
CONTROL = re.compile(r"\s*(?:(?:for|if|while|switch)\s*(?=\()|else\b|do\b)")


def blank_non_code(text):
    """text with comments, literals and preprocessor lines turned into spaces (newlines kept),
    so that every offset into it is the same offset into the original."""
    return NON_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


@dataclass
class Token:
    kind: str  # number, ident or op
    text: str
    start: int  # offsets into the file
    end: int


def tokenize(code, start, end):
    return [Token(m.lastgroup, m.group(), m.start(), m.end())
            for m in TOKEN.finditer(code, start, end)]


def matching_close(code, i):
    """Offset of the bracket that closes the one at code[i]."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] in "([{":
            depth += 1
        elif code[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced bracket at offset {i}")


# a definition's name: the word before the parameter list that ends the header, parentheses
# inside it one level deep (`float (*sums)[N]`); so not __launch_bounds__(...) before the name
FUNCTION_HEADER = re.compile(r"(\w+)\s*\([^{};()]*(?:\([^{};()]*\)[^{};()]*)*\)\s*$")


def target_functions(code, every=False, extra=frozenset()):
    """(name, body_start, body_end) of every top-level definition of a backward function (and
    of those named in extra), or with `every` of every function (a CUDA file's kernels,
    helpers and launchers)."""
    found, header_start, i = [], 0, 0
    while i < len(code):
        if code[i] == "{":
            close = matching_close(code, i)
            header = FUNCTION_HEADER.search(code[header_start:i])
            if header and ((TARGET_FUNCTION.fullmatch(header.group(1)) or header.group(1) in extra)
                           if not every else header.group(1) not in CUDA_SKIPPED_FUNCTIONS):
                found.append((header.group(1), i + 1, close))
            i = header_start = close + 1
        else:
            if code[i] == ";":
                header_start = i + 1
            i += 1
    return found


def statements(code, start, end):
    """(start, end) of every simple statement of a body, end at its `;`, with any control
    header in front of it (for (...), if (...), else) left out. Statements may span lines."""
    spans, depth, s = [], 0, start
    for i in range(start, end):
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c in "{}":
            s = i + 1  # what came before was a control header, or a block just ended
        elif depth == 0 and c == ";":
            while (m := CONTROL.match(code, s, i)):
                s = m.end()
                if code[s] == "(":
                    s = matching_close(code, s) + 1
            spans.append((s, i))
            s = i + 1
    return spans


def top_level(tokens):
    """The depth (in parentheses and brackets) of every token."""
    depths, depth = [], 0
    for t in tokens:
        if t.text in ")]":
            depth -= 1
        depths.append(depth)
        if t.text in "([":
            depth += 1
    return depths


def is_binary(tokens, i):
    """Whether the + or - at tokens[i] adds or subtracts (rather than sets a sign)."""
    if i == 0:
        return False
    prev = tokens[i - 1]
    if prev.kind == "number" or prev.text == "]":
        return True
    if prev.kind == "ident":
        return prev.text not in {"return", "sizeof", "case"}
    if prev.text == ")":  # a parenthesised operand, unless it is a cast
        j = i - 1
        depth = 0
        while True:
            depth += {")": 1, "(": -1}.get(tokens[j].text, 0)
            if depth == 0:
                break
            j -= 1
        inner = tokens[j + 1:i - 1]
        return not (inner and inner[0].text in CAST_WORDS
                    and all(t.kind == "ident" or t.text == "*" for t in inner))
    return False


def sum_terms(tokens):
    """The terms of a sum as (operator or None, first token, last token) index triples, or
    None when the expression is not a plain sum at its top level."""
    terms, first, op = [], 0, None
    for i, (t, depth) in enumerate(zip(tokens, top_level(tokens))):
        if depth > 0:
            continue
        if t.text in NOT_A_SUM:
            return None
        if t.text in "+-" and is_binary(tokens, i):
            terms.append((op, first, i - 1))
            op, first = i, i + 1
    terms.append((op, first, len(tokens) - 1))
    return terms


# ---------------------------------------------------------------------------------------
# Mutants.

@dataclass
class Mutant:
    file: str      # src/xxx.c
    line: int
    function: str
    action: str    # what was taken out, e.g. drop "- correction * x[c]"
    source: str    # the whole mutated file

    def name(self):
        return f"{self.file}:{self.line} {self.function}: {self.action}"


def shown(text, limit=80):
    """One line of code for a report: whitespace collapsed, long calls cut short."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def statement_mutants(path, source, code, function, s, e):
    """The mutants of the statement code[s:e] (e at its `;`)."""
    tokens = tokenize(code, s, e)
    if not tokens:
        return []
    line = source.count("\n", 0, tokens[0].start) + 1
    depths = top_level(tokens)

    def mutant(action, cut_from, cut_to):
        return Mutant(path, line, function, action, source[:cut_from] + source[cut_to:])

    delete = mutant(f'delete "{shown(source[tokens[0].start:e])};"', tokens[0].start, e)
    assign = next((i for i, t in enumerate(tokens) if depths[i] == 0 and t.text in ASSIGNMENTS),
                  None)
    if assign is None:
        # a call statement: name(...) or K->name(...), the whole statement
        callee = 0
        while callee + 2 < len(tokens) and tokens[callee + 1].text in {"->", "."}:
            callee += 2
        is_call = (tokens[callee].kind == "ident" and callee + 1 < len(tokens)
                   and tokens[callee + 1].text == "("
                   and matching_close(code, tokens[callee + 1].start) == tokens[-1].start)
        if (is_call and tokens[callee].text not in SKIPPED_CALLS
                and not (is_cuda(path) and CUDA_SKIPPED_STATEMENT.search(source[s:e]))):
            return [delete]
        return []
    op = tokens[assign].text
    if op not in {"=", "+=", "-="}:
        return []
    left = tokens[:assign]
    if len(left) > 1 and left[0].kind == "ident" and (left[1].kind == "ident"
                                                      or left[1].text == "*"):
        # a declaration (two words, or a word and a *, before the =): only a float or
        # double scalar holds gradient arithmetic, a pointer or an index does not
        words = [t.text for t in left[:-1]]
        if not (all(t.kind == "ident" for t in left) and set(words) <= FLOAT_DECLARATION_WORDS
                and set(words) & {"float", "double"}):
            return []
    right = tokens[assign + 1:]
    terms = sum_terms(right)
    found = []
    if terms is not None and len(terms) == 1 and op != "=":
        found.append(delete)  # dropping the only term of an accumulation
    elif terms is not None and len(terms) > 1:
        found += drop_term_mutants(right, terms, source, mutant)
    # the sums inside parentheses too: `s * (w * dy - x * correction)` loses either term
    for open_index, close_index in parenthesised_groups(right):
        inner = right[open_index + 1:close_index]
        inner_terms = sum_terms(inner)
        if inner_terms is not None and len(inner_terms) > 1:
            found += drop_term_mutants(inner, inner_terms, source, mutant)
    return found


def parenthesised_groups(tokens):
    """(open, close) token indices of every parenthesised sub-expression: not the argument
    list of a call (a name before the parenthesis) and not a cast."""
    groups, stack = [], []
    for i, t in enumerate(tokens):
        if t.text == "(":
            stack.append(i)
        elif t.text == ")" and stack:
            j = stack.pop()
            is_call = j > 0 and (tokens[j - 1].kind == "ident" or tokens[j - 1].text == "]")
            inner = tokens[j + 1:i]
            is_cast = bool(inner) and inner[0].text in CAST_WORDS and all(
                u.kind == "ident" or u.text == "*" for u in inner)
            if not is_call and not is_cast:
                groups.append((j, i))
    return groups


def drop_term_mutants(tokens, terms, source, mutant):
    """One mutant per term of the sum `tokens` (terms from sum_terms), without that term."""
    found = []
    for k, (op_index, first, last) in enumerate(terms):
        if k > 0:  # "a + b - c" without "- c": cut from the end of the term before
            shown_from = tokens[op_index].start
            found.append(mutant(f'drop "{shown(source[shown_from:tokens[last].end])}"',
                                tokens[op_index - 1].end, tokens[last].end))
        else:  # without "a": cut up to the next term, keeping its sign if it is a minus
            following = tokens[terms[1][0]]
            cut_to = tokens[terms[1][1]].start if following.text == "+" else following.start
            found.append(mutant(f'drop "{shown(source[tokens[first].start:tokens[last].end])}"',
                                tokens[first].start, cut_to))
    return found


def is_cuda(path):
    return path.startswith("cuda/")


def file_mutants(path):
    """Every mutant of the backward functions in the file (path relative to the root), or of
    every function of a CUDA file."""
    source = (ROOT / path).read_text()
    code = blank_non_code(source)
    found = []
    extra = EXTRA_TARGETS.get(Path(path).name, frozenset())
    for function, start, end in target_functions(code, every=is_cuda(path), extra=extra):
        for s, e in statements(code, start, end):
            found += statement_mutants(path, source, code, function, s, e)
    return found


# ---------------------------------------------------------------------------------------
# Running: a scratch copy of the repository, built once, then one mutant at a time.

def commands_for(path, scratch):
    """The test commands that judge a mutant of path, fastest first."""
    name = Path(path).name
    if is_cuda(path):
        tests = "--test-case=" + ",".join(CUDA_TESTS[name])
        return [["env", f"CUDA_EMU_ORDER={order}", "./test_cuda_emu", "--abort-after=1", tests]
                for order in ("forward", "reverse")]
    commands = []
    if name in CHECK_STATE_FILES:
        commands += [["./check_state", str(p.relative_to(scratch))]
                     for p in sorted((scratch / "tests" / "data").glob("*.bin"))]
    commands.append(["./test_attnres", "--abort-after=1", "--test-case=" + ",".join(TESTS[name])])
    return commands + SHELL_TESTS.get(name, [])


def fail(message):
    """A setup error (not a mutant's verdict): exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run(command, scratch, timeout=None):
    """Run a command in the scratch copy; (exit status, stdout and stderr). It runs in a
    process group of its own, so that a timeout or an interruption kills everything it
    started (make's compilers, test threads) before the scratch copy is removed. An outer
    make's job server (MAKEFLAGS from `make mutants`) is not passed on: its pipes are not."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS"}}
    with subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except BaseException:  # the timeout, Ctrl-C, SIGTERM
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return process.returncode, output


def copy_repository(scratch):
    """Copy the working tree's files that git tracks or would track (not build outputs)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():  # a tracked file deleted in the tree is skipped
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, scratch / name)


def emulator_flags_without_werror(scratch, shape):
    """The Makefile's EMU_FLAGS less -Werror: a mutant that leaves a variable unset (a deleted
    load) only warns, and is judged by the tests like any other. With a shape (R, T, K), the
    depth attention's block shape as -D switches."""
    found = re.search(r"^EMU_FLAGS\s*=(.*)$", (scratch / "Makefile").read_text(), re.M)
    if found is None:
        fail("no EMU_FLAGS line in the Makefile")
    flags = [f for f in found.group(1).split() if f != "-Werror"]
    if shape is not None:
        flags += [f"-D{name}={value}"
                  for name, value in zip(("DEPTH_ROWS", "ROW_THREADS", "DEPTH_COLS"), shape)]
    return "EMU_FLAGS=" + " ".join(flags)


def build(scratch, cuda, shape=None, files=()):
    """Build the test binaries (of the CUDA files, or of src/, with what SHELL_TESTS of files
    need); (ok, compiler output)."""
    targets = ([emulator_flags_without_werror(scratch, shape), "test_cuda_emu"] if cuda
               else ["test_attnres", "all"])  # all: ./train (the CLI tests) and ./check_state
    for path in files:
        targets += SHELL_BUILDS.get(Path(path).name, [])
    status, output = run(["make", f"-j{os.cpu_count() or 2}", "--no-print-directory", *targets],
                         scratch)
    return status == 0, output


def first_failure(scratch, commands):
    """None if every command passes, else which check failed and how: the state file, or
    the first doctest test case that failed (--abort-after=1 stops there)."""
    for command in commands:
        is_state = command[0] == "./check_state"
        check = (f"check_state {Path(command[1]).name}" if is_state else
                 f"test_cuda_emu ({command[1]})" if command[0] == "env" else
                 "the MPI tests (SHELL_TESTS)" if command[0] == "bash" else "test_attnres")
        try:
            status, output = run(command, scratch, TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{check}: timed out after {TEST_TIMEOUT_S} s"
        if status < 0:
            return f"{check}: crashed (signal {-status})"
        if status != 0:
            failed = re.search(r"TEST CASE:\s+(.*)", output)
            if failed:
                return f'test "{shown(failed.group(1), 60)}"'
            return f"{check}: exit {status}"
    return None


def check_baseline(scratch, files):
    """The unmutated copy must pass every command, and every doctest filter must select a
    test (a filter that matches nothing would let every mutant survive)."""
    for path in files:
        for command in commands_for(path, scratch):
            status, output = run(command, scratch, TEST_TIMEOUT_S)
            if status != 0:
                fail(f"the unmutated tree fails {' '.join(command)}:\n{output}")
            binary = next((c for c in command if c in {"./test_attnres", "./test_cuda_emu"}), None)
            if binary is not None:
                for pattern in command[-1].split("=", 1)[1].split(","):
                    _, listed = run([binary, "--list-test-cases", "--test-case=" + pattern],
                                    scratch)
                    if "passing the current filters: 0" in listed:
                        fail(f"the test filter '{pattern}' for {path} selects no test")


def run_study(files, mutants, shape=None):
    """Judge every mutant; returns {file: (killed list, survivor list, stillborn list)}."""
    results = {path: ([], [], []) for path in files}
    scratch = Path(tempfile.mkdtemp(prefix="attnres-mutants-"))
    try:
        copy_repository(scratch)
        started = time.monotonic()
        cuda = any(is_cuda(path) for path in files)
        print(f"building the unmutated copy in {scratch} ...", flush=True)
        ok, output = build(scratch, cuda, shape, files)
        if not ok:
            fail(f"the unmutated tree does not build:\n{output}")
        check_baseline(scratch, files)
        print(f"built and checked in {time.monotonic() - started:.0f} s; "
              f"{len(mutants)} mutants", flush=True)
        width = len(str(len(mutants)))
        number = 0
        for path in files:
            original = (scratch / path).read_text()
            commands = commands_for(path, scratch)
            for m in (m for m in mutants if m.file == path):
                number += 1
                print(f"[{number:{width}}/{len(mutants)}] {m.name()} ... ", end="", flush=True)
                (scratch / path).write_text(m.source)
                ok, output = build(scratch, cuda, shape, files)
                if not ok:  # a mutant the parser got wrong: show the compiler's complaint
                    results[path][2].append(m)
                    error = next((l for l in output.splitlines() if "error:" in l), "")
                    print(f"DID NOT COMPILE: {error}", flush=True)
                    continue
                failure = first_failure(scratch, commands)
                if failure is None:
                    results[path][1].append(m)
                    print("SURVIVED", flush=True)
                else:
                    results[path][0].append(m)
                    print(f"killed by {failure}", flush=True)
            (scratch / path).write_text(original)  # recompiled by the next file's first build
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def report(results, seconds, what):
    """The per-file table, the survivors named, and the total."""
    print(f"\n== mutation study of {what} ({seconds / 60:.1f} min)")
    total_killed = total = survivors = 0
    for path, (killed, survived, stillborn) in results.items():
        n = len(killed) + len(survived)
        note = f"  ({len(stillborn)} did not compile)" if stillborn else ""
        print(f"{path}: killed {len(killed)} / {n}{note}")
        for m in survived:
            print(f"    SURVIVED  {m.name()}")
        for m in stillborn:
            print(f"    NOT BUILT {m.name()}")
        total_killed += len(killed)
        total += n
        survivors += len(survived)
    print(f"total: killed {total_killed} / {total}, {survivors} survived")
    return survivors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuda", action="store_true",
                        help="the CUDA kernels (cuda/*.cu) under the emulator instead of src/")
    parser.add_argument("--shape", help="--cuda: the depth attention's block shape RxTxK "
                        "(DEPTH_ROWS x ROW_THREADS x DEPTH_COLS, e.g. 4x64x4)")
    parser.add_argument("--files", help="only these files, comma separated (rmsnorm.c,model.c)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--fail-on-survivor", action="store_true",
                        help="exit 1 if any mutant survives")
    args = parser.parse_args()
    shape = None
    if args.shape is not None:
        found = re.fullmatch(r"(\d+)x(\d+)x(\d+)", args.shape)
        if not args.cuda or found is None:
            fail(f"--shape {args.shape}: expected RxTxK (e.g. 4x64x4), with --cuda")
        shape = tuple(int(v) for v in found.groups())

    # the files with a backward function (each needs its tests in TESTS), or the CUDA files
    # with layer arithmetic (CUDA_TESTS)
    if args.cuda:
        folder, tests, table = "cuda", CUDA_TESTS, "CUDA_TESTS"
        files = [f"cuda/{p.name}" for p in sorted((ROOT / "cuda").glob("*.cu"))
                 if p.name not in CUDA_NOT_MUTATED]
        files += [f"cuda/{p.name}" for p in sorted((ROOT / "cuda").glob("*.cuh"))
                  if target_functions(blank_non_code(p.read_text()), every=True)]
    else:
        folder, tests, table = "src", TESTS, "TESTS"
        files = [f"src/{p.name}" for p in sorted((ROOT / "src").glob("*.c"))
                 if target_functions(blank_non_code(p.read_text()),
                                     extra=EXTRA_TARGETS.get(p.name, frozenset()))]
    unmapped = [p for p in files if Path(p).name not in tests]
    if unmapped:
        fail(f"no tests for {', '.join(unmapped)}: add them to {table} in dev/check/mutants.py")
    if args.files:
        wanted = [f"{folder}/{Path(name.strip()).name}" for name in args.files.split(",")]
        unknown = [p for p in wanted if p not in files]
        if unknown:
            fail(f"no backward function in {', '.join(unknown)} "
                     f"(files: {', '.join(Path(p).name for p in files)})")
        files = [p for p in files if p in wanted]

    mutants = [m for path in files for m in file_mutants(path)]
    if args.list:
        for m in mutants:
            print(m.name())
        print(f"{len(mutants)} mutants in {len(files)} files")
        return 0
    started = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill cleans up as Ctrl-C does
    try:
        results = run_study(files, mutants, shape)
    except KeyboardInterrupt:
        print("\ninterrupted: the scratch copy is removed; the working tree was never written",
              file=sys.stderr)
        return 130
    what = "the backward passes"
    if args.cuda:
        what = "the CUDA kernels (emulated" + (f", shape {args.shape})" if shape else ")")
    survivors = report(results, time.monotonic() - started, what)
    return 1 if args.fail_on_survivor and survivors else 0


if __name__ == "__main__":
    sys.exit(main())

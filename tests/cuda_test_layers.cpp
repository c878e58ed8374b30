// cuda_test_layers.cpp — every CUDA kernel of cuda/ but the depth attention's
// (cuda_test_depth.cpp), forward and backward, against its CPU twin in src/ on random inputs.
// Built by g++ with tests/cuda_emu.h (no GPU needed; nvcc builds it for build/test_cuda_gpu): every
// CUDA computation runs twice, with the emulator's threads resumed in forward and in reverse
// order, and the two results must agree bit for bit (a race, or an order-dependent sum, shows)
// before the forward-order result is compared with the CPU.
//
// Backward buffers start from random values on both sides, so the checks also prove that
// the kernels accumulate (+=) as layers.h demands.
//
// Tolerances |cuda - cpu| <= atol + rtol * |cpu| (inputs O(1); the errors come from summing
// in another order, and on a GPU from fused multiply-adds and expf within 2 ulp; run with
// GRADCHECK_VERBOSE=1 to see how much of each tolerance is used):
//   kernel            atol   rtol   why
//   embedding         0      0      a copy; the backward adds the rows of a token in order
//   rmsnorm           1e-5   1e-5   one reduction over C per row (N for the weight)
//   linear            1e-5   1e-5   up to 600 terms (a GPU's: 1024, at 1e-4), tiled in another order
//   rope              1e-5   1e-5   float angle and sincospif against a double-angle table
//   attention         1e-5   1e-5   scores over hs, softmax over T, sums over T and heads
//   swiglu            1e-6   1e-5   elementwise, expf
//   depth attention   1e-5   1e-5   reductions over C per source and over N for dw, dg
//   depth variants    1e-5   1e-5   the same per head, and for the query's per-token part
//   depth mixing      1e-5   1e-5   sums over sources; over N*C for the coefficients
//   mHC-lite          1e-5   1e-5   dots over d, the stream norm over m*d, the projection;
//                     1e-5   1e-4   the parameters' gradients, sums over the N rows
//                     0      0      expand, reduce: copies and sums over streams in order
//   crossentropy      1e-6   1e-5   softmax over V; the count is exact
//   adamw             1e-7   1e-5   elementwise, same formula
//   global norm       0      1e-5   float partial sums against one sum in double
//   muon              1e-4   0      X after Newton–Schulz (its slope amplifies rounding ~500x)
#include "cuda_test_util.h"

// ---- embedding ---------------------------------------------------------------------------
TEST_CASE("embedding forward and backward on the GPU match the CPU, with repeated tokens") {
    size_t V = 0, C = 0;
    std::vector<int> tokens;
    SUBCASE("V=5 C=3") { V = 5; C = 3; tokens = {1, 3, 1, 1, 0, 3}; }
    SUBCASE("V=11 C=37, one token everywhere") { V = 11; C = 37; tokens = {4, 4, 4, 4, 4, 4, 4}; }
    SUBCASE("V=13 C=130") { V = 13; C = 130; tokens = {12, 0, 12, 5, 2, 5, 5, 0, 9}; }
    SUBCASE("V=7 C=20, N=600: tokens read in three chunks") {
        V = 7; C = 20;
        Rng draw(11);
        for (int i = 0; i < 600; i++) tokens.push_back((int)(draw.next() % 7));
    }
    if (ON_GPU) {
        SUBCASE("GPU: V=256 C=256, N=1024") {
            V = 256; C = 256;
            Rng draw(12);
            for (int i = 0; i < 1024; i++) tokens.push_back((int)(draw.next() % 256));
        }
    }
    size_t N = tokens.size();
    Rng rng(1);
    Floats wte = rng.uniform_vector(V * C, -1, 1), dout = rng.uniform_vector(N * C, -1, 1);
    Floats dwte0 = rng.uniform_vector(V * C, -1, 1);

    Floats out(N * C), dwte = dwte0;
    embedding_forward(out.data(), tokens.data(), wte.data(), N, C);
    embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C);

    Outputs cuda = run_cuda([&] {
        Device d;
        float* d_out = d.zeros(N * C);
        float* d_dwte = d.upload(dwte0);
        int* d_tokens = d.upload(tokens);
        embedding_forward_cuda(d_out, d_tokens, d.upload(wte), N, C);
        embedding_backward_cuda(d_dwte, d.upload(dout), d_tokens, N, C);
        return Outputs{{"out", download(d_out, N * C)}, {"dwte", download(d_dwte, V * C)}};
    });
    compare_exact("out", cuda[0].values.data(), out.data(), out.size());
    compare_exact("dwte", cuda[1].values.data(), dwte.data(), dwte.size());
}

// ---- rmsnorm -----------------------------------------------------------------------------
TEST_CASE("rmsnorm forward and backward on the GPU match the CPU, with a gain and without (NULL)") {
    Tolerance tol{1e-5, 1e-5};  // the GPU sizes: sums of 1024 rows, 1e-4
    size_t N = 0, C = 0;
    SUBCASE("N=1 C=4") { N = 1; C = 4; }
    SUBCASE("N=5 C=33") { N = 5; C = 33; }
    SUBCASE("N=9 C=130") { N = 9; C = 130; }
    SUBCASE("N=3 C=300: a row in two chunks of 256 columns") { N = 3; C = 300; }
    SUBCASE("N=70 C=20: the weight gradient summed in three parts of rows") { N = 70; C = 20; }
    SUBCASE("N=300 C=12: ten parts of rows, summed in two chunks of parts") { N = 300; C = 12; }
    if (ON_GPU) {
        SUBCASE("GPU: N=1024 C=256") { N = 1024; C = 256; tol = {1e-4, 1e-4}; }
    }
    Rng rng(2);
    Floats inp = rng.uniform_vector(N * C, -2, 2), weight = rng.uniform_vector(C, 0.5, 1.5);
    Floats dout = rng.uniform_vector(N * C, -1, 1);
    Floats dinp0 = rng.uniform_vector(N * C, -1, 1), dweight0 = rng.uniform_vector(C, -1, 1);

    // without a gain (the input-dependent depth query's norm): weight and dweight NULL
    for (bool gain : {true, false}) {
        CAPTURE(gain);
        Floats out(N * C), rstd(N), dinp = dinp0, dweight = dweight0;
        const float* cpu_weight = gain ? weight.data() : nullptr;
        rmsnorm_forward(out.data(), rstd.data(), inp.data(), cpu_weight, N, C);
        rmsnorm_backward(dinp.data(), gain ? dweight.data() : nullptr, dout.data(), inp.data(),
                         cpu_weight, rstd.data(), N, C);

        Outputs cuda = run_cuda([&] {
            Device d;
            float *d_out = d.zeros(N * C), *d_rstd = d.zeros(N);
            float *d_dinp = d.upload(dinp0), *d_dweight = d.upload(dweight0);
            float *d_inp = d.upload(inp), *d_weight = gain ? d.upload(weight) : nullptr;
            rmsnorm_forward_cuda(d_out, d_rstd, d_inp, d_weight, N, C);
            rmsnorm_backward_cuda(d_dinp, gain ? d_dweight : nullptr, d.upload(dout), d_inp,
                                  d_weight, d_rstd, N, C);
            return Outputs{{"out", download(d_out, N * C)}, {"rstd", download(d_rstd, N)},
                           {"dinp", download(d_dinp, N * C)}, {"dweight", download(d_dweight, C)}};
        });
        check(cuda[0], out, tol);
        check(cuda[1], rstd, tol);
        check(cuda[2], dinp, tol);
        if (gain) check(cuda[3], dweight, tol);
        else compare_exact("dweight, no gain: untouched", cuda[3].values.data(), dweight0.data(), C);
    }
}

// ---- linear ------------------------------------------------------------------------------
// The emulator reports 4 multiprocessors (cuda_emu.h), so these sizes reach every branch of
// cuda/linear.cu: the 64 x 64 tiles, the 128 x 128 tiles (4 or more of them: 130 x 260),
// split-K (one tile, K >= 512; its sums overwriting (forward) or adding (dW), 16 bytes or
// one float at a time), tiles cut by the matrix edge in every dimension, and the
// scalar loads and stores (odd sizes, or pointers one float past 16-byte alignment).
TEST_CASE("linear forward and backward on the GPU match the CPU, on sizes around the tile") {
    size_t N = 0, IN = 0, OUT = 0, offset = 0;
    Tolerance tol{1e-5, 1e-5};
    SUBCASE("N=1 IN=1 OUT=1") { N = 1; IN = 1; OUT = 1; }
    SUBCASE("N=5 IN=7 OUT=3") { N = 5; IN = 7; OUT = 3; }
    SUBCASE("N=64 IN=16 OUT=64, one whole 64 x 64 tile, 16-byte loads") { N = 64; IN = 16; OUT = 64; }
    SUBCASE("N=33 IN=40 OUT=17, tiles plus remainders") { N = 33; IN = 40; OUT = 17; }
    SUBCASE("N=130 IN=12 OUT=260, 128 x 128 tiles (dW: split-K)") { N = 130; IN = 12; OUT = 260; }
    SUBCASE("N=600 IN=20 OUT=12, split-K of the weight gradient") { N = 600; IN = 20; OUT = 12; }
    SUBCASE("N=256 IN=256 OUT=256, 128 x 128 tiles split in 4 (every product)") {
        N = 256; IN = 256; OUT = 256;
    }
    SUBCASE("N=24 IN=8 OUT=20, pointers one float off alignment") { N = 24; IN = 8; OUT = 20; offset = 1; }
    SUBCASE("N=600 IN=7 OUT=5, split-K sums of an odd count, one float off alignment") {
        N = 600; IN = 7; OUT = 5; offset = 1;
    }
    SUBCASE("N=600 IN=8 OUT=12, split-K sums, one float off alignment") {
        N = 600; IN = 8; OUT = 12; offset = 1;
    }
    SUBCASE("N=20 IN=600 OUT=12, split-K of the forward (sums that overwrite)") {
        N = 20; IN = 600; OUT = 12;
    }
    if (ON_GPU) {
        // the model's shapes: d = 256, F = 704, B*T = 1024, and an odd one; sums of up to
        // 1024 terms, so the tolerance grows with sqrt(K) (measured errors: GRADCHECK_VERBOSE)
        SUBCASE("GPU: N=1024 IN=256 OUT=704 (MLP up)") { N = 1024; IN = 256; OUT = 704; tol = {1e-4, 1e-4}; }
        SUBCASE("GPU: N=1024 IN=704 OUT=256 (MLP down)") { N = 1024; IN = 704; OUT = 256; tol = {1e-4, 1e-4}; }
        SUBCASE("GPU: N=1021 IN=255 OUT=259, odd") { N = 1021; IN = 255; OUT = 259; tol = {1e-4, 1e-4}; }
    }
    // the premise of the sizes above: the matmul's choices (tile shape, split-K) see the
    // emulator's 4 multiprocessors, not 0 (which would take neither 64 x 64 tiles nor split-K)
    if (!ON_GPU) REQUIRE(cuda_sm_count() == 4);
    CAPTURE(N);
    CAPTURE(IN);
    CAPTURE(OUT);
    Rng rng(3);
    Floats inp = rng.uniform_vector(N * IN, -1, 1), weight = rng.uniform_vector(OUT * IN, -1, 1);
    Floats dout = rng.uniform_vector(N * OUT, -1, 1);
    Floats dinp0 = rng.uniform_vector(N * IN, -1, 1);
    Floats dweight0 = rng.uniform_vector(OUT * IN, -1, 1);

    Floats out(N * OUT), dinp = dinp0, dweight = dweight0;
    linear_forward(out.data(), inp.data(), weight.data(), N, IN, OUT);
    linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                    N, IN, OUT);

    Floats stale = rng.uniform_vector(N * OUT, -1, 1);  // what out holds before: overwritten
    // each buffer uploaded `offset` floats into its allocation
    auto shifted = [&](Device& d, const Floats& host) {
        Floats padded(offset, 0.0f);
        padded.insert(padded.end(), host.begin(), host.end());
        return d.upload(padded) + offset;
    };
    Outputs cuda = run_cuda([&] {
        Device d;
        float* d_out = shifted(d, stale);
        float *d_dinp = shifted(d, dinp0), *d_dweight = shifted(d, dweight0);
        float *d_inp = shifted(d, inp), *d_weight = shifted(d, weight);
        linear_forward_cuda(d_out, d_inp, d_weight, N, IN, OUT);
        linear_backward_cuda(d_dinp, d_dweight, shifted(d, dout), d_inp, d_weight, N, IN, OUT);
        return Outputs{{"out", download(d_out, N * OUT)}, {"dinp", download(d_dinp, N * IN)},
                       {"dweight", download(d_dweight, OUT * IN)}};
    });
    check(cuda[0], out, tol);
    check(cuda[1], dinp, tol);
    check(cuda[2], dweight, tol);
}

// The workspace model_build_cuda reserves for the matmul must cover every product of any
// shape: a graph-captured step cannot grow it (a GPU refuses cudaFree and cudaMalloc during
// stream capture). The shapes span the 64 x 64 and the 128 x 128 tiles, with and without
// split-K, up to d = 4096 and B*T = 8192, on the emulator's 4 multiprocessors or the GPU's.
TEST_CASE("no matmul borrows more workspace than linear_workspace_floats_cuda reserves") {
    const size_t sizes[] = {1, 7, 64, 100, 128, 130, 256, 300, 512, 704, 1024, 1408, 2816,
                            4096, 8192};
    const size_t most = linear_workspace_floats_cuda();
    size_t largest = 0, split_128 = 0;  // the most any product borrowed; products that split
    for (size_t M : sizes)
        for (size_t J : sizes)
            for (size_t K : sizes) {
                size_t floats = matmul_workspace_floats_cuda(M, J, K);
                if (floats > most) {
                    CAPTURE(M);
                    CAPTURE(J);
                    CAPTURE(K);
                    FAIL_CHECK("borrows " << floats << " floats, the reservation is " << most);
                }
                largest = floats > largest ? floats : largest;
                size_t big_tiles = (size_t)ceil_div(M, 128) * ceil_div(J, 128);
                if (floats > 0 && big_tiles >= (size_t)cuda_sm_count()) split_128++;
            }
    CHECK(split_128 > 0);        // 128 x 128 tiles do split K: the case the bound must cover
    CHECK(largest * 2 > most);  // and the bound is not far above what products borrow
}

// ---- rope --------------------------------------------------------------------------------
TEST_CASE("rope forward (in place, at one position) and backward on the GPU match the CPU") {
    const Tolerance tol{1e-5, 1e-5};
    size_t B = 0, T = 0, n_heads = 0, hs = 0;
    SUBCASE("B=1 T=5 heads=1 hs=2") { B = 1; T = 5; n_heads = 1; hs = 2; }
    SUBCASE("B=2 T=7 heads=3 hs=8") { B = 2; T = 7; n_heads = 3; hs = 8; }
    SUBCASE("B=1 T=33 heads=2 hs=64") { B = 1; T = 33; n_heads = 2; hs = 64; }
    if (ON_GPU) {
        SUBCASE("GPU: B=8 T=128 heads=8 hs=32") { B = 8; T = 128; n_heads = 8; hs = 32; }
    }
    size_t n = B * T * n_heads * hs;
    Rng rng(4);
    Floats inp = rng.uniform_vector(n, -1, 1), dout = rng.uniform_vector(n, -1, 1);
    Floats dinp0 = rng.uniform_vector(n, -1, 1);

    size_t position = T - 1;  // the decoder's rotation: every row (of B*T) at one position
    Floats out(n), out_at(n), dinp = dinp0;
    rope_forward(out.data(), inp.data(), B, T, n_heads, hs);
    rope_forward_at(out_at.data(), inp.data(), position, B * T, n_heads, hs);
    rope_backward(dinp.data(), dout.data(), B, T, n_heads, hs);

    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_out = d.zeros(n), *d_inplace = d.upload(inp), *d_dinp = d.upload(dinp0);
        float *d_inp = d.upload(inp), *d_out_at = d.zeros(n);
        rope_forward_cuda(d_out, d_inp, B, T, n_heads, hs);
        rope_forward_cuda(d_inplace, d_inplace, B, T, n_heads, hs);
        rope_forward_at_cuda(d_out_at, d_inp, position, B * T, n_heads, hs);
        rope_backward_cuda(d_dinp, d.upload(dout), B, T, n_heads, hs);
        return Outputs{{"out", download(d_out, n)}, {"out (in place)", download(d_inplace, n)},
                       {"out at one position", download(d_out_at, n)},
                       {"dinp", download(d_dinp, n)}};
    });
    check(cuda[0], out, tol);
    check(cuda[1], out, tol);
    check(cuda[2], out_at, tol);
    check(cuda[3], dinp, tol);
}

// ---- attention ---------------------------------------------------------------------------
// Each version (the naive one thread per query, the flash kernels the model runs) against
// src/attention.c: out, lse, and dq, dk, dv accumulated onto random values. T = 70 and 37 end
// inside a tile of 32 keys; hs = 40 spans two chunks of 32 dims.
TEST_CASE("attention forward and backward on the GPU match the CPU (causal, grouped-query; naive and flash)") {
    const Tolerance tol{1e-5, 1e-5};
    size_t B = 0, T = 0, H = 0, G = 0, hs = 0;
    SUBCASE("B=2 T=5 H=4 G=2 hs=8, GQA") { B = 2; T = 5; H = 4; G = 2; hs = 8; }
    SUBCASE("B=1 T=7 H=3 G=1 hs=16, one kv head") { B = 1; T = 7; H = 3; G = 1; hs = 16; }
    SUBCASE("B=2 T=37 H=2 G=2 hs=4, G=H, T over a warp") { B = 2; T = 37; H = 2; G = 2; hs = 4; }
    SUBCASE("B=1 T=9 H=6 G=3 hs=40, hs over a warp") { B = 1; T = 9; H = 6; G = 3; hs = 40; }
    SUBCASE("B=2 T=1 H=2 G=1 hs=2") { B = 2; T = 1; H = 2; G = 1; hs = 2; }
    SUBCASE("B=1 T=70 H=6 G=2 hs=40, three key tiles, two dim chunks") {
        B = 1; T = 70; H = 6; G = 2; hs = 40;
    }
    if (ON_GPU) {
        SUBCASE("GPU: B=8 T=128 H=8 G=4 hs=32, the bench model") { B = 8; T = 128; H = 8; G = 4; hs = 32; }
        SUBCASE("GPU: B=3 T=131 H=6 G=2 hs=16, odd") { B = 3; T = 131; H = 6; G = 2; hs = 16; }
    }
    size_t nq = B * T * H * hs, nkv = B * T * G * hs, nlse = B * H * T;
    Rng rng(5);
    Floats q = rng.uniform_vector(nq, -1, 1), k = rng.uniform_vector(nkv, -1, 1);
    Floats v = rng.uniform_vector(nkv, -1, 1), dout = rng.uniform_vector(nq, -1, 1);
    Floats dq0 = rng.uniform_vector(nq, -1, 1), dk0 = rng.uniform_vector(nkv, -1, 1);
    Floats dv0 = rng.uniform_vector(nkv, -1, 1);

    Floats out(nq), lse(nlse), dq = dq0, dk = dk0, dv = dv0;
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, hs);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), B, T, H, G, hs);

    for (bool naive : {true, false}) {
        CAPTURE(naive);
        Floats stale_out = rng.uniform_vector(nq, -1, 1), stale_lse = rng.uniform_vector(nlse, -1, 1);
        Outputs cuda = run_cuda([&] {
            Device d;
            float *d_out = d.upload(stale_out), *d_lse = d.upload(stale_lse);  // overwritten
            float *d_q = d.upload(q), *d_k = d.upload(k), *d_v = d.upload(v);
            float *d_dq = d.upload(dq0), *d_dk = d.upload(dk0), *d_dv = d.upload(dv0);
            if (naive) {
                attention_forward_naive_cuda(d_out, d_lse, d_q, d_k, d_v, B, T, H, G, hs);
                attention_backward_naive_cuda(d_dq, d_dk, d_dv, d.upload(dout), d_out, d_lse, d_q,
                                              d_k, d_v, B, T, H, G, hs);
            } else {
                attention_forward_cuda(d_out, d_lse, d_q, d_k, d_v, B, T, H, G, hs);
                attention_backward_cuda(d_dq, d_dk, d_dv, d.upload(dout), d_out, d_lse, d_q, d_k,
                                        d_v, B, T, H, G, hs);
            }
            return Outputs{{"out", download(d_out, nq)}, {"lse", download(d_lse, nlse)},
                           {"dq", download(d_dq, nq)}, {"dk", download(d_dk, nkv)},
                           {"dv", download(d_dv, nkv)}};
        });
        check(cuda[0], out, tol);
        check(cuda[1], lse, tol);
        check(cuda[2], dq, tol);
        check(cuda[3], dk, tol);
        check(cuda[4], dv, tol);
    }
}

// ---- swiglu ------------------------------------------------------------------------------
TEST_CASE("swiglu forward and backward on the GPU match the CPU") {
    const Tolerance tol{1e-6, 1e-5};
    size_t N = 0, F = 0;
    SUBCASE("N=1 F=1") { N = 1; F = 1; }
    SUBCASE("N=7 F=100") { N = 7; F = 100; }
    if (ON_GPU) {
        SUBCASE("GPU: N=1024 F=704") { N = 1024; F = 704; }
    }
    Rng rng(6);
    Floats gate = rng.uniform_vector(N * F, -6, 6), up = rng.uniform_vector(N * F, -2, 2);
    Floats dout = rng.uniform_vector(N * F, -1, 1);
    Floats dgate0 = rng.uniform_vector(N * F, -1, 1), dup0 = rng.uniform_vector(N * F, -1, 1);

    Floats out(N * F), dgate = dgate0, dup = dup0;
    swiglu_forward(out.data(), gate.data(), up.data(), N, F);
    swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N, F);

    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_out = d.zeros(N * F), *d_gate = d.upload(gate), *d_up = d.upload(up);
        float *d_dgate = d.upload(dgate0), *d_dup = d.upload(dup0);
        swiglu_forward_cuda(d_out, d_gate, d_up, N, F);
        swiglu_backward_cuda(d_dgate, d_dup, d.upload(dout), d_gate, d_up, N, F);
        return Outputs{{"out", download(d_out, N * F)}, {"dgate", download(d_dgate, N * F)},
                       {"dup", download(d_dup, N * F)}};
    });
    check(cuda[0], out, tol);
    check(cuda[1], dgate, tol);
    check(cuda[2], dup, tol);
}

// ---- mHC-lite ------------------------------------------------------------------------------
// An mHC-lite sub-layer's random inputs: the parameters (projections O(1/sqrt(m d)), so that e
// is O(1) and no gate or softmax saturates), x0, the sub-layer's output f, and the gradients
// arriving at the streams after it (dXnext) and at its input (du)
struct MhcInputs {
    size_t R, E, W, D;  // m! permutations, E projected values and W coefficients a row, m*d
    Floats x0, norm_weight, proj, bias, scale, f, dXnext, du;
    MhcInputs(size_t N, size_t d, size_t m, Rng& rng)
        : R(mhc_permutation_table(NULL, m)), E(2 * m + R), W(MHC_MIX_WIDTH(m)), D(m * d) {
        float proj_range = 1.5f / std::sqrt((float)D);
        x0 = rng.uniform_vector(N * d, -1, 1);
        norm_weight = rng.uniform_vector(D, 0.5f, 1.5f);
        proj = rng.uniform_vector(E * D, -proj_range, proj_range);
        bias = rng.uniform_vector(E, -1, 1);
        scale = rng.uniform_vector(3, 0.3f, 1.5f);
        f = rng.uniform_vector(N * d, -1, 1);
        dXnext = rng.uniform_vector(N * D, -1, 1);
        du = rng.uniform_vector(N * d, -1, 1);
    }
    // the parameters on the host
    MhcParams params() { return {norm_weight.data(), proj.data(), bias.data(), scale.data()}; }
};

// The operators in the order a sub-layer runs them: the streams from x0 (expand), the
// sub-layer's input u and the coefficients (input), the streams after it (output), the head's
// sum (reduce); then the backwards in reverse, dmix carrying dH and da_post from the output's
// backward to the input's. Every accumulated gradient starts random on both sides, and so do
// the buffers the functions overwrite (mix, e, z, u, the scratch de and dz, dmix).
TEST_CASE("mHC-lite's operators forward and backward on the GPU match the CPU, m = 2, 3, 4") {
    Tolerance tol{1e-5, 1e-5}, sum_tol{1e-5, 1e-4};  // sum_tol: sums over the N rows
    size_t N = 0, d = 0, m = 0;
    SUBCASE("m=2 N=3 d=8") { m = 2; N = 3; d = 8; }
    SUBCASE("m=3 N=5 d=37: a stream over a warp, 6 permutations") { m = 3; N = 5; d = 37; }
    SUBCASE("m=4 N=4 d=40: 24 permutations, 20 dot products a row") { m = 4; N = 4; d = 40; }
    SUBCASE("m=4 N=70 d=33: the rows' sums in the norm's parts, m*d over a block") { m = 4; N = 70; d = 33; }
    SUBCASE("m=2 N=2 d=200: a row's columns over a block") { m = 2; N = 2; d = 200; }
    if (ON_GPU) {
        SUBCASE("GPU: m=4 N=1024 d=256, the bench model") { m = 4; N = 1024; d = 256; sum_tol = {1e-4, 1e-4}; }
        SUBCASE("GPU: m=3 N=1021 d=130, odd") { m = 3; N = 1021; d = 130; sum_tol = {1e-4, 1e-4}; }
    }
    CAPTURE(m);
    CAPTURE(N);
    CAPTURE(d);
    Rng rng(14);
    MhcInputs in(N, d, m, rng);
    size_t R = in.R, E = in.E, W = in.W, D = in.D;
    const Floats &x0 = in.x0, &norm_weight = in.norm_weight, &proj = in.proj, &bias = in.bias;
    const Floats &scale = in.scale, &f = in.f, &dXnext = in.dXnext, &du = in.du;
    Floats X = rng.uniform_vector(N * D, -1, 1);
    Floats dout = rng.uniform_vector(N * d, -1, 1);
    // what the backwards add into, and what the functions overwrite
    Floats dX0 = rng.uniform_vector(N * D, -1, 1), df0 = rng.uniform_vector(N * d, -1, 1);
    Floats dx00 = rng.uniform_vector(N * d, -1, 1), dnorm0 = rng.uniform_vector(D, -1, 1);
    Floats dproj0 = rng.uniform_vector(E * D, -1, 1), dbias0 = rng.uniform_vector(E, -1, 1);
    Floats dscale0 = rng.uniform_vector(3, -1, 1);
    Floats stale_mix = rng.uniform_vector(N * W, -1, 1), stale_dmix = rng.uniform_vector(N * W, -1, 1);
    Floats stale_e = rng.uniform_vector(N * E, -1, 1), stale_z = rng.uniform_vector(N * D, -1, 1);
    Floats stale_rows = rng.uniform_vector(N * D, -1, 1);  // for u, Xnext, out, the expanded X

    // the CPU
    Floats expanded = stale_rows, u(stale_rows.begin(), stale_rows.begin() + N * d), mix = stale_mix;
    Floats e = stale_e, z = stale_z, rstd(N), Xnext = stale_rows;
    Floats out(stale_rows.begin(), stale_rows.begin() + N * d);
    Floats dX = dX0, df = df0, dmix = stale_dmix, dx0 = dx00, dnorm = dnorm0, dproj = dproj0;
    Floats dbias = dbias0, dscale = dscale0, de = stale_e, dz = stale_z, dX_reduce = dX0;
    mhc_expand_forward(expanded.data(), x0.data(), N, d, m);
    mhc_input_forward(u.data(), mix.data(), e.data(), z.data(), rstd.data(), X.data(),
                      in.params(), N, d, m);
    mhc_output_forward(Xnext.data(), X.data(), f.data(), mix.data(), N, d, m);
    mhc_reduce_forward(out.data(), X.data(), N, d, m);
    mhc_reduce_backward(dX_reduce.data(), dout.data(), N, d, m);
    mhc_output_backward(dX.data(), df.data(), dmix.data(), dXnext.data(), X.data(), f.data(),
                        mix.data(), N, d, m);
    MhcParams grads = {dnorm.data(), dproj.data(), dbias.data(), dscale.data()};
    mhc_input_backward(dX.data(), grads, dmix.data(), de.data(), dz.data(), du.data(), X.data(),
                       z.data(), rstd.data(), e.data(), mix.data(), in.params(), N, d, m);
    mhc_expand_backward(dx0.data(), dX.data(), N, d, m);

    Outputs cuda = run_cuda([&] {
        Device dev;
        float *d_X = dev.upload(X), *d_f = dev.upload(f), *d_norm = dev.upload(norm_weight);
        float *d_proj = dev.upload(proj), *d_scale = dev.upload(scale);
        float *d_expanded = dev.upload(stale_rows), *d_Xnext = dev.upload(stale_rows);
        float *d_u = dev.upload(Floats(stale_rows.begin(), stale_rows.begin() + N * d));
        float *d_out = dev.upload(Floats(stale_rows.begin(), stale_rows.begin() + N * d));
        float *d_mix = dev.upload(stale_mix), *d_e = dev.upload(stale_e), *d_z = dev.upload(stale_z);
        float *d_rstd = dev.zeros(N), *d_dX = dev.upload(dX0), *d_df = dev.upload(df0);
        float *d_dmix = dev.upload(stale_dmix), *d_dx0 = dev.upload(dx00);
        float *d_dnorm = dev.upload(dnorm0), *d_dproj = dev.upload(dproj0);
        float *d_dbias = dev.upload(dbias0), *d_dscale = dev.upload(dscale0);
        float *d_de = dev.upload(stale_e), *d_dz = dev.upload(stale_z);
        float* d_dX_reduce = dev.upload(dX0);
        mhc_expand_forward_cuda(d_expanded, dev.upload(x0), N, d, m);
        MhcParams params = {d_norm, d_proj, dev.upload(bias), d_scale};
        mhc_input_forward_cuda(d_u, d_mix, d_e, d_z, d_rstd, d_X, params, N, d, m);
        mhc_output_forward_cuda(d_Xnext, d_X, d_f, d_mix, N, d, m);
        mhc_reduce_forward_cuda(d_out, d_X, N, d, m);
        mhc_reduce_backward_cuda(d_dX_reduce, dev.upload(dout), N, d, m);
        mhc_output_backward_cuda(d_dX, d_df, d_dmix, dev.upload(dXnext), d_X, d_f, d_mix, N, d, m);
        MhcParams d_grads = {d_dnorm, d_dproj, d_dbias, d_dscale};
        mhc_input_backward_cuda(d_dX, d_grads, d_dmix, d_de, d_dz, dev.upload(du), d_X, d_z, d_rstd,
                                d_e, d_mix, params, N, d, m);
        mhc_expand_backward_cuda(d_dx0, d_dX, N, d, m);
        return Outputs{{"expanded X", download(d_expanded, N * D)}, {"u", download(d_u, N * d)},
                       {"mix", download(d_mix, N * W)}, {"e", download(d_e, N * E)},
                       {"z", download(d_z, N * D)}, {"rstd", download(d_rstd, N)},
                       {"Xnext", download(d_Xnext, N * D)}, {"out", download(d_out, N * d)},
                       {"dX of reduce", download(d_dX_reduce, N * D)},
                       {"dX", download(d_dX, N * D)}, {"df", download(d_df, N * d)},
                       {"dmix", download(d_dmix, N * W)}, {"de", download(d_de, N * E)},
                       {"dnorm_weight", download(d_dnorm, D)}, {"dproj", download(d_dproj, E * D)},
                       {"dbias", download(d_dbias, E)}, {"dscale", download(d_dscale, 3)},
                       {"dx0", download(d_dx0, N * d)}};
    });
    // copies and sums over the streams in the CPU's order: its bits
    compare_exact("expanded X", cuda[0].values.data(), expanded.data(), N * D);
    compare_exact("dX of reduce", cuda[8].values.data(), dX_reduce.data(), N * D);
    compare_exact("out", cuda[7].values.data(), out.data(), N * d);
    const Floats* cpu[] = {&expanded, &u, &mix, &e, &z, &rstd, &Xnext, &out, &dX_reduce, &dX, &df,
                           &dmix, &de, &dnorm, &dproj, &dbias, &dscale, &dx0};
    for (size_t i = 0; i < cuda.size(); i++) {
        bool over_rows = i >= 13 && i <= 16;  // dnorm_weight, dproj, dbias, dscale
        check(cuda[i], *cpu[i], over_rows ? sum_tol : tol);
    }
    // H is doubly stochastic: every row and column of every position's H sums to 1
    for (size_t n = 0; n < N; n++) {
        const float* H = cuda[2].values.data() + n * W + 2 * m + R;
        for (size_t i = 0; i < m; i++) {
            float row = 0.0f, column = 0.0f;
            for (size_t j = 0; j < m; j++) { row += H[i * m + j]; column += H[j * m + i]; }
            CHECK(row == doctest::Approx(1.0).epsilon(1e-5));
            CHECK(column == doctest::Approx(1.0).epsilon(1e-5));
        }
    }
}

// At sub-layer 0 every stream is x0: H mixes equal streams, every permutation's gradient dpi_r
// sums the same values, and the gradients of the res logits are exactly 0 (the CPU sums in
// double, the GPU in increasing order), so the identity's bias and the res rows of the
// projection and of the scale get no rounding noise to step on.
TEST_CASE("mHC-lite on the GPU: with every stream equal the res logits' gradients are exactly 0, as on the CPU") {
    size_t m = 0;
    SUBCASE("m=2") { m = 2; }
    SUBCASE("m=3") { m = 3; }
    SUBCASE("m=4") { m = 4; }
    CAPTURE(m);
    // many rows: the sums of 3 or 4 terms in another order round differently in some of them
    const size_t N = 64, d = 20;
    Rng rng(15);
    MhcInputs in(N, d, m, rng);
    size_t R = in.R, E = in.E, W = in.W, D = in.D;
    const Floats &x0 = in.x0, &norm_weight = in.norm_weight, &proj = in.proj, &bias = in.bias;
    const Floats &scale = in.scale, &f = in.f, &dXnext = in.dXnext, &du = in.du;
    Floats dbias0 = rng.uniform_vector(E, -1, 1), dscale0 = rng.uniform_vector(3, -1, 1);
    // the CPU's coefficients and backward, from streams that are all x0
    Floats X(N * D), u(N * d), mix(N * W), e(N * E), z(N * D), rstd(N), Xnext(N * D);
    Floats dX(N * D, 0.0f), df(N * d, 0.0f), dmix(N * W), dnorm(D, 0.0f), dproj(E * D, 0.0f);
    Floats dbias = dbias0, dscale = dscale0, de(N * E), dz(N * D);
    mhc_expand_forward(X.data(), x0.data(), N, d, m);
    mhc_input_forward(u.data(), mix.data(), e.data(), z.data(), rstd.data(), X.data(),
                      in.params(), N, d, m);
    mhc_output_backward(dX.data(), df.data(), dmix.data(), dXnext.data(), X.data(), f.data(),
                        mix.data(), N, d, m);
    MhcParams grads = {dnorm.data(), dproj.data(), dbias.data(), dscale.data()};
    mhc_input_backward(dX.data(), grads, dmix.data(), de.data(), dz.data(), du.data(), X.data(),
                       z.data(), rstd.data(), e.data(), mix.data(), in.params(), N, d, m);
    Outputs cuda = run_cuda([&] {
        Device dev;
        float *d_X = dev.zeros(N * D), *d_u = dev.zeros(N * d), *d_mix = dev.zeros(N * W);
        float *d_e = dev.zeros(N * E), *d_z = dev.zeros(N * D), *d_rstd = dev.zeros(N);
        float *d_dX = dev.zeros(N * D), *d_df = dev.zeros(N * d), *d_dmix = dev.zeros(N * W);
        float *d_dnorm = dev.zeros(D), *d_dproj = dev.zeros(E * D), *d_f = dev.upload(f);
        float *d_dbias = dev.upload(dbias0), *d_dscale = dev.upload(dscale0);
        float *d_de = dev.zeros(N * E), *d_dz = dev.zeros(N * D);
        float *d_norm = dev.upload(norm_weight), *d_proj = dev.upload(proj), *d_scale = dev.upload(scale);
        mhc_expand_forward_cuda(d_X, dev.upload(x0), N, d, m);
        MhcParams params = {d_norm, d_proj, dev.upload(bias), d_scale};
        mhc_input_forward_cuda(d_u, d_mix, d_e, d_z, d_rstd, d_X, params, N, d, m);
        mhc_output_backward_cuda(d_dX, d_df, d_dmix, dev.upload(dXnext), d_X, d_f, d_mix, N, d, m);
        MhcParams d_grads = {d_dnorm, d_dproj, d_dbias, d_dscale};
        mhc_input_backward_cuda(d_dX, d_grads, d_dmix, d_de, d_dz, dev.upload(du), d_X, d_z, d_rstd,
                                d_e, d_mix, params, N, d, m);
        return Outputs{{"de", download(d_de, N * E)}, {"dbias", download(d_dbias, E)},
                       {"dscale", download(d_dscale, 3)}};
    });
    Floats zeros(R, 0.0f);
    for (size_t n = 0; n < N; n++) {
        CAPTURE(n);
        compare_exact("CPU: de of the res logits", de.data() + n * E + m, zeros.data(), R);
        compare_exact("GPU: de of the res logits", cuda[0].values.data() + n * E + m, zeros.data(), R);
    }
    compare_exact("GPU: dbias of the res logits, unchanged", cuda[1].values.data() + m,
                  dbias0.data() + m, R);
    compare_exact("GPU: dscale of the res logits, unchanged", cuda[2].values.data() + 1,
                  dscale0.data() + 1, 1);
    check(cuda[0], de, Tolerance{1e-5, 1e-5});  // the other gradients as in the test above
}

// ---- crossentropy ------------------------------------------------------------------------
TEST_CASE("crossentropy forward and backward on the GPU match the CPU, with ignored targets") {
    const Tolerance tol{1e-6, 1e-5};
    size_t V = 0;
    std::vector<int> targets;
    SUBCASE("V=5") { V = 5; targets = {0, -1, 4, 2, -1, 1}; }
    SUBCASE("V=100, over a warp") { V = 100; targets = {99, 3, -1, 64, 31, 32, 0}; }
    SUBCASE("every target ignored") { V = 7; targets = {-1, -1, -1}; }
    if (ON_GPU) {
        SUBCASE("GPU: N=1024 V=256, every 7th ignored") {
            V = 256;
            Rng draw(13);
            for (int i = 0; i < 1024; i++) targets.push_back(i % 7 == 3 ? -1 : (int)(draw.next() % 256));
        }
    }
    size_t N = targets.size();
    Rng rng(8);
    Floats logits = rng.uniform_vector(N * V, -8, 8);
    Floats dlogits0 = rng.uniform_vector(N * V, -1, 1);

    Floats losses(N), probs(N * V), dlogits = dlogits0;
    crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    size_t counted = crossentropy_count(targets.data(), N);
    float scale = counted > 0 ? 1.0f / (float)counted : 0.0f;
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), scale, N, V);

    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_losses = d.zeros(N), *d_probs = d.zeros(N * V), *d_dlogits = d.upload(dlogits0);
        int* d_targets = d.upload(targets);
        crossentropy_forward_cuda(d_losses, d_probs, d.upload(logits), d_targets, N, V);
        crossentropy_backward_cuda(d_dlogits, d_probs, d_targets, scale, N, V);
        return Outputs{{"losses", download(d_losses, N)}, {"probs", download(d_probs, N * V)},
                       {"dlogits", download(d_dlogits, N * V)}};
    });
    check(cuda[0], losses, tol);
    check(cuda[1], probs, tol);
    check(cuda[2], dlogits, tol);
}

// ---- adamw and gradient clipping -----------------------------------------------------------
TEST_CASE("adamw update on the GPU matches the CPU") {
    const Tolerance tol{1e-7, 1e-5};
    int t = 0;
    float weight_decay = 0.0f;
    SUBCASE("first step") { t = 1; weight_decay = 0.1f; }
    SUBCASE("step 7, no weight decay") { t = 7; weight_decay = 0.0f; }
    size_t n = 1000;
    Rng rng(9);
    Floats params0 = rng.uniform_vector(n, -1, 1), grads = rng.uniform_vector(n, -1, 1);
    Floats m0 = rng.uniform_vector(n, -0.1f, 0.1f), v0 = rng.uniform_vector(n, 0, 0.01f);
    // the first 50 have never had a gradient (an embedding row of a token not yet seen):
    // m = v = g = 0, so the step is 0 / (0 + eps) = 0, and only eps keeps it from 0 / 0
    for (size_t i = 0; i < 50; i++) grads[i] = m0[i] = v0[i] = 0.0f;
    const float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;

    Floats params = params0, m = m0, v = v0;
    adamw_update(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps,
                 weight_decay, t);

    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_params = d.upload(params0), *d_m = d.upload(m0), *d_v = d.upload(v0);
        adamw_update_cuda(d_params, d.upload(grads), d_m, d_v, n, lr, beta1, beta2, eps,
                          weight_decay, t);
        return Outputs{{"params", download(d_params, n)}, {"m", download(d_m, n)},
                       {"v", download(d_v, n)}};
    });
    check(cuda[0], params, tol);
    check(cuda[1], m, tol);
    check(cuda[2], v, tol);
}

TEST_CASE("global gradient norm and clipping on the GPU match a double-precision reference") {
    size_t n = 0;
    SUBCASE("n=1") { n = 1; }
    SUBCASE("n=300, fewer than the grid's threads") { n = 300; }
    SUBCASE("n=70001, many per thread") { n = 70001; }
    Rng rng(10);
    Floats grads = rng.uniform_vector(n, -1, 1);
    double sum_sq = 0.0;
    for (float g : grads) sum_sq += (double)g * g;
    float norm = (float)sqrt(sum_sq), max_norm = 0.5f * norm;
    Floats clipped = grads, unchanged = grads;
    for (float& g : clipped) g *= max_norm / norm;

    float norm_cuda = 0.0f;
    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_grads = d.upload(grads), *d_unchanged = d.upload(grads);
        norm_cuda = global_norm_cuda(d_grads, n);
        clip_gradients_cuda(d_grads, n, norm_cuda, max_norm);
        clip_gradients_cuda(d_unchanged, n, norm_cuda, 2.0f * norm);  // under the limit
        return Outputs{{"clipped grads", download(d_grads, n)},
                       {"grads under the limit", download(d_unchanged, n)}};
    });
    CHECK(norm_cuda == doctest::Approx(norm).epsilon(1e-5));
    check(cuda[0], clipped, Tolerance{0, 1e-5});
    compare_exact("grads under the limit", cuda[1].values.data(), unchanged.data(), n);
}

// ---- muon ----------------------------------------------------------------------------------
// Newton–Schulz is a fixed polynomial: its slope at a small singular value is up to
// 3.4445^5 ~ 490, so the other order of the matmuls' sums (and the GPU's FMAs) moves X by
// up to ~500 float ulps in the directions of small singular values; |X| <= ~1.2.
TEST_CASE("the Muon step on the GPU matches the CPU, and so do its matmul_add and Newton-Schulz") {
    size_t rows = 0, cols = 0;
    SUBCASE("20 x 48, wide") { rows = 20; cols = 48; }
    SUBCASE("48 x 20, tall: transposed") { rows = 48; cols = 20; }
    SUBCASE("16 x 16") { rows = 16; cols = 16; }
    if (ON_GPU) {
        SUBCASE("GPU: 256 x 704 (wg of d=256)") { rows = 256; cols = 704; }
        SUBCASE("GPU: 704 x 256 (wd^T's shape: transposed)") { rows = 704; cols = 256; }
        SUBCASE("GPU: 1024 x 1024") { rows = 1024; cols = 1024; }
    }
    size_t n = rows * cols, a = std::min(rows, cols), b = std::max(rows, cols);
    Rng rng(31);
    Floats left = rng.uniform_vector(a * a, -1, 1), right = rng.uniform_vector(a * b, -1, 1);
    Floats sum0 = rng.uniform_vector(a * b, -1, 1);
    Floats params0 = rng.uniform_vector(n, -0.1f, 0.1f), grads = rng.uniform_vector(n, -1, 1);
    Floats momentum0 = rng.uniform_vector(n, -1, 1);
    const float lr = 0.02f, mu = 0.95f, weight_decay = 0.1f;

    Floats sum = sum0, X = right, work(3 * a * a + a * b);
    matmul_add(sum.data(), left.data(), right.data(), a, a, b);
    double norm = 0.0;
    for (float x : X) norm += (double)x * x;
    for (float& x : X) x = (float)(x / std::sqrt(norm));
    Floats X0 = X;
    newton_schulz(X.data(), work.data(), a, b);
    Floats params = params0, momentum = momentum0;
    muon_update(params.data(), grads.data(), momentum.data(), 1, rows, cols, lr, mu, weight_decay);
    // no gradient, no momentum: N = 0, and only the 1e-7 keeps X = 0 / 0 from NaN
    Floats zeros(n, 0.0f), decayed = params0, no_momentum = zeros;
    muon_update(decayed.data(), zeros.data(), no_momentum.data(), 1, rows, cols, lr, mu, weight_decay);

    Outputs cuda = run_cuda([&] {
        Device d;
        float *d_sum = d.upload(sum0), *d_X = d.upload(X0), *d_work = d.zeros(work.size());
        float *d_params = d.upload(params0), *d_momentum = d.upload(momentum0);
        matmul_add_cuda(d_sum, d.upload(left), d.upload(right), a, a, b);
        newton_schulz_cuda(d_X, d_work, a, b);
        muon_update_cuda(d_params, d.upload(grads), d_momentum, 1, rows, cols, lr, mu, weight_decay);
        float* d_decayed = d.upload(params0);
        muon_update_cuda(d_decayed, d.upload(zeros), d.upload(zeros), 1, rows, cols, lr, mu, weight_decay);
        return Outputs{{"matmul_add", download(d_sum, a * b)}, {"newton_schulz", download(d_X, a * b)},
                       {"params", download(d_params, n)}, {"momentum", download(d_momentum, n)},
                       {"params after a zero gradient", download(d_decayed, n)}};
    });
    // matmul_add's sums run over a = min(rows, cols) terms: linear's GPU rule, 1e-4 at K = 1024
    // (an H200 measured 2.2e-5 at 1024 x 1024, over 1e-5 + 1e-5|x|; K = 256 stays within 1e-5)
    const float sum_tol = ON_GPU && a >= 1024 ? 1e-4f : 1e-5f;
    check(cuda[0], sum, Tolerance{sum_tol, sum_tol});
    check(cuda[1], X, Tolerance{1e-4, 0});
    check(cuda[2], params, Tolerance{lr * 0.2f * std::sqrt((float)b) * 1e-4f, 1e-6});
    check(cuda[3], momentum, Tolerance{1e-6, 1e-6});
    check(cuda[4], decayed, Tolerance{0, 1e-6});
}

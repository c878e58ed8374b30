// cuda_test_model.cpp — the whole model on the GPU (cuda/model.cu) against the CPU model
// (src/model.c), in every residual mode (mhc too) and in SPEC's variants: logits, probabilities, loss,
// every gradient tensor, then three AdamW steps with gradient clipping (losses, norms,
// parameters, m and v).
// Built by g++ with tests/cuda_emu.h (no GPU needed), `make test` runs it in both thread
// orders and under AddressSanitizer; built by nvcc (build/test_cuda_gpu) it runs on a GPU.
//
// Parameters are random (gains and pseudo-queries too, so every depth attention is far from
// uniform), some targets are -1, and the models are built larger than the batch they run
// (max 3x6, run 2x5), so a mix-up of actual and maximum sizes shows.
//
// Tolerances |cuda - cpu| <= atol + rtol * |cpu|: the layers' rounding differences (sums in
// another order; tests/cuda_test_layers.cpp) compound through the layers, the depth attention
// and the head, and AdamW's m / sqrt(v) amplifies them in small gradients. Measured on these
// shapes with GRADCHECK_VERBOSE=1, the largest error uses about 12 % of its tolerance:
//   what                          atol   rtol   largest |err|   tolerance used
//   logits, probs                 1e-5   1e-5   2.4e-6          12 %
//   loss, gradient norm           1e-5   1e-5   (doctest::Approx)
//   every gradient tensor         1e-5   1e-4   6.3e-7           5 %
//   after 3 AdamW steps: params   1e-5   1e-4   2.9e-6          10 %
//                        m        1e-6   1e-4   1.3e-7           9 %
//                        v        1e-8   1e-4   1.7e-8          11 %
// Exact: the gradient of w_0 and g_0 (the first sub-layer has one source, SPEC), and the
// parameters after a host -> device -> host round trip.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "common.cuh"
#include "gradcheck.h"
#include "model.cuh"
#include "model.h"

using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;

typedef std::vector<float> Floats;

static Floats download(const float* device, size_t n) {
    Floats host(n);
    cudaCheck(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

// Random parameters of every kind: matrices O(1/sqrt(d)), gains around 1, pseudo-queries O(1).
// The query projection U of --depth-query input is half the other matrices: its per-token part of
// the query (RMS ~0.5 at d = 16) then varies the depth attention from position to position,
// where at 0.4 the queries (w + U rmsnorm(V), RMS ~1.1) made softmaxes so nearly one-hot that
// moving every parameter by 2^-23 moved the CPU's own gradients by up to 1.1x grad_tol
// (--depth-query input, full) and 12x (block S=3, L=3, 2 heads); at 0.2, 0.06x and 0.23x.
static void randomise_params(Model* m, uint64_t seed) {
    Rng rng(seed);
    float* p = m->params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        bool is_gain = PARAM_INFO[i].init == INIT_ONE;
        bool is_query = i == PARAM_res_query;
        for (size_t j = 0; j < m->param_sizes[i]; j++) {
            p[j] = is_gain ? rng.uniform(0.5f, 1.5f)
                   : is_query ? rng.uniform(-1.0f, 1.0f)
                   : i == PARAM_wte ? rng.uniform(-1.0f, 1.0f)   // wte: O(1) embeddings
                   : i == PARAM_res_qproj ? rng.uniform(-0.2f, 0.2f)
                            : rng.uniform(-0.4f, 0.4f);
        }
        p += m->param_sizes[i];
    }
}

// N random tokens and targets in [0, V), every `ignore_every`-th target -1 (ignored)
static void random_batch(std::vector<int>& tokens, std::vector<int>& targets, size_t N, size_t V,
                         uint64_t seed, size_t ignore_every) {
    Rng rng(seed);
    tokens.assign(N, 0);
    targets.assign(N, 0);
    for (size_t i = 0; i < N; i++) {
        tokens[i] = (int)(rng.next() % V);
        targets[i] = i % ignore_every == 1 ? -1 : (int)(rng.next() % V);
    }
}

// forward (returning the loss), zero_grad and backward of the batch (tokens, targets) (B,T)
static float forward_backward(Model* m, const std::vector<int>& tokens,
                              const std::vector<int>& targets, size_t B, size_t T) {
    float loss = model_forward(m, tokens.data(), targets.data(), B, T);
    model_zero_grad(m);
    model_backward(m);
    return loss;
}
static float forward_backward_cuda(ModelCuda* m, const std::vector<int>& tokens,
                                   const std::vector<int>& targets, size_t B, size_t T) {
    float loss = model_forward_cuda(m, tokens.data(), targets.data(), B, T);
    model_zero_grad_cuda(m);
    model_backward_cuda(m);
    return loss;
}

// Compares a flat buffer tensor by tensor, each under its canonical name.
static void compare_tensors(const std::string& what, const float* cuda, const float* cpu,
                            const size_t* sizes, Tolerance tol) {
    size_t offset = 0;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        compare_within(what + " " + PARAM_INFO[i].name, cuda + offset, cpu + offset, sizes[i], tol);
        offset += sizes[i];
    }
}

// Row 0 of each residual tensor the model has (the rows sub-layer 0 uses), as a place in the
// flat parameter (or gradient) buffer
struct TensorRow {
    std::string name;
    size_t offset, size;
};
static std::vector<TensorRow> first_rows(const Model* m) {
    const ModelDims* z = &m->dims;
    const int tensors[] = {PARAM_res_logits, PARAM_res_scalars, PARAM_res_query, PARAM_res_norm,
                           PARAM_res_qproj};
    const size_t row_sizes[] = {z->n_res, z->n_res, z->d, z->d, z->d * z->d};
    std::vector<TensorRow> rows;
    for (size_t j = 0; j < 5; j++) {
        size_t offset = 0;
        for (int i = 0; i < tensors[j]; i++) offset += m->param_sizes[i];
        if (m->param_sizes[tensors[j]] > 0)
            rows.push_back({std::string(PARAM_INFO[tensors[j]].name) + " row 0", offset, row_sizes[j]});
    }
    return rows;
}

// How the three AdamW steps compare. independent: each side steps with its own gradients, so
// the test follows two trajectories, which stay together while no gradient is rounding noise.
// same_gradients: at each step the gradients are compared, then the CPU steps with the GPU's
// (as the bench-size test below does): AdamW's first steps move a weight by about lr times the
// SIGN of its gradient, so a gradient that is rounding noise on both machines would step either
// way and the steps after would compare two different models.
enum class Steps { independent, same_gradients };

// The model of config c on the GPU against the CPU: logits, loss, every gradient, then three
// AdamW steps with clipping (the tolerances of this file's header).
static void check_gpu_model(const ModelConfig& c, Steps steps) {
    const Tolerance forward_tol{1e-5, 1e-5}, grad_tol{1e-5, 1e-4};
    const Tolerance param_tol{1e-5, 1e-4}, m_tol{1e-6, 1e-4}, v_tol{1e-8, 1e-4};
    gradcheck::SingleThreaded one_thread;  // the CPU model on tiny tensors: no OpenMP spinning
    const size_t max_B = 3, max_T = 6, B = 2, T = 5, N = B * T, V = c.vocab_size;
    std::vector<int> tokens, targets;
    random_batch(tokens, targets, N, V, 42, 4);

    Model cpu;
    model_build(&cpu, &c, max_B, max_T);
    randomise_params(&cpu, 7);
    ModelCuda gpu;
    model_build_cuda(&gpu, &c, max_B, max_T);
    model_to_device_cuda(&gpu, &cpu);
    REQUIRE(gpu.model.num_params == cpu.num_params);
    size_t n_params = cpu.num_params;

    // the round trip host -> device -> host is exact
    Model back;
    model_build(&back, &c, 1, 1);
    model_to_host_cuda(&back, &gpu);
    compare_exact("params after a round trip", back.params_memory, cpu.params_memory, n_params);

    // forward and backward
    float loss = forward_backward(&cpu, tokens, targets, B, T);
    float loss_cuda = forward_backward_cuda(&gpu, tokens, targets, B, T);
    CHECK(loss_cuda == doctest::Approx(loss).epsilon(1e-5));
    compare_within("logits", download(model_logits_cuda(&gpu), N * V).data(), model_logits(&cpu),
                   N * V, forward_tol);
    compare_within("probs", download(model_probs_cuda(&gpu), N * V).data(), model_probs(&cpu),
                   N * V, forward_tol);
    Floats grads = download(gpu.model.grads_memory, n_params);
    compare_tensors("grad", grads.data(), cpu.grads_memory, cpu.param_sizes, grad_tol);
    // Sub-layer 0 sees a single source: with softmax attention or static mixing its one weight
    // is exactly 1, so its rows (w_0, g_0, U_0, the logits' row 0) get exactly zero gradient
    // (SPEC); sigmoid and DenseFormer weights are not normalised.
    if (c.block_size > 0 && !c.depth_score && c.mixing != 2) {
        for (const TensorRow& row : first_rows(&cpu)) {
            Floats zeros(row.size, 0.0f);
            compare_exact("grad " + row.name, grads.data() + row.offset, zeros.data(), row.size);
        }
    }

    // a forward without targets gives the same probabilities and no loss
    CHECK(model_forward_cuda(&gpu, tokens.data(), NULL, B, T) == -1.0f);
    compare_within("probs without targets", download(model_probs_cuda(&gpu), N * V).data(),
                   model_probs(&cpu), N * V, forward_tol);

    // three AdamW steps as train.c takes them, clipping the gradient to half its norm
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    for (int t = 1; t <= 3; t++) {
        CAPTURE(t);
        float step_loss = forward_backward(&cpu, tokens, targets, B, T);
        float step_loss_cuda = forward_backward_cuda(&gpu, tokens, targets, B, T);
        CHECK(step_loss_cuda == doctest::Approx(step_loss).epsilon(1e-5));
        float norm = model_grad_norm(&cpu), max_norm = 0.5f * norm;
        float norm_cuda = model_grad_norm_cuda(&gpu);
        CHECK(norm_cuda == doctest::Approx(norm).epsilon(1e-5));
        float cpu_norm = norm;  // what the CPU's clipping divides by
        if (steps == Steps::same_gradients) {
            Floats step_grads = download(gpu.model.grads_memory, n_params);
            compare_tensors("step grad", step_grads.data(), cpu.grads_memory, cpu.param_sizes,
                            grad_tol);
            std::copy(step_grads.begin(), step_grads.end(), cpu.grads_memory);
            cpu_norm = norm_cuda;
        }
        for (size_t i = 0; i < n_params; i++) cpu.grads_memory[i] *= max_norm / cpu_norm;
        model_update(&cpu, lr, beta1, beta2, eps, weight_decay, t);
        model_clip_gradients_cuda(&gpu, norm_cuda, max_norm);
        model_update_cuda(&gpu, lr, beta1, beta2, eps, weight_decay, t);
    }
    model_to_host_cuda(&back, &gpu);
    compare_tensors("after 3 steps: param", back.params_memory, cpu.params_memory,
                    cpu.param_sizes, param_tol);
    compare_tensors("after 3 steps: m", back.m_memory, cpu.m_memory, cpu.param_sizes, m_tol);
    compare_tensors("after 3 steps: v", back.v_memory, cpu.v_memory, cpu.param_sizes, v_tol);

    model_free(&back);
    model_free_cuda(&gpu);
    model_free(&cpu);
}

TEST_CASE("the whole model on the GPU matches the CPU: logits, loss, gradients, AdamW steps") {
    //                V   d  L  H  G  F  S
    ModelConfig c = {11, 16, 2, 4, 2, 24, 0};
    SUBCASE("none (PreNorm)") { c.block_size = 0; }
    SUBCASE("full (S=1)") { c.block_size = 1; }
    SUBCASE("block S=2") { c.block_size = 2; }
    SUBCASE("block S=4") { c.block_size = 4; }
    SUBCASE("block S=3, L=3, multi-query") { c.n_layers = 3; c.block_size = 3; c.n_kv_heads = 1; }
    CAPTURE(c.block_size);
    check_gpu_model(c, Steps::independent);
}

// SPEC's variants (depth_variants.cu, rmsnorm without a gain for the input-dependent query),
// each switch alone in full and block mode where SPEC allows it, then combinations. The steps
// use the GPU's gradients on both sides (Steps::same_gradients): with DenseFormer, beta_{0,0}
// scales x0 just before sub-layer 0's RMSNorm, which takes the scale out again, so its
// gradient is rounding noise (1e-7; only the norm's eps sees it). Stepped their own ways, the
// two models differed beyond param_tol after 3 steps in block DenseFormer (beta_{0,0}: 1.6x)
// and in full --depth-query input (m and v of most tensors), with every gradient in tolerance.
TEST_CASE("the whole model on the GPU matches the CPU in SPEC's variants") {
    //                V   d  L  H  G  F  S  score key_off query heads window mixing
    ModelConfig c = {11, 16, 2, 4, 2, 24, 1, 0,    0,      0,    0,    0,     0};
    SUBCASE("full, sigmoid scores") { c.depth_score = 1; }
    SUBCASE("block S=2, sigmoid scores") { c.block_size = 2; c.depth_score = 1; }
    SUBCASE("full, no key norm") { c.key_norm_off = 1; }
    SUBCASE("block S=2, no key norm") { c.block_size = 2; c.key_norm_off = 1; }
    SUBCASE("full, input-dependent query") { c.depth_query = 1; }
    SUBCASE("block S=2, input-dependent query") { c.block_size = 2; c.depth_query = 1; }
    SUBCASE("full, 2 heads") { c.depth_heads = 2; }
    SUBCASE("block S=2, 4 heads") { c.block_size = 2; c.depth_heads = 4; }
    SUBCASE("full, window W=2") { c.depth_window = 2; }
    SUBCASE("full, static mixing") { c.mixing = 1; }
    SUBCASE("block S=2, static mixing") { c.block_size = 2; c.mixing = 1; }
    SUBCASE("full, DenseFormer") { c.mixing = 2; }
    SUBCASE("block S=2, DenseFormer") { c.block_size = 2; c.mixing = 2; }
    SUBCASE("full, window W=2, static mixing") { c.depth_window = 2; c.mixing = 1; }
    SUBCASE("full, window W=2, every attention switch, 4 heads") {
        c.depth_window = 2; c.depth_score = 1; c.key_norm_off = 1; c.depth_query = 1; c.depth_heads = 4;
    }
    SUBCASE("block S=2, L=3, softmax, input-dependent query, 2 heads") {
        c.n_layers = 3; c.block_size = 2; c.depth_query = 1; c.depth_heads = 2;
    }
    char problem[256];
    REQUIRE_MESSAGE(model_config_check(&c, problem, sizeof problem) == 0, problem);
    char variant[256];
    variant_describe(&c, variant, sizeof variant);
    CAPTURE(c.block_size);
    CAPTURE(std::string(variant));
    check_gpu_model(c, Steps::same_gradients);
}

// mHC-lite (mhc.cu; SPEC "mHC-lite"), m = 2, 3, 4: the streams, their norm over m*d values,
// the coefficients, H as a mix of the m! permutations, the head's sum of the normed streams.
// The steps use the GPU's gradients on both sides (Steps::same_gradients): every stream
// entering sub-layer 0 is x0, so its input u = (sum_s a_pre[s]) x0 is x0 scaled, a scale
// that the sub-layer's RMSNorm takes out again, and the gradients of its pre gates (their
// rows of hc_proj, hc_bias and the pre scale) are rounding noise that only the norm's eps
// sees (as DenseFormer's beta_{0,0} below), which AdamW's first steps move by about lr either
// way. Stepped their own ways, those parameters differed by up to 1e-3 after 3 steps, with
// every gradient in tolerance. (The res logits' gradients there are exactly 0 on both sides:
// H mixes equal streams; tests/cuda_test_layers.cpp.)
TEST_CASE("the whole model on the GPU matches the CPU in mhc mode, m = 2, 3, 4") {
    //                V   d  L  H  G  F  S
    ModelConfig c = {11, 16, 2, 4, 2, 24, 0};
    SUBCASE("m=2") { c.streams = 2; }
    SUBCASE("m=3, L=3, multi-query") { c.streams = 3; c.n_layers = 3; c.n_kv_heads = 1; }
    SUBCASE("m=4") { c.streams = 4; }
    char problem[256];
    REQUIRE_MESSAGE(model_config_check(&c, problem, sizeof problem) == 0, problem);
    CAPTURE(c.streams);
    check_gpu_model(c, Steps::same_gradients);
}

// ./train_cuda's step reads the loss and the gradient norm back once, after the backward
// (model_forward_backward_cuda): the same numbers, bit for bit, as the step taken in pieces,
// each read back when asked (model_forward_cuda, model_grad_norm_cuda), and the same gradients.
TEST_CASE("the one-read-back training step equals the step in pieces, bit for bit") {
    gradcheck::SingleThreaded one_thread;
    ModelConfig c = {11, 16, 2, 4, 2, 24, 2};
    SUBCASE("block S=2") { c.block_size = 2; }
    SUBCASE("none") { c.block_size = 0; }
    SUBCASE("mhc, 4 streams") { c.block_size = 0; c.streams = 4; }
    const size_t B = 3, T = 6, N = B * T;
    std::vector<int> tokens, targets;
    random_batch(tokens, targets, N, c.vocab_size, 45, 5);
    Model host;
    model_build(&host, &c, B, T);
    randomise_params(&host, 9);
    ModelCuda pieces, one;
    model_build_cuda(&pieces, &c, B, T);
    model_build_cuda(&one, &c, B, T);
    model_to_device_cuda(&pieces, &host);
    model_to_device_cuda(&one, &host);
#ifndef __CUDACC__
    // model_build_cuda reserved everything a step needs (the workspace, RoPE's table): the
    // steps below allocate no device memory
    size_t mallocs_before_steps = cuda_emu::malloc_calls;
#endif
    for (int step = 1; step <= 2; step++) {  // the second step after an AdamW update
        CAPTURE(step);
        float loss = forward_backward_cuda(&pieces, tokens, targets, B, T);
        float norm = model_grad_norm_cuda(&pieces);
        float loss_one = -1.0f, norm_one = -1.0f;
        model_forward_backward_cuda(&one, tokens.data(), targets.data(), B, T, &loss_one,
                                    &norm_one);
        CHECK(loss_one == loss);
        CHECK(one.model.loss == loss);
        CHECK(norm_one == norm);
        size_t n_params = host.num_params;
        compare_exact("grads", download(one.model.grads_memory, n_params).data(),
                      download(pieces.model.grads_memory, n_params).data(), n_params);
        model_update_cuda(&pieces, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        model_update_cuda(&one, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
#ifndef __CUDACC__
    CHECK_MESSAGE(cuda_emu::malloc_calls == mallocs_before_steps,
                  "training steps allocated device memory (cudaMalloc) after model_build_cuda");
#endif
    model_free_cuda(&pieces);
    model_free_cuda(&one);
    model_free(&host);
}

#ifndef __CUDACC__
// What one training step queues on the GPU, counted by the emulator: in full and block the
// depth attention and the RMSNorm that reads its output run fused (one kernel forward, the
// rows kernel and the parts' sum backward)
// (attnres_input_forward_cuda and its backward, which model.c's input_forward and
// input_backward call), so an AttnRes step launches no more kernels, memsets and copies than
// a PreNorm one; without the fusion (the two layers called in turn) it would launch 4 more
// per sub-layer input.
TEST_CASE("a full or block training step queues no more GPU work than a none step") {
    //                V   d  L  H  G  F  S
    ModelConfig c = {11, 16, 4, 4, 2, 24, 0};
    const size_t B = 2, T = 5;
    std::vector<int> tokens, targets;
    random_batch(tokens, targets, B * T, c.vocab_size, 61, 4);
    auto queued = [&](int block_size, size_t* launches, size_t* operations) {
        c.block_size = block_size;
        ModelCuda m;
        model_build_cuda(&m, &c, B, T);
        size_t launches_before = cuda_emu::kernel_launches;
        size_t operations_before = cuda_emu::async_operations;
        float loss = 0.0f, norm = 0.0f;
        model_forward_backward_cuda(&m, tokens.data(), targets.data(), B, T, &loss, &norm);
        *launches = cuda_emu::kernel_launches - launches_before;
        *operations = cuda_emu::async_operations - operations_before;
        model_free_cuda(&m);
    };
    size_t none_launches = 0, none_operations = 0;
    queued(0, &none_launches, &none_operations);
    for (int block_size : {1, 2, 4}) {
        CAPTURE(block_size);
        size_t launches = 0, operations = 0;
        queued(block_size, &launches, &operations);
        MESSAGE("kernels " << launches << " (none " << none_launches << "), memsets and copies "
                << operations << " (none " << none_operations << ")");
        CHECK(launches <= none_launches);
        CHECK(operations <= none_operations);
    }
}
#endif

#ifdef __CUDACC__
// The largest change of each tensor of the CPU's results (logits, then each gradient) when
// every parameter moves by a relative 2^-23 (one or two units in the last place), in random
// directions: how far apart two float32 computations of this model can land through rounding
// alone. cpu has just run forward and backward on (tokens, targets): that is the baseline;
// its parameters, logits and gradients are as they were when this returns.
struct Sensitivity {
    double logits = 0.0;
    std::vector<double> grads;
    double norm = 0.0;  // of the gradient norm, relative
};
static Sensitivity ulp_sensitivity(Model* cpu, const std::vector<int>& tokens,
                                   const std::vector<int>& targets, size_t B, size_t T,
                                   uint64_t seed) {
    size_t n_params = cpu->num_params, NV = B * T * cpu->config.vocab_size;
    Floats params(cpu->params_memory, cpu->params_memory + n_params);
    Floats logits(model_logits(cpu), model_logits(cpu) + NV);
    Floats grads(cpu->grads_memory, cpu->grads_memory + n_params);
    double norm = model_grad_norm(cpu);
    Rng rng(seed);
    for (size_t j = 0; j < n_params; j++)
        cpu->params_memory[j] *= 1.0f + (rng.next() & 1 ? 1.0f : -1.0f) * FLT_EPSILON;
    forward_backward(cpu, tokens, targets, B, T);
    Sensitivity s;
    for (size_t i = 0; i < NV; i++)
        s.logits = std::max(s.logits, (double)std::fabs(model_logits(cpu)[i] - logits[i]));
    size_t offset = 0;
    for (int t = 0; t < N_PARAM_TENSORS; t++) {
        double most = 0.0;
        for (size_t j = offset; j < offset + cpu->param_sizes[t]; j++)
            most = std::max(most, (double)std::fabs(cpu->grads_memory[j] - grads[j]));
        s.grads.push_back(most);
        offset += cpu->param_sizes[t];
    }
    s.norm = std::fabs(model_grad_norm(cpu) - norm) / norm;
    std::copy(params.begin(), params.end(), cpu->params_memory);
    std::copy(logits.begin(), logits.end(), cpu->acts.logits);
    std::copy(grads.begin(), grads.end(), cpu->grads_memory);
    return s;
}

// tol, with its atol raised to 4 x the sensitivity where that is larger (check_state's rule)
static Tolerance conditioned(Tolerance tol, double sensitivity) {
    return {std::max(tol.atol, 4.0 * sensitivity), tol.rtol};
}

// On a GPU (build/test_cuda_gpu, make gpu-check): the bench configuration of dev/bench/bench.c,
// d=256 L=8 H=8 G=4 F=704 V=256, B=8 T=128 (B*T = 1024 rows), in every mode and five of
// SPEC's variants, SPEC's init with gains and pseudo-queries randomised. Sums run over up to
// 1024 rows and 704 columns here,
// ~10x longer than in the small test above, so each tolerance is 10x the small test's.
// Random pseudo-queries of size ~1 against keys of 256 unit-RMS entries give depth scores of
// size ~10, near one-hot softmaxes that turn rounding into differences: moving every
// parameter by 2^-23 moves the CPU's own logits by 3e-4 in `full` (1.7e-6 in `none`), more
// than the tolerance; an H200 differed by 1.4e-4. So each tensor's atol is raised to 4 x that
// sensitivity where it is larger (ulp_sensitivity, measured at every step), and so is the
// gradient norm's relative tolerance (an H200: 1.8e-4 apart in `full` at step 2).
TEST_CASE("GPU: the whole model at the bench size matches the CPU: loss, gradients, 2 AdamW steps") {
    const Tolerance forward_tol{1e-4, 1e-4}, grad_tol{1e-4, 1e-3}, param_tol{1e-4, 1e-3};
    ModelConfig c = {256, 256, 8, 8, 4, 704, 0};
    SUBCASE("none") { c.block_size = 0; }
    SUBCASE("full") { c.block_size = 1; }
    SUBCASE("block S=4") { c.block_size = 4; }
    // SPEC's variants as `make bench` runs them (their kernels at the bench shapes)
    SUBCASE("full, 16 heads") { c.block_size = 1; c.depth_heads = 16; }
    SUBCASE("block S=4, 16 heads") { c.block_size = 4; c.depth_heads = 16; }
    SUBCASE("full, sigmoid, no key norm, input-dependent query") {
        c.block_size = 1; c.depth_score = 1; c.key_norm_off = 1; c.depth_query = 1;
    }
    SUBCASE("full, window 8, DenseFormer") { c.block_size = 1; c.depth_window = 8; c.mixing = 2; }
    SUBCASE("block S=4, static mixing") { c.block_size = 4; c.mixing = 1; }
    CAPTURE(c.block_size);
    const size_t B = 8, T = 128, N = B * T, V = c.vocab_size;
    std::vector<int> tokens, targets;
    random_batch(tokens, targets, N, V, 43, 7);
    Rng rng(44);
    Model cpu;
    model_build(&cpu, &c, B, T);
    model_init_params(&cpu, 5);
    float* p = cpu.params_memory;
    for (int i = 0; i < N_PARAM_TENSORS; i++) {
        for (size_t j = 0; j < cpu.param_sizes[i]; j++) {
            if (PARAM_INFO[i].init == INIT_ONE) p[j] = rng.uniform(0.5f, 1.5f);
            if (i == PARAM_res_query) p[j] = rng.uniform(-1.0f, 1.0f);
        }
        p += cpu.param_sizes[i];
    }
    ModelCuda gpu;
    model_build_cuda(&gpu, &c, B, T);
    model_to_device_cuda(&gpu, &cpu);
    size_t n_params = cpu.num_params;
    Model back;
    model_build(&back, &c, 1, 1);

    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    for (int t = 1; t <= 2; t++) {
        CAPTURE(t);
        float loss = forward_backward(&cpu, tokens, targets, B, T);
        Sensitivity s = ulp_sensitivity(&cpu, tokens, targets, B, T, 100 + t);
        CAPTURE(s.logits);
        CAPTURE(s.norm);
        float loss_cuda = forward_backward_cuda(&gpu, tokens, targets, B, T);
        CHECK(loss_cuda == doctest::Approx(loss).epsilon(1e-4));
        compare_within("logits", download(model_logits_cuda(&gpu), N * V).data(),
                       model_logits(&cpu), N * V, conditioned(forward_tol, s.logits));
        Floats grads = download(gpu.model.grads_memory, n_params);
        size_t offset = 0;
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            compare_within(std::string("grad ") + PARAM_INFO[i].name, grads.data() + offset,
                           cpu.grads_memory + offset, cpu.param_sizes[i],
                           conditioned(grad_tol, s.grads[i]));
            offset += cpu.param_sizes[i];
        }
        float norm = model_grad_norm(&cpu), norm_cuda = model_grad_norm_cuda(&gpu);
        CHECK(norm_cuda == doctest::Approx(norm).epsilon(std::max(1e-4, 4.0 * s.norm)));
        // The CPU steps with the GPU's gradients (just checked against its own): AdamW's first
        // steps move each weight by ~lr times the SIGN of its gradient, so a gradient that is
        // rounding noise (~1e-8 where the exact value is 0 or tiny) would step either way on
        // the two machines, and step 2 would compare two different models (an H200 showed
        // 2e-3 weight differences and a grad norm 17% apart). From the same gradients, the
        // parameters after the steps test the update, and step 2 the model at one point.
        std::copy(grads.begin(), grads.end(), cpu.grads_memory);
        model_update(&cpu, lr, beta1, beta2, eps, weight_decay, t);
        model_update_cuda(&gpu, lr, beta1, beta2, eps, weight_decay, t);
    }
    model_to_host_cuda(&back, &gpu);
    compare_tensors("after 2 steps: param", back.params_memory, cpu.params_memory,
                    cpu.param_sizes, param_tol);
    model_free(&back);
    model_free_cuda(&gpu);
    model_free(&cpu);
}
#endif

// --optimizer muon on the GPU's model (trainer_update calls model_update_shard_muon with the
// CUDA table): three steps on the same random gradients as the CPU model, which takes the
// same steps; Muon's matrices through muon_update_cuda, the rest through adamw_update_cuda.
TEST_CASE("Muon steps of the whole model on the GPU match the CPU's") {
    ModelConfig c = {11, 16, 2, 4, 2, 24, 2};
    Model cpu;
    model_build(&cpu, &c, 1, 1);
    randomise_params(&cpu, 77);
    ModelCuda gpu;
    model_build_cuda(&gpu, &c, 1, 1);
    model_to_device_cuda(&gpu, &cpu);
    size_t n_params = cpu.num_params;
    Rng rng(78);
    for (int t = 1; t <= 3; t++) {
        Floats grads = rng.uniform_vector(n_params, -1, 1);
        std::copy(grads.begin(), grads.end(), cpu.grads_memory);
        cudaCheck(cudaMemcpy(gpu.model.grads_memory, grads.data(), n_params * sizeof(float),
                             cudaMemcpyHostToDevice));
        model_update_shard_muon(&cpu, 0, n_params, cpu.grads_memory, cpu.m_memory, cpu.v_memory, 0.02f,
                                0.9f, 0.95f, 1e-8f, 0.1f, t, 0.95f);
        model_update_shard_muon(&gpu.model, 0, n_params, gpu.model.grads_memory, gpu.model.m_memory,
                                gpu.model.v_memory, 0.02f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.95f);
    }
    Model back;
    model_build(&back, &c, 1, 1);
    model_to_host_cuda(&back, &gpu);
    compare_within("params after 3 Muon steps", back.params_memory, cpu.params_memory, n_params,
                   Tolerance{1e-5, 1e-5});
    compare_within("m after 3 Muon steps", back.m_memory, cpu.m_memory, n_params, Tolerance{1e-6, 1e-5});
    compare_within("v after 3 Muon steps", back.v_memory, cpu.v_memory, n_params, Tolerance{1e-7, 1e-5});
    model_free(&back);
    model_free_cuda(&gpu);
    model_free(&cpu);
}

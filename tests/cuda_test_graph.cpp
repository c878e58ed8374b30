// cuda_test_graph.cpp — ./train_cuda's step as CUDA graphs (model_use_graph_cuda: captured at
// its first use, then walked for the arguments that change and replayed) against the same
// step queued call by call (--no-graph): the same losses, norms, parameters and AdamW / Muon
// state, bit for bit, over steps whose number of targets, learning rate, AdamW step and
// clipping change from step to step. Under the emulator (tests/cuda_emu.h, both thread
// orders) the two ways also run the same launches, sets and copies in the same order, with the
// same grids, blocks and argument bytes: the emulator traces what runs, and the graph's nodes
// run there as on a GPU. Built by nvcc (build/test_cuda_gpu) the results are compared on a GPU.
#include <doctest/doctest.h>

#include <string.h>

#include <string>
#include <vector>

#include "common.cuh"
#include "gradcheck.h"
#include "layers.h"
#include "model.cuh"
#include "model.h"

typedef std::vector<float> Floats;

static Floats download(const float* device, size_t n) {
    Floats host(n);
    cudaCheck(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

static bool same_bits(const Floats& a, const Floats& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What a run of steps gave: per step the loss and norm, then the state after the last step
struct Steps {
    std::vector<float> losses, norms;
    Floats params, m, v;
#ifndef __CUDACC__
    std::vector<std::vector<cuda_emu::Operation>> traces;  // per step, what ran
#endif
};

// `n_steps` steps of train.c's loop on gpu, from the host model's parameters and moments, the
// batches in tokens and targets (B*T, host: the same arrays every run, as the upload's source
// is traced too): the batch of step t has every (t+2)-th target ignored (the count of targets
// changes), lr and clipping change too: max_norm 1e-3 (clipped), 1e6 (not), 1e-3, 0 (off), ...
static Steps run_steps(ModelCuda* gpu, const Model* host, bool graph, bool muon, size_t B,
                       size_t T, int n_steps, std::vector<int>& tokens, std::vector<int>& targets) {
    model_to_device_cuda(gpu, host);
    model_use_graph_cuda(gpu, graph);
    Steps s;
    size_t N = B * T, V = host->config.vocab_size;
    gradcheck::Rng rng(21);
    const float max_norms[4] = {1e-3f, 1e6f, 1e-3f, 0.0f};
    for (int t = 1; t <= n_steps; t++) {
        for (size_t i = 0; i < N; i++) {
            tokens[i] = (int)(rng.next() % V);
            targets[i] = i % (size_t)(t + 2) == 1 ? -1 : (int)(rng.next() % V);
        }
#ifndef __CUDACC__
        cuda_emu::trace.clear();
        cuda_emu::tracing = true;
#endif
        model_step_forward_cuda(gpu, tokens.data(), targets.data(),
                                crossentropy_count(targets.data(), N), B, T);
        model_zero_grad_cuda(gpu);
        model_step_backward_cuda(gpu);
        float norm, loss = model_step_loss_and_norm_cuda(gpu, &norm);
        ModelUpdate u = {norm, max_norms[(t - 1) % 4], muon, 1e-2f / (float)t, 0.9f, 0.95f,
                         1e-8f, 0.1f, 0.95f, t};
        model_update_step_cuda(gpu, &u);
        model_wait_cuda();
#ifndef __CUDACC__
        cuda_emu::tracing = false;
        s.traces.push_back(cuda_emu::trace);
#endif
        s.losses.push_back(loss);
        s.norms.push_back(norm);
    }
    size_t n_params = host->num_params;
    s.params = download(gpu->model.params_memory, n_params);
    s.m = download(gpu->model.m_memory, n_params);
    s.v = download(gpu->model.v_memory, n_params);
    return s;
}

TEST_CASE("the step as CUDA graphs runs what the step queued call by call runs, bit for bit") {
    gradcheck::SingleThreaded one_thread;
    //                V   d  L  H  G  F  S
    ModelConfig c = {11, 16, 2, 4, 2, 24, 0};
    bool muon = false;
    SUBCASE("none") {}
    SUBCASE("full") { c.block_size = 1; }
    SUBCASE("block S=2") { c.block_size = 2; }
    SUBCASE("block S=2, Muon") { c.block_size = 2; muon = true; }
    SUBCASE("mhc, 3 streams, Muon") { c.streams = 3; muon = true; }
    SUBCASE("block S=2, L=3, sigmoid, no key norm, input query, 2 heads") {
        c.n_layers = 3; c.block_size = 2; c.depth_score = 1; c.key_norm_off = 1;
        c.depth_query = 1; c.depth_heads = 2;
    }
    SUBCASE("full, window 2, DenseFormer") { c.block_size = 1; c.depth_window = 2; c.mixing = 2; }
    SUBCASE("full, static mixing") { c.block_size = 1; c.mixing = 1; }
    char problem[256];
    REQUIRE_MESSAGE(model_config_check(&c, problem, sizeof problem) == 0, problem);
    CAPTURE(c.block_size);
    CAPTURE(c.streams);
    CAPTURE(muon);
    const size_t max_B = 3, max_T = 6, B = 2, T = 5;  // built larger than it runs
    Model host;
    model_build(&host, &c, max_B, max_T);
    model_init_params(&host, 5);
    ModelCuda gpu;  // one model both ways: the same buffers, so the same argument bytes
    model_build_cuda(&gpu, &c, max_B, max_T);
    const int n_steps = 5;
    std::vector<int> tokens(B * T), targets(B * T);
    Steps queued = run_steps(&gpu, &host, false, muon, B, T, n_steps, tokens, targets);
#ifndef __CUDACC__
    size_t mallocs_before = cuda_emu::malloc_calls;
#endif
    Steps graphs = run_steps(&gpu, &host, true, muon, B, T, n_steps, tokens, targets);
    for (int t = 0; t < n_steps; t++) {
        CAPTURE(t + 1);
        CHECK(memcmp(&graphs.losses[t], &queued.losses[t], sizeof(float)) == 0);
        CHECK(memcmp(&graphs.norms[t], &queued.norms[t], sizeof(float)) == 0);
#ifndef __CUDACC__
        const std::vector<cuda_emu::Operation>& a = graphs.traces[t];
        const std::vector<cuda_emu::Operation>& b = queued.traces[t];
        size_t first = 0;  // the first operation that differs
        while (first < a.size() && first < b.size() && a[first] == b[first]) first++;
        CHECK_MESSAGE(a.size() == b.size(), "graphs ran " << a.size() << " operations, the "
                      "step queued call by call " << b.size());
        CHECK_MESSAGE(first == b.size(), "operation " << first << " differs");
        CHECK(b.size() > 100);
#endif
    }
    CHECK(queued.losses[0] != queued.losses[1]);  // the steps did change the model
    CHECK(same_bits(graphs.params, queued.params));
    CHECK(same_bits(graphs.m, queued.m));
    CHECK(same_bits(graphs.v, queued.v));
#ifndef __CUDACC__
    CHECK_MESSAGE(cuda_emu::malloc_calls == mallocs_before,
                  "the graphs' steps allocated device memory (cudaMalloc)");
#endif
    model_free_cuda(&gpu);
    model_free(&host);
}

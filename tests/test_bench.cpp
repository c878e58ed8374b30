// test_bench.cpp — the statistics `make bench` reports (dev/bench/bench_util.h): quantiles,
// and the median's 95 % confidence interval, whose claims ("full's overhead is below 10 %")
// rest on it covering the true median as often as it says; and its memory lines (the
// activations and the training state of each config).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../dev/bench/bench_util.h"

TEST_CASE("quantile picks the nearest order statistic of the sorted values") {
    std::vector<double> v = {5, 1, 4, 2, 3};
    sort_values(v.data(), 5);
    CHECK(quantile(v.data(), 5, 0.5) == 3);
    CHECK(quantile(v.data(), 5, 0.25) == 2);
    CHECK(quantile(v.data(), 5, 0.75) == 4);
    CHECK(quantile(v.data(), 5, 0.0) == 1);
    CHECK(quantile(v.data(), 5, 1.0) == 5);
}

TEST_CASE("the median's 95% interval is the binomial table's order statistics") {
    // for n = 25 values the textbook interval is the 8th and the 18th smallest (coverage
    // 95.7 %); for n = 301, the 134th and the 168th
    std::vector<double> v(301);
    for (int i = 0; i < 301; i++) v[(size_t)i] = (double)((i * 37) % 301) + 1;  // 1 .. 301 shuffled
    double lo, hi;
    std::vector<double> first(v.begin(), v.begin() + 25);
    sort_values(first.data(), 25);
    median_interval(first.data(), 25, &lo, &hi);
    CHECK(lo == first[7]);
    CHECK(hi == first[17]);
    sort_values(v.data(), 301);
    median_interval(v.data(), 301, &lo, &hi);
    CHECK(lo == 134);
    CHECK(hi == 168);
    median_interval(v.data(), 1, &lo, &hi);  // one round: the interval is that round
    CHECK(lo == v[0]);
    CHECK(hi == v[0]);
}

TEST_CASE("the median's interval covers the true median in about 95% of samples, skewed noise too") {
    // exponential noise (the machine's: mostly small, a long tail of slow rounds), true
    // median ln 2; 4000 samples of 25 rounds each
    uint64_t state = 12345;
    int covered = 0, trials = 4000;
    std::vector<double> sample(25);
    for (int t = 0; t < trials; t++) {
        for (double& x : sample) x = -std::log(1.0 - rng_uniform(&state));
        double lo, hi;
        sort_values(sample.data(), 25);
        median_interval(sample.data(), 25, &lo, &hi);
        covered += lo <= std::log(2.0) && std::log(2.0) <= hi;
    }
    double coverage = (double)covered / trials;
    INFO("coverage " << coverage);
    // exact: 95.7 %; one standard error over 4000 trials is 0.32 %: within three of them
    CHECK(coverage > 0.947);
    CHECK(coverage < 0.967);
}

TEST_CASE("bench_memory counts point_activations' table and the parameters of each config") {
    for (int i = 0; i < N_BENCH_CONFIGS; i++) {
        const char* name;
        int parent;
        ModelConfig c = bench_config_at(i, &name, &parent);
        CAPTURE(name);
        std::vector<SubLayer> sub(2 * (size_t)c.n_layers + 1);
        Activations a;
        a.sub = sub.data();
        size_t sizes[N_PARAM_TENSORS];
        BenchMemory m = bench_memory(&c, 3, 5);
        CHECK(m.activations == point_activations(&a, &c, 3, 5, 1, NULL));
        CHECK(m.params == param_sizes(&c, sizes));
    }
    // the activations grow with the batch; the parameters do not
    ModelConfig none = bench_config(0), full = bench_config(1);
    CHECK(bench_memory(&none, 2, 8).activations > bench_memory(&none, 1, 8).activations);
    CHECK(bench_memory(&none, 2, 8).params == bench_memory(&none, 1, 8).params);
    // full AttnRes keeps more than none (every partial, the weights), its few parameters more
    CHECK(bench_memory(&full, 8, 128).activations > bench_memory(&none, 8, 128).activations);
    CHECK(bench_memory(&full, 8, 128).params > bench_memory(&none, 8, 128).params);
    // mHC-lite keeps its m streams (and their norm) for every sub-layer: more with 4 than 2,
    // and more than full AttnRes
    ModelConfig mhc4 = bench_mhc_config(0), mhc2 = bench_mhc_config(1);
    CHECK(mhc4.streams == 4);
    CHECK(mhc2.streams == 2);
    CHECK(bench_memory(&mhc4, 8, 128).activations > bench_memory(&mhc2, 8, 128).activations);
    CHECK(bench_memory(&mhc2, 8, 128).activations > bench_memory(&full, 8, 128).activations);
}

TEST_CASE("the benches' configs: the three modes, mHC-lite with 4 and 2 streams, then the variants") {
    const char* name;
    int parent;
    CHECK(bench_config_at(0, &name, &parent).block_size == 0);
    CHECK(std::string(name) == "none");
    ModelConfig c = bench_config_at(N_MODES, &name, &parent);
    CHECK(std::string(name) == "mhc m=4");
    CHECK(c.streams == 4);
    CHECK(c.block_size == 0);
    CHECK(parent == 0);  // its overhead is against none
    c = bench_config_at(N_MODES + 1, &name, &parent);
    CHECK(std::string(name) == "mhc m=2");
    CHECK(c.streams == 2);
    c = bench_config_at(N_BENCH_MODES, &name, &parent);
    CHECK(std::string(name) == BENCH_VARIANT_NAMES[0]);
    CHECK(parent == BENCH_VARIANT_MODES[0]);
    CHECK(c.streams == 0);
    for (int i = 0; i < N_BENCH_CONFIGS; i++) {
        c = bench_config_at(i, &name, &parent);
        char problem[256];
        CAPTURE(name);
        CHECK(model_config_check(&c, problem, sizeof problem) == 0);
        CHECK(parent < N_MODES);  // a variant varies full or block
    }
}

TEST_CASE("print_memory writes a header and one line per config: MB, the ratio to none, the state") {
    const char* names[N_BENCH_CONFIGS];
    ModelConfig configs[N_BENCH_CONFIGS];
    for (int i = 0; i < N_BENCH_CONFIGS; i++) {
        int parent;
        configs[i] = bench_config_at(i, &names[i], &parent);
    }
    FILE* f = tmpfile();
    REQUIRE(f != NULL);
    print_memory(f, names, configs, N_BENCH_CONFIGS, 8, 128);
    rewind(f);
    char line[512];
    REQUIRE(fgets(line, sizeof(line), f) != NULL);
    CHECK(std::string(line).rfind("memory at B=8 T=128", 0) == 0);
    double none_mb = 0.0;
    for (int i = 0; i < N_BENCH_CONFIGS; i++) {
        CAPTURE(names[i]);
        REQUIRE(fgets(line, sizeof(line), f) != NULL);
        std::string text(line);
        REQUIRE(text.rfind(names[i], 0) == 0);  // the name first
        double mb = 0.0, ratio = 0.0, state = 0.0;
        size_t params = 0;
        REQUIRE(sscanf(line + strlen(names[i]), " activations %lf MB (%lfx none) training state "
                       "%lf MB (%zu parameters)", &mb, &ratio, &state, &params) == 4);
        BenchMemory m = bench_memory(&configs[i], 8, 128);
        CHECK(mb == doctest::Approx(m.activations * 4.0 / 1e6).epsilon(1e-3));
        CHECK(state == doctest::Approx(m.params * 16.0 / 1e6).epsilon(1e-3));
        CHECK(params == m.params);
        if (i == 0) none_mb = mb;
        CHECK(ratio == doctest::Approx(mb / none_mb).epsilon(1e-2));
    }
    CHECK(fgets(line, sizeof(line), f) == NULL);  // nothing more
    fclose(f);
}

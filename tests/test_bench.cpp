// test_bench.cpp — the statistics `make bench` reports (dev/bench/bench_util.h): quantiles,
// and the median's 95 % confidence interval, whose claims ("full's overhead is below 10 %")
// rest on it covering the true median as often as it says.
#include <doctest/doctest.h>

#include <cmath>
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

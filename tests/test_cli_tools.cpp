// test_cli_tools.cpp — the tools beside ./train, run as a person runs them (tests/cli.h):
// make plots' script, make bench-sizes' benchmark (build/bench_sizes) and make scaling's fit
// (build/scaling_fit).
#include "cli.h"

#include <iomanip>

// ---- make plots, make bench-sizes, make scaling ------------------------------------------

TEST_CASE("make plots on a run stopped before its first evaluation: one error line") {
    TempDir dir;
    std::string diag = dir.file("diag");
    check_success(run_train(dir, tiny({"--steps", "10", "--eval-every", "5", "--log-every", "5",
                                       "--stop-after", "1", "--diagnostics", diag})));
    write_text(diag + "/eval.csv", "step,val_loss,accuracy,exact_match\n");  // no evaluation yet
    Run plots = run_program(dir, "dev/experiments/plots.sh", {diag});
    CHECK(plots.exit_code == 1);
    CHECK(contains(plots.err, "eval.csv has only its header line"));
    CHECK(lines_of(plots.err).size() == 1);
}

TEST_CASE("make bench-sizes' benchmark refuses a size it cannot build, and unknown arguments, in one line") {
    TempDir dir;
    // d not a multiple of 64; L odd (block S=4 needs 4 | 2L); T not one of 128 .. 4096; two
    // numbers; something after the third
    for (const char* size : {"100,8,128", "256,3,128", "256,8,100", "256,8", "256,8,128x"})
        check_error(run_program(dir, "build/bench_sizes", {"--size", size}), {"--size", size});
    check_error(run_program(dir, "build/bench_sizes", {"--rounds", "0"}), {"--rounds"});
    check_error(run_program(dir, "build/bench_sizes", {"--mode", "mhc"}), {"--mode", "mhc"});
    check_error(run_program(dir, "build/bench_sizes", {"--bogus"}), {"unknown argument", "--bogus"});
}

// make scaling's fit (dev/experiments/scaling_fit.c) on losses that follow a known law:
// a baseline at loss = 2·C^−0.1 and a mode at the baseline's loss for 1.5 times its compute,
// every size at two seeds a factor e^±0.002 apart (so the least squares in log space meet
// the law exactly, and the seeds still differ)
TEST_CASE("the scaling fit recovers A and α of a power law and a mode's compute multiplier") {
    TempDir dir;
    const double pflop_s_day = 8.64e19, alpha = 0.1;
    std::ostringstream csv;
    csv << "mode,size,seed,params,tokens,flops,val_loss\n";
    // and a third mode on a steeper law, 3·C^−0.12: its multiplier at the largest C (1e13)
    // is (2 / (3·1e13^−0.12))^(1/0.1) / 1e13, which mixes the two modes' A and α
    for (const char* mode : {"none", "fast", "steep"}) {
        for (int size = 0; size < 4; size++) {
            double C = 1e10 * std::pow(10.0, size);
            double loss = std::string(mode) == "steep"
                              ? 3.0 * std::pow(C, -0.12)
                              : 2.0 * std::pow((std::string(mode) == "fast" ? 1.5 : 1.0) * C, -alpha);
            for (int seed = 1; seed <= 2; seed++)
                csv << mode << ",s" << size << "," << seed << ","
                    << (std::string(mode) == "steep" ? "1250,2000," : std::string(mode) == "fast" ? "1000,3000," : "1000,2000,")
                    << C << ","
                    << std::setprecision(12) << loss * std::exp(seed == 1 ? 0.002 : -0.002) << "\n";
        }
    }
    write_text(dir.file("runs.csv"), csv.str());
    Run fit = run_program(dir, "build/scaling_fit", {dir.file("runs.csv"), dir.file("fits.csv")});
    check_success(fit);
    char A_base[32], A_fast[32];  // A for C in PFLOP/s-days
    std::snprintf(A_base, sizeof(A_base), "%.4g", 2.0 * std::pow(pflop_s_day, -alpha));
    std::snprintf(A_fast, sizeof(A_fast), "%.4g", 2.0 * std::pow(1.5 * pflop_s_day, -alpha));
    CHECK_MESSAGE(contains(fit.out, std::string("| none | ") + A_base + " · C^−0.1000 | 1 (the baseline) |"), fit.out);
    CHECK_MESSAGE(contains(fit.out, std::string("| fast | ") + A_fast + " · C^−0.1000 | 1.50× ["), fit.out);
    // the baseline's params and tokens, the fewest tokens a parameter of any mode (steep's
    // 2000 / 1250, not the baseline's 2 or fast's 3); 2·(1e13)^−0.1 and 2·(1.5e13)^−0.1; sd of
    // x·e^±0.002: x·0.002·sqrt(2)
    CHECK_MESSAGE(contains(fit.out, "| s3 | 1e+03 | 2e+03 | 1.6 | 1e+13 | 0.1002 ± 0.0003 | 0.0963 ± 0.0003 |"), fit.out);
    std::vector<std::string> fits = lines_of(read_text(dir.file("fits.csv")));
    REQUIRE(fits.size() == 4);
    CHECK(fits[2].rfind("fast,", 0) == 0);
    double lo = 0, hi = 0, multiplier = 0;
    REQUIRE(std::sscanf(fits[2].c_str(), "fast,%*g,%*g,%lg,%lg,%lg", &multiplier, &lo, &hi) == 3);
    CHECK(multiplier == doctest::Approx(1.5).epsilon(1e-4));
    CHECK(lo < 1.5); CHECK(hi > 1.5); CHECK(hi < 1.6); CHECK(lo > 1.4);  // the seeds' spread
    double steep_A = 0, steep_alpha = 0;
    REQUIRE(std::sscanf(fits[3].c_str(), "steep,%lg,%lg,%lg", &steep_A, &steep_alpha, &multiplier) == 3);
    CHECK(steep_A == doctest::Approx(3.0 * std::pow(pflop_s_day, -0.12)).epsilon(1e-4));
    CHECK(steep_alpha == doctest::Approx(0.12).epsilon(1e-4));
    double steep_multiplier = std::pow(2.0 / (3.0 * std::pow(1e13, -0.12)), 1.0 / alpha) / 1e13;
    CHECK(multiplier == doctest::Approx(steep_multiplier).epsilon(1e-4));

    write_text(dir.file("bad.csv"), "mode,size,seed,params,tokens,flops,val_loss\nnone,s0,1,10,20,abc,2\n");
    Run bad = run_program(dir, "build/scaling_fit", {dir.file("bad.csv")});
    CHECK(bad.exit_code == 1);
    REQUIRE(lines_of(bad.err).size() == 1);
    CHECK(contains(bad.err, "error: scaling_fit: malformed line"));
}

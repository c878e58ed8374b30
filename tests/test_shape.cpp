// test_shape.cpp — make shape and make scaling's sweeps, run as a person runs them
// (tests/cli.h): make shape's reading of the best depth (build/shape_fit) on losses with a
// known best, its widths against the trainer's own parameter count, the size tables of make
// scaling and every run's steps against their tokens a parameter, and a dry run of each sweep (two tiny sizes, a
// few steps) that must write its table, CSVs and charts.
#include "cli.h"

#include <iomanip>
#include <map>

namespace {

// the rows of a size table printed by --print-sizes, each split at its spaces
std::vector<std::vector<std::string>> rows_of(const std::string& out) {
    std::vector<std::vector<std::string>> rows;
    for (const std::string& line : lines_of(out)) {
        std::istringstream in(line);
        std::vector<std::string> row;
        for (std::string word; in >> word;) row.push_back(word);
        if (!row.empty()) rows.push_back(row);
    }
    return rows;
}

// the trainer's own parameter count ("params N" of its first line) for a model, after one
// step on a small text
long trainer_params(const TempDir& dir, const Args& model) {
    write_text(dir.file("text.txt"), std::string(4000, 'a') + std::string(4000, 'b'));
    Args args = {"--task", "text", "--text", dir.file("text.txt"), "--seq-len", "16", "--batch", "1",
                 "--steps", "1", "--warmup", "0", "--eval-examples", "4", "--threads", "1"};
    args.insert(args.end(), model.begin(), model.end());
    Run run = run_train(dir, args);
    check_success(run);
    size_t at = run.out.find("| params ");
    REQUIRE_MESSAGE(at != std::string::npos, run.out);
    return std::stol(run.out.substr(at + 9));
}

}  // namespace

// a baseline best at L = 4, a mode best at L = 8 (deeper), a mode whose L = 4 and L = 8 tie
// in the mean while their seeds spread (so the bootstrap splits between them), every loss a
// quadratic in log2 L
TEST_CASE("make shape's fit picks each mode's best depth, and its bootstrap shares and neighbour differences") {
    TempDir dir;
    std::ostringstream csv;
    csv << "mode,size,seed,params,tokens,flops,val_loss\n";
    const int depths[] = {2, 4, 8, 16};
    for (const char* mode : {"none", "deep", "tie"}) {
        for (int depth : depths) {
            double x = std::log2((double)depth);
            double loss = std::string(mode) == "none"   ? 2.0 + 0.05 * (x - 2) * (x - 2)
                          : std::string(mode) == "deep" ? 1.9 + 0.05 * (x - 3) * (x - 3)
                                                        : 2.0 + 0.1 * (x - 2.5) * (x - 2.5);
            // seeds e^±0.001 apart, the tie's middle depths ±0.02
            double spread = std::string(mode) == "tie" && (depth == 4 || depth == 8) ? 0.02 : 0.001;
            for (int seed = 1; seed <= 2; seed++)
                csv << mode << "," << depth << "," << seed << ",1000,20000,1e12," << std::setprecision(12)
                    << loss + (seed == 1 ? spread : -spread) << "\n";
        }
    }
    write_text(dir.file("runs.csv"), csv.str());
    Run fit = run_program(dir, "build/shape_fit", {dir.file("runs.csv"), dir.file("best.csv")});
    check_success(fit);
    CHECK_MESSAGE(contains(fit.out, "| none | 4 | 2.0000 ± 0.0014 | 4: 100 % | (the baseline) |"), fit.out);
    CHECK_MESSAGE(contains(fit.out, "| deep | 8 | 1.9000 ± 0.0014 | 8: 100 % | 100 % / 0 % / 0 % |"), fit.out);
    // the table: tokens a parameter beside each depth's losses, 2.05 = 2 + 0.05·(1 − 2)²
    CHECK_MESSAGE(contains(fit.out, "| 2 | 1e+03 | 2e+04 | 20.0 | 1e+12 | 2.0500 ± 0.0014 |"), fit.out);
    // neighbour differences: none 2 → 4 is 2.0 − 2.05, deep 8 → 16 is 1.95 − 1.9
    CHECK_MESSAGE(contains(fit.out, "| none | -0.0500 [-0.0520, -0.0480] |"), fit.out);
    CHECK_MESSAGE(contains(fit.out, "+0.0500 [+0.0480, +0.0520] |\n| tie |"), fit.out);

    std::vector<std::string> best = lines_of(read_text(dir.file("best.csv")));
    REQUIRE(best.size() == 1 + 3 * 4);
    CHECK(best[0] == "mode,L,mean,sd,share_best");
    CHECK(best[2] == "none,4,2,0.00141421,1");
    CHECK(best[7] == "deep,8,1.9,0.00141421,1");
    // the tie: the means are equal, so a resample's best is whichever depth draws the lower
    // mean (+0.02, 0, −0.02 with odds 1/4, 1/2, 1/4 each), L = 4 on an equal draw (the first
    // on a tie): L = 4 in 5/16 + 6/16 of the resamples, L = 8 in 5/16
    double share4 = 0, share8 = 0;
    REQUIRE(std::sscanf(best[10].c_str(), "tie,4,%*g,%*g,%lg", &share4) == 1);
    REQUIRE(std::sscanf(best[11].c_str(), "tie,8,%*g,%*g,%lg", &share8) == 1);
    CHECK(share4 + share8 == doctest::Approx(1.0));
    CHECK(share4 == doctest::Approx(11.0 / 16).epsilon(0.05));

    write_text(dir.file("one_depth.csv"), "mode,size,seed,params,tokens,flops,val_loss\nnone,2,1,10,20,1,2\nfull,2,1,10,20,1,2\n");
    Run bad = run_program(dir, "build/shape_fit", {dir.file("one_depth.csv")});
    CHECK(bad.exit_code == 1);
    CHECK_MESSAGE(contains(bad.err, "error: shape_fit: need at least 2 modes and 2 sizes"), bad.err);
}

// dev/experiments/shape.sh --print-sizes: every depth's width, and each mode's parameters as
// ./train counts them, less the embedding and lm_head (2 · 256 · d), within 5 % of TARGET
TEST_CASE("make shape's widths give every depth the target's non-embedding parameters within 5 %, by the trainer's count") {
    TempDir dir;
    for (long target : {172000L, 60000L}) {
        CAPTURE(target);
        Run sizes = run_program(dir, "/usr/bin/env", {"TARGET=" + std::to_string(target), "dev/experiments/shape.sh",
                                                      "--print-sizes"});
        check_success(sizes);
        std::vector<std::vector<std::string>> rows = rows_of(sizes.out);
        REQUIRE(rows.size() == 5);  // L = 2, 4, 8, 12, 16
        for (const std::vector<std::string>& row : rows) {
            REQUIRE(row.size() == 8);  // L d H G F S non_embedding all
            CAPTURE(sizes.out);
            int d = std::stoi(row[1]), S = std::stoi(row[5]), L = std::stoi(row[0]);
            CHECK(d % 8 == 0);
            CHECK(std::stoi(row[2]) * 8 == d);  // head size 8
            CHECK((2 * L) % S == 0);
            CHECK(S >= 2);
            Args model = {"--d", row[1], "--L", row[0], "--H", row[2], "--G", row[3], "--F", row[4]};
            for (const char* mode : {"none", "block", "full"}) {
                CAPTURE(mode);
                Args args = model;
                args.insert(args.end(), {"--mode", mode});
                if (std::string(mode) == "block") args.insert(args.end(), {"--block-size", row[5]});
                long params = trainer_params(dir, args);
                long non_embedding = params - 2 * 256 * d;
                CHECK(std::abs(non_embedding - target) <= 0.05 * target);
                if (std::string(mode) == "none") {  // the script's own count is the trainer's
                    CHECK(std::stol(row[6]) == non_embedding);
                    CHECK(std::stol(row[7]) == params);
                }
            }
        }
    }
}

// dev/experiments/scaling.sh --print-sizes: TPP=20's steps are ⌈20 · params / 1024⌉ of the
// baseline's parameters as ./train counts them; the default's about 2.6; other TPP refused
TEST_CASE("make scaling's size tables: TPP=20 trains 20 tokens a parameter at every size, the default about 2.6") {
    TempDir dir;
    for (const char* tpp : {"20", "2.6"}) {
        CAPTURE(tpp);
        Run sizes = run_program(dir, "/usr/bin/env", {std::string("TPP=") + tpp, "dev/experiments/scaling.sh",
                                                      "--print-sizes"});
        check_success(sizes);
        std::vector<std::vector<std::string>> rows = rows_of(sizes.out);
        REQUIRE(rows.size() == 4);
        for (const std::vector<std::string>& row : rows) {
            REQUIRE(row.size() == 7);  // name d L H G F steps
            CAPTURE(row[0]);
            CHECK(row[2] == "8");  // L = 8: block's S = 2 gives 8 blocks
            long params = trainer_params(dir, {"--d", row[1], "--L", row[2], "--H", row[3], "--G", row[4],
                                               "--F", row[5], "--mode", "none"});
            long steps = std::stol(row[6]);
            if (std::string(tpp) == "20") {
                CHECK(steps == (20 * params + 1023) / 1024);
            } else {
                CHECK(steps * 1024.0 / params > 2.5);
                CHECK(steps * 1024.0 / params < 2.75);
            }
        }
    }
    Run bad = run_program(dir, "/usr/bin/env", {"TPP=7", "dev/experiments/scaling.sh", "--print-sizes"});
    CHECK(bad.exit_code == 1);
    CHECK_MESSAGE(contains(bad.err, "error: TPP=7 (valid: 2.6, 20)"), bad.err);
}

// dev/experiments/scaling.sh --print-steps: with TPP=20 every run trains at least 20 tokens a
// parameter of its own (AttnRes and mHC-lite have more than the baseline, mHC-lite up to 1.8x):
// ⌈20 · params / 1024⌉ by the trainer's count for each mode; by default the table's steps
TEST_CASE("make scaling TPP=20 gives every mode 20 tokens a parameter of its own; the default the table's steps") {
    TempDir dir;
    for (const char* tpp : {"20", "2.6"}) {
        CAPTURE(tpp);
        std::string env = std::string("TPP=") + tpp;
        Run sizes = run_program(dir, "/usr/bin/env", {env, "dev/experiments/scaling.sh", "--print-sizes"});
        Run steps = run_program(dir, "/usr/bin/env", {env, "dev/experiments/scaling.sh", "--print-steps"});
        check_success(sizes);
        check_success(steps);
        std::map<std::string, std::vector<std::string>> size_of;
        for (const std::vector<std::string>& row : rows_of(sizes.out)) size_of[row[0]] = row;
        std::vector<std::vector<std::string>> runs = rows_of(steps.out);
        REQUIRE(runs.size() == 4 * 4);
        for (const std::vector<std::string>& run : runs) {
            REQUIRE(run.size() == 3);  // size mode steps
            CAPTURE(run[0]);
            CAPTURE(run[1]);
            const std::vector<std::string>& size = size_of.at(run[0]);
            long steps_run = std::stol(run[2]);
            if (std::string(tpp) == "2.6") {
                CHECK(run[2] == size[6]);
                continue;
            }
            Args model = {"--d", size[1], "--L", size[2], "--H", size[3], "--G", size[4], "--F", size[5],
                          "--mode", run[1]};
            if (run[1] == "block") model.insert(model.end(), {"--block-size", "2"});
            if (run[1] == "mhc") model.insert(model.end(), {"--streams", "4"});
            long params = trainer_params(dir, model);
            CHECK(steps_run == (20 * params + 1023) / 1024);
            if (run[1] == "mhc") CHECK(steps_run > std::stol(size[6]));
        }
    }
}

// the dry runs: two tiny sizes (depths), 12 steps, 2 seeds, on a small text
TEST_CASE("make scaling's and make shape's sweeps, dry run: the tables, CSVs and charts are written") {
    TempDir dir;
    std::string text;
    for (int i = 0; i < 400; i++) text += "the quick brown fox jumps over the lazy dog. ";
    write_text(dir.file("text.txt"), text);
    SUBCASE("make scaling") {
        Run sweep = run_program(dir, "/usr/bin/env", {"SIZES=a 16 2 2 1 32 12\nb 24 2 2 1 48 12",
                                                      "TEXT=" + dir.file("text.txt"),
                                                      "dev/experiments/scaling.sh", dir.file("out")});
        INFO(sweep.out, sweep.err);
        REQUIRE(sweep.exit_code == 0);
        CHECK(contains(sweep.out, "| size | params | tokens | tokens/param | FLOPs | none | block | full | mhc |"));
        CHECK(lines_of(read_text(dir.file("out/runs.csv"))).size() == 1 + 4 * 2 * 2);
        CHECK(lines_of(read_text(dir.file("out/fits.csv"))).size() == 1 + 4);
        CHECK(contains(read_text(dir.file("out/table.md")), "| block | "));
        CHECK(fs::file_size(dir.file("out/scaling.png")) > 1000);
    }
    SUBCASE("make shape") {
        Run sweep = run_program(dir, "/usr/bin/env", {"DEPTHS=2 4", "TARGET=6000", "STEPS=12",
                                                      "TEXT=" + dir.file("text.txt"),
                                                      "dev/experiments/shape.sh", dir.file("out")});
        INFO(sweep.out, sweep.err);
        REQUIRE(sweep.exit_code == 0);
        CHECK(contains(sweep.out, "| L | params | tokens | tokens/param | FLOPs | none | block | full |"));
        CHECK(contains(sweep.out, "| mode | best L | its loss |"));
        CHECK(contains(read_text(dir.file("out/sizes.md")), "| 4 | 8 | 1 | 1 |"));
        std::vector<std::string> runs = lines_of(read_text(dir.file("out/runs.csv")));
        REQUIRE(runs.size() == 1 + 3 * 2 * 2);
        CHECK(runs[1].rfind("none,2,1,", 0) == 0);
        CHECK(lines_of(read_text(dir.file("out/best.csv"))).size() == 1 + 3 * 2);
        CHECK(contains(read_text(dir.file("out/table.md")), "| full | "));
        // the RMS by sub-layer at L = 4: sub-layers 0 .. 7 and the final hidden state, 8
        std::vector<std::string> rms = lines_of(read_text(dir.file("out/rms_full.csv")));
        REQUIRE(rms.size() == 9);
        CHECK(rms[8].rfind("8,", 0) == 0);
        CHECK(fs::file_size(dir.file("out/shape.png")) > 1000);
        CHECK(fs::file_size(dir.file("out/rms.png")) > 1000);
    }
}

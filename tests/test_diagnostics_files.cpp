// test_diagnostics_files.cpp — what src/diagnostics.h writes and what measuring costs: the
// CSV files get their headers and a line per record and append on resume, a CSV that cannot be
// written is an error naming it, and training with diagnostics on is bit-identical to training
// with them off, in-process and through ./train.
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "diagnostics_test.h"

namespace fs = std::filesystem;

TEST_CASE("the CSV files get their headers and one line per record, and append on resume") {
    ModelConfig c = {9, 8, 2, 2, 1, 12, 2};
    ScopedModel scoped(c, 1, 4);
    Model& m = scoped.m;
    model_init_params(&m, 1);
    std::vector<int> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, -1};
    TempDir dir;
    std::string run = dir.path + "/nested/run";
    char err[256];
    for (int append = 0; append < 2; append++) {
        ScopedDiagnostics sd(c);
        REQUIRE(diagnostics_open(&sd.dg, run.c_str(), append ? 10 : -1, "./train --x", err, sizeof(err)) == 0);
        model_forward(&m, tokens.data(), targets.data(), 1, 4);
        model_zero_grad(&m);
        model_backward(&m);
        diagnostics_measure_layers(&sd.dg, &m);
        diagnostics_write_layers(&sd.dg, 10 + append);
        diagnostics_write_train(&sd.dg, 10 + append, 2.5f, 1e-3f, 0.75f, 12.0f);
        diagnostics_measure_alpha(&sd.dg, &m);
        diagnostics_write_alpha(&sd.dg, 10 + append);
        diagnostics_write_eval(&sd.dg, 10 + append, 2.0f, 40.0f, append ? 12.5f : -1.0f);
    }
    std::vector<std::string> meta = read_lines(run + "/meta.csv");
    REQUIRE(meta.size() == 16);
    CHECK(meta[0] == "key,value");
    CHECK(meta[1] == "mode,block");
    CHECK(meta[9] == "depth_score,softmax");
    CHECK(meta[12] == "depth_heads,1");
    CHECK(meta[14] == "mixing,attention");
    CHECK(meta[15] == "command,./train --x");
    std::vector<std::string> train = read_lines(run + "/train.csv");
    REQUIRE(train.size() == 3);
    CHECK(train[0] == "step,train_loss,lr,grad_norm,ms_per_step");
    CHECK(train[1] == "10,2.5,0.001,0.75,12");
    std::vector<std::string> eval = read_lines(run + "/eval.csv");
    REQUIRE(eval.size() == 3);
    CHECK(eval[0] == "step,val_loss,accuracy,exact_match");
    CHECK(eval[1] == "10,2,40.0000,");  // exact match does not apply
    CHECK(eval[2] == "11,2,40.0000,12.5000");
    std::vector<std::string> layers = read_lines(run + "/layers.csv");
    REQUIRE(layers.size() == 1 + 2 * (1 + 4 + 1));  // emb, 4 sub-layers, out; two records
    CHECK(layers[0] == "step,index,name,input_rms,output_rms,grad_norm,res_grad_norm");
    CHECK(layers[1].rfind("10,-1,emb,,,", 0) == 0);
    CHECK(layers[2].rfind("10,0,L0.attn,", 0) == 0);
    CHECK(layers[6].rfind("10,4,out,", 0) == 0);
    CHECK(layers[12].rfind("11,4,out,", 0) == 0);
    std::vector<std::string> alpha = read_lines(run + "/alpha.csv");
    REQUIRE(alpha.size() == 1 + 2 * (1 + 2 + 2 + 3 + 3));  // sources per row: 1, 2, 2, 3, 3
    CHECK(alpha[0] == "step,row,row_name,source,source_name,alpha");
    CHECK(alpha[1] == "10,0,L0.attn,0,emb,1.00000");
    CHECK(alpha[3] == "10,1,L0.mlp,1,b1,0.50000");

    ScopedDiagnostics sd(c);
    std::string blocked = dir.path + "/file";
    std::ofstream(blocked) << "x";
    CHECK(diagnostics_open(&sd.dg, (blocked + "/run").c_str(), -1, "", err, sizeof(err)) == -1);
    CHECK(std::string(err).find(blocked) != std::string::npos);
}

// /dev/full takes every open and fails every write with ENOSPC: a full disk, on demand
TEST_CASE("a CSV that cannot be written (a full disk) is an error naming the file, not lost lines") {
    REQUIRE_MESSAGE(fs::exists("/dev/full"), "this test needs /dev/full");
    ModelConfig c = {9, 8, 2, 2, 1, 12, 2};
    ScopedModel scoped(c, 1, 4);
    Model& m = scoped.m;
    model_init_params(&m, 1);
    std::vector<int> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, -1};
    model_forward(&m, tokens.data(), targets.data(), 1, 4);
    model_zero_grad(&m);
    model_backward(&m);
    char err[4400];
    const char* names[] = {"train.csv", "eval.csv", "layers.csv", "alpha.csv"};
    SUBCASE("a line written while training") {
        for (int i = 0; i < 4; i++) {
            INFO(names[i]);
            TempDir dir;
            ScopedDiagnostics sd(c);
            REQUIRE(diagnostics_open(&sd.dg, dir.path.c_str(), -1, "", err, sizeof(err)) == 0);
            diagnostics_measure_layers(&sd.dg, &m);
            diagnostics_measure_alpha(&sd.dg, &m);
            // each writes its lines, and every file still takes them, except file i
            FILE** files[] = {&sd.dg.train_csv, &sd.dg.eval_csv, &sd.dg.layers_csv, &sd.dg.alpha_csv};
            std::fclose(*files[i]);
            *files[i] = std::fopen("/dev/full", "w");
            REQUIRE(*files[i] != nullptr);
            int status[] = {diagnostics_write_train(&sd.dg, 1, 2.5f, 1e-3f, 0.75f, 12.0f),
                            diagnostics_write_eval(&sd.dg, 1, 2.0f, 40.0f, -1.0f),
                            diagnostics_write_layers(&sd.dg, 1), diagnostics_write_alpha(&sd.dg, 1)};
            for (int j = 0; j < 4; j++) CHECK(status[j] == (j == i ? -1 : 0));
            CHECK(std::string(sd.dg.error) ==
                  "cannot write " + dir.path + "/" + names[i] + ": " + std::strerror(ENOSPC));
        }
    }
    SUBCASE("a resumed run's CSV on a device is written to, never read or replaced") {
        TempDir dir;
        fs::create_symlink("/dev/null", dir.path + "/train.csv");  // reads as empty, takes writes
        ScopedDiagnostics sd(c);
        REQUIRE(diagnostics_open(&sd.dg, dir.path.c_str(), 10, "", err, sizeof(err)) == 0);
        CHECK(diagnostics_write_train(&sd.dg, 11, 2.5f, 1e-3f, 0.75f, 12.0f) == 0);
        CHECK(fs::is_symlink(dir.path + "/train.csv"));  // not replaced by a file
    }
    SUBCASE("a header, or meta.csv, when the directory is opened") {
        for (const char* name : {"meta.csv", "train.csv", "eval.csv", "layers.csv", "alpha.csv"}) {
            INFO(name);
            TempDir dir;
            fs::create_symlink("/dev/full", dir.path + "/" + name);
            ScopedDiagnostics sd(c);
            CHECK(diagnostics_open(&sd.dg, dir.path.c_str(), -1, "", err, sizeof(err)) == -1);
            CHECK(std::string(err) ==
                  "cannot write " + dir.path + "/" + name + ": " + std::strerror(ENOSPC));
        }
    }
}

TEST_CASE("training with diagnostics on is bit-identical to training with them off") {
    const size_t B = 2, T = 6, N = B * T;
    for (ModelConfig c : tiny_configs()) {
        INFO("mode ", mode_name(c));
        std::vector<float> losses[2], params[2];
        for (int on = 0; on < 2; on++) {
            ScopedModel scoped(c, B, T);
            Model& m = scoped.m;
            model_init_params(&m, 99);
            ScopedDiagnostics sd(c);
            for (int step = 1; step <= 5; step++) {
                std::vector<int> tokens, targets;
                random_batch(c.vocab_size, N, (uint64_t)step, tokens, targets);
                losses[on].push_back(model_forward(&m, tokens.data(), targets.data(), B, T));
                model_zero_grad(&m);
                model_backward(&m);
                if (on) {
                    diagnostics_measure_layers(&sd.dg, &m);
                    diagnostics_measure_alpha(&sd.dg, &m);
                }
                model_update(&m, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
            }
            params[on].assign(m.params_memory, m.params_memory + m.num_params);
        }
        CHECK(std::memcmp(losses[0].data(), losses[1].data(), losses[0].size() * sizeof(float)) == 0);
        CHECK(std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)) == 0);
    }
}

TEST_CASE("./train --diagnostics prints the same losses as without, writes the CSVs, shows the heatmap") {
    const char* env = std::getenv("ATTNRES_TRAIN");
    std::string binary = env != nullptr && env[0] != '\0' ? env : "./train";
    REQUIRE_MESSAGE(fs::exists(binary), binary << " does not exist: build it (make) or set ATTNRES_TRAIN");
    TempDir dir;
    std::string args = " --d 16 --L 1 --H 2 --G 1 --F 32 --batch 4 --length 4 --symbols 6"
                       " --eval-examples 16 --threads 1 --steps 12 --log-every 3 --eval-every 6";
    auto run = [&](const std::string& extra, const std::string& out) {
        std::string command = "OMP_WAIT_POLICY=PASSIVE " + binary + args + extra + " > " + dir.path + "/" + out;
        REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
        std::vector<std::string> lines;  // the loss, eval and final lines without timings
        for (std::string line : read_lines(dir.path + "/" + out)) {
            size_t tok = line.find(" | ") == std::string::npos ? std::string::npos : line.find("tok/s");
            size_t time = line.find(" | time");
            if (tok != std::string::npos) line = line.substr(0, line.rfind(" | ", tok));
            if (time != std::string::npos) line = line.substr(0, time);
            lines.push_back(line);
        }
        return lines;
    };
    std::string csv = dir.path + "/run";
    std::vector<std::string> off = run(" --block-size 2", "off.txt");
    std::vector<std::string> on = run(" --block-size 2 --diagnostics " + csv, "on.txt");
    CHECK(off == on);
    REQUIRE(off.size() > 10);
    CHECK(std::find(off.begin(), off.end(), "L0.attn  ██100     ·") != off.end());
    CHECK(read_lines(csv + "/train.csv").size() == 1 + 4);
    CHECK(read_lines(csv + "/eval.csv").size() == 1 + 2);
    CHECK(read_lines(csv + "/layers.csv").size() == 1 + 4 * (1 + 2 + 1));
    CHECK(read_lines(csv + "/alpha.csv").size() == 1 + 2 * (1 + 2 + 2));
    // a variant: sigmoid, 2 heads, a window of 2 over L = 2; one line per source at each eval
    std::vector<std::string> variant = run(" --mode full --L 2 --depth-score sigmoid --depth-heads 2"
                                           " --depth-window 2 --diagnostics " + csv + "_variant", "variant.txt");
    CHECK(std::find(variant.begin(), variant.end(),
                    "depth attention (sigmoid weights in %, mean over tokens and the 2 heads): the input "
                    "of each sub-layer (rows)") != variant.end());
    std::vector<std::string> variant_alpha = read_lines(csv + "_variant/alpha.csv");
    REQUIRE(variant_alpha.size() == 1 + 2 * (1 + 2 + 3 + 3 + 3));
    CHECK(variant_alpha[0] == "step,row,row_name,source,source_name,alpha,alpha_h0,alpha_h1");
    CHECK(variant_alpha[12].rfind("6,4,out,4,m1,", 0) == 0);
    // none mode: no depth attention, no heatmap
    std::vector<std::string> none = run(" --mode none --diagnostics " + csv + "_none", "none.txt");
    CHECK(none.back().rfind("final", 0) == 0);
    CHECK(read_lines(csv + "_none/alpha.csv").size() == 1);
    // mhc mode: the same losses with diagnostics on; mhc.csv at each eval, no heatmap
    std::vector<std::string> mhc_off = run(" --mode mhc --streams 2", "mhc_off.txt");
    std::vector<std::string> mhc_on = run(" --mode mhc --streams 2 --diagnostics " + csv + "_mhc", "mhc_on.txt");
    CHECK(mhc_off == mhc_on);
    CHECK(mhc_on.back().rfind("final", 0) == 0);
    CHECK(read_lines(csv + "_mhc/alpha.csv").size() == 1);
    std::vector<std::string> mhc = read_lines(csv + "_mhc/mhc.csv");
    REQUIRE(mhc.size() == 1 + 2 * (2 * 2));  // 2 evals of 2 sub-layers x 2 streams
    CHECK(mhc[0] == "step,row,row_name,stream,a_pre,a_post,h_0,h_1");
    CHECK(mhc[1].rfind("6,0,L0.attn,0,", 0) == 0);
    CHECK(mhc[8].rfind("12,1,L0.mlp,1,", 0) == 0);
}

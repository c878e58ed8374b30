// test_cli_safetensors.cpp — ./train's safetensors files (tests/cli.h): --export and
// --init-from give the same bytes back in every mode and variant, refuse what does not fit in
// one line writing nothing, and a file PyTorch wrote trains from PyTorch's first loss and
// comes back byte for byte.
#include "cli.h"

// ---- safetensors: --export and --init-from -----------------------------------------------

namespace {

// The flags of tiny() that are no model flags: an --init-from run takes the model from its file
Args tiny_data(Args extra = {}) {
    Args args = {"--batch", "4", "--eval-examples", "16", "--threads", "1", "--length", "4", "--symbols", "6"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

// What a final line says of the model, without the steps and the time: "val_loss ... | exact_match ..."
std::string final_metrics(const std::string& out) {
    std::vector<std::string> lines = lines_to_final(out);
    REQUIRE(!lines.empty());
    const std::string& last = lines.back();
    size_t from = last.find("val_loss"), to = last.find(" | time");
    REQUIRE((from != std::string::npos && to != std::string::npos));
    return last.substr(from, to - from);
}

// The banner up to the task: the mode, the model's sizes and its parameter count
std::string banner_model(const std::string& out) {
    std::string first = lines_of(out).at(0);
    return first.substr(0, first.find(" | task"));
}

}  // namespace

TEST_CASE("--export, --init-from --steps 0 (the weights as a checkpoint) and --export again give the same bytes, in every mode and variant") {
    // and the imported model is the trained one: the same banner and the same evaluation
    TempDir dir;
    const Args models[] = {
        {"--mode", "none"}, {"--mode", "full"}, {}, {"--mode", "full", "--depth-score", "sigmoid"},
        {"--key-norm", "off"}, {"--mode", "full", "--depth-query", "input"}, {"--depth-heads", "2"},
        {"--mode", "full", "--depth-window", "1"}, {"--mode", "full", "--mixing", "static"},
        {"--mixing", "dense"}, {"--mode", "mhc", "--streams", "2"}, {"--mode", "mhc", "--streams", "3"},
        {"--mode", "mhc", "--streams", "4"}, {"--optimizer", "muon"},
    };
    int k = 0;
    for (const Args& model : models) {
        std::string name = "m" + std::to_string(k++);
        std::string trained = dir.file(name + ".ckpt"), exported = dir.file(name + ".safetensors");
        std::string imported = dir.file(name + "_imported.ckpt"), again = dir.file(name + "_again.safetensors");
        Args args = {"--steps", "2", "--eval-every", "2", "--checkpoint", trained};
        args.insert(args.end(), model.begin(), model.end());
        Run train = run_train(dir, tiny(args));
        check_success(train);
        Run out = run_train(dir, {"--export", exported, "--checkpoint", trained});
        check_success(out);
        CHECK(out.out == "exported " + trained + " (step 2) to " + exported + ": " +
                             std::to_string(out.out.empty() ? 0 : std::stoul(out.out.substr(out.out.rfind(": ") + 2))) + " tensors\n");
        Run import = run_train(dir, tiny_data({"--init-from", exported, "--steps", "0", "--checkpoint", imported}));
        check_success(import);
        CHECK(contains(import.out, "initialised from " + exported));
        CHECK(contains(import.out, "checkpoint: " + imported + " holds the weights of " + exported + " (step 0)"));
        CHECK(banner_model(import.out) == banner_model(train.out));
        CHECK(final_metrics(import.out) == final_metrics(train.out));
        check_success(run_train(dir, {"--export", again, "--checkpoint", imported}));
        CHECK_MESSAGE(read_text(again) == read_text(exported), "model " << name);
        CHECK(read_text(exported).size() > 1000);
    }
}

TEST_CASE("--init-from starts fresh (step 0, the AdamW moments zero) from the file's weights, and trains on") {
    TempDir dir;
    std::string trained = dir.file("model.ckpt"), exported = dir.file("model.safetensors");
    std::string imported = dir.file("imported.ckpt");
    check_success(run_train(dir, tiny({"--steps", "4", "--eval-every", "4", "--checkpoint", trained})));
    check_success(run_train(dir, {"--export", exported, "--checkpoint", trained}));
    check_success(run_train(dir, tiny_data({"--init-from", exported, "--steps", "0", "--checkpoint", imported})));
    const std::string before = read_text(trained), after = read_text(imported);
    REQUIRE(before.size() == after.size());
    size_t header = 256 * sizeof(int), n_params = (before.size() - header) / (3 * sizeof(float));
    int step = -1;
    std::memcpy(&step, after.data() + 9 * sizeof(int), sizeof step);
    CHECK(step == 0);
    CHECK(after.compare(header, n_params * sizeof(float), before, header, n_params * sizeof(float)) == 0);  // the weights
    CHECK(after.substr(header + n_params * sizeof(float)) == std::string(2 * n_params * sizeof(float), '\0'));  // m, v
    CHECK(before.substr(header + n_params * sizeof(float)) != std::string(2 * n_params * sizeof(float), '\0'));
    // the model flags the file agrees with may be given; training goes on from the weights
    Run more = run_train(dir, tiny({"--init-from", exported, "--steps", "6", "--stop-after", "4", "--eval-every", "2",
                                    "--log-every", "1", "--checkpoint", dir.file("more.ckpt")}));
    check_success(more);
    CHECK(contains(more.out, "step     4/6"));
    // and its checkpoint resumes as any other
    check_success(run_train(dir, tiny({"--steps", "6", "--eval-every", "2", "--checkpoint", dir.file("more.ckpt"),
                                       "--resume"})));
}

TEST_CASE("--init-from refuses a model flag that contradicts the file, naming it, and a bad file in one line, writing nothing") {
    TempDir dir;
    std::string trained = dir.file("model.ckpt"), exported = dir.file("model.safetensors");
    std::string mhc_trained = dir.file("mhc.ckpt"), mhc = dir.file("mhc.safetensors");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", trained})));
    check_success(run_train(dir, {"--export", exported, "--checkpoint", trained}));
    check_success(run_train(dir, tiny({"--mode", "mhc", "--streams", "3", "--steps", "2", "--eval-every", "2",
                                       "--checkpoint", mhc_trained})));
    check_success(run_train(dir, {"--export", mhc, "--checkpoint", mhc_trained}));
    std::string out = dir.file("out.ckpt");
    auto import = [&](const std::string& file, Args extra) {
        Args args = tiny_data({"--init-from", file, "--steps", "2", "--checkpoint", out});
        args.insert(args.end(), extra.begin(), extra.end());
        return run_train(dir, args);
    };
    const struct { Args flags; std::vector<std::string> words; } contradictions[] = {
        {{"--d", "32"}, {"--d 32", "contradicts --init-from " + exported, "d_model 16"}},
        {{"--L", "2"}, {"--L 2", "n_layers 1"}},
        {{"--H", "4"}, {"--H 4", "n_heads 2"}},
        {{"--G", "2"}, {"--G 2", "n_kv_heads 1"}},
        {{"--F", "64"}, {"--F 64", "ffn_hidden 32"}},
        {{"--mode", "full"}, {"--mode full", "mode block"}},
        {{"--mode", "mhc"}, {"--mode mhc", "mode block"}},
        {{"--block-size", "4"}, {"--block-size 4", "block_size 2"}},
        {{"--depth-score", "sigmoid"}, {"--depth-score sigmoid", "--depth-score softmax"}},
        {{"--key-norm", "off"}, {"--key-norm off", "--key-norm on"}},
        {{"--depth-query", "input"}, {"--depth-query input", "--depth-query static"}},
        {{"--depth-heads", "2"}, {"--depth-heads 2", "depth_heads 0"}},
        {{"--mixing", "dense"}, {"--mixing dense", "--mixing attention"}},
        {{"--symbols", "7"}, {"--init-from " + exported, "vocab_size 7", "has 8 tokens"}},
        {{"--resume"}, {"--init-from", "--resume", "one of them"}},
    };
    for (const auto& k : contradictions) check_error(import(exported, k.flags), k.words);
    check_error(import(mhc, {"--streams", "2"}), {"--streams 2", "streams 3"});
    check_error(import(mhc, {"--mode", "none"}), {"--mode none", "mode mhc"});
    check_error(run_train(dir, {"--sample", "--checkpoint", trained, "--init-from", exported}),
                {"--init-from is a training flag", "--sample"});
    // the file's own values are no contradiction
    check_success(import(exported, {"--d", "16", "--L", "1", "--mode", "block", "--block-size", "2", "--mixing", "attention"}));
    check_success(import(mhc, {"--mode", "mhc", "--streams", "3"}));
    std::filesystem::remove(out);
    // bad files: one line naming the file and the problem; no checkpoint written
    std::string bytes = read_text(exported);
    write_text(dir.file("nan.safetensors"), bytes.substr(0, bytes.size() - 4) + std::string("\x00\x00\xc0\x7f", 4));
    write_text(dir.file("cut.safetensors"), bytes.substr(0, bytes.size() / 2));
    write_text(dir.file("text.safetensors"), "{\"not\": \"a safetensors file\"}");
    check_error(import(dir.file("nan.safetensors"), {}), {"nan.safetensors", "'lm_head.weight'", "NaN or Inf"});
    check_error(import(dir.file("cut.safetensors"), {}), {"cut.safetensors"});
    check_error(import(dir.file("text.safetensors"), {}), {"text.safetensors", "header length"});
    check_error(import(trained, {}), {"model.ckpt", "header length"});  // a checkpoint is no safetensors file
    check_error(import(dir.file("missing.safetensors"), {}), {"missing.safetensors", "No such file"});
    check_error(import(dir.path, {}), {dir.path, "is a directory"});
    check_error(import("", {}), {"--init-from is empty"});
    CHECK(!std::filesystem::exists(out));
    check_error(run_train(dir, tiny({"--steps", "0"})), {"--steps", "positive"});  // only --init-from trains 0 steps
}

TEST_CASE("a --checkpoint path (or its .best) that is the --init-from file is refused before training, and the file kept") {
    TempDir dir;
    std::string trained = dir.file("model.ckpt"), weights = dir.file("w.safetensors");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", trained})));
    check_success(run_train(dir, {"--export", weights, "--checkpoint", trained}));
    std::string best = dir.file("w.best");  // the best checkpoint of --checkpoint w
    fs::copy_file(weights, best);
    const std::string bytes = read_text(weights);
    std::string spelled = dir.path + "/./w.safetensors";
    Run same = run_train(dir, tiny_data({"--init-from", weights, "--steps", "2", "--checkpoint", spelled}));
    check_error(same, {spelled, "--init-from file", weights});
    Run as_best = run_train(dir, tiny_data({"--init-from", best, "--steps", "2", "--checkpoint", dir.file("w")}));
    check_error(as_best, {best, "--init-from file"});
    CHECK(read_text(weights) == bytes);
    CHECK(read_text(best) == bytes);
    CHECK(!fs::exists(dir.file("w")));
}

TEST_CASE("--export reads only --checkpoint, and refuses a bad checkpoint or destination in one line, writing nothing") {
    TempDir dir;
    std::string trained = dir.file("model.ckpt"), out = dir.file("out.safetensors");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", trained})));
    const std::string bytes = read_text(trained);
    check_error(run_train(dir, {"--export", out}), {"--export needs --checkpoint"});
    check_error(run_train(dir, {"--export", out, "--checkpoint", trained, "--steps", "3"}),
                {"--steps does not go with --export"});
    check_error(run_train(dir, {"--export", out, "--checkpoint", trained, "--init-from", out}),
                {"--init-from does not go with --export"});
    check_error(run_train(dir, {"--sample", "--export", out, "--checkpoint", trained}), {"--sample does not go with --export"});
    check_error(run_train(dir, {"--export", "", "--checkpoint", trained}), {"--export is empty"});
    check_error(run_train(dir, {"--export", trained, "--checkpoint", trained}), {trained, "is the checkpoint it reads"});
    check_error(run_train(dir, {"--export", dir.path, "--checkpoint", trained}), {dir.path, "not a regular file"});
    check_error(run_train(dir, {"--export", out, "--checkpoint", dir.file("missing.ckpt")}), {"missing.ckpt", "No such file"});
    write_text(dir.file("cut.ckpt"), bytes.substr(0, bytes.size() - 100));
    check_error(run_train(dir, {"--export", out, "--checkpoint", dir.file("cut.ckpt")}), {"cut.ckpt", "truncated"});
    CHECK(!std::filesystem::exists(out));
    CHECK(read_text(trained) == bytes);
}

TEST_CASE("--export writes a new file or replaces an earlier export, and refuses every other file, keeping it") {
    TempDir dir;
    std::string trained = dir.file("run.ckpt"), out = dir.file("out.safetensors");
    check_success(run_train(dir, tiny({"--steps", "4", "--eval-every", "2", "--checkpoint", trained})));
    check_success(run_train(dir, {"--export", out, "--checkpoint", trained}));
    check_success(run_train(dir, {"--export", out, "--checkpoint", trained}));  // an earlier export
    std::string other = dir.file("other.ckpt"), text = dir.file("input.txt"), link = dir.file("link.ckpt");
    std::string pipe = dir.file("pipe"), fresh = dir.file("fresh.ckpt");
    fs::copy_file(trained, other);
    fs::copy_file(trained, fresh);  // a checkpoint without a .best yet
    write_text(text, "the quick brown fox jumps over the lazy dog\n");
    REQUIRE(symlink(trained.c_str(), link.c_str()) == 0);
    REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
    const std::string best_bytes = read_text(trained + ".best"), other_bytes = read_text(other);
    auto export_to = [&](const std::string& path, const std::string& from) {
        return run_train(dir, {"--export", path, "--checkpoint", from});
    };
    check_error(export_to(trained + ".best", trained), {trained + ".best", "best checkpoint", trained});
    check_error(export_to(fresh + ".best", fresh), {fresh + ".best", "best checkpoint"});
    check_error(export_to(other, trained), {other, "is a checkpoint", "earlier export"});
    check_error(export_to(link, trained), {link, "is the checkpoint it reads"});
    check_error(export_to(text, trained), {text, "not an earlier export"});
    check_error(export_to(pipe, trained), {pipe, "not a regular file"});
    // a file of a terabyte (sparse: it takes no disk) that starts as no safetensors file does:
    // refused from its first bytes, never read whole
    std::string big = dir.file("big.bin");
    write_text(big, "no safetensors header here");
    fs::resize_file(big, (uintmax_t)1 << 40);
    check_error(export_to(big, trained), {big, "not an earlier export"});
    CHECK(fs::file_size(big) == (uintmax_t)1 << 40);
    CHECK(read_text(trained + ".best") == best_bytes);
    CHECK(read_text(other) == other_bytes);
    CHECK(read_text(text) == "the quick brown fox jumps over the lazy dog\n");
    CHECK(fs::is_fifo(pipe));
    CHECK(!fs::exists(fresh + ".best"));
}

// ---- weights from PyTorch ------------------------------------------------------------------

// tests/data/torch_block_s2_rand.safetensors was written from PyTorch: dev/check/reference.py's
// random init ("rand": every tensor away from SPEC's init, so a tensor read into the wrong
// place, transposed or from another layer moves this loss by 0.4 % or more) of a block model,
// S = 2, d = 16, L = 2, H = 4, G = 2, F = 32, V = 9, 23 KB:
//   /usr/bin/python3 dev/load_safetensors.py write tests/data/torch_block_s2_rand.safetensors
//       --init rand --seed 31 --mode block --block-size 2 --V 9 --d 16 --L 2 --H 4 --G 2 --F 32
// kTorchFirstLoss is PyTorch's loss (float64, reference.forward) of that model on the batch
// ./train draws at step 1 with the data flags below, which load_safetensors.py draws as
// data/dataset.c does (splitmix64 sequence streams, the held-out prompts avoided):
//   /usr/bin/python3 dev/load_safetensors.py loss tests/data/torch_block_s2_rand.safetensors
//       --task reverse --length 4 --symbols 8 --eval-examples 50 --batch 8 --seed 7
// Each command on one line regenerates them (needs Debian's python3-torch; this test does
// not).
TEST_CASE("--init-from a file PyTorch wrote: the first loss is PyTorch's loss of that batch, and 20 steps train") {
    const double kTorchFirstLoss = 2.46044435;
    TempDir dir;
    std::string diag = dir.file("diag");
    Run run = run_train(dir, {"--init-from", "tests/data/torch_block_s2_rand.safetensors",
                              "--task", "reverse", "--length", "4", "--symbols", "8",
                              "--eval-examples", "50", "--batch", "8", "--seed", "7",
                              "--steps", "20", "--warmup", "2", "--lr", "0.01", "--log-every", "1",
                              "--eval-every", "20", "--threads", "1", "--diagnostics", diag});
    check_success(run);
    // the loss of every step, as train.csv prints it (six digits)
    std::vector<double> losses;
    for (const std::string& line : lines_of(read_text(diag + "/train.csv"))) {
        int step = 0;
        double loss = NAN;
        if (std::sscanf(line.c_str(), "%d,%lf,", &step, &loss) == 2) losses.push_back(loss);
    }
    REQUIRE(losses.size() == 20);
    // check_state's tolerance for the loss is 1e-5 of it at least (dev/check/check_state.c,
    // TOL_FLOOR); the six digits round 2.46044 by at most 2e-6 of it
    INFO("first loss ", losses[0], ", PyTorch's ", kTorchFirstLoss);
    CHECK(std::fabs(losses[0] - kTorchFirstLoss) <= 1e-5 * kTorchFirstLoss);
    double last_five = 0.0;
    for (size_t i = 0; i < losses.size(); i++) {
        CHECK(std::isfinite(losses[i]));
        if (i >= 15) last_five += losses[i] / 5.0;
    }
    CHECK(last_five < losses[0] - 0.1);  // 2.46 falls to about 2.18 (one batch of 8 is noisy)
}

TEST_CASE("a file PyTorch wrote comes back byte for byte through --init-from --steps 0 and --export: the Python and C writers agree") {
    const std::string file = "tests/data/torch_block_s2_rand.safetensors";  // written as above
    TempDir dir;
    std::string checkpoint = dir.file("model.ckpt"), exported = dir.file("again.safetensors");
    check_success(run_train(dir, {"--init-from", file, "--task", "reverse", "--length", "4",
                                  "--symbols", "8", "--eval-examples", "50", "--steps", "0",
                                  "--threads", "1", "--checkpoint", checkpoint}));
    check_success(run_train(dir, {"--export", exported, "--checkpoint", checkpoint}));
    std::string written = read_text(file), again = read_text(exported);
    REQUIRE(written.size() == 23336);
    CHECK(again.size() == written.size());
    CHECK_MESSAGE(again == written, "the C writer's bytes differ from dev/load_safetensors.py's");
}

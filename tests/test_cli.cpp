// test_cli.cpp — the real ./train binary (tests/cli.h) on bad input: every bad flag, value,
// combination, path, text file and checkpoint ends with exit status 1 and exactly one
// "error: ..." line on stderr naming the problem, never a crash. Every run is tiny, so the
// file takes a few seconds. Its siblings: test_cli_safetensors.cpp (--export, --init-from,
// files PyTorch wrote), test_cli_training.cpp (--help, tiny runs, determinism, resume, NaN,
// schedules), test_cli_tools.cpp (make plots, the size benchmark, the scaling fit).
#include "cli.h"

#include "checkpoint.h"
#include "dataset.h"  // TEXT_MAX_BYTES

// ---- bad input ---------------------------------------------------------------------------

TEST_CASE("bad flags and values exit 1 with one error line naming the problem") {
    TempDir dir;
    struct Case {
        Args args;
        std::vector<std::string> words;
    };
    Case cases[] = {
        {{"--bogus"}, {"unknown flag", "--bogus"}},
        {{"--d"}, {"--d", "needs a value"}},
        {{"--steps", "10", "--lr"}, {"--lr", "needs a value"}},
        {{"--d", "x"}, {"--d", "integer", "'x'"}},
        {{"--d", "12.5"}, {"--d", "integer", "12.5"}},
        {{"--batch", "99999999999"}, {"--batch", "integer"}},
        {{"--lr", "fast"}, {"--lr", "number", "fast"}},
        {{"--seed", "-1"}, {"--seed", "-1"}},
        {{"--d", "10", "--H", "4"}, {"d=10", "H=4"}},
        {{"--H", "4", "--G", "3"}, {"H=4", "G=3"}},
        {{"--d", "12", "--H", "4"}, {"head size", "3", "even"}},
        {{"--L", "3", "--block-size", "4"}, {"S=4", "2L=6"}},
        {{"--d", "0"}, {"d", "positive", "0"}},
        {{"--L", "-1"}, {"L", "positive", "-1"}},
        {{"--F", "0"}, {"F", "positive"}},
        {{"--batch", "0"}, {"--batch", "positive"}},
        {{"--microbatches", "0"}, {"--microbatches", "positive"}},
        {{"--microbatches", "3"}, {"--microbatches 3 does not divide 32 sequences (--batch 32 over 1 process)"}},
        // the pipeline: MPI's (tests/mpi_tests.sh tries the rest under mpirun)
        {{"--pipeline", "2", "--microbatches", "2"}, {"--pipeline needs MPI: mpirun -np P*D ./train_mpi --pipeline P ..."}},
        {{"--pipeline", "0"}, {"--pipeline must be positive"}},
        {{"--virtual", "2"}, {"--virtual needs --pipeline P (P >= 2)"}},
        {{"--pipeline-cache", "off"}, {"--pipeline-cache needs --pipeline P (P >= 2)"}},
        {{"--pipeline-trace", "t.csv"}, {"--pipeline-trace needs --pipeline P (P >= 2)"}},
        {{"--pipeline", "2", "--pipeline-cache", "maybe"}, {"unknown --pipeline-cache 'maybe' (valid: on, off)"}},
        {{"--pipeline", "2", "--diagnostics", "d"}, {"--diagnostics runs without --pipeline"}},
        {{"--steps", "0"}, {"--steps", "positive"}},
        {{"--eval-every", "-5"}, {"--eval-every", "positive"}},
        {{"--lr", "0"}, {"--lr", "out of range", "(0, 3.40282e+38]"}},
        {{"--beta2", "1"}, {"--beta2"}},
        {{"--mode", "bogus"}, {"--mode", "bogus"}},
        {{"--mode", "block", "--block-size", "1"}, {"--block-size"}},
        {{"--seq-len", "7"}, {"--seq-len", "7", "24"}},
        {{"--task", "bogus"}, {"task", "bogus"}},
        {{"--length", "0"}, {"length", "0"}},
        {{"--symbols", "1"}, {"symbols", "1"}},
        {{"--task", "text"}, {"--text"}},
        {{"--resume"}, {"--resume", "--checkpoint"}},
        {{"--cublas"}, {"--cublas", "./train_cuda"}},
        {{"--no-graph"}, {"--no-graph", "./train_cuda"}},
        // flags that would do nothing
        {{"--text", "x.txt"}, {"--text", "--task text"}},
        {{"--prompt", "hi"}, {"--prompt", "--sample"}},
        {{"--top-k", "3"}, {"--top-k", "--sample"}},
        {{"--mode", "full", "--block-size", "2"}, {"--block-size", "--mode block", "full"}},
        {{"--mode", "none", "--block-size", "4"}, {"--block-size", "none"}},
        {{"--sample", "--checkpoint", "x.ckpt", "--resume"}, {"--resume", "training"}},
        // plain decimal numbers only
        {{"--lr", "0x10"}, {"--lr", "number", "0x10"}},
        {{"--lr", "inf"}, {"--lr", "number"}},
        {{"--lr", " 0.1"}, {"--lr", "number"}},
        {{"--seed", " -1"}, {"--seed", "non-negative", " -1"}},
        {{"--seed", "+5"}, {"--seed", "+5"}},
        {{"--steps", " 5"}, {"--steps", "integer"}},
        // checkpoint paths that cannot be written are found before training
        {{"--checkpoint", ""}, {"--checkpoint", "empty"}},
        {{"--diagnostics", ""}, {"--diagnostics", "empty"}},
        {{"--checkpoint", "/nonexistent-dir/model.ckpt"}, {"/nonexistent-dir/model.ckpt", "No such file"}},
        {{"--checkpoint", "/tmp"}, {"/tmp", "is a directory"}},
        {{"--resume", "--checkpoint", "/tmp"}, {"/tmp", "is a directory"}},
        // SPEC's variants: unknown values, switches the mode lacks, ruled-out combinations
        {{"--depth-score", "relu"}, {"--depth-score", "relu", "softmax, sigmoid"}},
        {{"--key-norm", "maybe"}, {"--key-norm", "maybe", "on, off"}},
        {{"--depth-query", "dynamic"}, {"--depth-query", "dynamic", "static, input"}},
        {{"--mixing", "avg"}, {"--mixing", "avg", "attention, static, dense"}},
        {{"--depth-heads", "3"}, {"--depth-heads 3", "d=64"}},
        {{"--depth-heads", "-1"}, {"--depth-heads -1"}},
        {{"--depth-window", "-2", "--mode", "full"}, {"--depth-window", "-2"}},
        {{"--depth-window", "2"}, {"--depth-window", "full only"}},
        {{"--mode", "none", "--depth-score", "sigmoid"}, {"--depth-score sigmoid", "mode none"}},
        {{"--mode", "none", "--key-norm", "off"}, {"--key-norm off", "mode none"}},
        {{"--mode", "none", "--mixing", "dense"}, {"--mixing", "mode none"}},
        {{"--mixing", "static", "--depth-heads", "2"}, {"--mixing", "--depth-heads"}},
        {{"--mixing", "dense", "--depth-query", "input"}, {"--mixing", "--depth-query input"}},
        // the schedules
        {{"--schedule", "linear"}, {"--schedule", "linear", "cosine, wsd"}},
        {{"--schedule", "wsd", "--decay-frac", "0"}, {"--decay-frac", "(0, 1)"}},
        {{"--schedule", "wsd", "--decay-frac", "1"}, {"--decay-frac", "(0, 1)"}},
        {{"--schedule", "wsd", "--decay-frac", "-0.5"}, {"--decay-frac", "(0, 1)"}},
        {{"--schedule", "wsd", "--decay-frac", "1.5"}, {"--decay-frac", "(0, 1)"}},
        {{"--schedule", "wsd", "--decay-frac", "nan"}, {"--decay-frac", "number", "nan"}},
        {{"--decay-frac", "0.3"}, {"--decay-frac", "--schedule wsd", "cosine"}},
        {{"--schedule", "cosine", "--decay-frac", "0.3"}, {"--decay-frac", "--schedule wsd"}},
        // mHC-lite: 2 .. 4 streams, --streams only with --mode mhc, no depth-attention switch
        {{"--mode", "mhc", "--streams", "5"}, {"--streams", "2 .. 4", "5"}},
        {{"--mode", "mhc", "--streams", "1"}, {"--streams", "2 .. 4", "1"}},
        {{"--streams", "3"}, {"--streams", "--mode mhc", "block"}},
        {{"--mode", "none", "--streams", "2"}, {"--streams", "--mode mhc", "none"}},
        {{"--mode", "mhc", "--depth-score", "sigmoid"}, {"--depth-score sigmoid", "mode mhc"}},
        {{"--mode", "mhc", "--mixing", "static"}, {"--mixing", "mode mhc"}},
        {{"--mode", "mhc", "--block-size", "2"}, {"--block-size", "--mode block", "mhc"}},
        // the optimisers
        {{"--optimizer", "sgd"}, {"--optimizer", "sgd", "adamw, muon"}},
        {{"--optimizer", "muon", "--muon-momentum", "1"}, {"--muon-momentum", "[0, 1)", "1"}},
        {{"--optimizer", "muon", "--muon-momentum", "-0.1"}, {"--muon-momentum", "[0, 1)", "-0.1"}},
        {{"--optimizer", "muon", "--muon-momentum", "abc"}, {"--muon-momentum", "number", "abc"}},
        {{"--muon-momentum", "0.9"}, {"--muon-momentum", "--optimizer muon", "adamw"}},
    };
    for (const Case& k : cases) check_error(run_train(dir, k.args), k.words);
}

TEST_CASE("an integer out of range says so, naming the flag and the range") {
    TempDir dir;
    check_error(run_train(dir, {"--batch", "99999999999"}), {"--batch", "out of range", "99999999999", "2147483647"});
    check_error(run_train(dir, {"--d", "-99999999999"}), {"--d", "out of range", "-2147483648"});
    check_error(run_train(dir, {"--seed", "99999999999999999999999"}),
                {"--seed", "out of range", "18446744073709551615"});
    check_error(run_train(dir, {"--steps", "12x"}), {"--steps", "expects an integer", "12x"});
}

TEST_CASE("a float out of range says so, naming the flag and the range, also where float32 rounding takes it there") {
    TempDir dir;
    check_error(run_train(dir, {"--lr", "1e39"}), {"--lr", "out of range", "1e39 is not in (0, 3.40282e+38]"});
    check_error(run_train(dir, {"--lr", "1e-50"}), {"--lr", "out of range", "1e-50 is 0 as a float32", "(0, 3.40282e+38]"});
    check_error(run_train(dir, {"--lr", "-0.001"}), {"--lr", "out of range", "-0.001 is not in (0, 3.40282e+38]"});
    check_error(run_train(dir, {"--optimizer", "muon", "--muon-momentum", "0.99999999999"}),
                {"--muon-momentum", "out of range", "0.99999999999 is 1 as a float32", "[0, 1)"});
    check_error(run_train(dir, {"--beta1", "0.999999999"}), {"--beta1", "out of range", "is 1 as a float32", "[0, 1)"});
    check_error(run_train(dir, {"--schedule", "wsd", "--decay-frac", "1e-60"}),
                {"--decay-frac", "out of range", "is 0 as a float32", "(0, 1)"});
    check_error(run_train(dir, {"--weight-decay", "1e400"}), {"--weight-decay", "out of range", "[0, 3.40282e+38]"});
    check_error(run_train(dir, {"--grad-clip", "-1"}), {"--grad-clip", "out of range", "[0, 3.40282e+38]"});
    check_error(run_train(dir, {"--final-lr-frac", "-0.1"}), {"--final-lr-frac", "out of range"});
    check_error(run_train(dir, {"--final-lr-frac", "2"}), {"--final-lr-frac", "out of range", "2 is not in [0, 1]"});
    check_error(run_train(dir, {"--final-lr-frac", "1e30"}), {"--final-lr-frac", "out of range", "1e30 is not in [0, 1]"});
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--final-lr-frac", "1"})));
    check_error(run_train(dir, {"--sample", "--checkpoint", "x.ckpt", "--temperature", "-1"}),
                {"--temperature", "out of range", "[0, 3.40282e+38]"});
    check_error(run_train(dir, {"--lr", "1e3x"}), {"--lr", "expects a number", "1e3x"});
}

TEST_CASE("--help says that --seed under --sample sets the draws and picks the task prompt") {
    TempDir dir;
    Run help = run_train(dir, {"--help"});
    check_success(help);
    std::string seed;
    for (const std::string& line : lines_of(help.out))
        if (line.find("--seed") == 2) seed = line;
    CHECK(contains(seed, "--sample"));
    CHECK(contains(seed, "draws"));
    CHECK(contains(seed, "task prompt"));
}

TEST_CASE("every variant trains, and its checkpoint resumes and samples only with its own switches") {
    TempDir dir;
    const Args variants[] = {
        {"--mode", "full", "--depth-score", "sigmoid", "--depth-heads", "2"},
        {"--key-norm", "off", "--depth-query", "input"},
        {"--mode", "full", "--depth-window", "1", "--mixing", "static"},
        {"--mixing", "dense"},
    };
    int k = 0;
    for (const Args& variant : variants) {
        std::string path = dir.file("v" + std::to_string(k++) + ".ckpt");
        Args args = {"--steps", "4", "--eval-every", "2", "--checkpoint", path};
        args.insert(args.end(), variant.begin(), variant.end());
        Run first = run_train(dir, tiny(args));
        check_success(first);
        CHECK(contains(first.out, "final"));
        Args resume = args;
        resume.push_back("--resume");
        // the same switches resume; without them, the checkpoint's variant is named
        Args plain = {"--steps", "4", "--eval-every", "2", "--checkpoint", path, "--resume"};
        if (std::find(variant.begin(), variant.end(), "full") != variant.end())
            plain.insert(plain.end(), {"--mode", "full"});
        check_error(run_train(dir, tiny(plain)), {path, "no variant", variant[variant.size() - 1]});
        check_success(run_train(dir, tiny(resume)));
        check_success(run_train(dir, {"--sample", "--checkpoint", path, "--threads", "1"}));
        // sampling with another value of a switch is refused, naming it
        Args other = {"--sample", "--checkpoint", path, "--depth-heads", "4"};
        check_error(run_train(dir, other), {path, "--depth-heads disagrees"});
    }
}

TEST_CASE("--sample refuses every flag it does not read, naming it") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", path})));
    const Args training[] = {{"--mode", "full"}, {"--d", "32"}, {"--L", "2"}, {"--H", "4"}, {"--G", "2"},
                             {"--F", "64"}, {"--block-size", "2"}, {"--steps", "5"}, {"--batch", "8"},
                             {"--seq-len", "8"}, {"--lr", "0.1"}, {"--warmup", "3"}, {"--final-lr-frac", "0.5"},
                             {"--weight-decay", "0"}, {"--grad-clip", "0"}, {"--beta1", "0.8"},
                             {"--beta2", "0.9"}, {"--eval-every", "3"}, {"--log-every", "3"},
                             {"--cublas"}, {"--no-graph"}, {"--resume"}, {"--stop-after", "1"}, {"--diagnostics", dir.file("d")},
                             {"--schedule", "wsd"}, {"--decay-frac", "0.3"},
                             {"--optimizer", "muon"}, {"--muon-momentum", "0.9"},
                             {"--init-from", dir.file("model.safetensors")}};
    for (const Args& flag : training) {
        Args args = {"--sample", "--checkpoint", path};
        args.insert(args.end(), flag.begin(), flag.end());
        check_error(run_train(dir, args), {flag[0] + " is a training flag", "--sample"});
    }
    // the flags it reads still work
    check_success(run_train(dir, {"--sample", "--checkpoint", path, "--threads", "1", "--seed", "3",
                                  "--temperature", "1", "--top-k", "2", "--tokens", "3"}));
}

TEST_CASE("--sample refuses --top-k without a --temperature above 0: greedy decoding ignores it") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", path})));
    check_error(run_train(dir, {"--sample", "--checkpoint", path, "--top-k", "5"}), {"--top-k needs --temperature", "greedy"});
    check_error(run_train(dir, {"--sample", "--checkpoint", path, "--top-k", "5", "--temperature", "0"}),
                {"--top-k needs --temperature"});
    check_success(run_train(dir, {"--sample", "--checkpoint", path, "--top-k", "5", "--temperature", "0.5"}));
}

TEST_CASE("--depth-heads 1 and 0 are one head: a checkpoint trained with either resumes and samples with the other") {
    TempDir dir;
    const Args one = {"--depth-heads", "1"}, none = {};
    for (int k = 0; k < 2; k++) {
        const Args& trained = k == 0 ? one : none;
        const Args& resumed = k == 0 ? none : one;
        std::string path = dir.file("heads" + std::to_string(k) + ".ckpt");
        Args args = {"--steps", "4", "--eval-every", "2", "--checkpoint", path};
        Args first = args;
        first.insert(first.end(), {"--stop-after", "2"});
        first.insert(first.end(), trained.begin(), trained.end());
        check_success(run_train(dir, tiny(first)));
        ModelConfig config;
        int step = 0;
        char err[512];
        REQUIRE(checkpoint_read_config(path.c_str(), &config, &step, err, sizeof(err)) == 0);
        CHECK(config.depth_heads == 0);  // stored as the default model
        Args second = args;
        second.push_back("--resume");
        second.insert(second.end(), resumed.begin(), resumed.end());
        check_success(run_train(dir, tiny(second)));
        Args sample = {"--sample", "--checkpoint", path, "--threads", "1"};
        sample.insert(sample.end(), resumed.begin(), resumed.end());
        check_success(run_train(dir, sample));
    }
}

TEST_CASE("--depth-window W >= 2L is full mode: stored as full, so --resume and --sample take it as such") {
    TempDir dir;
    std::string path = dir.file("window.ckpt");
    Args args = {"--mode", "full", "--steps", "4", "--eval-every", "2", "--checkpoint", path};
    Args first = args;
    first.insert(first.end(), {"--depth-window", "2", "--stop-after", "2"});  // L = 1: 2L = 2
    check_success(run_train(dir, tiny(first)));
    ModelConfig config;
    int step = 0;
    char err[512];
    REQUIRE(checkpoint_read_config(path.c_str(), &config, &step, err, sizeof(err)) == 0);
    CHECK(config.depth_window == 0);
    Args second = args;
    second.push_back("--resume");  // full mode without a window: the same run
    check_success(run_train(dir, tiny(second)));
    check_success(run_train(dir, {"--sample", "--checkpoint", path, "--threads", "1", "--depth-window", "5"}));
    check_error(run_train(dir, {"--sample", "--checkpoint", path, "--depth-window", "1"}),
                {path, "--depth-window disagrees"});
}

TEST_CASE("--stop-after past --steps is refused, and so is --resume --stop-after past --steps from the checkpoint's step") {
    TempDir dir;
    check_error(run_train(dir, tiny({"--steps", "4", "--stop-after", "5"})), {"--stop-after 5", "--steps 4"});
    std::string path = dir.file("model.ckpt");
    Args args = {"--steps", "4", "--eval-every", "2", "--checkpoint", path};
    Args first = args;
    first.insert(first.end(), {"--stop-after", "2"});
    check_success(run_train(dir, tiny(first)));  // at step 2 of 4
    Args resume = args;
    resume.insert(resume.end(), {"--resume", "--stop-after", "3"});
    check_error(run_train(dir, tiny(resume)), {path, "step 2", "--stop-after 3", "--steps 4"});
    resume.back() = "2";
    check_success(run_train(dir, tiny(resume)));  // to step 4, the end
    resume.back() = "1";
    check_error(run_train(dir, tiny(resume)), {path, "step 4", "--stop-after 1"});
}

TEST_CASE("--checkpoint onto a pipe (or a device such as /dev/null) is refused before training, not replaced") {
    TempDir dir;
    std::string pipe = dir.file("pipe");
    REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
    check_error(run_train(dir, tiny({"--steps", "2", "--checkpoint", pipe})), {pipe, "not a regular file"});
    CHECK(fs::is_fifo(pipe));
}

TEST_CASE("a --checkpoint path (or its .best) that is the --text file or the --diagnostics directory is refused, however spelled") {
    TempDir dir;
    std::string text = dir.file("input.txt"), link = dir.file("link.txt");
    std::string some_text;
    for (int i = 0; i < 40; i++) some_text += "the quick brown fox jumps over the lazy dog. ";
    write_text(text, some_text);
    REQUIRE(symlink(text.c_str(), link.c_str()) == 0);
    Args text_run = {"--task", "text", "--steps", "2", "--eval-every", "2", "--seq-len", "16"};
    // the text file as the checkpoint, spelled another way, or through a symbolic link
    std::string spelled = dir.path + "/./input.txt";
    Args a = text_run;
    a.insert(a.end(), {"--text", text, "--checkpoint", spelled});
    check_error(run_train(dir, tiny(a)), {spelled, "--text file"});
    Args b = text_run;
    b.insert(b.end(), {"--text", link, "--checkpoint", text});
    check_error(run_train(dir, tiny(b)), {text, "--text file"});
    // the text file as the best checkpoint
    write_text(dir.file("notes"), "");
    std::string best_text = dir.file("notes.best");
    write_text(best_text, some_text);
    Args c = text_run;
    c.insert(c.end(), {"--text", best_text, "--checkpoint", dir.file("notes")});
    check_error(run_train(dir, tiny(c)), {best_text, "--text file"});
    CHECK(read_text(text) == some_text);
    CHECK(read_text(best_text) == some_text);
    // the diagnostics directory, before it exists, as the checkpoint or its .best
    std::string diag = dir.file("diag");
    check_error(run_train(dir, tiny({"--steps", "2", "--checkpoint", diag, "--diagnostics", diag + "/"})),
                {diag, "--diagnostics directory"});
    check_error(run_train(dir, tiny({"--steps", "2", "--checkpoint", diag, "--diagnostics", diag + ".best"})),
                {diag + ".best", "--diagnostics directory"});
    CHECK(!fs::exists(diag));
}

TEST_CASE("a directory (or a pipe) at PATH.best is refused before training, like one at PATH") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    REQUIRE(fs::create_directory(path + ".best"));
    Run run = run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", path}));
    check_error(run, {path + ".best", "is a directory"});
    CHECK(!contains(run.out, "step"));
    CHECK(!fs::exists(path));
    std::string other = dir.file("other.ckpt");
    REQUIRE(mkfifo((other + ".best").c_str(), 0600) == 0);
    check_error(run_train(dir, tiny({"--steps", "2", "--checkpoint", other})), {other + ".best", "not a regular file"});
    CHECK(fs::is_fifo(other + ".best"));
}

TEST_CASE("a run removes the temporary files that killed saves of its checkpoint left, not a live process's") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    pid_t child = fork();  // a process id that no process has once the child is reaped
    REQUIRE(child >= 0);
    if (child == 0) _exit(0);
    REQUIRE(waitpid(child, nullptr, 0) == child);
    std::string gone = std::to_string(child), live = std::to_string(getpid());
    std::vector<std::string> stale = {path + ".tmp." + gone, path + ".best.tmp." + gone};
    std::vector<std::string> kept = {path + ".tmp." + live, path + ".best.tmp." + live,
                                     path + ".tmp." + gone + "x", dir.file("other.ckpt.tmp." + gone)};
    for (const std::string& f : stale) write_text(f, "torn");
    for (const std::string& f : kept) write_text(f, "torn");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", path})));
    for (const std::string& f : stale) CHECK_MESSAGE(!fs::exists(f), f << " is still there");
    for (const std::string& f : kept) CHECK_MESSAGE(fs::exists(f), f << " was removed");
}

TEST_CASE("bad text files exit 1 with one error line naming the file and the problem") {
    TempDir dir;
    std::string missing = dir.file("missing.txt"), empty = dir.file("empty.txt");
    std::string short_text = dir.file("short.txt");
    write_text(empty, "");
    write_text(short_text, std::string(100, 'a'));  // seq-len 32 needs 10 * 33 bytes
    Args text = {"--task", "text", "--seq-len", "32", "--text"};
    auto with = [&](const std::string& path) { Args a = text; a.push_back(path); return tiny(a); };
    check_error(run_train(dir, with(missing)), {missing, "No such file"});
    check_error(run_train(dir, with(empty)), {empty, "empty"});
    check_error(run_train(dir, with(dir.path)), {dir.path, "directory"});
    check_error(run_train(dir, with(short_text)), {short_text, "too short", "100 bytes", "330"});
    std::string huge = dir.file("huge.txt");  // sparse: takes no disk, refused by its size
    write_text(huge, "");
    fs::resize_file(huge, TEXT_MAX_BYTES + 1);
    check_error(run_train(dir, with(huge)), {huge, "1073741825 bytes, more than the 1073741824"});
}

TEST_CASE("a --text that is no regular file (a pipe with no writer, a device) is refused, not waited on") {
    // under timeout: a run that waits for a writer that never comes fails the test (status
    // 124) rather than hang the suite
    TempDir dir;
    std::string pipe = dir.file("pipe");
    REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
    const std::string timeout = "/usr/bin/timeout";
    REQUIRE_MESSAGE(fs::exists(timeout), "this test needs timeout (coreutils)");
    for (const std::string& text : {pipe, std::string("/dev/zero")}) {
        Args command = {"20", train_binary()};
        Args args = tiny({"--task", "text", "--text", text, "--steps", "2"});
        command.insert(command.end(), args.begin(), args.end());
        check_error(run_program(dir, timeout, command), {text, "not a regular file"});
    }
    CHECK(fs::is_fifo(pipe));
}

TEST_CASE("an error about a long path still says what is wrong, after the whole path") {
    // 7 folders of 200 characters: the messages were cut at 512 or 1024 bytes, mid-path
    TempDir dir;
    std::string deep = dir.path;
    for (int i = 0; i < 7; i++) deep += "/" + std::string(200, 'd');
    fs::create_directories(deep);
    std::string text = deep + "/missing.txt", checkpoint = deep + "/none.ckpt";
    check_error(run_train(dir, tiny({"--task", "text", "--text", text})),
                {text + "': cannot open: No such file or directory"});
    check_error(run_train(dir, tiny({"--resume", "--checkpoint", checkpoint})),
                {checkpoint + ": No such file or directory"});
}

TEST_CASE("a held-out set larger than the memory there is is refused before it is built") {
    // 2e9 examples of 2 * 4096 + 1 tokens: 65 TB; before, it was allocated and filled
    // (--eval-examples 1e8 at --length 12: 11 GB, not in the header's memory)
    TempDir dir;
    check_error(run_train(dir, tiny({"--eval-examples", "2000000000", "--length", "4096"})),
                {"--eval-examples 2000000000 would take", "GiB (with --length 4096)",
                 "GiB available"});
}

TEST_CASE("bad checkpoints given to --resume exit 1 with one error line naming the problem") {
    TempDir dir;
    std::string good = dir.file("good.ckpt");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", good})));
    const std::string bytes = read_text(good);
    REQUIRE(bytes.size() > 1024);
    auto corrupt = [&](const std::string& name, std::string contents) {
        write_text(dir.file(name), contents);
        return dir.file(name);
    };
    auto resume = [&](const std::string& path, Args extra = {}) {
        extra.insert(extra.end(), {"--steps", "4", "--resume", "--checkpoint", path});
        return run_train(dir, tiny(extra));
    };
    std::string wrong_magic = bytes, wrong_version = bytes;
    int value = 4711;
    std::memcpy(&wrong_magic[0], &value, sizeof value);
    value = CHECKPOINT_VERSION + 1;
    std::memcpy(&wrong_version[4], &value, sizeof value);
    check_error(resume(corrupt("magic.ckpt", wrong_magic)), {"magic.ckpt", "magic"});
    check_error(resume(corrupt("version.ckpt", wrong_version)), {"version.ckpt", "version"});
    check_error(resume(corrupt("cut.ckpt", bytes.substr(0, bytes.size() - 100))), {"cut.ckpt", "truncated"});
    check_error(resume(corrupt("long.ckpt", bytes + "extra")), {"long.ckpt", "too long"});
    check_error(resume(dir.file("missing.ckpt")), {"missing.ckpt", "No such file"});
    // a run record naming a task that does not exist (its name was read past the task table:
    // a crash, or a garbled message): refused by --resume and by --sample alike
    std::string bad_task = bytes;
    value = 7;
    std::memcpy(&bad_task[13 * sizeof(int)], &value, sizeof value);
    std::string task_path = corrupt("task.ckpt", bad_task);
    check_error(resume(task_path), {"task.ckpt", "corrupt run record", "task 7"});
    check_error(run_train(dir, {"--sample", "--checkpoint", task_path}),
                {"task.ckpt", "corrupt run record", "task 7"});
    // the flags ask for another model than the file holds: both configs are named
    check_error(resume(good, {"--d", "32"}), {"good.ckpt", "d=16", "d=32"});
    check_error(resume(good, {"--mode", "full"}), {"S=2", "S=1"});
    check_error(resume(good, {"--mode", "none"}), {"S=2", "S=0"});
    check_error(resume(good, {"--symbols", "7"}), {"V=7", "V=8"});
    // a checkpoint past the requested number of steps
    Args past = tiny({"--steps", "1", "--resume", "--checkpoint", good});
    check_error(run_train(dir, past), {"good.ckpt", "step 2", "--steps 1"});
    CHECK(read_text(good) == bytes);  // none of this touched the checkpoint
}

TEST_CASE("a checkpoint with one NaN in an optimiser moment is refused by --resume, --sample and --export, naming the file and the tensor") {
    TempDir dir;
    std::string good = dir.file("good.ckpt"), bad = dir.file("bad.ckpt");
    for (const char* optimizer : {"adamw", "muon"}) {
        INFO("--optimizer ", optimizer);
        Args first = {"--steps", "4", "--eval-every", "2", "--stop-after", "2", "--checkpoint", good,
                      "--optimizer", optimizer};
        check_success(run_train(dir, tiny(first)));
        // one NaN in the first moments (after the n_params parameters) at wq's first element, a
        // matrix that Muon keeps its momentum for
        std::string bytes = read_text(good);
        size_t header = 256 * sizeof(int), n_params = (bytes.size() - header) / (3 * sizeof(float));
        size_t wte = 7 * 16, attn_norm = 16;  // V x d, then L x d
        const float nan_value = NAN;
        std::memcpy(&bytes[header + (n_params + wte + attn_norm) * sizeof(float)], &nan_value, sizeof nan_value);
        write_text(bad, bytes);
        Args resume = {"--steps", "4", "--eval-every", "2", "--checkpoint", bad, "--resume",
                       "--optimizer", optimizer};
        check_error(run_train(dir, tiny(resume)), {bad, "NaN/Inf first moments", "(in wq)"});
        check_error(run_train(dir, {"--sample", "--checkpoint", bad}), {bad, "NaN/Inf first moments", "(in wq)"});
        check_error(run_train(dir, {"--export", dir.file("out.safetensors"), "--checkpoint", bad}),
                    {bad, "NaN/Inf first moments", "(in wq)"});
        CHECK(read_text(bad) == bytes);
        CHECK(!fs::exists(dir.file("out.safetensors")));
    }
}

TEST_CASE("a checkpoint with any header slot in use corrupted: --resume and --sample end cleanly") {
    // each slot the format uses (checkpoint.h: [2..11] config, step, parameter count; [12..38]
    // the run record, the schedule at [34..35], the optimiser at [36..37], the microbatches at
    // [38]; [64] the text file's name; [128..133] the
    // variant) set to a negative, a small and a huge value: the file is refused with one error
    // line or read as a plausible one, never a crash (a task past the task table was one,
    // found by fuzzing)
    TempDir dir;
    std::string good = dir.file("good.ckpt");
    check_success(run_train(dir, tiny({"--steps", "2", "--eval-every", "2", "--checkpoint", good})));
    const std::string bytes = read_text(good);
    std::vector<int> slots;
    for (int i = 2; i <= 38; i++) slots.push_back(i);
    for (int i : {64, 128, 129, 130, 131, 132, 133}) slots.push_back(i);
    std::string path = dir.file("slot.ckpt");
    for (int slot : slots) {
        for (int value : {-1, 7, 2147483647}) {
            std::string corrupt = bytes;
            std::memcpy(&corrupt[(size_t)slot * sizeof(int)], &value, sizeof value);
            write_text(path, corrupt);
            const Run runs[] = {run_train(dir, tiny({"--steps", "3", "--resume", "--checkpoint", path})),
                                run_train(dir, {"--sample", "--checkpoint", path, "--threads", "1"})};
            for (const Run& run : runs) {
                INFO("slot ", slot, " = ", value, ": ", run.command, "\nstderr:\n", run.err);
                REQUIRE_MESSAGE(run.exited, "killed by signal " << run.signal);
                CHECK((run.exit_code == 0 || run.exit_code == 1));
                if (run.exit_code == 1) {
                    CHECK(run.err.rfind("error: ", 0) == 0);
                    CHECK(run.err.find('\n') == run.err.size() - 1);
                }
            }
        }
    }
}

// test_cli.cpp — the real ./train binary (or $ATTNRES_TRAIN), run from the repository root:
// every bad input ends with exit status 1 and exactly one "error: ..." line on stderr naming
// the problem, never a crash; --help lists every flag with its default; tiny runs train,
// print the final metrics, are deterministic, resume bit for bit, and stop on NaN keeping the
// last checkpoint. Every run is tiny, so the file takes a few seconds.
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "dataset.h"  // TEXT_MAX_BYTES

extern char** environ;

namespace {

namespace fs = std::filesystem;
typedef std::vector<std::string> Args;

std::string train_binary() {
    const char* path = std::getenv("ATTNRES_TRAIN");
    return path != nullptr && path[0] != '\0' ? path : "./train";
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE(out.good());
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

// The output up to the "final" line: after it an AttnRes run prints its depth-attention
// heatmap (diagnostics.h).
std::vector<std::string> lines_to_final(const std::string& out) {
    std::vector<std::string> lines = lines_of(out);
    for (size_t i = 0; i < lines.size(); i++)
        if (lines[i].rfind("final", 0) == 0) lines.resize(i + 1);
    return lines;
}

bool contains(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

struct Run {
    bool exited = false;   // false: killed by a signal (a crash)
    int exit_code = -1;
    int signal = 0;
    std::string out, err;  // stdout and stderr, captured separately
    std::string command;
};

// Runs the trainer with args; stdout and stderr go to files in dir. OpenMP threads sleep
// rather than spin at barriers, so runs stay fast on a busy machine (results do not depend
// on it).
// wait_policy: the OMP_WAIT_POLICY the program gets (nullptr: none, the trainer's default);
// GOMP_SPINCOUNT is never passed on
Run run_program(const TempDir& dir, const std::string& binary, const Args& args,
                const char* wait_policy = "PASSIVE") {
    Run run;
    REQUIRE_MESSAGE(fs::exists(binary), binary << " does not exist: build it (make) or set ATTNRES_TRAIN");
    std::vector<std::string> argv_strings = {binary};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_strings) {
        argv.push_back(&s[0]);
        run.command += s + " ";
    }
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    if (wait_policy != nullptr) env_strings.push_back(std::string("OMP_WAIT_POLICY=") + wait_policy);
    for (char** e = environ; *e != nullptr; e++)  // how threads wait: only as asked here
        if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) != 0 && std::strncmp(*e, "GOMP_SPINCOUNT=", 15) != 0)
            env_strings.push_back(*e);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(&s[0]);
    envp.push_back(nullptr);

    std::string out_path = dir.file("stdout.txt"), err_path = dir.file("stderr.txt");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int spawned = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE_MESSAGE(spawned == 0, "cannot run " << binary << ": " << std::strerror(spawned));
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    run.exited = WIFEXITED(status);
    run.exit_code = run.exited ? WEXITSTATUS(status) : -1;
    run.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    run.out = read_text(out_path);
    run.err = read_text(err_path);
    return run;
}
Run run_train(const TempDir& dir, const Args& args) { return run_program(dir, train_binary(), args); }

// The trainer run under prlimit, every file it writes (stdout and stderr included) capped at
// max_bytes: a write past it fails with EFBIG, as one on a full disk fails with ENOSPC.
// SIGXFSZ, which would end the run instead, is ignored here and so in the run too.
Run run_train_with_file_limit(const TempDir& dir, size_t max_bytes, const Args& args) {
    const std::string prlimit = "/usr/bin/prlimit";
    REQUIRE_MESSAGE(fs::exists(prlimit), "this test needs prlimit (util-linux)");
    Args command = {"--fsize=" + std::to_string(max_bytes), train_binary()};
    command.insert(command.end(), args.begin(), args.end());
    void (*previous)(int) = std::signal(SIGXFSZ, SIG_IGN);
    Run run = run_program(dir, prlimit, command);
    std::signal(SIGXFSZ, previous);
    return run;
}

// A successful run: exit status 0, nothing on stderr.
void check_success(const Run& run) {
    INFO("command: ", run.command, "\nstdout:\n", run.out, "stderr:\n", run.err);
    CHECK(run.exited);
    CHECK(run.exit_code == 0);
    CHECK(run.err.empty());
}

// A rejected input: exit status 1 (not a crash), nothing on stdout, and stderr exactly one
// line "error: ..." containing every word.
void check_error(const Run& run, const std::vector<std::string>& words, bool quiet_stdout = true) {
    INFO("command: ", run.command, "\nstdout:\n", run.out, "stderr:\n", run.err);
    CHECK_MESSAGE(run.exited, "killed by signal " << run.signal);
    CHECK(run.exit_code == 1);
    if (quiet_stdout) CHECK(run.out.empty());
    CHECK(run.err.rfind("error: ", 0) == 0);
    CHECK(run.err.size() > 8);
    CHECK(run.err.find('\n') == run.err.size() - 1);  // one line, ended by its newline
    for (const std::string& word : words) CHECK_MESSAGE(contains(run.err, word), "missing '" << word << "'");
}

// The output with the timing columns (tok/s, ms/step, time) taken out: what must be equal
// between runs.
std::vector<std::string> without_timings(const std::string& out) {
    std::vector<std::string> result;
    for (const std::string& line : lines_of(out)) {
        std::string kept, field;
        size_t start = 0;
        while (start <= line.size()) {
            size_t bar = line.find(" | ", start);
            field = line.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
            if (!contains(field, "tok/s") && !contains(field, "ms/step") && field.rfind("time ", 0) != 0)
                kept += (kept.empty() ? "" : " | ") + field;
            if (bar == std::string::npos) break;
            start = bar + 3;
        }
        result.push_back(kept);
    }
    return result;
}

// The lines about training steps >= first_step: "step N/..." and "eval step N", plus "final".
std::vector<std::string> lines_from_step(const std::vector<std::string>& lines, int first_step) {
    std::vector<std::string> result;
    for (const std::string& line : lines) {
        int step = 0;
        if (std::sscanf(line.c_str(), "step %d/", &step) == 1 ||
            std::sscanf(line.c_str(), "eval step %d", &step) == 1) {
            if (step >= first_step) result.push_back(line);
        } else if (line.rfind("final", 0) == 0) {
            result.push_back(line);
        }
    }
    return result;
}

// A tiny model and task: V = 7, T = 8, one layer, blocks of two sub-layers (for --task text
// and --mode none/full the same, without the flags such runs refuse: --length and --symbols,
// --block-size).
Args tiny(Args extra = {}) {
    bool text = false, block = true;
    for (size_t i = 0; i + 1 < extra.size(); i++) {
        text |= extra[i] == "--task" && extra[i + 1] == "text";
        block &= !(extra[i] == "--mode" && extra[i + 1] != "block");
    }
    Args args = {"--d", "16", "--L", "1", "--H", "2", "--G", "1", "--F", "32",
                 "--batch", "4", "--eval-examples", "16", "--threads", "1"};
    if (block) args.insert(args.end(), {"--block-size", "2"});
    if (!text) args.insert(args.end(), {"--length", "4", "--symbols", "6"});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

// The flags the trainer documents (train.c), in --help order.
const char* const FLAGS[] = {"--d", "--L", "--H", "--G", "--F", "--mode", "--streams", "--block-size", "--task",
                             "--text", "--length", "--symbols", "--eval-examples", "--batch",
                             "--seq-len", "--steps", "--lr", "--warmup", "--final-lr-frac",
                             "--schedule", "--decay-frac", "--weight-decay", "--optimizer",
                             "--muon-momentum", "--grad-clip", "--beta1",
                             "--beta2", "--seed",
                             "--threads", "--eval-every", "--log-every", "--checkpoint", "--resume",
                             "--init-from", "--export", "--diagnostics"};

}  // namespace

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
        {{"--microbatches", "3"}, {"--microbatches 3 does not divide 32 rows (--batch 32 over 1 process)"}},
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
        // one NaN in the first moments (after the P parameters) at wq's first element, a
        // matrix that Muon keeps its momentum for
        std::string bytes = read_text(good);
        size_t header = 256 * sizeof(int), P = (bytes.size() - header) / (3 * sizeof(float));
        size_t wte = 7 * 16, attn_norm = 16;  // V x d, then L x d
        const float nan_value = NAN;
        std::memcpy(&bytes[header + (P + wte + attn_norm) * sizeof(float)], &nan_value, sizeof nan_value);
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
    size_t header = 256 * sizeof(int), P = (before.size() - header) / (3 * sizeof(float));
    int step = -1;
    std::memcpy(&step, after.data() + 9 * sizeof(int), sizeof step);
    CHECK(step == 0);
    CHECK(after.compare(header, P * sizeof(float), before, header, P * sizeof(float)) == 0);  // the weights
    CHECK(after.substr(header + P * sizeof(float)) == std::string(2 * P * sizeof(float), '\0'));  // m, v
    CHECK(before.substr(header + P * sizeof(float)) != std::string(2 * P * sizeof(float), '\0'));
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

// ---- --help and a tiny run ---------------------------------------------------------------

TEST_CASE("--help exits 0 and lists every flag with a default that the parser accepts") {
    TempDir dir;
    Run help = run_train(dir, {"--help"});
    check_success(help);
    std::vector<std::string> lines = lines_of(help.out);
    for (const char* flag : FLAGS) {
        INFO("flag ", flag);
        std::string line;
        for (const std::string& l : lines) {
            std::istringstream words(l);
            std::string first;
            words >> first;
            if (first == flag) line = l;
        }
        REQUIRE_MESSAGE(!line.empty(), flag << " is not listed by --help");
        size_t open = line.rfind('['), close = line.rfind(']');
        REQUIRE(open != std::string::npos);
        REQUIRE(close == line.size() - 1);
        std::string value = line.substr(open + 1, close - open - 1);
        CHECK(!value.empty());
        // the listed default is a valid value: parsing it, then --help, exits 0 (a switch
        // takes no value; a path without default gets one)
        Args args = {flag};
        if (value != "off") args.push_back(value == "(none)" ? dir.file("some_file") : value);
        args.push_back("--help");
        Run run = run_train(dir, args);
        CHECK_MESSAGE((run.exited && run.exit_code == 0), run.command << " -> " << run.err);
    }
    CHECK(contains(help.out, "--help"));
}

TEST_CASE("a tiny training run prints loss lines and a final line with val_loss and exact_match") {
    TempDir dir;
    Run run = run_train(dir, tiny({"--steps", "20", "--eval-every", "10", "--log-every", "5"}));
    check_success(run);
    std::vector<std::string> lines = lines_to_final(run.out);
    REQUIRE(lines.size() == 1 + 4 + 2 + 1);  // banner, 4 loss lines, 2 evals, final
    CHECK(lines[0].rfind("attnres.c | mode block (S=2)", 0) == 0);
    int evals = 0;
    for (const std::string& line : lines) evals += line.rfind("eval step", 0) == 0;
    CHECK(evals == 2);
    const std::string& last = lines.back();
    INFO("final line: ", last);
    CHECK(last.rfind("final | steps 20", 0) == 0);
    CHECK(contains(last, "val_loss"));
    CHECK(contains(last, "exact_match"));
    CHECK(contains(last, "%"));
    float val_loss = NAN;
    REQUIRE(std::sscanf(last.c_str() + last.find("val_loss"), "val_loss %f", &val_loss) == 1);
    CHECK(std::isfinite(val_loss));
    CHECK(val_loss > 0.0f);
}

TEST_CASE("training lowers the loss: 200 steps take reversal's val_loss from ln 17 to below 2.2") {
    // A run whose backward or update does nothing prints the same loss lines and exits 0;
    // only the loss falling tells it learned. (200 steps of this model reach about 1.75.)
    TempDir dir;
    Run run = run_train(dir, {"--d", "32", "--L", "1", "--H", "2", "--G", "1", "--F", "64",
                              "--block-size", "2", "--batch", "16", "--eval-examples", "16",
                              "--threads", "1", "--steps", "200", "--warmup", "10", "--lr",
                              "0.01", "--eval-every", "200", "--log-every", "1"});
    check_success(run);
    std::vector<std::string> lines = lines_to_final(run.out);
    REQUIRE(lines.size() > 2);
    float first = NAN, val_loss = NAN;
    INFO("first step: ", lines[1]);
    INFO("final line: ", lines.back());
    REQUIRE(std::sscanf(lines[1].c_str() + lines[1].find("loss"), "loss %f", &first) == 1);
    REQUIRE(std::sscanf(lines.back().c_str() + lines.back().find("val_loss"), "val_loss %f",
                        &val_loss) == 1);
    CHECK(first > 2.7f);  // ln 17 = 2.83: the zero-query model starts near uniform
    CHECK(val_loss < 2.2f);
}

TEST_CASE("a tiny run on a text file prints val_loss") {
    TempDir dir;
    std::string text = "/usr/share/common-licenses/GPL-3";
    if (!fs::exists(text)) {  // any text of a few kB does
        text = dir.file("text.txt");
        std::string body;
        for (int i = 0; i < 200; i++) body += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
        write_text(text, body);
    }
    Run run = run_train(dir, tiny({"--task", "text", "--text", text, "--seq-len", "32", "--steps", "10",
                                    "--eval-every", "10"}));
    check_success(run);
    std::vector<std::string> lines = lines_to_final(run.out);
    REQUIRE(!lines.empty());
    CHECK(contains(lines[0], "V=256"));
    CHECK(contains(lines[0], "T=32"));
    CHECK(lines.back().rfind("final | steps 10", 0) == 0);
    CHECK(contains(lines.back(), "val_loss"));
    CHECK_FALSE(contains(lines.back(), "exact_match"));  // no answers to match in text
}

// ---- determinism, resume, NaN ------------------------------------------------------------

TEST_CASE("the same command prints the same losses, for 1 and for 2 threads") {
    TempDir dir;
    Args args = tiny({"--steps", "12", "--eval-every", "6", "--log-every", "1"});
    Run first = run_train(dir, args), second = run_train(dir, args);
    args.insert(args.end(), {"--threads", "2"});  // the later --threads wins
    Run two_threads = run_train(dir, args);
    check_success(first);
    check_success(second);
    check_success(two_threads);
    std::vector<std::string> a = without_timings(first.out), b = without_timings(second.out),
                             c = without_timings(two_threads.out);
    REQUIRE(lines_to_final(first.out).size() == 1 + 12 + 2 + 1);
    CHECK(a == b);
    REQUIRE(c.size() == a.size());
    CHECK(contains(c[0], "threads 2"));
    for (size_t i = 1; i < a.size(); i++) CHECK(c[i] == a[i]);  // the banner names the threads
}

// Trains --steps 20 with `schedule` three ways, whole and as two halves split at step 10
// by --stop-after (as a crash would), and checks that the resumed half prints what the
// whole run prints from step 11 on and ends at the same checkpoint, bit for bit.
static void check_interrupted_run_resumes_exactly(const Args& schedule) {
    TempDir dir;
    std::string whole = dir.file("whole.ckpt"), parts = dir.file("parts.ckpt");
    Args common = {"--eval-every", "10", "--log-every", "1", "--warmup", "5", "--steps", "20"};
    common.insert(common.end(), schedule.begin(), schedule.end());
    auto args = [&](const std::string& path, bool first_half, bool resume) {
        Args a = tiny(common);
        a.insert(a.end(), {"--checkpoint", path});
        if (first_half) a.insert(a.end(), {"--stop-after", "10"});
        if (resume) a.push_back("--resume");
        return a;
    };
    Run uninterrupted = run_train(dir, args(whole, false, false));
    Run first_half = run_train(dir, args(parts, true, false));
    Run second_half = run_train(dir, args(parts, false, true));
    check_success(uninterrupted);
    check_success(first_half);
    check_success(second_half);
    CHECK(contains(second_half.out, "resumed from " + parts + " at step 10"));
    std::vector<std::string> expected = lines_from_step(without_timings(uninterrupted.out), 11);
    std::vector<std::string> resumed = lines_from_step(without_timings(second_half.out), 1);
    REQUIRE(expected.size() == 10 + 1 + 1);  // steps 11-20, eval at 20, final
    CHECK(resumed == expected);
    // and the final checkpoints agree bit for bit: parameters, moments and step
    CHECK(read_text(parts) == read_text(whole));
}

TEST_CASE("a run interrupted at step 10 and resumed prints what the uninterrupted run prints") {
    check_interrupted_run_resumes_exactly({});  // warmup, then cosine decay over --steps 20
}

TEST_CASE("a --optimizer muon run interrupted and resumed prints what the uninterrupted run prints") {
    // the momentum buffers (the checkpoint's m at the matrices) carry the run on, bit for bit
    check_interrupted_run_resumes_exactly({"--optimizer", "muon", "--muon-momentum", "0.9"});
}

TEST_CASE("a --microbatches 2 run interrupted and resumed prints what the uninterrupted run prints") {
    check_interrupted_run_resumes_exactly({"--microbatches", "2"});
}

// --microbatches M: the step's batch in M parts whose gradients add up (train.c), so the run
// trains on the whole batch's loss and gradient, as --microbatches 1 does, up to the order of
// the sums over the rows; M is recorded in the checkpoint's slot [38] (0 for one).
TEST_CASE("--microbatches 2 and 4 print the losses of --microbatches 1 and end within rounding of its checkpoint") {
    TempDir dir;
    Args common = {"--steps", "20", "--eval-every", "10", "--log-every", "1", "--batch", "8"};
    std::string paths[3];
    std::vector<std::string> lines[3];
    const char* parts[3] = {"1", "2", "4"};
    for (int k = 0; k < 3; k++) {
        paths[k] = dir.file(std::string("m") + parts[k] + ".ckpt");
        Args args = common;
        args.insert(args.end(), {"--microbatches", parts[k], "--checkpoint", paths[k]});
        Run run = run_train(dir, tiny(args));
        check_success(run);
        lines[k] = lines_from_step(without_timings(run.out), 1);
    }
    REQUIRE(lines[0].size() == 20 + 2 + 1);  // steps 1-20, two evaluations, final
    for (int k = 1; k < 3; k++) {
        INFO("--microbatches ", parts[k]);
        CHECK(lines[k] == lines[0]);
        std::string a = read_text(paths[0]), b = read_text(paths[k]);
        REQUIRE(a.size() == b.size());
        int slot[2];
        std::memcpy(&slot[0], &a[38 * sizeof(int)], sizeof(int));
        std::memcpy(&slot[1], &b[38 * sizeof(int)], sizeof(int));
        CHECK(slot[0] == 0);
        CHECK(slot[1] == std::stoi(parts[k]));
        // the parameters and moments: within 5e-7 of each kind's largest value (measured: at
        // most 1.8e-7, the second moments after 20 steps; rounding, from the sums' order)
        size_t P = (a.size() - 256 * sizeof(int)) / (3 * sizeof(float));
        for (int kind = 0; kind < 3; kind++) {
            const float* x = reinterpret_cast<const float*>(a.data() + 256 * sizeof(int)) + kind * P;
            const float* y = reinterpret_cast<const float*>(b.data() + 256 * sizeof(int)) + kind * P;
            double largest = 0.0, worst = 0.0;
            for (size_t i = 0; i < P; i++) {
                largest = std::max(largest, (double)std::fabs(x[i]));
                worst = std::max(worst, std::fabs((double)x[i] - y[i]));
            }
            CHECK(largest > 0.0);
            CHECK(worst <= 5e-7 * largest);
        }
    }
}

TEST_CASE("--resume refuses another --optimizer or --muon-momentum than the checkpoint's, naming the flag") {
    TempDir dir;
    std::string muon = dir.file("muon.ckpt"), adamw = dir.file("adamw.ckpt");
    Args common = {"--steps", "4", "--eval-every", "2", "--stop-after", "2"};
    Args muon_args = common, adamw_args = common;
    muon_args.insert(muon_args.end(), {"--checkpoint", muon, "--optimizer", "muon"});
    adamw_args.insert(adamw_args.end(), {"--checkpoint", adamw});
    check_success(run_train(dir, tiny(muon_args)));
    check_success(run_train(dir, tiny(adamw_args)));
    std::string bytes = read_text(muon);
    int slots[2];
    std::memcpy(slots, &bytes[36 * sizeof(int)], sizeof slots);
    CHECK(slots[0] == 1);
    float momentum;
    std::memcpy(&momentum, &slots[1], sizeof momentum);
    CHECK(momentum == 0.95f);
    bytes = read_text(adamw);
    std::memcpy(slots, &bytes[36 * sizeof(int)], sizeof slots);
    CHECK(slots[0] == 0);  // a default run writes zeros there, as files before the slots hold
    CHECK(slots[1] == 0);
    auto resume = [&](const std::string& path, Args extra) {
        Args a = {"--steps", "4", "--eval-every", "2", "--checkpoint", path, "--resume"};
        a.insert(a.end(), extra.begin(), extra.end());
        return run_train(dir, tiny(a));
    };
    check_error(resume(muon, {}), {muon, "--optimizer muon", "--optimizer adamw"});
    check_error(resume(muon, {"--optimizer", "adamw"}), {muon, "--optimizer muon", "--optimizer adamw"});
    check_error(resume(adamw, {"--optimizer", "muon"}), {adamw, "--optimizer adamw", "--optimizer muon"});
    check_error(resume(muon, {"--optimizer", "muon", "--muon-momentum", "0.9"}),
                {muon, "--muon-momentum 0.95", "--muon-momentum 0.9"});
    check_success(resume(muon, {"--optimizer", "muon"}));  // its own flags resume, to the end
}

TEST_CASE("a NaN loss stops training with one error line, and the last checkpoint still loads") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    Args run_flags = {"--steps", "10", "--eval-every", "5", "--checkpoint", path};
    check_success(run_train(dir, tiny({"--steps", "10", "--eval-every", "5", "--stop-after", "5",
                                       "--checkpoint", path})));
    // AdamW's first moments set huge (the file holds params, then m, then v): the next
    // update sends the parameters to infinity and the loss turns NaN. Loads (params finite).
    std::string bytes = read_text(path);
    size_t P = (bytes.size() - 1024) / 12;
    for (size_t i = 0; i < P; i++) {
        const float huge = 3e38f;
        std::memcpy(&bytes[1024 + 4 * (P + i)], &huge, sizeof huge);
    }
    write_text(path, bytes);
    Args resume = run_flags;
    resume.push_back("--resume");
    Run blow_up = run_train(dir, tiny(resume));
    check_error(blow_up, {"NaN", path, "resumed from, is unchanged"}, /*quiet_stdout=*/false);
    CHECK_FALSE(contains(blow_up.out, "eval step    10"));
    CHECK(read_text(path) == bytes);
    for (const auto& entry : fs::directory_iterator(dir.path))  // no temporary file left
        CHECK(entry.path().filename().string().rfind("model.ckpt.tmp", 0) == std::string::npos);
    ModelConfig config;
    int step = -1;
    char err[512] = "";
    CHECK_MESSAGE(checkpoint_read_config(path.c_str(), &config, &step, err, sizeof err) == 0, err);
    CHECK(step == 5);
}

TEST_CASE("the NaN stop names a checkpoint only if this run wrote one") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    // an absurd learning rate: NaN within the first steps, before the first evaluation
    Run early = run_train(dir, tiny({"--steps", "10", "--eval-every", "10", "--checkpoint", path,
                                     "--lr", "1e30", "--warmup", "0"}));
    check_error(early, {"NaN", "training stopped"}, /*quiet_stdout=*/false);
    CHECK_FALSE(contains(early.err, path));
    CHECK_FALSE(fs::exists(path));
}

TEST_CASE("a checkpoint is never written from parameters whose val_loss is not finite") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    Run run = run_train(dir, tiny({"--steps", "10", "--eval-every", "1", "--log-every", "1",
                                   "--checkpoint", path, "--lr", "1e30", "--warmup", "0"}));
    check_error(run, {"NaN"}, /*quiet_stdout=*/false);
    if (!fs::exists(path)) return;  // no checkpoint at all is fine too
    ModelConfig config;
    int step = -1;
    char err[512] = "";
    REQUIRE_MESSAGE(checkpoint_read_config(path.c_str(), &config, &step, err, sizeof err) == 0, err);
    std::string eval_line;
    char prefix[64];
    std::snprintf(prefix, sizeof prefix, "eval step %5d |", step);
    for (const std::string& line : lines_of(run.out))
        if (line.rfind(prefix, 0) == 0) eval_line = line;
    INFO("checkpoint at step ", step, ", its evaluation: ", eval_line);
    REQUIRE(!eval_line.empty());
    float val_loss = NAN;
    std::sscanf(eval_line.c_str() + eval_line.find("val_loss"), "val_loss %f", &val_loss);
    CHECK(std::isfinite(val_loss));
}


// ---- rough edges: mhc, resuming, schedules, memory, threads, failed writes, tools --------

TEST_CASE("a tiny learning rate is a number: 1e-45 (subnormal) parses and trains") {
    TempDir dir;
    check_success(run_train(dir, tiny({"--lr", "1e-45", "--steps", "2", "--eval-every", "2"})));
}

TEST_CASE("mode mhc trains, resumes and samples; its checkpoint records m and refuses another mode or m") {
    TempDir dir;
    for (const char* m : {"2", "4"}) {
        std::string path = dir.file(std::string("mhc") + m + ".ckpt");
        Args args = {"--mode", "mhc", "--streams", m, "--steps", "4", "--eval-every", "2",
                     "--checkpoint", path};
        Args first = args;
        first.insert(first.end(), {"--stop-after", "2"});
        Run run = run_train(dir, tiny(first));
        check_success(run);
        CHECK(contains(run.out, std::string("mode mhc (m=") + m + ")"));
        // header slot [134] holds m
        std::vector<int> header(256);
        FILE* f = std::fopen(path.c_str(), "rb");
        REQUIRE(f != nullptr);
        REQUIRE(std::fread(header.data(), sizeof(int), 256, f) == 256);
        std::fclose(f);
        CHECK(header[134] == std::atoi(m));
        CHECK(header[8] == 0);
        // another mode, or another m, is refused naming the checkpoint's mode
        Args none = {"--mode", "none", "--steps", "4", "--eval-every", "2", "--resume",
                     "--checkpoint", path};
        check_error(run_train(dir, tiny(none)), {path, std::string("mhc m=") + m});
        Args other = {"--mode", "mhc", "--streams", "3", "--steps", "4", "--eval-every", "2",
                      "--resume", "--checkpoint", path};
        check_error(run_train(dir, tiny(other)), {path, std::string("mhc m=") + m, "mhc m=3"});
        // the same flags resume to the end, and --sample reads it
        Args resume = args;
        resume.push_back("--resume");
        check_success(run_train(dir, tiny(resume)));
        check_success(run_train(dir, {"--sample", "--checkpoint", path, "--threads", "1"}));
    }
}

TEST_CASE("--resume refuses a run whose flags differ from the checkpoint's, naming the flag") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    check_success(run_train(dir, tiny({"--steps", "4", "--eval-every", "2", "--stop-after", "2",
                                       "--checkpoint", path})));
    struct Case {
        Args flags;
        std::vector<std::string> words;
    };
    Case cases[] = {
        {{"--task", "copy"}, {"--task reverse", "--task copy"}},
        {{"--batch", "8"}, {"--batch 4", "--batch 8"}},
        {{"--steps", "6"}, {"--steps 4", "--steps 6"}},
        {{"--lr", "0.001"}, {"--lr 0.003", "--lr 0.001"}},
        {{"--seed", "7"}, {"--seed 1337", "--seed 7"}},
        {{"--warmup", "1"}, {"--warmup 100", "--warmup 1"}},
        {{"--schedule", "wsd"}, {"--schedule cosine", "--schedule wsd"}},
        {{"--microbatches", "2"}, {"--microbatches 1", "--microbatches 2"}},
    };
    for (const Case& k : cases) {
        Args args = {"--steps", "4", "--eval-every", "2", "--resume", "--checkpoint", path};
        for (size_t i = 0; i < k.flags.size(); i += 2) {
            auto at = std::find(args.begin(), args.end(), k.flags[i]);
            if (at != args.end()) *(at + 1) = k.flags[i + 1];
            else args.insert(args.end(), {k.flags[i], k.flags[i + 1]});
        }
        check_error(run_train(dir, tiny(args)), k.words);
    }
    // the same flags resume, to the end
    check_success(run_train(dir, tiny({"--steps", "4", "--eval-every", "2", "--resume",
                                       "--checkpoint", path})));
}

TEST_CASE("--resume refuses another --schedule or --decay-frac than the checkpoint's, naming the flag") {
    TempDir dir;
    std::string path = dir.file("wsd.ckpt");
    Args args = {"--steps", "4", "--eval-every", "2", "--checkpoint", path, "--schedule", "wsd",
                 "--decay-frac", "0.5"};
    Args first = args;
    first.insert(first.end(), {"--stop-after", "2"});
    check_success(run_train(dir, tiny(first)));
    Args cosine = {"--steps", "4", "--eval-every", "2", "--checkpoint", path, "--resume"};
    check_error(run_train(dir, tiny(cosine)), {path, "--schedule wsd", "--schedule cosine"});
    Args other = args;
    other.back() = "0.25";
    other.push_back("--resume");
    check_error(run_train(dir, tiny(other)), {path, "--decay-frac 0.5", "--decay-frac 0.25"});
    args.push_back("--resume");  // the same flags resume, to the end
    check_success(run_train(dir, tiny(args)));
}

TEST_CASE("a checkpoint written without a schedule (zeros at [34..35]) resumes as cosine, and a default run writes zeros there") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    Args args = {"--steps", "4", "--eval-every", "2", "--checkpoint", path};
    Args first = args;
    first.insert(first.end(), {"--stop-after", "2"});
    check_success(run_train(dir, tiny(first)));
    std::string bytes = read_text(path);
    int slots[2];
    std::memcpy(slots, &bytes[34 * sizeof(int)], sizeof slots);
    CHECK(slots[0] == 0);  // what files before the schedule was recorded hold
    CHECK(slots[1] == 0);
    RunRecord run{};
    int recorded = 0;
    char err[512];
    REQUIRE(checkpoint_read_run(path.c_str(), &run, &recorded, err, sizeof(err)) == 0);
    CHECK(recorded == 1);
    CHECK(run.schedule == 0);
    args.push_back("--resume");
    check_success(run_train(dir, tiny(args)));
    args.insert(args.end(), {"--schedule", "wsd"});
    check_error(run_train(dir, tiny(args)), {path, "--schedule cosine", "--schedule wsd"});
}

TEST_CASE("--schedule wsd: the lr column follows SPEC's warmup, stable and linear decay step by step") {
    // steps 10, warmup 2, decay_frac 0.3: D = floor(0.3 * 10 + 0.5) = 3 decay steps, so lr
    // 0.005, then 0.01 for s = 1..6, then 0.007, 0.004, 0.001 (lr * final_lr_frac) at the end.
    // The line "step N" prints the lr of the step that made it, s = N - 1.
    TempDir dir;
    const int steps = 10, warmup = 2;
    const double lr = 0.01, final_lr_frac = 0.1, decay_frac = 0.3;
    Run run = run_train(dir, tiny({"--steps", "10", "--warmup", "2", "--schedule", "wsd",
                                   "--decay-frac", "0.3", "--lr", "0.01", "--final-lr-frac", "0.1",
                                   "--log-every", "1", "--eval-every", "10"}));
    check_success(run);
    int D = std::max(1, (int)std::floor(decay_frac * steps + 0.5));
    std::vector<std::string> printed, expected;
    for (const std::string& line : lines_of(run.out)) {
        int step = 0;
        if (std::sscanf(line.c_str(), "step %d/", &step) != 1) continue;
        size_t at = line.find("| lr ");
        REQUIRE(at != std::string::npos);
        printed.push_back(line.substr(at + 5, line.find(' ', at + 5) - (at + 5)));
        int s = step - 1;
        double want = s < warmup ? lr * (s + 1) / warmup
                    : s < steps - D ? lr
                    : lr * (1.0 - (1.0 - final_lr_frac) * (s - steps + D + 1) / D);
        char text[32];
        std::snprintf(text, sizeof(text), "%.2e", want);
        expected.push_back(text);
    }
    REQUIRE(printed.size() == (size_t)steps);
    CHECK(printed == expected);
    CHECK(expected.back() == "1.00e-03");  // lr * final_lr_frac at the last step
    CHECK(expected[6] == "1.00e-02");      // the stable phase's last step, s = steps - D - 1
}

TEST_CASE("a --warmup the schedule cannot finish is refused; the default one in a short run is named in the header") {
    TempDir dir;
    // the run would end inside its warmup, never decaying to lr * final-lr-frac
    check_error(run_train(dir, tiny({"--warmup", "30", "--steps", "20"})), {"--warmup 30", "--steps 20", "inside its warmup"});
    check_error(run_train(dir, tiny({"--warmup", "20", "--steps", "20"})), {"--warmup 20", "--steps 20"});
    // wsd: D = floor(0.5 * 20 + 0.5) = 10 decay steps, so at most 10 warmup steps
    check_error(run_train(dir, tiny({"--schedule", "wsd", "--warmup", "11", "--decay-frac", "0.5", "--steps", "20"})),
                {"--warmup 11", "wsd's decay", "last 10 of the 20", "at most 10"});
    Run fits = run_train(dir, tiny({"--schedule", "wsd", "--warmup", "10", "--decay-frac", "0.5", "--steps", "20",
                                    "--eval-every", "20"}));
    check_success(fits);
    CHECK(!contains(lines_of(fits.out).at(0), "warmup"));
    // the default warmup (100) is kept, and the header says where the run ends
    Run short_run = run_train(dir, tiny({"--steps", "20", "--eval-every", "20"}));
    check_success(short_run);
    CHECK(contains(lines_of(short_run.out).at(0), "| the run ends inside its warmup (--warmup 100, --steps 20)"));
    Run wsd = run_train(dir, tiny({"--schedule", "wsd", "--steps", "110", "--eval-every", "110"}));
    check_success(wsd);
    CHECK(contains(lines_of(wsd.out).at(0), "| the warmup (--warmup 100) reaches into wsd's decay (the last 22 of 110 steps)"));
}

TEST_CASE("a --schedule wsd run interrupted in its stable phase and resumed prints what the uninterrupted run prints") {
    // --steps 20 --decay-frac 0.25: stable to step 15, decay over the last 5; interrupted at
    // step 10, so the resumed run crosses into the decay.
    check_interrupted_run_resumes_exactly({"--schedule", "wsd", "--decay-frac", "0.25"});
}

TEST_CASE("the best checkpoint is kept beside the latest, and --sample reads either") {
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    Run run = run_train(dir, tiny({"--steps", "6", "--eval-every", "2", "--checkpoint", path}));
    check_success(run);
    CHECK(fs::exists(path));
    CHECK(fs::exists(path + ".best"));
    CHECK(contains(run.out, "checkpoints: " + path + " is the latest (step 6); " + path + ".best the best"));
    for (const std::string& file : {path, path + ".best"}) {
        // --sample takes the task, its length, symbols and seed from the checkpoint
        Run sample = run_train(dir, {"--sample", "--checkpoint", file});
        check_success(sample);
        CHECK(contains(sample.out, "prompt:"));
        CHECK(contains(sample.out, "expected:"));
        CHECK(lines_of(sample.out).size() == 3);
    }
    check_error(run_train(dir, {"--sample", "--checkpoint", path, "--task", "sort"}),
                {"--task reverse", "sort"});
    check_error(run_train(dir, {"--sample", "--checkpoint", path, "--length", "5"}),
                {"--length 4", "5"});
}

TEST_CASE("text runs print a greedy sample at each evaluation, and sampling slides past T") {
    TempDir dir;
    std::string text = dir.file("text.txt"), path = dir.file("text.ckpt");
    std::string body;
    for (int i = 0; i < 200; i++) body += "the quick brown fox jumps over the lazy dog. ";
    write_text(text, body);
    Run run = run_train(dir, tiny({"--task", "text", "--text", text, "--seq-len", "32",
                                   "--steps", "4", "--eval-every", "2", "--checkpoint", path}));
    check_success(run);
    int samples = 0;
    for (const std::string& line : lines_of(run.out)) samples += line.rfind("sample: \"", 0) == 0;
    CHECK(samples == 2);
    // 100 new bytes after a 10-byte prompt: 109 positions, 3 times the trained T = 32
    Run sample = run_train(dir, {"--sample", "--checkpoint", path, "--prompt", "the quick ",
                                 "--tokens", "100"});
    check_success(sample);
    CHECK(sample.out.size() == 10 + 100 + 1);
}

TEST_CASE("a run that needs more memory than the machine has is refused before it allocates") {
    TempDir dir;
    std::string text = dir.file("long.txt");
    write_text(text, std::string(250000, 'a'));
    // the activations of 64 rows of 20000 positions at d = 4096: about 445 GiB (the attention
    // keeps no T x T maps, so a long context alone no longer takes that much)
    check_error(run_train(dir, tiny({"--task", "text", "--text", text, "--seq-len", "20000",
                                     "--d", "4096"})),
                {"needs", "GiB", "available", "--seq-len", "--batch"});
}

TEST_CASE("the header says how much memory the run takes and how threads wait") {
    TempDir dir;
    Run run = run_train(dir, tiny({"--steps", "1", "--eval-every", "1"}));
    check_success(run);
    std::string header = lines_of(run.out).at(0);
    CHECK(contains(header, "| memory "));
    CHECK(contains(header, " MiB"));
    CHECK(contains(header, "PASSIVE waiting"));  // run_train sets OMP_WAIT_POLICY=PASSIVE
    // without OMP_WAIT_POLICY (or GOMP_SPINCOUNT) the trainer sets GOMP_SPINCOUNT=1000
    // (restarting itself so libgomp reads it); a policy the user set is kept
    Run unset = run_program(dir, train_binary(), tiny({"--steps", "1", "--eval-every", "1"}), nullptr);
    check_success(unset);
    CHECK(contains(lines_of(unset.out).at(0), "(spin 1000, then sleep)"));
    Run active = run_program(dir, train_binary(), tiny({"--steps", "1", "--eval-every", "1"}), "active");
    check_success(active);
    CHECK(contains(lines_of(active.out).at(0), "(active waiting)"));
}

TEST_CASE("more threads than cores: a warning, and the run goes on; past 8 per core, an error") {
    TempDir dir;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    std::string over = std::to_string(cores + 1), limit = std::to_string(8 * cores);
    Run run = run_train(dir, tiny({"--steps", "1", "--eval-every", "1", "--threads", over}));
    CHECK(run.exit_code == 0);
    CHECK(contains(run.err, "warning: --threads " + over + " is more than the"));
    // 100000 threads crashed libgomp (SIGSEGV), 16384 took minutes a step
    for (std::string threads : {std::to_string(8 * cores + 1), std::string("100000")}) {
        check_error(run_train(dir, tiny({"--threads", threads})),
                    {"--threads " + threads + " is more than 8 per core", "at most " + limit});
    }
}

TEST_CASE("a resumed run's diagnostics hold each step once, however often it was interrupted") {
    TempDir dir;
    std::string path = dir.file("model.ckpt"), diag = dir.file("diag");
    Args flags = {"--steps", "12", "--eval-every", "4", "--log-every", "1", "--checkpoint", path,
                  "--diagnostics", diag};
    auto with = [&](Args extra) { Args a = flags; a.insert(a.end(), extra.begin(), extra.end()); return tiny(a); };
    check_success(run_train(dir, with({"--stop-after", "4"})));
    const std::string at_step_4 = read_text(path);
    check_success(run_train(dir, with({"--resume", "--stop-after", "4"})));  // to step 8
    write_text(path, at_step_4);  // as if the run had died before its step-8 checkpoint
    check_success(run_train(dir, with({"--resume"})));                      // 5 .. 12 again
    for (const char* csv : {"train.csv", "layers.csv"}) {
        std::vector<int> steps;
        for (const std::string& line : lines_of(read_text(diag + "/" + csv))) {
            int step = 0;
            if (std::sscanf(line.c_str(), "%d,", &step) == 1 && (steps.empty() || steps.back() != step))
                steps.push_back(step);
        }
        INFO(csv);
        REQUIRE(steps.size() == 12);
        for (int i = 0; i < 12; i++) CHECK(steps[i] == i + 1);
    }
}

TEST_CASE("diagnostics that cannot be written end the run with one line naming the file") {
    TempDir dir;
    std::string diag = dir.file("diag");
    SUBCASE("at the start: a CSV on a full disk (/dev/full fails every write)") {
        fs::create_directories(diag);
        fs::create_symlink("/dev/full", diag + "/train.csv");
        Run run = run_train(dir, tiny({"--steps", "4", "--diagnostics", diag}));
        check_error(run, {"cannot write " + diag + "/train.csv: " + std::strerror(ENOSPC)}, false);
    }
    SUBCASE("while training: layers.csv outgrows a file size limit") {
        // every file capped at 3000 bytes: layers.csv (~165 bytes a step at --log-every 1)
        // reaches it near step 18, stdout (~90 a step) is still under it
        Run run = run_train_with_file_limit(dir, 3000, tiny({"--steps", "30", "--eval-every", "10",
                                                             "--log-every", "1", "--diagnostics", diag}));
        check_error(run, {"cannot write " + diag + "/layers.csv: " + std::strerror(EFBIG)}, false);
        CHECK(contains(run.out, "eval step    10"));  // it trained until then
    }
}

TEST_CASE("output that does not reach stdout (a full disk) is exit 1 and one line, not exit 0") {
    // every file capped at 60 bytes: the header line (and the samples) are longer, the error
    // line (48 bytes on stderr) is not
    TempDir dir;
    std::string path = dir.file("model.ckpt");
    const std::string why = std::string("error: cannot write the output: ") + std::strerror(EFBIG);
    check_error(run_train_with_file_limit(dir, 60, tiny({"--steps", "4"})), {why}, false);
    check_success(run_train(dir, tiny({"--steps", "4", "--checkpoint", path})));
    Run sample = run_train_with_file_limit(dir, 60, {"--sample", "--checkpoint", path, "--prompt-tokens",
                                                     "1,2,3", "--tokens", "40"});
    check_error(sample, {why}, false);
}

TEST_CASE("make plots on a run stopped before its first evaluation: one error line") {
    TempDir dir;
    std::string diag = dir.file("diag");
    check_success(run_train(dir, tiny({"--steps", "10", "--eval-every", "5", "--log-every", "5",
                                       "--stop-after", "1", "--diagnostics", diag})));
    write_text(diag + "/eval.csv", "step,val_loss,accuracy,exact_match\n");  // no evaluation yet
    Run plots = run_program(dir, "dev/experiments/plots.sh", {diag});
    CHECK(plots.exit_code == 1);
    CHECK(contains(plots.err, "eval.csv has no rows yet"));
    CHECK(lines_of(plots.err).size() == 1);
}

TEST_CASE("make bench-sizes' benchmark refuses a size it cannot build, and unknown arguments, in one line") {
    TempDir dir;
    // d not a multiple of 64; L odd (block S=4 needs 4 | 2L); T not one of 128 .. 1024; two
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
                csv << mode << ",s" << size << "," << seed << ",1000,2000," << C << ","
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
    // 2·(1e13)^−0.1 and 2·(1.5e13)^−0.1; sd of x·e^±0.002: x·0.002·sqrt(2)
    CHECK_MESSAGE(contains(fit.out, "| s3 | 1e+03 | 2e+03 | 1e+13 | 0.1002 ± 0.0003 | 0.0963 ± 0.0003 |"), fit.out);
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

// ---- weights from PyTorch ------------------------------------------------------------------

// tests/data/torch_block_s2_rand.safetensors was written from PyTorch: dev/check/reference.py's
// random init ("rand": every tensor away from SPEC's init, so a tensor read into the wrong
// place, transposed or from another layer moves this loss by 0.4 % or more) of a block model,
// S = 2, d = 16, L = 2, H = 4, G = 2, F = 32, V = 9, 23 KB:
//   /usr/bin/python3 dev/load_safetensors.py write tests/data/torch_block_s2_rand.safetensors
//       --init rand --seed 31 --mode block --block-size 2 --V 9 --d 16 --L 2 --H 4 --G 2 --F 32
// kTorchFirstLoss is PyTorch's loss (float64, reference.forward) of that model on the batch
// ./train draws at step 1 with the data flags below, which load_safetensors.py draws as
// data/dataset.c does (splitmix64 row streams, the held-out prompts avoided):
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

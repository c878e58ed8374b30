// cli.h — what the command-line tests (tests/test_cli*.cpp) share: running the real ./train
// binary (or $ATTNRES_TRAIN), or another program of the repository, from the repository root
// with its stdout and stderr captured; the checks of a successful run and of a refused input
// (exit status 1 and exactly one "error: ..." line naming the problem, never a crash); the
// tiny model every run trains.
#ifndef ATTNRES_CLI_H
#define ATTNRES_CLI_H

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

extern char** environ;

namespace cli {

namespace fs = std::filesystem;
typedef std::vector<std::string> Args;

inline std::string train_binary() {
    const char* path = std::getenv("ATTNRES_TRAIN");
    return path != nullptr && path[0] != '\0' ? path : "./train";
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE(out.good());
}

inline std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

// The output up to the "final" line: after it an AttnRes run prints its depth-attention
// heatmap (diagnostics.h).
inline std::vector<std::string> lines_to_final(const std::string& out) {
    std::vector<std::string> lines = lines_of(out);
    for (size_t i = 0; i < lines.size(); i++)
        if (lines[i].rfind("final", 0) == 0) lines.resize(i + 1);
    return lines;
}

inline bool contains(const std::string& text, const std::string& word) {
    return text.find(word) != std::string::npos;
}

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
inline Run run_program(const TempDir& dir, const std::string& binary, const Args& args,
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
inline Run run_train(const TempDir& dir, const Args& args) { return run_program(dir, train_binary(), args); }

// The trainer run under prlimit, every file it writes (stdout and stderr included) capped at
// max_bytes: a write past it fails with EFBIG, as one on a full disk fails with ENOSPC.
// SIGXFSZ, which would end the run instead, is ignored here and so in the run too.
inline Run run_train_with_file_limit(const TempDir& dir, size_t max_bytes, const Args& args) {
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
inline void check_success(const Run& run) {
    INFO("command: ", run.command, "\nstdout:\n", run.out, "stderr:\n", run.err);
    CHECK(run.exited);
    CHECK(run.exit_code == 0);
    CHECK(run.err.empty());
}

// A rejected input: exit status 1 (not a crash), nothing on stdout, and stderr exactly one
// line "error: ..." containing every word.
inline void check_error(const Run& run, const std::vector<std::string>& words, bool quiet_stdout = true) {
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
inline std::vector<std::string> without_timings(const std::string& out) {
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
inline std::vector<std::string> lines_from_step(const std::vector<std::string>& lines, int first_step) {
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
inline Args tiny(Args extra = {}) {
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

}  // namespace cli

using namespace cli;

#endif

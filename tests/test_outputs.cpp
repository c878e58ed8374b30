// test_outputs.cpp — the one check every output of a run goes through (src/outputs.h): each
// output flag against each target it must never replace, the one line it prints, and not a
// byte of any file changed; then what it must still accept.
#include <doctest/doctest.h>
#include "temp_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "outputs.h"
#include "pipeline.h"
#include "util.h"  // ERROR_MAX

namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// every entry under dir: its kind and, for a regular file, its bytes
std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> all;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
        std::string kind = e.is_symlink() ? "link:" + fs::read_symlink(e.path()).string()
                         : e.is_regular_file() ? "file:" + read_bytes(e.path().string())
                         : e.is_directory() ? "dir" : "other";
        all[e.path().string()] = kind;
    }
    return all;
}

std::string checkpoint_bytes() {
    int magic = CHECKPOINT_MAGIC;
    return std::string(reinterpret_cast<const char*>(&magic), sizeof(magic)) + "rest of a checkpoint";
}

// A run's paths: an Options with only its path fields set
struct Paths {
    const char *text = nullptr, *init_from = nullptr, *checkpoint = nullptr, *export_path = nullptr;
    const char *diagnostics = nullptr, *trace = nullptr;
    int resume = 0;
};

// outputs_check's line for those paths ("" when they pass)
std::string check(const Paths& p) {
    Options o;
    std::memset(&o, 0, sizeof(o));
    o.text_path = p.text;
    o.init_from = p.init_from;
    o.checkpoint = p.checkpoint;
    o.export_path = p.export_path;
    o.diagnostics = p.diagnostics;
    o.pipeline_trace = p.trace;
    o.resume = p.resume;
    std::vector<RunPath> paths(RUN_PATHS_MAX);
    char err[ERROR_MAX] = "";
    int n = run_paths(&o, paths.data());
    REQUIRE(n <= RUN_PATHS_MAX);
    int status = outputs_check(paths.data(), n, err, sizeof(err));
    CHECK((status == 0) == (err[0] == '\0'));
    return err;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every output flag onto every target it must not replace: one line, and no byte of any file changed") {
    TempDir dir;
    const std::string text = dir.file("input.txt"), init = dir.file("init.safetensors");
    const std::string old = dir.file("old.ckpt"), pipe = dir.file("pipe"), link = dir.file("link");
    const std::string run = dir.file("run.ckpt"), diag = dir.file("diag");
    write_bytes(text, "the quick brown fox jumps over the lazy dog\n");
    write_bytes(init, "an init file");
    write_bytes(old, checkpoint_bytes());
    write_bytes(run, checkpoint_bytes());
    REQUIRE(mkfifo(pipe.c_str(), 0600) == 0);
    REQUIRE(symlink(text.c_str(), link.c_str()) == 0);
    fs::create_directories(dir.file("diag_with_pipe"));
    REQUIRE(mkfifo(dir.file("diag_with_pipe/train.csv").c_str(), 0600) == 0);

    // the flag each row sets to `target`, beside the inputs every training row reads
    enum Flag { CHECKPOINT, DIAGNOSTICS, TRACE, EXPORT };
    const char* flag_names[] = {"--checkpoint", "--diagnostics", "--pipeline-trace", "--export"};
    struct Row {
        Flag flag;
        std::string target, why;  // the line must hold flag, target and why
        std::string other;        // another output at once, as its own flag's value
    };
    const std::string missing = "/nonexistent-attnres-folder/x";
    std::vector<Row> rows = {
        // inputs
        {CHECKPOINT, text, "the --text file"}, {DIAGNOSTICS, text, "the --text file"},
        {TRACE, text, "the --text file"},
        {CHECKPOINT, init, "the --init-from file"}, {DIAGNOSTICS, init, "the --init-from file"},
        {TRACE, init, "the --init-from file"},
        {CHECKPOINT, link, "the --text file"}, {TRACE, link, "the --text file"},
        {DIAGNOSTICS, link, "the --text file"},
        // each other (D17: the trace onto the checkpoint); the line names both flags
        {TRACE, run, "--checkpoint " + run + " is the --pipeline-trace file", "checkpoint"},
        {TRACE, run + ".best", "is the --pipeline-trace file", "checkpoint"},
        {DIAGNOSTICS, run, "--checkpoint " + run + " is the --diagnostics directory", "checkpoint"},
        {TRACE, diag + "/train.csv", "--diagnostics " + diag + ": " + diag + "/train.csv is the --pipeline-trace file", "diagnostics"},
        // no regular file (D19), a checkpoint of another run, a folder not there (D20)
        {CHECKPOINT, pipe, "not a regular file"}, {TRACE, pipe, "not a regular file"},
        {DIAGNOSTICS, pipe, "not a directory"}, {EXPORT, pipe, "not a regular file"},
        {CHECKPOINT, "/dev/null", "not a regular file"}, {TRACE, "/dev/null", "not a regular file"},
        {EXPORT, "/dev/null", "not a regular file"},
        {DIAGNOSTICS, dir.file("diag_with_pipe"), "not a regular file"},
        {CHECKPOINT, dir.path, "is a directory"}, {TRACE, dir.path, "is a directory"},
        {EXPORT, dir.path, "is a directory"},
        {TRACE, old, "is a checkpoint"}, {EXPORT, old, "is a checkpoint"},
        {CHECKPOINT, text + "2", "not a checkpoint"},  // (written below: a file of other bytes)
        {TRACE, text + "2", "not an earlier trace"}, {EXPORT, text + "2", "not an earlier export"},
        {CHECKPOINT, missing, "cannot write"}, {TRACE, missing, "cannot write"},
        {EXPORT, missing, "cannot write"},
        // export: the checkpoint it reads and its best
        {EXPORT, run, "the checkpoint it reads"}, {EXPORT, run + ".best", "the best checkpoint"},
    };
    write_bytes(text + "2", "other bytes");
    const auto before = snapshot(dir.path);
    for (const Row& row : rows) {
        Paths p;
        if (row.flag == EXPORT) {
            p.checkpoint = run.c_str();
            p.export_path = row.target.c_str();
        } else {
            p.text = link.c_str();  // the text through a link, as an input may be named
            p.init_from = init.c_str();
            const char** slot[] = {&p.checkpoint, &p.diagnostics, &p.trace};
            *slot[row.flag] = row.target.c_str();
            if (row.other == "checkpoint") p.checkpoint = run.c_str();
            if (row.other == "diagnostics") p.diagnostics = diag.c_str();
        }
        std::string line = check(p);
        INFO(flag_names[row.flag], " ", row.target, ": ", line);
        CHECK(contains(line, flag_names[row.flag]));
        CHECK(contains(line, row.target));
        CHECK(contains(line, row.why));
        CHECK(line.find('\n') == std::string::npos);
    }
    CHECK(snapshot(dir.path) == before);
    CHECK(fs::is_character_file("/dev/null"));
}

TEST_CASE("the outputs a run may write pass the check: new files, its own checkpoint, earlier traces, a resumed checkpoint") {
    TempDir dir;
    const std::string text = dir.file("input.txt"), run = dir.file("run.ckpt");
    const std::string trace = dir.file("trace.csv"), empty = dir.file("empty");
    write_bytes(text, "the quick brown fox\n");
    // all new, in existing folders and a directory to be made
    Paths fresh;
    fresh.text = text.c_str();
    fresh.checkpoint = run.c_str();
    fresh.trace = trace.c_str();
    std::string diag = dir.file("a/b/diag");
    fresh.diagnostics = diag.c_str();
    CHECK(check(fresh) == "");
    CHECK(!fs::exists(diag));  // made by the run, not by the check
    // an earlier checkpoint at PATH and PATH.best, an earlier trace, an empty file
    write_bytes(run, checkpoint_bytes());
    write_bytes(run + ".best", checkpoint_bytes());
    write_bytes(trace, std::string(PIPELINE_TRACE_HEADER) + "\n1,0,0,0,F,0.000,1.000\n");
    CHECK(check(fresh) == "");
    write_bytes(trace, "");
    fresh.checkpoint = empty.c_str();
    write_bytes(empty, "");
    CHECK(check(fresh) == "");
    // --resume reads the checkpoint it then replaces
    Paths resumed;
    resumed.checkpoint = run.c_str();
    resumed.resume = 1;
    CHECK(check(resumed) == "");
    // the check leaves no temporary file, and removes those of saves killed midway
    std::string stale = run + ".tmp.999999999";  // no process has that id
    write_bytes(stale, "torn");
    CHECK(check(resumed) == "");
    CHECK(!fs::exists(stale));
    for (const auto& e : fs::directory_iterator(dir.path)) {
        CHECK_MESSAGE(e.path().string().find(".tmp.") == std::string::npos, e.path());
    }
}

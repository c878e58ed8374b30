// test_data.cpp — the toy tasks and text data of data/dataset.h.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "dataset.h"

namespace {

struct Batch {
    std::vector<int> x, y;
    Batch(size_t B, int T) : x(B * (size_t)T), y(B * (size_t)T) {}
};

Batch train_batch(const Dataset& ds, size_t B, uint64_t step) {
    Batch batch(B, ds.seq_len);
    dataset_train_batch(&ds, batch.x.data(), batch.y.data(), B, step);
    return batch;
}

Batch eval_batch(const Dataset& ds, size_t B, size_t first) {
    Batch batch(B, ds.seq_len);
    dataset_eval_batch(&ds, batch.x.data(), batch.y.data(), B, first);
    return batch;
}

std::vector<int> prompt_of(const Batch& batch, const Dataset& ds, size_t sequence) {
    auto begin = batch.x.begin() + (ptrdiff_t)(sequence * (size_t)ds.seq_len);
    return std::vector<int>(begin, begin + ds.length);
}

std::vector<int> expected_answer(TaskKind kind, std::vector<int> prompt) {
    if (kind == TASK_REVERSE) { std::reverse(prompt.begin(), prompt.end()); }
    if (kind == TASK_SORT) { std::sort(prompt.begin(), prompt.end()); }
    return prompt;
}

// every sequence: prompt symbols in 1..n_symbols, separator 0, y = -1 on the prompt, the answer
// in y[L..2L), and x[L+1..2L) = the answer shifted by one (teacher forcing)
void check_task_sequences(const Dataset& ds, const Batch& batch, size_t B) {
    int L = ds.length, T = ds.seq_len;
    REQUIRE(T == 2 * L);
    for (size_t b = 0; b < B; b++) {
        const int* x = batch.x.data() + b * (size_t)T;
        const int* y = batch.y.data() + b * (size_t)T;
        std::vector<int> prompt(x, x + L);
        std::vector<int> answer = expected_answer(ds.kind, prompt);
        for (int t = 0; t < L; t++) {
            INFO("sequence ", b, " position ", t);
            CHECK(x[t] >= 1);
            CHECK(x[t] <= ds.n_symbols);
            CHECK(y[t] == -1);
        }
        INFO("sequence ", b);
        CHECK(x[L] == 0);
        for (int i = 0; i < L; i++) {
            INFO("sequence ", b, " answer position ", i);
            CHECK(y[L + i] == answer[(size_t)i]);
            if (i + 1 < L) { CHECK(x[L + 1 + i] == answer[(size_t)i]); }
        }
    }
}

void check_task(const char* name, TaskKind kind) {
    Dataset ds;
    char err[256] = "";
    REQUIRE_MESSAGE(dataset_init_task(&ds, name, 7, 10, 50, 1234, err, sizeof err) == 0, err);
    CHECK(ds.kind == kind);
    CHECK(ds.vocab_size == 11);
    CHECK(ds.seq_len == 14);
    CHECK(ds.answer_start == 7);
    CHECK(ds.answer_len == 7);
    for (uint64_t step = 0; step < 5; step++) {
        check_task_sequences(ds, train_batch(ds, 16, step), 16);
    }
    check_task_sequences(ds, eval_batch(ds, ds.n_eval, 0), ds.n_eval);
    dataset_free(&ds);
}

// a private temporary directory, removed with everything in it
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        auto temp = std::filesystem::temp_directory_path();
        std::string pattern = (temp / "test_data_XXXXXX").string();
        REQUIRE(mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string write(const char* name, const std::string& bytes) const {
        std::string file = (path / name).string();
        std::ofstream(file, std::ios::binary) << bytes;
        return file;
    }
};

std::string random_bytes(size_t n) {
    std::string bytes(n, '\0');
    uint64_t state = 42;
    for (auto& c : bytes) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        c = (char)(state >> 56);
    }
    return bytes;
}

bool fails_with(int rc, const Dataset& ds, const char* err, const char* keyword) {
    INFO("message: ", err);
    CHECK(rc == -1);
    CHECK(std::strchr(err, '\n') == nullptr);
    CHECK(ds.eval_examples == nullptr);
    CHECK(ds.text == nullptr);
    return std::string(err).find(keyword) != std::string::npos;
}

}  // namespace

TEST_CASE("reversal answers are the prompt reversed") { check_task("reverse", TASK_REVERSE); }
TEST_CASE("copy answers are the prompt copied") { check_task("copy", TASK_COPY); }
TEST_CASE("sort answers are the prompt sorted") { check_task("sort", TASK_SORT); }

TEST_CASE("a length-1 task has the separator as its only answer input") {
    Dataset ds;
    char err[256] = "";
    REQUIRE(dataset_init_task(&ds, "reverse", 1, 2, 1, 7, err, sizeof err) == 0);
    Batch batch = train_batch(ds, 8, 0);
    check_task_sequences(ds, batch, 8);
    for (size_t b = 0; b < 8; b++) { CHECK(batch.x[2 * b] != ds.eval_examples[0]); }
    dataset_free(&ds);
}

TEST_CASE("dataset_task_bytes is what dataset_init_task allocates, known before it does") {
    for (size_t n_eval : {1, 50, 64, 65, 100}) {
        CAPTURE(n_eval);
        Dataset ds;
        char err[256] = "";
        REQUIRE(dataset_init_task(&ds, "reverse", 7, 10, n_eval, 3, err, sizeof err) == 0);
        size_t allocated = ds.n_eval * 15 * sizeof(int) + ds.hash_capacity * sizeof(uint64_t);
        CHECK(ds.hash_capacity >= 2 * n_eval);
        CHECK(dataset_task_bytes(7, n_eval) == allocated);
        CHECK(dataset_bytes(&ds) == allocated);
        dataset_free(&ds);
    }
    CHECK(dataset_task_bytes(0, 10) == 0);     // lengths dataset_init_task refuses
    CHECK(dataset_task_bytes(4097, 10) == 0);
}

TEST_CASE("held-out prompts never appear in 2000 training batches, and all others do") {
    // 4^4 = 256 prompts, 100 of them held out: without rejection, training would hit them
    for (const char* name : {"reverse", "copy", "sort"}) {
        INFO("task ", name);
        Dataset ds;
        char err[256] = "";
        REQUIRE(dataset_init_task(&ds, name, 4, 4, 100, 99, err, sizeof err) == 0);
        std::set<std::vector<int>> eval_prompts, train_prompts;
        Batch eval = eval_batch(ds, ds.n_eval, 0);
        for (size_t e = 0; e < ds.n_eval; e++) { eval_prompts.insert(prompt_of(eval, ds, e)); }
        REQUIRE(eval_prompts.size() == 100);
        for (uint64_t step = 0; step < 2000; step++) {
            Batch batch = train_batch(ds, 8, step);
            for (size_t b = 0; b < 8; b++) {
                std::vector<int> prompt = prompt_of(batch, ds, b);
                REQUIRE(eval_prompts.count(prompt) == 0);
                train_prompts.insert(prompt);
            }
        }
        CHECK(train_prompts.size() == 256 - 100);
        dataset_free(&ds);
    }
}

TEST_CASE("the eval set has no duplicates and is a function of the seed") {
    // 3^5 = 243 prompts hold at most 121 eval examples
    Dataset a, b, c;
    char err[256] = "";
    REQUIRE(dataset_init_task(&a, "sort", 5, 3, 121, 5, err, sizeof err) == 0);
    REQUIRE(dataset_init_task(&b, "sort", 5, 3, 121, 5, err, sizeof err) == 0);
    REQUIRE(dataset_init_task(&c, "sort", 5, 3, 121, 6, err, sizeof err) == 0);
    size_t n = a.n_eval * (2 * (size_t)a.length + 1);
    std::vector<int> ea(a.eval_examples, a.eval_examples + n);
    std::vector<int> eb(b.eval_examples, b.eval_examples + n);
    std::vector<int> ec(c.eval_examples, c.eval_examples + n);
    CHECK(ea == eb);
    CHECK(ea != ec);
    Batch eval = eval_batch(a, a.n_eval, 0);
    std::set<std::vector<int>> prompts;
    for (size_t e = 0; e < a.n_eval; e++) { prompts.insert(prompt_of(eval, a, e)); }
    CHECK(prompts.size() == a.n_eval);
    dataset_free(&a);
    dataset_free(&b);
    dataset_free(&c);
}

TEST_CASE("training batches are a function of seed, step and sequence only") {
    Dataset ds, other_seed;
    char err[256] = "";
    REQUIRE(dataset_init_task(&ds, "reverse", 8, 16, 64, 1, err, sizeof err) == 0);
    REQUIRE(dataset_init_task(&other_seed, "reverse", 8, 16, 64, 2, err, sizeof err) == 0);
    Batch step3 = train_batch(ds, 8, 3);
    CHECK(train_batch(ds, 8, 3).x == step3.x);
    CHECK(train_batch(ds, 8, 3).y == step3.y);
    CHECK(train_batch(ds, 8, 4).x != step3.x);
    CHECK(train_batch(other_seed, 8, 3).x != step3.x);
    // the first 4 sequences of a batch of 8 are the batch of 4: sequences don't depend on B
    Batch half = train_batch(ds, 4, 3);
    CHECK(std::equal(half.x.begin(), half.x.end(), step3.x.begin()));
    CHECK(std::equal(half.y.begin(), half.y.end(), step3.y.begin()));
    // sequences of one batch differ from each other
    CHECK(prompt_of(step3, ds, 0) != prompt_of(step3, ds, 1));
    dataset_free(&ds);
    dataset_free(&other_seed);
}

TEST_CASE("eval batches wrap round at the end of the held-out set") {
    Dataset ds;
    char err[256] = "";
    REQUIRE(dataset_init_task(&ds, "copy", 5, 9, 10, 3, err, sizeof err) == 0);
    CHECK(dataset_eval_sequences(&ds) == 10);
    Batch all = eval_batch(ds, 10, 0), wrapped = eval_batch(ds, 4, 8);
    size_t T = (size_t)ds.seq_len;
    for (size_t b = 0; b < 4; b++) {
        size_t i = (8 + b) % 10;
        INFO("batch sequence ", b, " eval sequence ", i);
        for (size_t t = 0; t < T; t++) {
            CHECK(wrapped.x[b * T + t] == all.x[i * T + t]);
            CHECK(wrapped.y[b * T + t] == all.y[i * T + t]);
        }
    }
    dataset_free(&ds);
}

TEST_CASE("text sequences are windows of the train split and eval sequences tile the val split") {
    TempDir dir;
    std::string bytes = random_bytes(1000);  // train split [0, 900), val split [900, 1000)
    std::string path = dir.write("text.bin", bytes);
    Dataset ds;
    char err[256] = "";
    const int T = 16;
    REQUIRE_MESSAGE(dataset_init_text(&ds, path.c_str(), T, TEXT_MAX_BYTES, 11, err, sizeof err) == 0, err);
    CHECK(ds.kind == TASK_TEXT);
    CHECK(ds.vocab_size == 256);
    CHECK(ds.seq_len == T);
    CHECK(ds.answer_start == 0);
    CHECK(ds.answer_len == T);
    CHECK(ds.n_text == 1000);
    CHECK(ds.n_train == 900);
    auto byte = [&](size_t i) { return (int)(unsigned char)bytes[i]; };

    std::set<size_t> starts;
    for (uint64_t step = 0; step < 50; step++) {
        Batch batch = train_batch(ds, 8, step);
        for (size_t b = 0; b < 8; b++) {
            const int* x = batch.x.data() + b * T;
            const int* y = batch.y.data() + b * T;
            auto matches_at = [&](size_t start) {
                for (int t = 0; t < T; t++) {
                    if (x[t] != byte(start + (size_t)t)) { return false; }
                }
                return true;
            };
            size_t start = 0;
            while (start + T < bytes.size() && !matches_at(start)) { start++; }
            INFO("step ", step, " sequence ", b, " start ", start);
            REQUIRE(start + T + 1 <= 900);
            for (int t = 0; t < T; t++) { CHECK(y[t] == byte(start + (size_t)t + 1)); }
            starts.insert(start);
        }
    }
    CHECK(starts.size() > 300);  // 400 draws of 884 starts: windows really are random

    REQUIRE(dataset_eval_sequences(&ds) == (100 - 1) / T);
    size_t n_sequences = dataset_eval_sequences(&ds);
    Batch eval = eval_batch(ds, n_sequences + 1, 0);
    for (size_t i = 0; i <= n_sequences; i++) {
        size_t start = 900 + (i % n_sequences) * T;
        for (int t = 0; t < T; t++) {
            INFO("eval sequence ", i, " position ", t);
            CHECK(eval.x[i * T + (size_t)t] == byte(start + (size_t)t));
            CHECK(eval.y[i * T + (size_t)t] == byte(start + (size_t)t + 1));
        }
    }
    dataset_free(&ds);
}

TEST_CASE("dataset_free zeroes the struct, which can be initialised again") {
    Dataset ds;
    char err[256] = "";
    REQUIRE(dataset_init_task(&ds, "reverse", 3, 5, 10, 0, err, sizeof err) == 0);
    dataset_free(&ds);
    Dataset zero;
    std::memset(&zero, 0, sizeof zero);
    CHECK(std::memcmp(&ds, &zero, sizeof ds) == 0);
    dataset_free(&ds);  // freeing twice is harmless
    REQUIRE(dataset_init_task(&ds, "sort", 3, 5, 10, 0, err, sizeof err) == 0);
    check_task_sequences(ds, train_batch(ds, 4, 0), 4);
    dataset_free(&ds);
}

TEST_CASE("bad task settings fail with a one-line reason") {
    Dataset ds;
    char err[256] = "";
    auto init = [&](const char* name, int length, int n_symbols, size_t n_eval) {
        err[0] = '\0';
        return dataset_init_task(&ds, name, length, n_symbols, n_eval, 1, err, sizeof err);
    };
    CHECK(fails_with(init("reverso", 4, 8, 10), ds, err, "unknown task"));
    CHECK(fails_with(init("reverso", 4, 8, 10), ds, err, "reverse, copy, sort"));
    CHECK(fails_with(init("reverse", 0, 8, 10), ds, err, "length 0"));
    CHECK(fails_with(init("reverse", 4097, 8, 10), ds, err, "length 4097"));
    CHECK(fails_with(init("copy", 4, 1, 10), ds, err, "n_symbols 1"));
    CHECK(fails_with(init("copy", 4, 65536, 10), ds, err, "n_symbols 65536"));
    CHECK(fails_with(init("sort", 4, 8, 0), ds, err, "n_eval 0"));
    CHECK(fails_with(init("sort", 3, 4, 33), ds, err, "too small"));  // 64 < 66
    CHECK(init("sort", 3, 4, 32) == 0);                               // 64 = 2*32 is enough
    dataset_free(&ds);
    CHECK(init("sort", 4096, 65535, 10) == 0);  // the limits themselves are fine
    dataset_free(&ds);
}

TEST_CASE("bad text files fail with a one-line reason naming the path") {
    TempDir dir;
    Dataset ds;
    char err[512] = "";
    auto init = [&](const std::string& path, int seq_len, size_t max_bytes = TEXT_MAX_BYTES) {
        err[0] = '\0';
        return dataset_init_text(&ds, path.c_str(), seq_len, max_bytes, 1, err, sizeof err);
    };
    std::string missing = (dir.path / "missing.txt").string();
    CHECK(fails_with(init(missing, 8), ds, err, "No such file"));
    CHECK(fails_with(init(missing, 8), ds, err, missing.c_str()));
    CHECK(fails_with(init(dir.path.string(), 8), ds, err, "directory"));
    CHECK(fails_with(init(dir.write("empty.txt", ""), 8), ds, err, "empty"));
    std::string short_file = dir.write("short.txt", std::string(89, 'a'));  // val split 8 < 9
    CHECK(fails_with(init(short_file, 8), ds, err, "too short"));
    CHECK(fails_with(init(short_file, 0), ds, err, "seq_len 0"));
    CHECK(init(dir.write("enough.txt", std::string(90, 'a')), 8) == 0);  // val split 9 = 9
    CHECK(dataset_eval_sequences(&ds) == 1);
    dataset_free(&ds);
    // at most max_bytes: a larger file is refused by its size
    std::string kilobyte = dir.write("kilobyte.txt", std::string(1000, 'a'));
    CHECK(fails_with(init(kilobyte, 8, 999), ds, err, "1000 bytes, more than the 999"));
    CHECK(init(kilobyte, 8, 1000) == 0);
    dataset_free(&ds);
    // a regular file only: an endless device (/dev/zero has size 0) is never read until
    // memory runs out
    CHECK(fails_with(init("/dev/zero", 8, 5000), ds, err, "not a regular file"));
    CHECK(fails_with(init("/dev/zero", 8, 1 << 20), ds, err, "'/dev/zero'"));
}

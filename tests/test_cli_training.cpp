// test_cli_training.cpp — ./train's runs (tests/cli.h): --help lists every flag with its
// default; tiny runs train and print the final metrics, are deterministic, resume bit for bit,
// stop on NaN keeping the last checkpoint; mhc, schedules, memory, threads, diagnostics and
// failed writes.
#include "cli.h"

#include "checkpoint.h"

namespace {

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
        size_t n_params = (a.size() - 256 * sizeof(int)) / (3 * sizeof(float));
        for (int kind = 0; kind < 3; kind++) {
            const float* x = reinterpret_cast<const float*>(a.data() + 256 * sizeof(int)) + kind * n_params;
            const float* y = reinterpret_cast<const float*>(b.data() + 256 * sizeof(int)) + kind * n_params;
            double largest = 0.0, worst = 0.0;
            for (size_t i = 0; i < n_params; i++) {
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
    size_t n_params = (bytes.size() - 1024) / 12;
    for (size_t i = 0; i < n_params; i++) {
        const float huge = 3e38f;
        std::memcpy(&bytes[1024 + 4 * (n_params + i)], &huge, sizeof huge);
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

// ---- rough edges: mhc, resuming, schedules, memory, threads, failed writes --------------

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
    // 4096 sequences of 4096 tokens: their logits and probabilities alone (256 floats each) are
    // 32 GiB, more than the 24 GiB machine this suite runs on has
    check_error(run_train(dir, tiny({"--task", "text", "--text", text, "--seq-len", "4096",
                                     "--batch", "4096"})),
                {"needs", "GiB", "of them activations", "KiB for each of the B x T = 16777216 tokens",
                 "available", "lower --batch or --seq-len"});
}

TEST_CASE("the header says how much memory the run takes and how threads wait") {
    TempDir dir;
    Run run = run_train(dir, tiny({"--steps", "1", "--eval-every", "1"}));
    check_success(run);
    std::string header = lines_of(run.out).at(0);
    CHECK(contains(header, "| memory "));
    CHECK(contains(header, " MiB (activations "));
    CHECK(contains(header, " KiB a token)"));
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
    SUBCASE("before training: a CSV that is a device (/dev/full, a full disk on demand) is refused") {
        // (diagnostics_open's own line for a full disk: test_diagnostics_files.cpp)
        fs::create_directories(diag);
        fs::create_symlink("/dev/full", diag + "/train.csv");
        Run run = run_train(dir, tiny({"--steps", "4", "--diagnostics", diag}));
        check_error(run, {diag + "/train.csv", "not a regular file"});
        CHECK(!contains(run.out, "step"));
        CHECK(fs::is_symlink(diag + "/train.csv"));
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

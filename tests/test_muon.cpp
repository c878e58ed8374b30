// test_muon.cpp — Muon (src/muon.c, SPEC "Optimisers and schedules"): Newton–Schulz puts
// every singular value where the quintic sends it, the update's size follows
// 0.2 sqrt(max(A,B)), the momentum and Nesterov terms against a float64 replay, and the
// model's step: AdamW tensors exactly as plain AdamW, shards cut between matrices.
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "layers.h"
#include "model.h"

using gradcheck::compare_exact;
using gradcheck::compare_within;
using gradcheck::Rng;
using gradcheck::Tolerance;

namespace {

typedef std::vector<double> Mat;  // row-major, double

const double NS_A = 3.4445, NS_B = -4.7750, NS_C = 2.0315;

// The quintic on one singular value: phi(s) = a s + b s^3 + c s^5
double quintic(double s) { return NS_A * s + NS_B * s * s * s + NS_C * s * s * s * s * s; }

// the eigenvalues of the symmetric n x n matrix S (cyclic Jacobi rotations), ascending
std::vector<double> symmetric_eigenvalues(Mat S, size_t n) {
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (size_t p = 0; p < n; p++)
            for (size_t q = p + 1; q < n; q++) off += S[p * n + q] * S[p * n + q];
        if (off < 1e-30) break;
        for (size_t p = 0; p < n; p++)
            for (size_t q = p + 1; q < n; q++) {
                double apq = S[p * n + q];
                if (std::fabs(apq) < 1e-300) continue;
                double theta = (S[q * n + q] - S[p * n + p]) / (2.0 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
                double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
                for (size_t k = 0; k < n; k++) {  // columns p, q
                    double skp = S[k * n + p], skq = S[k * n + q];
                    S[k * n + p] = c * skp - s * skq;
                    S[k * n + q] = s * skp + c * skq;
                }
                for (size_t k = 0; k < n; k++) {  // rows p, q
                    double spk = S[p * n + k], sqk = S[q * n + k];
                    S[p * n + k] = c * spk - s * sqk;
                    S[q * n + k] = s * spk + c * sqk;
                }
            }
    }
    std::vector<double> eig(n);
    for (size_t i = 0; i < n; i++) eig[i] = S[i * n + i];
    std::sort(eig.begin(), eig.end());
    return eig;
}

// the singular values of X (rows,cols), rows <= cols: sqrt of the eigenvalues of X X^T
template <typename T>
std::vector<double> singular_values(const T* X, size_t rows, size_t cols) {
    Mat gram(rows * rows, 0.0);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < rows; j++)
            for (size_t p = 0; p < cols; p++) gram[i * rows + j] += (double)X[i * cols + p] * X[j * cols + p];
    std::vector<double> eig = symmetric_eigenvalues(gram, rows);
    for (double& e : eig) e = std::sqrt(std::max(e, 0.0));
    return eig;
}

// out (n,m) = a (n,k) . b (k,m) in double
Mat matmul(const Mat& a, const Mat& b, size_t n, size_t k, size_t m) {
    Mat out(n * m, 0.0);
    for (size_t i = 0; i < n; i++)
        for (size_t p = 0; p < k; p++)
            for (size_t j = 0; j < m; j++) out[i * m + j] += a[i * k + p] * b[p * m + j];
    return out;
}

Mat transpose(const Mat& x, size_t rows, size_t cols) {
    Mat t(rows * cols);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) t[j * rows + i] = x[i * cols + j];
    return t;
}

// SPEC's Muon step in double, written out: params and momentum (rows,cols) updated in place
void muon_step_in_double(Mat& W, Mat& M, const std::vector<float>& G, size_t rows, size_t cols,
                         double lr, double mu, double weight_decay) {
    size_t n = rows * cols;
    Mat N(n);
    double sum_sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        M[i] = mu * M[i] + G[i];
        N[i] = G[i] + mu * M[i];
        sum_sq += N[i] * N[i];
    }
    for (double& x : N) x /= std::sqrt(sum_sq) + 1e-7;
    bool tall = rows > cols;
    size_t a = tall ? cols : rows, b = tall ? rows : cols;
    Mat X = tall ? transpose(N, rows, cols) : N;
    for (int step = 0; step < 5; step++) {
        Mat Y = matmul(X, transpose(X, a, b), a, b, a);
        Mat YY = matmul(Y, Y, a, a, a);
        Mat Z(a * a);
        for (size_t i = 0; i < a * a; i++) Z[i] = NS_B * Y[i] + NS_C * YY[i];
        Mat ZX = matmul(Z, X, a, a, b);
        for (size_t i = 0; i < a * b; i++) X[i] = NS_A * X[i] + ZX[i];
    }
    if (tall) X = transpose(X, a, b);
    double scale = 0.2 * std::sqrt((double)b);
    for (size_t i = 0; i < n; i++) W[i] -= lr * (weight_decay * W[i] + scale * X[i]);
}

struct Shape {
    size_t rows, cols;
};
const Shape SHAPES[] = {{64, 64}, {32, 128}, {256, 64}, {48, 20}};

std::vector<float> gaussian(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(n);
    for (float& v : x) {
        double u1 = std::max((double)rng.uniform(0.0f, 1.0f), 1e-12), u2 = rng.uniform(0.0f, 1.0f);
        v = (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    return x;
}

struct ScopedThreads {
    int saved;
    explicit ScopedThreads(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
    ~ScopedThreads() { omp_set_num_threads(saved); }
};

}  // namespace

// Five steps map each singular value s of X (Frobenius norm 1) to p(p(p(p(p(s))))) (as sets:
// p^5 is not monotone, so the order changes): the
// iteration is an odd matrix polynomial, X -> X q(X^T X), which acts on each singular value
// alone. The band: p's largest value on [0, 1] is 1.2024 and its smallest on [0.68, 1.21]
// is 0.6818, so once there a singular value stays in [0.6818, 1.2024]; from s >= 0.01, five
// steps reach [0.6818, 1.1344] (Keller Jordan's [0.68, 1.13]); the square 64x64 matrix has
// s_min = 0.0034, whose p^5 = 1.16. Measured: every output singular value within 2e-4 of
// p^5 of an input's, and inside p^5's range over [s_min, 1].
TEST_CASE("five Newton-Schulz steps send every singular value into the quintic's band") {
    for (const Shape& shape : SHAPES) {
        size_t a = std::min(shape.rows, shape.cols), b = std::max(shape.rows, shape.cols);
        std::vector<float> X = gaussian(a * b, 100 + a * 7 + b);
        double norm = 0.0;
        for (float x : X) norm += (double)x * x;
        for (float& x : X) x = (float)(x / std::sqrt(norm));
        std::vector<double> before = singular_values(X.data(), a, b);
        std::vector<float> work(3 * a * a + a * b);
        newton_schulz(X.data(), work.data(), a, b);
        std::vector<double> after = singular_values(X.data(), a, b);
        std::vector<double> mapped = before;  // p^5 is not monotone: sorted again
        for (double& s : mapped)
            for (int k = 0; k < NEWTON_SCHULZ_STEPS; k++) s = quintic(s);
        std::sort(mapped.begin(), mapped.end());
        double lowest = 1e9, highest = 0.0;
        for (size_t i = 0; i < a; i++) {
            CHECK_MESSAGE(std::fabs(after[i] - mapped[i]) < 2e-4, a, "x", b, " singular value ",
                          i, ": ", after[i], " after, p^5 of the input's ", mapped[i]);
            lowest = std::min(lowest, after[i]);
            highest = std::max(highest, after[i]);
        }
        // the band: p^5 over [smallest input singular value, 1], on a fine grid
        double band_low = 1e9, band_high = 0.0;
        for (int k = 0; k <= 200000; k++) {
            double s = before[0] + (1.0 - before[0]) * k / 200000.0;
            for (int step = 0; step < NEWTON_SCHULZ_STEPS; step++) s = quintic(s);
            band_low = std::min(band_low, s);
            band_high = std::max(band_high, s);
        }
        MESSAGE(a, "x", b, ": singular values after five steps in [", lowest, ", ", highest,
                "], before in [", before[0], ", ", before[a - 1], "]; the band [", band_low,
                ", ", band_high, "]");
        CHECK(lowest >= band_low - 2e-4);
        CHECK(highest <= band_high + 2e-4);
        CHECK(lowest >= 0.68);   // p's band: p maps [0.6818, 1.2024] into itself
        CHECK(highest <= 1.21);
        if (before[0] >= 0.01) CHECK(highest <= 1.135);  // Keller's [0.68, 1.13]
    }
}

// SPEC's update is dW = -lr 0.2 sqrt(max(A,B)) X (no decay), X the orthogonalised matrix
// (A,B) with singular values sigma_1 .. sigma_min(A,B). |X|_F^2 = sum sigma_i^2, so
// RMS(X) = sqrt(sum sigma_i^2 / (A B)) and RMS(dW)/lr = 0.2 sqrt(max(A,B)) RMS(X)
// = 0.2 sqrt(sum sigma_i^2 / min(A,B)): 0.2 times the RMS of the singular values, whatever
// the shape (about 0.2 with every sigma_i near 1). The sigma_i come independently from p^5
// of the singular values of N / |N|_F.
TEST_CASE("the Muon update's RMS is 0.2 sqrt(max(A,B)) times that of the orthogonalised matrix") {
    for (const Shape& shape : SHAPES) {
        size_t n = shape.rows * shape.cols, a = std::min(shape.rows, shape.cols);
        std::vector<float> grads = gaussian(n, 300 + n), momentum(n, 0.0f), params(n, 0.0f);
        const float lr = 0.01f;
        muon_update(params.data(), grads.data(), momentum.data(), 1, shape.rows, shape.cols, lr,
                    0.95f, 0.0f);
        double sum_sq = 0.0;
        for (float p : params) sum_sq += (double)p * p;
        double rms_over_lr = std::sqrt(sum_sq / (double)n) / lr;
        // N = G + 0.95 (0 + G) = 1.95 G: the same direction as G
        std::vector<float> direction = grads;
        double norm = 0.0;
        for (float g : grads) norm += (double)g * g;
        for (float& x : direction) x = (float)(x / std::sqrt(norm));
        std::vector<float> wide = direction;
        if (shape.rows > shape.cols) {
            for (size_t i = 0; i < shape.rows; i++)
                for (size_t j = 0; j < shape.cols; j++) wide[j * shape.rows + i] = direction[i * shape.cols + j];
        }
        std::vector<double> s = singular_values(wide.data(), a, n / a);
        double sigma_sq = 0.0;
        for (double x : s) {
            for (int k = 0; k < NEWTON_SCHULZ_STEPS; k++) x = quintic(x);
            sigma_sq += x * x;
        }
        double expected = 0.2 * std::sqrt(sigma_sq / (double)a);
        MESSAGE(shape.rows, "x", shape.cols, ": RMS(dW)/lr = ", rms_over_lr, ", expected ", expected);
        CHECK(std::fabs(rms_over_lr - expected) < 1e-4 * expected);
    }
}

// Three steps on fresh gradients with mu = 0.9 and weight decay, against SPEC's step in
// double: M = mu M + G, N = G + mu M, then the rest. Dropping G from M, or mu M from N
// (from the second step on, when M is no longer G), moves params and momentum far outside
// the tolerance; so does a wrong transpose, scale or decay term.
TEST_CASE("Muon's momentum, Nesterov direction, scale and decay match SPEC's step in double") {
    ScopedThreads threads(2);
    for (const Shape& shape : SHAPES) {
        size_t n = shape.rows * shape.cols;
        std::vector<float> params = gaussian(n, 500 + n), momentum(n, 0.0f);
        for (float& p : params) p *= 0.05f;
        Mat W(params.begin(), params.end()), M(n, 0.0);
        const float lr = 0.02f, mu = 0.9f, weight_decay = 0.1f;
        for (int step = 0; step < 3; step++) {
            std::vector<float> grads = gaussian(n, 700 + n + (size_t)step);
            muon_update(params.data(), grads.data(), momentum.data(), 1, shape.rows, shape.cols, lr,
                        mu, weight_decay);
            muon_step_in_double(W, M, grads, shape.rows, shape.cols, lr, mu, weight_decay);
            std::string where = std::to_string(shape.rows) + "x" + std::to_string(shape.cols) +
                                " step " + std::to_string(step + 1);
            compare_within(where + " momentum", momentum.data(), M.data(), n, Tolerance{1e-6, 1e-6});
            compare_within(where + " params", params.data(), W.data(), n, Tolerance{2e-6, 1e-5});
        }
    }
}

// Several matrices at once (a tensor's layers: each thread takes whole matrices, its matmuls
// on one thread) give the bits of one call per matrix, on one thread or two; so does one
// matrix, whose matmuls then take every thread.
TEST_CASE("Muon's step gives the same bits on one thread and on two, one matrix or several at once") {
    Shape shape = {96, 40};
    const size_t count = 3, n = shape.rows * shape.cols;
    std::vector<float> grads = gaussian(count * n, 41);
    std::vector<float> params[3], momentum[3];
    for (int k = 0; k < 3; k++) {  // 1 thread, 2 threads, 2 threads one matrix per call
        ScopedThreads threads(k == 0 ? 1 : 2);
        params[k] = gaussian(count * n, 42);
        momentum[k] = gaussian(count * n, 43);
        if (k < 2) {
            muon_update(params[k].data(), grads.data(), momentum[k].data(), count, shape.rows,
                        shape.cols, 0.01f, 0.95f, 0.1f);
        } else {
            for (size_t j = 0; j < count; j++)
                muon_update(params[k].data() + j * n, grads.data() + j * n,
                            momentum[k].data() + j * n, 1, shape.rows, shape.cols, 0.01f, 0.95f, 0.1f);
        }
    }
    for (int k = 1; k < 3; k++) {
        compare_exact("params, run " + std::to_string(k), params[k].data(), params[0].data(), count * n);
        compare_exact("momentum, run " + std::to_string(k), momentum[k].data(), momentum[0].data(), count * n);
    }
}

namespace {

struct ScopedModel {
    Model m;
    ScopedModel(const ModelConfig& c) { model_build(&m, &c, 1, 1); }
    ~ScopedModel() { model_free(&m); }
};

void randomise(float* x, size_t n, uint64_t seed) {
    std::vector<float> g = gaussian(n, seed);
    std::memcpy(x, g.data(), n * sizeof(float));
}

}  // namespace

// With Muon, every tensor but the seven layer matrices takes the very AdamW step it takes
// with --optimizer adamw (bit for bit: wte and lm_head decayed, the rest not); the matrices
// change, and their second moments stay as they were.
TEST_CASE("with Muon every other tensor takes exactly the plain AdamW step") {
    ModelConfig configs[] = {{11, 16, 2, 4, 2, 24, 0}, {11, 16, 2, 4, 2, 24, 2}};
    for (const ModelConfig& c : configs) {
        ScopedModel adam(c), muon(c);
        randomise(adam.m.params_memory, adam.m.num_params, 1);
        randomise(adam.m.grads_memory, adam.m.num_params, 2);
        randomise(adam.m.m_memory, adam.m.num_params, 3);
        for (size_t i = 0; i < adam.m.num_params; i++) adam.m.v_memory[i] = 0.01f * (float)(i % 7 + 1);
        std::memcpy(muon.m.params_memory, adam.m.params_memory, adam.m.num_params * sizeof(float));
        std::memcpy(muon.m.grads_memory, adam.m.grads_memory, adam.m.num_params * sizeof(float));
        std::memcpy(muon.m.m_memory, adam.m.m_memory, adam.m.num_params * sizeof(float));
        std::memcpy(muon.m.v_memory, adam.m.v_memory, adam.m.num_params * sizeof(float));
        std::vector<float> v_before(adam.m.v_memory, adam.m.v_memory + adam.m.num_params);
        for (int t = 1; t <= 2; t++) {
            model_update(&adam.m, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
            model_update_shard_muon(&muon.m, 0, muon.m.num_params, muon.m.grads_memory,
                                    muon.m.m_memory, muon.m.v_memory, 0.01f, 0.9f, 0.95f, 1e-8f,
                                    0.1f, t, 0.95f);
        }
        size_t offset = 0, rows, cols;
        int muon_tensors = 0;
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            size_t n = adam.m.param_sizes[i];
            std::string name = PARAM_INFO[i].name;
            if (muon_matrix_shape(&muon.m.dims, i, &rows, &cols)) {
                muon_tensors++;
                CHECK(rows * cols * c.n_layers == n);
                CHECK_MESSAGE(std::memcmp(muon.m.params_memory + offset, adam.m.params_memory + offset,
                                          n * sizeof(float)) != 0, name);
                compare_exact(name + ": v untouched", muon.m.v_memory + offset, v_before.data() + offset, n);
            } else {
                compare_exact(name + " params", muon.m.params_memory + offset, adam.m.params_memory + offset, n);
                compare_exact(name + " m", muon.m.m_memory + offset, adam.m.m_memory + offset, n);
                compare_exact(name + " v", muon.m.v_memory + offset, adam.m.v_memory + offset, n);
            }
            offset += n;
        }
        CHECK(muon_tensors == 7);
    }
}

// Data parallel with Muon: the shards (model_muon_shard_bounds) cover the buffer in order and
// cut no matrix, and updating shard after shard gives the bits of one update of the whole.
TEST_CASE("Muon's shards cut between matrices, and the shards' updates make the whole update") {
    ModelConfig c = {11, 16, 3, 4, 2, 24, 2};
    for (int world : {2, 3, 5, 8}) {
        ScopedModel whole(c), sharded(c);
        randomise(whole.m.params_memory, whole.m.num_params, 11);
        randomise(whole.m.grads_memory, whole.m.num_params, 12);
        std::memcpy(sharded.m.params_memory, whole.m.params_memory, whole.m.num_params * sizeof(float));
        std::vector<size_t> bounds((size_t)world + 1);
        model_muon_shard_bounds(&sharded.m, world, bounds.data());
        CHECK(bounds[0] == 0);
        CHECK(bounds[(size_t)world] == whole.m.num_params);
        for (int r = 0; r < world; r++) CHECK(bounds[(size_t)r] <= bounds[(size_t)r + 1]);
        size_t offset = 0, rows, cols;
        for (int i = 0; i < N_PARAM_TENSORS; i++) {
            if (muon_matrix_shape(&whole.m.dims, i, &rows, &cols)) {
                for (size_t first = offset; first < offset + whole.m.param_sizes[i]; first += rows * cols)
                    for (size_t b : bounds) CHECK_MESSAGE(!(b > first && b < first + rows * cols), world, " ranks cut ", PARAM_INFO[i].name);
            }
            offset += whole.m.param_sizes[i];
        }
        model_update_shard_muon(&whole.m, 0, whole.m.num_params, whole.m.grads_memory,
                                whole.m.m_memory, whole.m.v_memory, 0.01f, 0.9f, 0.95f, 1e-8f,
                                0.1f, 1, 0.95f);
        for (int r = 0; r < world; r++) {
            size_t lo = bounds[(size_t)r], hi = bounds[(size_t)r + 1];
            model_update_shard_muon(&sharded.m, lo, hi, whole.m.grads_memory + lo,
                                    sharded.m.m_memory + lo, sharded.m.v_memory + lo, 0.01f, 0.9f,
                                    0.95f, 1e-8f, 0.1f, 1, 0.95f);
        }
        compare_exact(std::to_string(world) + " shards: params", sharded.m.params_memory,
                      whole.m.params_memory, whole.m.num_params);
        compare_exact(std::to_string(world) + " shards: momentum", sharded.m.m_memory,
                      whole.m.m_memory, whole.m.num_params);
    }
}

// N = 0 (no gradient, no momentum): X = 0 / (0 + 1e-7) = 0, so the step is the decay alone,
// W (1 - lr wd), and never 0/0.
TEST_CASE("Muon with a zero gradient and zero momentum only decays the matrix") {
    Shape shape = {12, 20};
    size_t n = shape.rows * shape.cols;
    std::vector<float> params = gaussian(n, 51), grads(n, 0.0f), momentum(n, 0.0f);
    std::vector<double> expected(params.begin(), params.end());
    const float lr = 0.1f, weight_decay = 0.5f;
    for (size_t i = 0; i < n; i++) expected[i] -= (double)lr * weight_decay * params[i];
    muon_update(params.data(), grads.data(), momentum.data(), 1, shape.rows, shape.cols, lr, 0.95f,
                weight_decay);
    compare_within("params", params.data(), expected.data(), n, Tolerance{0.0, 3e-7});
}

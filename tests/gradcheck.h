// gradcheck.h — checking analytic gradients against finite differences, and comparing
// tensors with a tolerance. Used by the layer tests and the whole-model check.
//
// The scalar loss of a check is L = sum_i R_i * out_i with fixed random R, summed in double.
// Feeding dout = R to a backward pass then makes its gradients exactly dL/dinput, and outputs
// that a perturbation does not touch are bit-identical in L(x+h) and L(x-h), so they cancel.
// Set GRADCHECK_VERBOSE=1 to print, for every checked tensor, the largest error and how much
// of its tolerance it used (the numbers behind the tolerances chosen in the tests).
#ifndef ATTNRES_GRADCHECK_H
#define ATTNRES_GRADCHECK_H

#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace gradcheck {

// A small deterministic generator (splitmix64), so tests draw the same numbers everywhere.
struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed) {}
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // uniform in [lo, hi)
    float uniform(float lo, float hi) {
        double u = (double)(next() >> 11) * (1.0 / 9007199254740992.0);
        return (float)(lo + (hi - lo) * u);
    }
    std::vector<float> uniform_vector(size_t n, float lo, float hi) {
        std::vector<float> out(n);
        for (float& x : out) x = uniform(lo, hi);
        return out;
    }
    // uniform magnitude in [lo, hi) with a random sign: values bounded away from zero
    std::vector<float> signed_vector(size_t n, float lo, float hi) {
        std::vector<float> out(n);
        for (float& x : out) x = (next() & 1 ? 1.0f : -1.0f) * uniform(lo, hi);
        return out;
    }
};

struct Tolerance {
    double atol;
    double rtol;
};

inline bool verbose() {
    const char* flag = std::getenv("GRADCHECK_VERBOSE");
    return flag != nullptr && flag[0] != '\0' && flag[0] != '0';
}

// L = sum_i weights_i * out_i, in double (each product of two floats is exact in double)
inline double weighted_sum(const float* weights, const float* out, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)weights[i] * (double)out[i];
    return sum;
}

// What a failure message calls the two values.
struct Labels {
    const char* actual;
    const char* expected;
};

// Counts elements with |actual - expected| > atol + rtol * |expected|, reports the first few
// (name, index, both values) as failed checks, and returns the number of mismatches.
// A NaN or infinite actual value is always a mismatch.
template <typename Expected>
size_t compare_within(const std::string& name, const float* actual, const Expected* expected,
                      size_t n, Tolerance tol, size_t max_printed = 8,
                      Labels labels = {"got", "expected"}) {
    size_t mismatches = 0;
    double max_err = 0.0, max_used = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = actual[i], e = (double)expected[i];
        double err = std::fabs(a - e), allowed = tol.atol + tol.rtol * std::fabs(e);
        if (err > max_err) max_err = err;
        if (allowed > 0 && err / allowed > max_used) max_used = err / allowed;
        if (std::isfinite(a) && err <= allowed) continue;
        if (mismatches++ < max_printed) {
            char line[256];
            std::snprintf(line, sizeof line, "%s[%zu]: %s %.9g, %s %.9g (|diff| %.3g > %.3g)",
                          name.c_str(), i, labels.actual, a, labels.expected, e, err, allowed);
            FAIL_CHECK(line);
        }
    }
    if (verbose()) {
        char line[256];
        std::snprintf(line, sizeof line, "%-24s n=%-6zu max|err| %.3g, tolerance used %.3f",
                      name.c_str(), n, max_err, max_used);
        MESSAGE(line);
    }
    CHECK_MESSAGE(mismatches == 0, name << ": " << mismatches << " of " << n << " elements mismatch");
    return mismatches;
}

// The slope of loss() along element *x, by central differences with steps eps and 2 eps
// combined (Richardson): D(h) = (L(x+h) - L(x-h)) / 2h errs by c h^2 + O(h^4), so
// (4 D(eps) - D(2 eps)) / 3 errs by O(eps^4), and a step large against float rounding stays
// accurate. Each D divides by the step actually taken in float; *x is restored exactly.
inline double central_difference(float* x, const std::function<double()>& loss, float eps) {
    float original = *x;
    double slope[2];
    for (int k = 0; k < 2; k++) {
        float step = (k + 1) * eps, plus = original + step, minus = original - step;
        *x = plus;
        double loss_plus = loss();
        *x = minus;
        double loss_minus = loss();
        slope[k] = (loss_plus - loss_minus) / ((double)plus - (double)minus);
    }
    *x = original;
    return (4.0 * slope[0] - slope[1]) / 3.0;
}

// Sets OpenMP to one thread for its lifetime. The finite differences run thousands of tiny
// forward passes, which on several threads would mostly start and join parallel regions (and
// crawl on a machine busy with other work); the layers' results do not depend on it.
struct SingleThreaded {
    int saved;
    SingleThreaded() : saved(omp_get_max_threads()) { omp_set_num_threads(1); }
    ~SingleThreaded() { omp_set_num_threads(saved); }
};

// Checks analytic[i] == dL/dx[i] for every element of x (n floats), against
// central_difference (run on one thread), accepted when |fd - analytic| <= atol + rtol * |fd|.
// loss() must recompute the forward pass from the current contents of x. Returns the number of
// mismatches.
inline size_t check_gradient(const std::string& name, float* x, const float* analytic, size_t n,
                             const std::function<double()>& loss, float eps, Tolerance tol,
                             size_t max_printed = 8) {
    std::vector<double> numeric(n);
    {
        SingleThreaded one_thread;
        for (size_t i = 0; i < n; i++) numeric[i] = central_difference(&x[i], loss, eps);
    }
    return compare_within("d" + name, analytic, numeric.data(), n, tol, max_printed,
                          {"analytic", "finite difference"});
}

// Checks actual == expected bit for bit (zeros of either sign compare equal).
inline size_t compare_exact(const std::string& name, const float* actual, const float* expected,
                            size_t n, size_t max_printed = 8) {
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) {
        if (actual[i] == expected[i]) continue;
        if (mismatches++ < max_printed) {
            char line[256];
            std::snprintf(line, sizeof line, "%s[%zu]: got %.9g, expected exactly %.9g",
                          name.c_str(), i, actual[i], expected[i]);
            FAIL_CHECK(line);
        }
    }
    CHECK_MESSAGE(mismatches == 0, name << ": " << mismatches << " of " << n << " elements differ");
    return mismatches;
}

inline bool all_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return false;
    return true;
}

}  // namespace gradcheck

#endif

// rng.h — a small deterministic random number generator (splitmix64) with uniform and
// normal draws, so a seed fixes every initial weight on every machine.
#ifndef ATTNRES_RNG_H
#define ATTNRES_RNG_H

#include <math.h>
#include <stdint.h>

#define RNG_GOLDEN 0x9E3779B97F4A7C15ull

// the splitmix64 finaliser: a bijective mix of all 64 bits (also a good hash step)
static inline uint64_t rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// next number of the splitmix64 stream whose state is *state
static inline uint64_t rng_next(uint64_t* state) {
    *state += RNG_GOLDEN;
    return rng_mix64(*state);
}
// uniform in [0, 1)
static inline double rng_uniform(uint64_t* state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}
// standard normal (Box-Muller)
static inline double rng_normal(uint64_t* state) {
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    if (u1 < 1e-300) { u1 = 1e-300; }
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif

// A minimal test harness for bnn's core kernels (no TensorFlow, no test framework): TEST(name)
// registers a test, CHECK and CHECK_EQ record failures with their location, Variants lists the
// instruction-set variants a kernel family runs on this CPU (and records the ones it skips), and
// main (check.cc) runs every test, prints one line per test and exits nonzero on any failure.
//
// Build and run (from the repository root):
//   g++ -std=c++17 -O2 -I bnn/native/src bnn/native/tests/*.cc -o /tmp/bnn_native_tests
//   /tmp/bnn_native_tests [name-substring]
#ifndef BNN_NATIVE_TESTS_CHECK_H_
#define BNN_NATIVE_TESTS_CHECK_H_

// Vector types passed by value in always-inline helpers would warn about the AVX calling
// convention; they never cross a function boundary.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu.h"

namespace bnn_test {

using bnn::core::Isa;

// What one test has done so far: its failures (the first few kept), cases run, variants run and
// skipped.
struct Context {
  int64_t failures = 0;
  int64_t checks = 0;
  std::vector<std::string> messages;
  std::vector<std::string> ran, skipped;
};

Context& Current();

inline void Fail(const char* file, int line, const std::string& what) {
  Context& c = Current();
  ++c.failures;
  if (c.messages.size() < 8) {
    std::ostringstream out;
    out << file << ":" << line << ": " << what;
    c.messages.push_back(out.str());
  }
}

struct Registration {
  Registration(const char* name, void (*fn)());
};

// The instruction-set variants a family runs here (cpu_runs: the family's CpuRuns), each run by
// the caller; the others are recorded as skipped.
std::vector<Isa> Variants(bool (*cpu_runs)(Isa));

// A case label built from its parts, for failure messages: Case("batch", 3, "n", 70).
inline void AppendParts(std::ostringstream&) {}
template <typename A, typename B, typename... Rest>
void AppendParts(std::ostringstream& out, const A& name, const B& value, const Rest&... rest) {
  out << " " << name << "=" << value;
  AppendParts(out, rest...);
}
template <typename... Parts>
std::string Case(const Parts&... parts) {
  std::ostringstream out;
  AppendParts(out, parts...);
  return out.str();
}

// The seeded generator every test draws from (a fixed seed per test).
using Rng = std::mt19937_64;

inline int64_t RandomWord(Rng& rng) { return static_cast<int64_t>(rng()); }

inline std::vector<int64_t> RandomWords(Rng& rng, int64_t n) {
  std::vector<int64_t> out(n);
  for (int64_t& v : out) v = RandomWord(rng);
  return out;
}

// n random bits in ceil(n / 64) words, the pad bits past n clear (the packed layout).
inline std::vector<int64_t> RandomBits(Rng& rng, int64_t rows, int64_t n) {
  const int64_t words = (n + 63) / 64;
  std::vector<int64_t> out(rows * words);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < words; ++k) {
      uint64_t v = rng();
      const int64_t live = n - 64 * k;
      if (live < 64) v &= (uint64_t{1} << live) - 1;
      out[r * words + k] = static_cast<int64_t>(v);
    }
  return out;
}

inline int64_t Uniform(Rng& rng, int64_t lo, int64_t hi) {  // in [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// [0, items) cut into 1 to 4 consecutive ranges at random points, as a thread pool might shard
// it; fn(first, last) for each.
template <typename Fn>
void Sharded(Rng& rng, int64_t items, const Fn& fn) {
  std::vector<int64_t> cuts = {0, items};
  const int64_t extra = items > 1 ? Uniform(rng, 0, 3) : 0;
  for (int64_t i = 0; i < extra; ++i) cuts.push_back(Uniform(rng, 0, items));
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    if (cuts[i] < cuts[i + 1]) fn(cuts[i], cuts[i + 1]);
}

// Whether two arrays hold the same bytes (float results compared bit for bit, NaN included).
template <typename T>
bool SameBytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The first index where two arrays differ (or the shorter length), for failure messages.
template <typename T>
size_t FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && std::memcmp(&a[i], &b[i], sizeof(T)) == 0) ++i;
  return i;
}

}  // namespace bnn_test

#define BNN_TEST_CONCAT2(a, b) a##b
#define BNN_TEST_CONCAT(a, b) BNN_TEST_CONCAT2(a, b)

// Defines and registers a test: TEST(family_what) { ... }.
#define TEST(name)                                                                     \
  static void BNN_TEST_CONCAT(Test_, name)();                                          \
  static const ::bnn_test::Registration BNN_TEST_CONCAT(registration_, name)(#name,   \
                                                    &BNN_TEST_CONCAT(Test_, name)); \
  static void BNN_TEST_CONCAT(Test_, name)()

// Records a failure unless cond holds; `what` (streamable parts) says which case.
#define CHECK(cond, what)                                                           \
  do {                                                                              \
    ++::bnn_test::Current().checks;                                                 \
    if (!(cond)) {                                                                  \
      std::ostringstream bnn_check_out;                                             \
      bnn_check_out << "CHECK(" #cond ") failed:" << what;                          \
      ::bnn_test::Fail(__FILE__, __LINE__, bnn_check_out.str());                    \
    }                                                                               \
  } while (0)

// Records a failure unless a == b, with both values.
#define CHECK_EQ(a, b, what)                                                        \
  do {                                                                              \
    ++::bnn_test::Current().checks;                                                 \
    const auto& bnn_check_a = (a);                                                  \
    const auto& bnn_check_b = (b);                                                  \
    if (!(bnn_check_a == bnn_check_b)) {                                            \
      std::ostringstream bnn_check_out;                                             \
      bnn_check_out << "CHECK_EQ(" #a ", " #b ") failed: " << bnn_check_a << " vs "  \
                    << bnn_check_b << ";" << what;                                  \
      ::bnn_test::Fail(__FILE__, __LINE__, bnn_check_out.str());                    \
    }                                                                               \
  } while (0)

// Records a failure unless the two arrays hold the same bytes, naming the first difference.
#define CHECK_SAME(a, b, what)                                                      \
  do {                                                                              \
    ++::bnn_test::Current().checks;                                                 \
    if (!::bnn_test::SameBytes(a, b)) {                                             \
      std::ostringstream bnn_check_out;                                             \
      bnn_check_out << "CHECK_SAME(" #a ", " #b ") failed at index "                \
                    << ::bnn_test::FirstDifference(a, b) << " of " << (a).size()    \
                    << " and " << (b).size() << ";" << what;                        \
      ::bnn_test::Fail(__FILE__, __LINE__, bnn_check_out.str());                    \
    }                                                                               \
  } while (0)

#endif  // BNN_NATIVE_TESTS_CHECK_H_

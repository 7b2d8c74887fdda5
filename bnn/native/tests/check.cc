// The test runner of check.h: runs every registered test (or those whose name contains argv[1]),
// prints one line per test with the variants it ran and skipped, and exits 1 on any failure.
#include "check.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace bnn_test {
namespace {

std::vector<std::pair<const char*, void (*)()>>& Registry() {
  static std::vector<std::pair<const char*, void (*)()>> tests;
  return tests;
}

Context* current = nullptr;

std::string Join(const std::vector<std::string>& names) {
  if (names.empty()) return "-";
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ",") + name;
  return out;
}

}  // namespace

Context& Current() { return *current; }

Registration::Registration(const char* name, void (*fn)()) {
  Registry().emplace_back(name, fn);
}

std::vector<Isa> Variants(bool (*cpu_runs)(Isa)) {
  std::vector<Isa> out;
  for (Isa isa : bnn::core::kIsas) {
    std::vector<std::string>& list = cpu_runs(isa) ? current->ran : current->skipped;
    const std::string name = bnn::core::kIsaNames[isa];
    bool listed = false;
    for (const std::string& n : list) listed = listed || n == name;
    if (!listed) list.push_back(name);
    if (cpu_runs(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace bnn_test

int main(int argc, char** argv) {
  using namespace bnn_test;
  const std::string filter = argc > 1 ? argv[1] : "";
  std::printf("CPU: avx2=%d avx512(f,bw)=%d avx512(f,bw,vl,dq,vpopcntdq)=%d\n",
              bnn::core::HasAvx2(), bnn::core::HasAvx512Bw(),
              bnn::core::HasAvx512Vpopcntdq());
  int failed = 0, run = 0;
  for (const auto& [name, fn] : Registry()) {
    if (std::string(name).find(filter) == std::string::npos) continue;
    Context context;
    current = &context;
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++run;
    failed += context.failures > 0;
    std::printf("%s %-34s %7lld checks  ran: %-20s skipped: %-8s %6.2f s\n",
                context.failures ? "FAIL" : "ok  ", name,
                static_cast<long long>(context.checks), Join(context.ran).c_str(),
                Join(context.skipped).c_str(), seconds);
    for (const std::string& message : context.messages) std::printf("    %s\n", message.c_str());
    if (context.failures > static_cast<int64_t>(context.messages.size()))
      std::printf("    ... %lld failures in all\n", static_cast<long long>(context.failures));
    std::fflush(stdout);
  }
  std::printf("%d of %d tests passed\n", run - failed, run);
  return failed || run == 0 ? 1 : 0;
}

// TAP output of the CUDA kernel tests (plain programs: they also run under ThreadSanitizer, where
// Criterion's runner cannot start): check() prints one test line, and the detail of a failure as
// "# " comment lines; tap_failures says whether any failed (main's exit status).
#ifndef KVQ_TESTS_CUDA_EMU_TAP_H
#define KVQ_TESTS_CUDA_EMU_TAP_H

#include <cstdio>
#include <string>

inline int tap_number = 0;
inline int tap_failures = 0;

inline void check(bool ok, const std::string &what, const std::string &detail = "") {
  ++tap_number;
  std::printf("%s %d - %s\n", ok ? "ok" : "not ok", tap_number, what.c_str());
  if (!ok) {
    ++tap_failures;
    std::string d = detail;
    for (size_t p = 0; (p = d.find('\n', p)) != std::string::npos; p += 3) d.replace(p, 1, "\n# ");
    if (!d.empty()) std::printf("# %s\n", d.c_str());
  }
  std::fflush(stdout);
}

#endif

// Numbers in compression specs are written and read in the C locale's format ("0.001"), whatever
// LC_NUMERIC the application set: strtod and snprintf follow it, and a locale with a decimal comma
// (de_DE, fr_FR, ...) would refuse "topk:density=0.001" and write "0,001", which the spec grammar
// splits at the comma.
#pragma once

#include <locale.h>

namespace concord {
namespace compression {

// While alive, this thread's locale is the C locale (uselocale, POSIX 2008); the thread's previous
// locale comes back at destruction. Other threads are not affected. If the C locale cannot be
// made (out of memory), nothing changes. Not copyable; use on one thread.
class ScopedCLocale {
 public:
  ScopedCLocale() : c_(newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(0))) {
    if (c_ != static_cast<locale_t>(0)) previous_ = uselocale(c_);
  }
  ~ScopedCLocale() {
    if (c_ == static_cast<locale_t>(0)) return;
    uselocale(previous_);
    freelocale(c_);
  }
  ScopedCLocale(const ScopedCLocale&) = delete;
  ScopedCLocale& operator=(const ScopedCLocale&) = delete;

 private:
  locale_t c_;
  locale_t previous_ = static_cast<locale_t>(0);
};

}  // namespace compression
}  // namespace concord

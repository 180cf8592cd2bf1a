// Numbers that a machine reads back (configuration variables, compression specs, the metrics JSON
// and Prometheus text, the timeline, the run summary) are written and read in the C locale's
// format ("0.5"), whatever LC_NUMERIC the application set: strtod and the printf family follow
// it, and a locale with a decimal comma (de_DE, fr_FR, ...) would refuse "0.5" and write "0,5".
// std::to_chars and std::from_chars ignore the locale and need no guard.
#pragma once

#include <clocale>  // newlocale, uselocale, freelocale (POSIX 2008, through <locale.h>)

namespace concord {

// While alive, this thread's locale is the C locale (uselocale, POSIX 2008); the thread's previous
// locale comes back at destruction. Other threads are not affected, nor are C++ streams (they
// follow their imbued std::locale). If the C locale cannot be made (out of memory), nothing
// changes. Not copyable; use on one thread.
class ScopedCLocale {
 public:
  ScopedCLocale() : c_(newlocale(LC_ALL_MASK, "C", nullptr)) {
    if (c_ != nullptr) previous_ = uselocale(c_);
  }
  ~ScopedCLocale() {
    if (c_ == nullptr) return;
    uselocale(previous_);
    freelocale(c_);
  }
  ScopedCLocale(const ScopedCLocale&) = delete;
  ScopedCLocale& operator=(const ScopedCLocale&) = delete;

 private:
  locale_t c_;
  locale_t previous_ = nullptr;
};

}  // namespace concord

// A locale whose numbers have a decimal comma (de_DE: "0,5", and "86.400" in C++ streams), for
// tests that what an application sets as its locale does not change the numbers Concord reads and
// writes. An installed one is used if there is one; otherwise `localedef -i de_DE -f UTF-8` makes
// one (once per process) in a temporary directory, and LOCPATH names that directory while the
// locale is in use (glibc reads LOCPATH whenever it loads a locale). Debian's `locales` package
// holds localedef's sources (scripts/setup.sh installs it).
#pragma once

#include <stdlib.h>

#include <clocale>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <locale>
#include <string>

#include "tests/common/temp_dir.h"

namespace concord {
namespace harness {

// Contract: the constructor makes a decimal-comma locale the process's C locale
// (setlocale(LC_ALL)) and its global C++ locale (std::locale::global), as an application or
// Python's locale.setlocale(locale.LC_ALL, "") may; active() says whether it could, and why()
// says why not (for GTEST_SKIP: only when no such locale is installed and localedef cannot make
// one). The destructor restores both locales and LOCPATH. Not copyable; not thread-safe (the
// locale is process-wide): own it in the test's thread while no other thread formats numbers.
class CommaLocale {
 public:
  CommaLocale() : saved_c_(std::setlocale(LC_ALL, nullptr)) {
    const char* locpath = std::getenv("LOCPATH");
    had_locpath_ = locpath != nullptr;
    if (had_locpath_) saved_locpath_ = locpath;
    for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "de_DE", "fr_FR.UTF-8", "fr_FR.utf8"}) {
      if (Use(name)) return;
    }
    const Made& made = MadeOnce();
    if (!made.why.empty()) {
      why_ = made.why;
      return;
    }
    ::setenv("LOCPATH", made.dir.path().c_str(), 1);
    if (!Use("de_DE.UTF-8")) {
      why_ = "localedef made " + made.dir.path() +
             "/de_DE.UTF-8, but setlocale(LC_ALL, \"de_DE.UTF-8\") with LOCPATH there refused it "
             "or it has no decimal comma";
    }
  }
  ~CommaLocale() {
    if (active_) std::locale::global(saved_cpp_);
    std::setlocale(LC_ALL, saved_c_.c_str());
    if (had_locpath_) {
      ::setenv("LOCPATH", saved_locpath_.c_str(), 1);
    } else {
      ::unsetenv("LOCPATH");
    }
  }
  CommaLocale(const CommaLocale&) = delete;
  CommaLocale& operator=(const CommaLocale&) = delete;

  bool active() const { return active_; }
  const std::string& why() const { return why_; }

 private:
  // The locale localedef made for this process, or why it could not.
  struct Made {
    Made() {
      if (dir.path().empty()) {
        why = "no directory could be made under /tmp for localedef's output";
        return;
      }
      const std::string log = dir.path() + "/localedef.log";
      const std::string command =
          "localedef -i de_DE -f UTF-8 " + dir.path() + "/de_DE.UTF-8 >" + log + " 2>&1";
      const int rc = std::system(command.c_str());
      if (std::ifstream(dir.path() + "/de_DE.UTF-8/LC_NUMERIC")) return;
      std::ifstream in(log);
      const std::string output((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
      why = "no decimal-comma locale is installed, and `" + command + "` made none (status " +
            std::to_string(rc) + "): " + output +
            " (Debian's `locales` package has its sources; scripts/setup.sh installs it)";
    }
    TempDir dir{"concord-locale-"};
    std::string why;  // "" when dir holds de_DE.UTF-8
  };

  static const Made& MadeOnce() {
    static const Made made;
    return made;
  }

  // Makes `name` the C and global C++ locale if it loads and has a decimal comma.
  bool Use(const char* name) {
    if (std::setlocale(LC_ALL, name) == nullptr ||
        std::string(std::localeconv()->decimal_point) != ",") {
      std::setlocale(LC_ALL, saved_c_.c_str());
      return false;
    }
    try {
      std::locale cpp(name);
      saved_cpp_ = std::locale::global(cpp);  // sets the C locale to `name` again
    } catch (const std::exception&) {
      std::setlocale(LC_ALL, saved_c_.c_str());
      return false;
    }
    active_ = true;
    return true;
  }

  const std::string saved_c_;
  bool had_locpath_ = false;
  std::string saved_locpath_;
  std::locale saved_cpp_;
  bool active_ = false;
  std::string why_;
};

}  // namespace harness
}  // namespace concord
